"""Counting a Voyage model's tokens: exact with Voyage's own tokenizer when a copy is on this machine, else an
estimate from cl100k_base, stated as such.

Voyage publishes its tokenizers on Hugging Face (`voyageai/<model>`, docs.voyageai.com/docs/tokenization)
and counts as `tokenizers` does with the special tokens (`voyageai.Client.count_tokens`: `encode_batch`,
no truncation). Nothing here downloads: `tokenizer_path` names a tokenizer.json, else the local Hugging Face
cache is asked, else counts are estimated. The estimate is Voyage's own rule of thumb, "on average 1.1 - 1.2
times" the tiktoken count (the same page), taken at its high end and rounded up, so the plan and the budget
err high; what was billed is read back from each answer's `usage.total_tokens`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reindex.errors import ConfigError, MissingDependency
from reindex.ports import TokenCounts, Tokens

if TYPE_CHECKING:
    from tokenizers import Tokenizer

ESTIMATE_FACTOR = 1.2  # Voyage's tokens per cl100k_base token, at the high end of the range it publishes


class TokenCounter:
    """Counts for one model; `counts` says whether they are exact (from which file) or estimated.

    Texts are never cut: Voyage truncates an input past the context itself, so `Tokens.data` is the whole
    text and `count` is what is embedded (at most the context), `original_count` the whole text's.
    """

    def __init__(self, model: str, context: int, tokenizer_path: str | None = None) -> None:
        self.context = context
        found = _given(tokenizer_path) if tokenizer_path else _cached(model)
        self._tokenizer = _load(found) if found else None
        self._codec: Any = None if self._tokenizer else _cl100k()
        self.is_exact = self._tokenizer is not None
        self.counts_are = (
            TokenCounts(True, f"exact: {found}")
            if self.is_exact
            else TokenCounts(
                False,
                f"estimate: cl100k_base x {ESTIMATE_FACTOR} (no tokenizer of voyageai/{model} on this machine)",
            )
        )

    def counts(self, texts: Sequence[str]) -> list[int]:
        """Whole-text counts."""
        if self._tokenizer is not None:
            return [len(encoding) for encoding in self._tokenizer.encode_batch(list(texts))]
        encode = self._codec.encode_ordinary
        return [math.ceil(len(encode(text)) * ESTIMATE_FACTOR) for text in texts]

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        return [
            Tokens(min(n, self.context), n, text) for text, n in zip(texts, self.counts(texts), strict=True)
        ]


def _given(tokenizer_path: str) -> Path:
    path = Path(tokenizer_path).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"  # a model folder, as Hugging Face lays it out
    if not path.is_file():
        raise ConfigError(f"tokenizer_path {tokenizer_path!r} holds no tokenizer.json", hint="name the file")
    return path


def _cached(model: str) -> Path | None:
    """The model's tokenizer.json in the local Hugging Face cache, if one was ever downloaded (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(f"voyageai/{model}", "tokenizer.json")
    return Path(found) if isinstance(found, str) else None


def _load(path: Path) -> Tokenizer:
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise MissingDependency("tokenizers", extra="voyage") from exc
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises a bare Exception for an unreadable file
        raise ConfigError(f"cannot read the tokenizer {path}: {exc}", hint="name a tokenizer.json") from None
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def _cl100k() -> Any:
    try:
        import tiktoken  # noqa: F401  (the voyage extra's; reindex_adapters.remote.tokens would name openai)
    except ImportError as exc:
        raise MissingDependency("tiktoken", extra="voyage") from exc
    from reindex_adapters.remote.tokens import encoding

    return encoding("cl100k_base")
