"""HashEmbedder, the free `hash` kind: vectors from a 64-bit hash of each text, computed by numpy in columns."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from itertools import chain, repeat
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import ConfigDict, Field

from reindex.columns import TokenColumns, ragged
from reindex.fingerprint import fingerprint
from reindex.ports import EmbedderInfo, EmbedderTraits, Section, Tokens, Vectors

if TYPE_CHECKING:
    from reindex_adapters.sentence_transformers import ColumnTokenizer


class HashEmbedder:
    """Vectors derived from a 64-bit hash of the text: deterministic, nearly free, and wrong for retrieval.

    Columnar: a batch's texts are packed into one buffer of 8-byte words (each text zero-padded to a word
    boundary), hashed by numpy in row chunks that fit the cache (splitmix64-mixed words weighted by their
    place), and each 64-bit key, xor'd with per-column constants, is mixed into `dim` bytes. Tokens are
    whitespace words: the kept text is the first `max_tokens` words joined by one space; the row keys
    ride in `TokenColumns.items` beside the kept texts, so embedding does not hash twice. With
    `tokenizer` (a tokenizer.json or a model folder holding one), counts and truncation come from that
    real tokenizer and the vector hashes the kept token ids.
    """

    class Config(Section):
        model_config = ConfigDict(extra="forbid", frozen=True)
        kind: Literal["hash"]
        dim: int = 32
        max_tokens: int = 512
        seed: str = ""
        latency_ms: float = 0.0  # per batch: behaves like a slow model (demos, interruption tests)
        tokenizer: str | None = None  # a tokenizer.json (or model folder): real token counts, free vectors
        tokenizer_threads: int | None = Field(default=None, gt=0)

    def __init__(
        self,
        dim: int = 32,
        max_tokens: int = 512,
        seed: str = "",
        latency_ms: float = 0.0,
        *,
        tokenizer: str | None = None,
        tokenizer_threads: int | None = None,
    ) -> None:
        options: dict[str, Any] = {"seed": seed}
        self.tokenizer: ColumnTokenizer | None = None
        if tokenizer is not None:
            from reindex_adapters.sentence_transformers import ColumnTokenizer

            self.tokenizer = ColumnTokenizer.from_file(tokenizer, max_tokens, threads=tokenizer_threads)
            options["tokenizer"] = self.tokenizer.digest
        self.seed = seed.encode()
        self._seed_key = np.uint64(
            int.from_bytes(hashlib.blake2b(self.seed, digest_size=8).digest(), "little")
        )
        self.latency = latency_ms / 1000
        # a free model takes whole shards; a slow one the run's batches
        self.traits = EmbedderTraits(batch_tokens=None if latency_ms else FREE_BATCH_TOKENS)
        self.info = EmbedderInfo(
            kind="hash",
            model=HASH_MODEL,
            dim=dim,
            max_tokens=max_tokens,
            fingerprint=fingerprint("hash", HASH_MODEL, dim, options),
            options=options,
        )

    @classmethod
    def from_config(cls, config: Config) -> HashEmbedder:
        return cls(
            config.dim,
            config.max_tokens,
            config.seed,
            config.latency_ms,
            tokenizer=config.tokenizer,
            tokenizer_threads=config.tokenizer_threads,
        )

    @property
    def column_tokenizer(self) -> ColumnTokenizer | None:
        """With a real tokenizer, `tokenize_columns` without the rest (see the sentence-transformers one);
        whitespace words need no read task's help."""
        return self.tokenizer

    def tokenize_columns(self, texts: list[str]) -> TokenColumns:
        if self.tokenizer is not None:
            return self.tokenizer(texts)
        return _words(texts, self.info.max_tokens)

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        return list(self.tokenize_columns(list(texts)))

    def embed_columns(self, tokens: TokenColumns) -> Vectors:
        if self.latency:
            time.sleep(self.latency)
        return self._vectors(_keys_of(tokens, ids=self.tokenizer is not None))

    def embed(self, items: Sequence[Tokens]) -> Vectors:
        return self.embed_columns(TokenColumns.from_tokens(items))

    def vector(self, text: str) -> Vectors:
        """The vector of `text` exactly as given (a kept text); with a tokenizer, of its kept tokens."""
        vector: Vectors = self.vectors([text])[0]
        return vector

    def vectors(self, texts: list[str]) -> Vectors:
        """`vector` of each text, computed together (each row is hashed on its own: the same values)."""
        if self.tokenizer is not None:
            return self.embed_columns(self.tokenizer(texts))
        return self._vectors(_keys(*_packed(texts)))

    def _vectors(self, keys: Words) -> Vectors:
        """`dim` pseudo-random bytes per key and seed, centred and normalised, in cache-sized chunks."""
        out = np.empty((len(keys), self.info.dim), dtype=np.float32)
        columns = _columns(-(-self.info.dim // 8)) ^ self._seed_key
        with np.errstate(over="ignore"):
            for start in range(0, len(keys), CHUNK_ROWS):
                _key_vectors(keys[start : start + CHUNK_ROWS], columns, out[start : start + CHUNK_ROWS])
        return out


HASH_MODEL = "words64-splitmix"  # was "shake256": vectors are derived differently, so targets differ
FREE_BATCH_TOKENS = 1 << 22
CHUNK_ROWS = 256  # rows hashed or expanded at once: 256 x 384 floats stay in the core's cache
Words = NDArray[np.uint64]
Int64s = NDArray[np.int64]
_M1, _M2, _GOLDEN = (
    np.uint64(0xBF58476D1CE4E5B9),
    np.uint64(0x94D049BB133111EB),
    np.uint64(0x9E3779B97F4A7C15),
)
_BASE = 0xD6E8FEB86659FD93  # odd: powers of it weigh a word by its place in the text
_PADS = ["\0" * n for n in range(8)]
_BYTE_PADS = [b"\0" * n for n in range(8)]
_POWERS: list[Words] = [np.ones(1, dtype=np.uint64), np.ones(1, dtype=np.uint64)]  # BASE^g, BASE^-g


def _words(texts: list[str], limit: int) -> TokenColumns:
    """Whitespace words: `counts` kept, `original` in the text, `texts` the kept words joined by one space.

    A batch of ASCII texts already in that form (single spaces, no other whitespace, no space at either
    end) is counted by numpy in one pass; any other batch is split text by text."""
    packed = _packed(texts)
    counts = _normal_word_counts(*packed)
    if counts is None:
        return _split_words(texts, limit)
    keys = _keys(*packed)
    kept = texts
    over = np.flatnonzero(counts > limit).tolist()
    if over:
        kept = list(texts)
        for row in over:
            kept[row] = " ".join(texts[row].split(" ", limit)[:limit])
        keys[over] = _keys(*_packed([kept[row] for row in over]))
    return TokenColumns(np.minimum(counts, limit), counts, texts=kept, items=keys.tolist())


def _normal_word_counts(words: Words, offsets: Int64s, lengths: Int64s) -> Int64s | None:
    data = words.view(np.uint8)
    if np.count_nonzero(data >= 128):  # UTF-8 beyond ASCII: it may hold Unicode whitespace
        return None
    if np.count_nonzero(data < 32) != len(data) - int(lengths.sum()):  # a control char besides the padding
        return None
    spaces = data == 32
    starts = 8 * offsets[:-1][lengths > 0]
    ends = starts + lengths[lengths > 0] - 1
    if spaces[starts].any() or spaces[ends].any() or (spaces[1:] & spaces[:-1]).any():
        return None
    counts = np.zeros(len(lengths), dtype=np.int64)
    if len(starts):
        counts[lengths > 0] = np.add.reduceat(spaces, starts, dtype=np.int64) + 1
    return counts


def _split_words(texts: Sequence[str], limit: int) -> TokenColumns:
    counts, original, kept = [], [], []
    for text in texts:
        words = text.split()
        counts.append(min(len(words), limit))
        original.append(len(words))
        kept.append(" ".join(words[:limit]))
    keys = _keys(*_packed(kept)).tolist()
    return TokenColumns(
        np.asarray(counts, dtype=np.int64), np.asarray(original, dtype=np.int64), texts=kept, items=keys
    )


def _keys_of(tokens: TokenColumns, *, ids: bool) -> Words:
    """Each row's 64-bit key: carried in `items` beside `texts` by `_words`, else hashed here from the
    kept token ids (tokenizer mode) or the kept texts (per-text `Tokens` hold them as data)."""
    if tokens.ids is not None and tokens.offsets is not None:
        return _keys(tokens.ids.astype(np.uint64), tokens.offsets, np.diff(tokens.offsets))
    if tokens.texts is not None and tokens.items is not None:
        return np.fromiter(tokens.items, dtype=np.uint64, count=len(tokens.items))
    if tokens.texts is not None:
        return _keys(*_packed(tokens.texts))
    if ids:
        flat, offsets = ragged(tokens.items or [])
        return _keys(flat.astype(np.uint64), offsets, np.diff(offsets))
    return _keys(*_packed([str(item) for item in tokens.items or []]))


def _packed(texts: list[str]) -> tuple[Words, Int64s, Int64s]:
    """UTF-8 of the texts, each zero-padded to 8 bytes, as little-endian words; word offsets; byte lengths."""
    if all(map(str.isascii, texts)):  # O(1) per text: the string knows
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        pads = map(_PADS.__getitem__, ((-lengths) % 8).tolist())
        data = "".join(chain.from_iterable(zip(texts, pads, strict=True))).encode("ascii")
    else:
        encoded = list(map(str.encode, texts, repeat("utf-8"), repeat("surrogatepass")))
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(texts))
        byte_pads = map(_BYTE_PADS.__getitem__, ((-lengths) % 8).tolist())
        data = b"".join(chain.from_iterable(zip(encoded, byte_pads, strict=True)))
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum((lengths + 7) // 8, out=offsets[1:])
    return np.frombuffer(data, dtype="<u8").astype(np.uint64, copy=False), offsets, lengths


def _keys(words: Words, offsets: Int64s, lengths: Int64s) -> Words:
    """Row i's key hashes words[offsets[i]:offsets[i+1]] and its length (chunks keep the tables small)."""
    keys = np.empty(len(lengths), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for start in range(0, len(lengths), CHUNK_ROWS):
            rows = slice(start, start + CHUNK_ROWS)
            keys[rows] = _row_keys(words, offsets[start : start + CHUNK_ROWS + 1], lengths[rows])
    return keys


def _row_keys(words: Words, offsets: Int64s, lengths: Int64s) -> Words:
    """One 64-bit key per row: sum of mixed words weighted by BASE^place, then the row length, mixed."""
    first = int(offsets[0])
    part = words[first : int(offsets[-1])] * _M1
    part ^= part >> np.uint64(32)
    powers, inverses = _powers(len(part))
    part *= powers[: len(part)]  # BASE^(place in the chunk); the row's start is divided out below
    starts = offsets[:-1] - first
    sums = np.zeros(len(lengths), dtype=np.uint64)
    filled = offsets[1:] > offsets[:-1]
    if filled.any():
        sums[filled] = np.add.reduceat(part, starts[filled])
    sums *= inverses[starts]
    sums ^= lengths.astype(np.uint64) * _GOLDEN
    return _mix(sums)


def _powers(size: int) -> tuple[Words, Words]:
    """BASE^g and BASE^-g mod 2^64 for g < size (grown by doubling, kept for the process)."""
    powers, inverses = _POWERS
    if len(powers) < size + 1:
        grown = max(size + 1, 2 * len(powers), 1 << 16)
        powers = _geometric(_BASE, grown)
        inverses = _geometric(pow(_BASE, -1, 1 << 64), grown)
        _POWERS[:] = [powers, inverses]
    return powers, inverses


def _geometric(base: int, size: int) -> Words:
    terms = np.full(size, base, dtype=np.uint64)
    terms[0] = 1
    return np.cumprod(terms, dtype=np.uint64)


def _key_vectors(keys: Words, columns: Words, out: Vectors) -> None:
    """Two multiply-xorshift rounds of key ^ column constant give the bytes; -127.5..127.5, never zero."""
    mixed = keys[:, None] ^ columns[None, :]
    mixed *= _M1
    mixed ^= mixed >> np.uint64(29)
    mixed *= _M2
    np.add(mixed.astype("<u8", copy=False).view(np.int8)[:, : out.shape[1]], np.float32(0.5), out=out)
    out *= (1 / np.sqrt(np.einsum("ij,ij->i", out, out)))[:, None]


def _columns(count: int) -> Words:
    with np.errstate(over="ignore"):
        return _mix(np.arange(1, count + 1, dtype=np.uint64) * _GOLDEN)


def _mix(z: Words) -> Words:
    """The splitmix64 finalizer, in place."""
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return z
