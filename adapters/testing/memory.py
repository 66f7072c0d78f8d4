"""In-memory source, sink and a deterministic embedder: the shipped fakes for tests and demo mode.

Every command opens its adapters anew from the TOML, so `store = "<name>"` on `[source]` and `[target]`
puts them on one process-wide `MemoryStore` (see `store()`): documents a test inserts, edits and deletes
between commands, and the sink's targets and aliases. Without `store` each adapter has a private one.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import chain, repeat
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from reindex.columns import TokenColumns, ragged
from reindex.errors import BackendError, ConfigError, CutoverRefused, RowsRejected
from reindex.fingerprint import fingerprint
from reindex.ports import (
    AliasInfo,
    Distance,
    EmbedderInfo,
    IndexEntry,
    JobItem,
    JobResult,
    Record,
    Rows,
    SourceSchema,
    TargetInfo,
    TargetSpec,
    Tokens,
    Vectors,
)
from reindex.vectors import vector_problem

if TYPE_CHECKING:
    from reindex_adapters.sentence_transformers import ColumnTokenizer

Stored = tuple[Record, Vectors, str, str]  # record, vector, content hash, fingerprint
_SEP = "\x1f"  # cursor of a record that shares its id with later ones: `<id>\x1f<index among them>`
_STORES: dict[str, MemoryStore] = {}
_STORES_LOCK = threading.Lock()


def store(name: str) -> MemoryStore:
    """The process-wide store called `name`, created empty on first use."""
    with _STORES_LOCK:
        return _STORES.setdefault(name, MemoryStore(name))


def forget_store(name: str) -> None:
    """Drop a named store (tests: a fresh world per example)."""
    with _STORES_LOCK:
        _STORES.pop(name, None)


class MemoryStore:
    """Source documents kept in id order (keyset scans, like a table's primary key), plus a sink's
    targets, specs and aliases. Several records may share an id, as in a file; they keep insertion order."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name
        self.lock = threading.RLock()
        self.seeded = False  # `[source] documents` loaded once into a named store
        self._docs: dict[str, list[Record]] = {}
        self._ids: list[str] = []  # sorted keys of _docs
        self.targets: dict[str, dict[str, Stored]] = {}
        self.specs: dict[str, TargetSpec] = {}
        self.aliases: dict[str, tuple[str, Mapping[str, Any]]] = {}
        self._fail_in: int | None = None
        self._fail_landed = False
        self.provider = BatchProvider()  # a batch API's side, for `memory-batch` with this store

    # source side ---------------------------------------------------------------------------------------

    def load(self, documents: Sequence[Record]) -> None:
        """Append many records at once (one sort, not one insertion each)."""
        with self.lock:
            for record in documents:
                self._docs.setdefault(record.id, []).append(_plain(record))
            self._ids = sorted(self._docs)

    def put(self, doc_id: str, text: str, **fields: Any) -> None:
        """Insert the document, or replace every record with this id by it."""
        with self.lock:
            if doc_id not in self._docs:
                bisect.insort(self._ids, doc_id)
            self._docs[doc_id] = [_document(doc_id, text, fields)]

    def append(self, doc_id: str, text: str, **fields: Any) -> None:
        """Add one more record with this id (a duplicate id, as a JSONL file can hold)."""
        with self.lock:
            if doc_id not in self._docs:
                bisect.insort(self._ids, doc_id)
            self._docs.setdefault(doc_id, []).append(_document(doc_id, text, fields))

    def edit(self, doc_id: str, text: str) -> None:
        """Change the text of every record with this id, keeping the other fields."""
        with self.lock:
            self._docs[doc_id] = [
                _document(doc_id, text, {k: v for k, v in r.payload.items() if k not in ("id", "text")})
                for r in self._docs[doc_id]
            ]

    def delete(self, doc_id: str) -> None:
        with self.lock:
            if self._docs.pop(doc_id, None) is not None:
                self._ids.remove(doc_id)

    def get(self, doc_id: str) -> list[Record]:
        with self.lock:
            return list(self._docs.get(doc_id, []))

    def ids(self) -> list[str]:
        with self.lock:
            return list(self._ids)

    def records(self) -> list[Record]:
        """Every record in scan order."""
        return list(self.scan())

    def __len__(self) -> int:
        with self.lock:
            return sum(len(group) for group in self._docs.values())

    def scan(self, after: str | None = None) -> Iterator[Record]:
        """Keyset scan: each step finds the next record after the last position, so a document inserted
        behind the cursor is not seen (as with Postgres) and one inserted ahead of it is."""
        key = _parse(after)
        while True:
            with self.lock:
                step = self._next(key)
            if step is None:
                return
            record, key = step
            yield record

    def _next(self, key: tuple[str, int | None] | None) -> tuple[Record, tuple[str, int]] | None:
        if key is not None and key[1] is not None and key[1] + 1 < len(self._docs.get(key[0], [])):
            doc_id, index = key[0], key[1] + 1
        else:
            at = 0 if key is None else bisect.bisect_right(self._ids, key[0])
            if at >= len(self._ids):
                return None
            doc_id, index = self._ids[at], 0
        group = self._docs[doc_id]
        cursor = doc_id if index == len(group) - 1 else f"{doc_id}{_SEP}{index}"
        r = group[index]
        return Record(r.id, r.text, r.payload, cursor=cursor, defect=r.defect), (doc_id, index)

    # sink side -----------------------------------------------------------------------------------------

    def fail_write(self, after: int | None, *, landed: bool = False) -> None:
        """Make the `after`-th sink write from now raise BackendError once (None: never), like a crash.

        `landed`: the rows are stored first and the error comes after, like a crash before the ledger mark.
        """
        with self.lock:
            self._fail_in, self._fail_landed = after, landed

    def write_fails(self) -> bool | None:
        """Count one write; None when it goes through, else whether it lands before failing."""
        with self.lock:
            if self._fail_in is None:
                return None
            self._fail_in -= 1
            if self._fail_in > 0:
                return None
            self._fail_in = None
            return self._fail_landed


def _document(doc_id: str, text: str, fields: Mapping[str, Any]) -> Record:
    return Record(doc_id, text, {"id": doc_id, "text": text, **fields})


def _plain(record: Record) -> Record:
    return Record(record.id, record.text, record.payload, defect=record.defect)


def _parse(after: str | None) -> tuple[str, int | None] | None:
    if after is None:
        return None
    doc_id, sep, index = after.rpartition(_SEP)
    return (doc_id, int(index)) if sep and index.isdigit() else (after, None)


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(_holds_nul(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_holds_nul(v) for v in value)
    return False


class MemorySource:
    """Records in a MemoryStore, scanned in id order; the cursor is the id (keyset, as for Postgres)."""

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        kind: Literal["memory"]
        documents: list[dict[str, Any]] = []
        store: str | None = None  # a named, process-wide store shared with other adapters and commands

    def __init__(self, records: Sequence[Record] = (), *, store: MemoryStore | None = None) -> None:
        self.store = store if store is not None else MemoryStore()
        if records:
            self.store.load(records)
        self._identity = f"memory:{self.store.name}" if self.store.name else _inline_identity(records)

    @classmethod
    def from_config(cls, config: Config) -> MemorySource:
        records = [Record(str(d["id"]), str(d["text"]), d) for d in config.documents]
        if config.store is None:
            return cls(records)
        shared = store(config.store)
        with shared.lock:
            if not shared.seeded:
                shared.seeded = True
                shared.load(records)
        return cls(store=shared)

    @property
    def records(self) -> list[Record]:
        return self.store.records()

    def identity(self) -> str:
        return self._identity

    def schema(self) -> SourceSchema:
        return SourceSchema(id_field="id", text_field="text")

    def count(self) -> int | None:
        return len(self.store)

    def scan(self, after: str | None = None) -> Iterator[Record]:
        return self.store.scan(after)

    def fetch(self, ids: Sequence[str]) -> Iterator[Record]:
        for doc_id in sorted(set(ids)):
            yield from self.store.get(doc_id)

    def close(self) -> None:
        pass


def _inline_identity(records: Sequence[Record]) -> str:
    """A private store is named by what it was given: the same TOML documents, the same source."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(
            f"{len(record.id)}:{record.id}{len(record.text)}:{record.text}".encode("utf-8", "surrogatepass")
        )
    return f"memory:inline:{digest.hexdigest()[:16]}"


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

    class Config(BaseModel):
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
        self.batch_tokens = None if latency_ms else FREE_BATCH_TOKENS  # a free model takes whole shards
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


class MemorySink:
    """Targets as dicts and aliases as a dict in a MemoryStore; the same contract as the real sinks.

    `reject_nul` refuses a batch holding a NUL character in a text or a payload string, writing none of
    it, as pgvector does (SQLSTATE 22021): the core must isolate and dead-letter the poison rows.
    """

    holds_writers = False  # its settle runs before the lock; no application writes through it anyway

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        kind: Literal["memory"]
        alias: str
        name: str | None = None
        store: str | None = None  # a named, process-wide store shared with other adapters and commands
        reject_nul: bool = False

    def __init__(self, store: MemoryStore | None = None, *, reject_nul: bool = False) -> None:
        self.state = store if store is not None else MemoryStore()
        self.targets_: dict[str, dict[str, Stored]] = self.state.targets
        self.specs: dict[str, TargetSpec] = self.state.specs
        self.aliases: dict[str, tuple[str, Mapping[str, Any]]] = self.state.aliases
        self.reject_nul = reject_nul
        self.writes = 0

    @classmethod
    def from_config(cls, config: Config) -> MemorySink:
        shared = store(config.store) if config.store is not None else None
        return cls(shared, reject_nul=config.reject_nul)

    def identity(self) -> str:
        return f"memory:{self.state.name}" if self.state.name else f"memory:{id(self.state):x}"

    def prepare(self, spec: TargetSpec) -> None:
        with self.state.lock:
            existing = self.specs.get(spec.name)
            if existing and (existing.fingerprint, existing.dim) != (spec.fingerprint, spec.dim):
                raise ConfigError(
                    f"target {spec.name!r} holds fingerprint {existing.fingerprint}",
                    hint="choose another [target] name",
                )
            self.specs.setdefault(spec.name, spec)  # never re-stamps plan_id and nonce
            self.targets_.setdefault(spec.name, {})

    def write(self, target: str, rows: Rows) -> None:
        """Upsert by id; with `reject_nul`, a batch holding a NUL is refused whole (nothing written)."""
        self.writes += 1
        fails = self.state.write_fails()
        if fails is False:
            raise BackendError("injected write failure (MemoryStore.fail_write)")
        if self.reject_nul:
            for record in rows.records:
                if _holds_nul(record.text) or _holds_nul(record.payload):
                    raise RowsRejected(
                        f"document {record.id!r}: invalid byte sequence for encoding UTF8: 0x00",
                        reason="sink_rejected:22021",
                    )
        with self.state.lock:
            stored = self.targets_[target]
            for record, vector, digest in zip(rows.records, rows.vectors, rows.content_hashes, strict=True):
                stored[record.id] = (record, vector.copy(), digest, rows.fingerprint)
        if fails:
            raise BackendError("injected failure after the write landed (MemoryStore.fail_write)")

    def delete(self, target: str, ids: Sequence[str]) -> None:
        with self.state.lock:
            for doc_id in ids:
                self.targets_[target].pop(doc_id, None)

    def finalize(self, spec: TargetSpec) -> None:
        pass

    def describe(self, target: str) -> TargetInfo | None:
        with self.state.lock:
            if target not in self.targets_:
                return None
            spec = self.specs[target]
            return TargetInfo(
                target,
                len(self.targets_[target]),
                spec.dim,
                spec.fingerprint,
                spec.model,
                plan_id=spec.plan_id or None,
                nonce=spec.nonce or None,
            )

    def scan_index(self, target: str, dim: int) -> Iterator[IndexEntry]:
        with self.state.lock:
            entries = list(self.targets_[target].items())
        for doc_id, (_, vector, digest, fp) in entries:
            yield IndexEntry(doc_id, digest, fp, vector_problem(vector, dim))

    def fetch(self, target: str, ids: Sequence[str]) -> dict[str, Vectors]:
        with self.state.lock:
            stored = self.targets_[target]
            return {i: stored[i][1] for i in ids if i in stored}

    def fetch_matching(self, target: str, expected: Mapping[str, str]) -> dict[str, Vectors]:
        """Only ids whose stored content hash is the expected one: a copy never takes a stale vector."""
        with self.state.lock:
            stored = self.targets_[target]
            return {i: stored[i][1] for i, h in expected.items() if i in stored and stored[i][2] == h}

    def scan_vectors(self, target: str, batch: int = 5000) -> Iterator[tuple[list[str], Vectors]]:
        with self.state.lock:
            entries = [(doc_id, vector) for doc_id, (_, vector, _, _) in self.targets_[target].items()]
        for start in range(0, len(entries), batch):
            part = entries[start : start + batch]
            yield [doc_id for doc_id, _ in part], np.stack([v for _, v in part]).astype(np.float32)

    def search(self, target: str, vectors: Vectors, k: int) -> list[list[str]]:
        """Exact: the memory sink has no ANN index."""
        from reindex.vectors import exact_neighbours

        found = exact_neighbours(
            self.scan_vectors(target), vectors, [None] * len(vectors), k, self.distance(target)
        )
        return [ids for ids, _ in found]

    def distance(self, target: str) -> Distance:
        with self.state.lock:
            return self.specs[target].source.distance

    def alias(self, alias: str) -> AliasInfo:
        with self.state.lock:
            if alias not in self.aliases:
                return AliasInfo(alias, None)
            target, meta = self.aliases[alias]
        return AliasInfo(alias, target, fingerprint=meta.get("fingerprint"), model=meta.get("model"))

    def move_alias(
        self,
        alias: str,
        target: str,
        *,
        expected: str | None,
        meta: Mapping[str, Any],
        settle: Callable[[], None] | None = None,
    ) -> str | None:
        if settle is not None:
            settle()
        with self.state.lock:  # compare-and-swap: the check and the move are one step
            current = self.aliases.get(alias, (None, {}))[0]
            if current != expected:
                raise CutoverRefused(f"alias {alias!r} points to {current!r}, expected {expected!r}")
            if target not in self.targets_:
                raise CutoverRefused(f"target {target!r} does not exist")
            self.aliases[alias] = (target, dict(meta))
            return current

    def targets(self, alias: str) -> list[str]:
        with self.state.lock:
            return [name for name in self.targets_ if name.startswith(f"{alias}__")]

    def drop(self, target: str) -> None:
        with self.state.lock:
            self.targets_.pop(target, None)
            self.specs.pop(target, None)

    def close(self) -> None:
        pass


class BatchProvider:
    """A provider account's side of the batch API: jobs, files released, and what it billed and lost.

    Kept on a named MemoryStore (`store.provider`), so it outlives the embedder each command builds, as a
    real provider outlives the process. `script` sets a transient fault for the jobs created from now on.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.jobs: dict[str, ProviderJob] = {}
        self.created: dict[str, int] = {}  # jobs created per key: more than 1 is a double cost
        self.released: set[str] = set()
        self.billed_tokens = 0
        self.lost_tokens = 0  # billed for lines the provider ran but never delivered
        self.bills: list[Bill] = []  # one per billed line
        self.expire_after: int | None = None
        self.bill_expired = False

    def script(self, *, expire_after: int | None = None, bill_expired: bool = False) -> None:
        """Jobs created from now on expire after `expire_after` lines (None: they complete); with
        `bill_expired` the expired lines ran and are billed, but their output is lost."""
        with self.lock:
            self.expire_after, self.bill_expired = expire_after, bill_expired


@dataclass(frozen=True)
class Bill:
    """One line a provider billed: under which fingerprint, its text and tokens, and whether it was lost."""

    fingerprint: str
    text: str
    tokens: int
    lost: bool


class ProviderJob:
    """One batch on the provider: its key, its lines, how often it was polled, its fault and its result."""

    def __init__(
        self,
        key: str,
        fingerprint: str,
        lines: list[tuple[str, str, int]],
        expire_after: int | None,
        bill_expired: bool,
    ) -> None:
        self.key, self.fingerprint, self.lines = key, fingerprint, lines  # (custom_id, text, tokens)
        self.expire_after, self.bill_expired = expire_after, bill_expired
        self.polls = 0
        self.billed = False


class MemoryBatchEmbedder:
    """A provider batch API in memory: jobs advance one state per poll, vectors come from HashEmbedder.

    Scriptable like the real service: `expire_after` lines complete before a job expires (decided when
    it is polled), texts containing `reject` fail with `invalid_request`. `created` counts jobs per key
    (no double cost). A job bills its delivered lines once, when it first turns terminal, however often it is polled.
    With `store = "<name>"` the provider's state (jobs, bills) lives on that named store, shared by
    every command, and `store(name).provider.script(...)` injects expiry faults into later jobs.
    """

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        kind: Literal["memory-batch"]
        dim: int = 32
        max_tokens: int = 512
        seed: str = ""  # vectors and fingerprint are the `hash` embedder's with this seed
        price_per_million: float = 0.01
        polls_to_finish: int = Field(2, ge=1)
        reject: str | None = None  # texts containing this fail with invalid_request
        store: str | None = None  # a named, process-wide store holding the provider's state

    def __init__(
        self,
        dim: int = 32,
        *,
        max_tokens: int = 512,
        seed: str = "",
        expire_after: int | None = None,
        reject: str | None = None,
        polls_to_finish: int = 2,
        price_per_million: float | None = 0.01,
        provider: BatchProvider | None = None,
    ) -> None:
        self.inline = HashEmbedder(dim, max_tokens, seed)
        self.info = replace(self.inline.info, kind="memory-batch")
        self.expire_after, self.reject, self.polls_to_finish = expire_after, reject, polls_to_finish
        self.price_per_million = price_per_million
        self.provider = provider if provider is not None else BatchProvider()
        self.jobs = self.provider.jobs
        self.created = self.provider.created
        self.released = self.provider.released

    @classmethod
    def from_config(cls, config: Config) -> MemoryBatchEmbedder:
        provider = store(config.store).provider if config.store is not None else None
        return cls(
            config.dim,
            max_tokens=config.max_tokens,
            seed=config.seed,
            reject=config.reject,
            polls_to_finish=config.polls_to_finish,
            price_per_million=config.price_per_million,
            provider=provider,
        )

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        return self.inline.tokenize(texts)

    def submit(self, key: str, items: Sequence[JobItem], *, isolate: bool = False) -> str:
        provider = self.provider
        with provider.lock:
            for job_id, job in provider.jobs.items():
                if job.key == key:
                    return job_id
            job_id = f"batch_{len(provider.jobs)}"
            lines = [(item.custom_id, str(item.tokens.data), item.tokens.count) for item in items]
            fingerprint, expire_after = self.info.fingerprint, provider.expire_after
            provider.jobs[job_id] = ProviderJob(key, fingerprint, lines, expire_after, provider.bill_expired)
            provider.created[key] = provider.created.get(key, 0) + 1
            return job_id

    def poll(self, job_id: str) -> JobResult:
        provider = self.provider
        with provider.lock:
            job = provider.jobs[job_id]
            job.polls += 1
            if job.polls < self.polls_to_finish:
                return JobResult("in_progress", is_terminal=False)
            expire_after = self.expire_after if self.expire_after is not None else job.expire_after
            ran = job.lines if expire_after is None else job.lines[:expire_after]
            vectors: dict[str, Vectors] = {}
            failed: dict[str, str] = {}
            billed, lost, bills = 0, 0, []
            done = [text for _, text, _ in ran if not (self.reject and self.reject in text)]
            computed = iter(self.inline.vectors(done) if done else ())  # in the order of the lines below
            for index, (custom_id, text, tokens) in enumerate(job.lines):
                if self.reject and self.reject in text:
                    failed[custom_id] = "invalid_request"
                elif index < len(ran):
                    vectors[custom_id] = next(computed)
                    billed += tokens
                    bills.append(Bill(job.fingerprint, text, tokens, lost=False))
                else:
                    failed[custom_id] = "batch_expired"
                    if job.bill_expired:
                        lost += tokens
                        bills.append(Bill(job.fingerprint, text, tokens, lost=True))
            if not job.billed:
                job.billed = True
                provider.billed_tokens += billed + lost
                provider.lost_tokens += lost
                provider.bills += bills
            status = "completed" if expire_after is None else "expired"
            return JobResult(status, True, vectors=vectors, failed=failed, billed_tokens=billed + lost)

    def release(self, job_id: str) -> None:
        with self.provider.lock:
            self.provider.released.add(job_id)
