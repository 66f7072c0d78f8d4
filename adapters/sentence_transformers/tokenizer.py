"""`ColumnTokenizer`, the columnar hot path of the local embedders (also the hash embedder's `tokenizer` option):
one `encode_batch` per chunk on a thread pool (the Rust code releases the GIL), ids flattened in C, truncation
and the post-processor's special tokens applied to the flat array by numpy.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from reindex.columns import TokenColumns, ragged
from reindex.errors import ConfigError
from reindex_adapters.hub import special_count, untruncated

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer

PROBES = ("hello world", "", "a", "Ünïcödé 漢字 🙂 text", "North and south, east and west: " * 9)
MIN_CHUNK = 256  # texts per encode_batch call on the pool; smaller chunks are not worth a hand-off
FALSE_WORDS = {"", "0", "off", "false", "f", "no", "n"}


class ColumnTokenizer:
    """A `tokenizers.Tokenizer` that answers `TokenColumns`: O(1) Python calls per chunk of texts.

    The texts are split into chunks encoded on a per-process thread pool of `threads` (default: every
    core this process may use); `encode_batch` releases the GIL, so this is parallel even with
    TOKENIZERS_PARALLELISM=false, and fork-safe because no Rust thread pool is started. A user who sets
    TOKENIZERS_PARALLELISM to a true value gets the library's own pool instead (one call per batch).
    The post-processor's special tokens are found once, by post-processing probes; a post-processor
    that is not "prefix + ids + suffix" is applied per encoding (slower, same ids).
    """

    def __init__(
        self,
        backend: Tokenizer,
        max_tokens: int,
        *,
        prompt: str = "",
        lowercase: bool = False,
        threads: int | None = None,
    ) -> None:
        self.backend = untruncated(backend)
        self.specials = special_count(self.backend)
        if max_tokens <= self.specials:
            raise ConfigError(f"max_tokens {max_tokens} leaves no room beside {self.specials} special tokens")
        self.max_tokens, self.prompt, self.lowercase = max_tokens, prompt, lowercase
        self.threads = threads or _default_threads()
        self._encode = _batch_encoder(self.backend)
        self._frame = _template(self.backend, self.specials)
        self.digest: str | None = None  # the tokenizer file's sha256 when read from one

    @classmethod
    def from_file(cls, path: str, max_tokens: int, *, threads: int | None = None) -> ColumnTokenizer:
        """A tokenizer.json, or a model folder holding one; `digest` is the file's sha256."""
        from tokenizers import Tokenizer

        file = Path(path) / "tokenizer.json" if Path(path).is_dir() else Path(path)
        try:
            data = file.read_bytes()
            backend = Tokenizer.from_str(data.decode())
        except Exception as exc:  # tokenizers raises a bare Exception for a broken file
            raise ConfigError(
                f"tokenizer {path!r} could not be loaded", hint="pass a tokenizer.json"
            ) from exc
        tokenizer = cls(backend, max_tokens, threads=threads)
        tokenizer.digest = hashlib.sha256(data).hexdigest()
        return tokenizer

    def __call__(self, texts: list[str]) -> TokenColumns:
        if self.prompt:
            texts = list(map(self.prompt.__add__, texts))
        if self.lowercase:
            texts = list(map(str.lower, texts))
        size = max(MIN_CHUNK, -(-len(texts) // (self.threads * 4)))
        if self.threads == 1 or len(texts) <= size:
            return self._chunk(texts)
        chunks = [texts[start : start + size] for start in range(0, len(texts), size)]
        return TokenColumns.concat(list(_pool(self.threads).map(self._chunk, chunks)))

    def _chunk(self, texts: list[str]) -> TokenColumns:
        encodings = self._encode(texts, add_special_tokens=False)
        if self._frame is None:
            return self._post_processed(encodings)
        ids = list(map(attrgetter("ids"), encodings))
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
        return framed(flat, lengths, self.max_tokens - self.specials, *self._frame)

    def _post_processed(self, encodings: list[Encoding]) -> TokenColumns:
        """The tokenizer's own post-processor per encoding (a template numpy cannot reproduce)."""
        original = np.fromiter(map(len, encodings), dtype=np.int64, count=len(encodings)) + self.specials
        finals = []
        for encoding in encodings:
            encoding.truncate(self.max_tokens - self.specials)
            finals.append(self.backend.post_process(encoding, None, True).ids)
        flat, offsets = ragged(finals)
        return TokenColumns(np.diff(offsets), original, flat, offsets)


def framed(
    flat: NDArray[np.int64],
    lengths: NDArray[np.int64],
    limit: int,
    prefix: Sequence[int],
    suffix: Sequence[int],
) -> TokenColumns:
    """Rows of `flat` (ragged by `lengths`) cut to `limit` ids, each framed by `prefix` and `suffix`."""
    kept = np.minimum(lengths, limit)
    if (kept < lengths).any():
        starts, new = _offsets(lengths)[:-1], _offsets(kept)
        flat = flat[np.repeat(starts - new[:-1], kept) + np.arange(int(new[-1]), dtype=np.int64)]
    counts = kept + len(prefix) + len(suffix)
    offsets = _offsets(counts)
    if not prefix and not suffix:
        return TokenColumns(counts, lengths + 0, flat, offsets)
    head = offsets[:-1, None] + np.arange(len(prefix))
    tail = offsets[1:, None] - len(suffix) + np.arange(len(suffix))
    specials = np.concatenate([head, tail], axis=1).ravel()  # each row's special positions, in order
    ids = np.empty(int(offsets[-1]), dtype=np.int64)
    body = np.ones(len(ids), dtype=np.bool_)
    body[specials] = False
    ids[body] = flat
    ids[specials] = np.tile(np.asarray([*prefix, *suffix], dtype=np.int64), len(counts))
    return TokenColumns(counts, lengths + len(prefix) + len(suffix), ids, offsets)


def _offsets(lengths: NDArray[np.int64]) -> NDArray[np.int64]:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _template(backend: Tokenizer, specials: int) -> tuple[list[int], list[int]] | None:
    """(prefix, suffix) such that post-processing is `prefix + ids + suffix` for every probe, truncated
    or not; None when no split explains them all (then encodings are post-processed one by one)."""
    cases = []
    for text in PROBES:
        encoding = backend.encode(text, add_special_tokens=False)
        ids = list(encoding.ids)
        cases.append((ids, backend.post_process(encoding, None, True).ids))
        encoding.truncate(max(len(ids) // 2, 1))
        cases.append((ids[: max(len(ids) // 2, 1)], backend.post_process(encoding, None, True).ids))
    ids, full = cases[0]
    for head in range(len(full) - len(ids) + 1):
        prefix, suffix = full[:head], full[head + len(ids) :]
        if len(prefix) + len(suffix) == specials and all(prefix + i + suffix == f for i, f in cases):
            return prefix, suffix
    return None


def _batch_encoder(backend: Tokenizer) -> Any:
    """`encode_batch_fast` (no character offsets) where this tokenizers has it and it gives the same ids."""
    fast = getattr(backend, "encode_batch_fast", None)
    if fast is None:
        return backend.encode_batch
    same = [e.ids for e in fast(list(PROBES), add_special_tokens=False)]
    return (
        fast
        if same == [e.ids for e in backend.encode_batch(list(PROBES), add_special_tokens=False)]
        else backend.encode_batch
    )


def _default_threads() -> int:
    """Every core this process may use, unless the user asked for the tokenizers library's own pool."""
    if os.environ.get("TOKENIZERS_PARALLELISM", "false").strip().lower() not in FALSE_WORDS:
        return 1
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(threads: int) -> ThreadPoolExecutor:
    """One pool per process and size: a forked child builds its own (the parent's threads are not there)."""
    key = (os.getpid(), threads)
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = ThreadPoolExecutor(threads, thread_name_prefix="reindex-tokenize")
        return _POOLS[key]
