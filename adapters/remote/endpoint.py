"""One provider API as every provider kind speaks to it: the pacer every request waits on, the API key's
variable (named in errors) and the key itself (scrubbed from every message), and the provider's one error
translation. `call` paces and retries (reads, embeddings, uploads: repeating them is harmless); `once` is
one attempt (a job create: repeating it could bill twice)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from reindex_adapters.remote.pacing import Pacer

T = TypeVar("T")

# the provider module's `translated_errors(secret, key_env, **options)`: its SDK's exceptions made ours
Translation = Callable[..., AbstractContextManager[None]]


class ProviderEndpoint:
    """The pacing, the retries and the error translation a provider's client is used through."""

    def __init__(self, pacer: Pacer, key_env: str, secret: object, translate: Translation) -> None:
        self.pacer, self.key_env = pacer, key_env
        self._secret = secret if isinstance(secret, str) else ""  # what an SDK keeps may be a wrapper
        self._translate = translate

    def call(
        self,
        request: Callable[[], T],
        *,
        tokens: int = 0,
        usage: Callable[[T], int] | None = None,
        **translation: Any,
    ) -> T:
        """Paced and retried; `tokens` paces by tokens per minute, `usage` reads what the answer billed."""
        once = functools.partial(self.once, request, **translation)
        return self.pacer.call(once, tokens=tokens, usage=usage)

    def once(self, request: Callable[[], T], **translation: Any) -> T:
        """One attempt, no retry; the provider's exceptions translated, the key in none of them."""
        with self._translate(self._secret, self.key_env, **translation):
            return request()
