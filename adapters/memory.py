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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from reindex.errors import BackendError, ConfigError, CutoverRefused, RowsRejected
from reindex.fingerprint import fingerprint
from reindex.ports import (
    AliasInfo,
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
    """Vectors derived from SHAKE-256 of the text: deterministic, nearly free, and wrong for retrieval."""

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        kind: Literal["hash"]
        dim: int = 32
        max_tokens: int = 512
        seed: str = ""
        latency_ms: float = 0.0  # per batch: behaves like a slow model (demos, interruption tests)

    def __init__(self, dim: int = 32, max_tokens: int = 512, seed: str = "", latency_ms: float = 0.0) -> None:
        options = {"seed": seed}
        self.seed = seed.encode()
        self.latency = latency_ms / 1000
        self.info = EmbedderInfo(
            kind="hash",
            model="shake256",
            dim=dim,
            max_tokens=max_tokens,
            fingerprint=fingerprint("hash", "shake256", dim, options),
            options=options,
        )

    @classmethod
    def from_config(cls, config: Config) -> HashEmbedder:
        return cls(config.dim, config.max_tokens, config.seed, config.latency_ms)

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        items = []
        for text in texts:
            words = text.split()
            kept = words[: self.info.max_tokens]
            items.append(Tokens(count=len(kept), original_count=len(words), data=" ".join(kept)))
        return items

    def embed(self, items: Sequence[Tokens]) -> Vectors:
        if self.latency:
            time.sleep(self.latency)
        return self._vectors([str(item.data) for item in items])

    def vector(self, text: str) -> Vectors:
        vector: Vectors = self._vectors([text])[0]
        return vector

    def _vectors(self, texts: Sequence[str]) -> Vectors:
        digests = b"".join(
            hashlib.shake_256(self.seed + t.encode("utf-8", "surrogatepass")).digest(self.info.dim)
            for t in texts
        )
        raw = (
            np.frombuffer(digests, dtype=np.uint8).reshape(len(texts), self.info.dim).astype(np.float32)
            - 127.5
        )
        normalized: Vectors = raw / np.linalg.norm(raw, axis=1, keepdims=True)
        return normalized


class MemorySink:
    """Targets as dicts and aliases as a dict in a MemoryStore; the same contract as the real sinks.

    `reject_nul` refuses a batch holding a NUL character in a text or a payload string, writing none of
    it, as pgvector does (SQLSTATE 22021): the core must isolate and dead-letter the poison rows.
    """

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

    def alias(self, alias: str) -> AliasInfo:
        with self.state.lock:
            if alias not in self.aliases:
                return AliasInfo(alias, None)
            target, meta = self.aliases[alias]
        return AliasInfo(alias, target, fingerprint=meta.get("fingerprint"), model=meta.get("model"))

    def move_alias(
        self, alias: str, target: str, *, expected: str | None, meta: Mapping[str, Any]
    ) -> str | None:
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
            vectors, failed = {}, {}
            billed, lost, bills = 0, 0, []
            for index, (custom_id, text, tokens) in enumerate(job.lines):
                if self.reject and self.reject in text:
                    failed[custom_id] = "invalid_request"
                elif index < len(ran):
                    vectors[custom_id] = self.inline.vector(text)
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
