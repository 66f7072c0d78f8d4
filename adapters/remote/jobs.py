"""Creating a provider batch job once for a deterministic key, and adopting the job when a create that failed
was made anyway (the openai-batch, mistral-batch, gemini-batch and bedrock-batch embedders)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from reindex.errors import TransientError
from reindex_adapters.remote.errors import ProviderBusy

J = TypeVar("J")


def create_once(
    create: Callable[[], J],
    find: Callable[[], J | None],
    *,
    what: str,
    unsure: tuple[type[Exception], ...] = (ProviderBusy,),
) -> J:
    """`create()` once, never retried: a second create could bill twice. When it fails without saying whether
    the job was made (a timeout or 5xx: ProviderBusy, or another of `unsure`), adopt the job `find()` returns
    (the job carrying the key); with none, raise TransientError, so that a rerun finds or creates it.

    Callers look the key up with the same `find` before uploading anything, which adopts a job a crashed run
    created; `what` names the job in the error ("the batch for key 'k'").
    """
    try:
        return create()
    except unsure as exc:
        found = find()
        if found is None:
            raise TransientError(f"creating {what} failed: {exc}; rerun to retry") from exc
        return found
