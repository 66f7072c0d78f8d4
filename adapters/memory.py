"""In-memory source, sink and a deterministic embedder: the shipped fakes for tests and demo mode."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from reindex.errors import ConfigError, CutoverRefused
from reindex.fingerprint import fingerprint
from reindex.ports import (
    AliasInfo,
    EmbedderInfo,
    IndexEntry,
    Record,
    Rows,
    SourceSchema,
    TargetInfo,
    TargetSpec,
    Tokens,
    Vectors,
)
from reindex.vectors import vector_problem


class MemorySource:
    """Records held in a list; the cursor is the position, as for files."""

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        kind: Literal["memory"]
        documents: list[dict[str, Any]] = []

    def __init__(self, records: Sequence[Record]) -> None:
        self.records = list(records)

    @classmethod
    def from_config(cls, config: Config) -> MemorySource:
        return cls([Record(str(d["id"]), str(d["text"]), d) for d in config.documents])

    def schema(self) -> SourceSchema:
        return SourceSchema(id_field="id", text_field="text")

    def count(self) -> int | None:
        return len(self.records)

    def scan(self, after: str | None = None) -> Iterator[Record]:
        start = 0 if after is None else int(after) + 1
        for position in range(start, len(self.records)):
            record = self.records[position]
            yield Record(record.id, record.text, record.payload, cursor=str(position), defect=record.defect)

    def fetch(self, ids: Sequence[str]) -> Iterator[Record]:
        wanted = set(ids)
        return (r for r in self.scan() if r.id in wanted)

    def close(self) -> None:
        pass


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
    """Targets as dicts and aliases as a dict; the same contract as the real sinks."""

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        kind: Literal["memory"]
        alias: str
        name: str | None = None

    def __init__(self) -> None:
        self.targets_: dict[str, dict[str, tuple[Record, Vectors, str, str]]] = {}
        self.specs: dict[str, TargetSpec] = {}
        self.aliases: dict[str, tuple[str, Mapping[str, Any]]] = {}
        self.writes = 0

    @classmethod
    def from_config(cls, config: Config) -> MemorySink:
        return cls()

    def prepare(self, spec: TargetSpec) -> None:
        existing = self.specs.get(spec.name)
        if existing and (existing.fingerprint, existing.dim) != (spec.fingerprint, spec.dim):
            raise ConfigError(
                f"target {spec.name!r} holds fingerprint {existing.fingerprint}",
                hint="choose another [target] name",
            )
        self.specs.setdefault(spec.name, spec)
        self.targets_.setdefault(spec.name, {})

    def write(self, target: str, rows: Rows) -> None:
        self.writes += 1
        stored = self.targets_[target]
        for record, vector, digest in zip(rows.records, rows.vectors, rows.content_hashes, strict=True):
            stored[record.id] = (record, vector.copy(), digest, rows.fingerprint)

    def delete(self, target: str, ids: Sequence[str]) -> None:
        for doc_id in ids:
            self.targets_[target].pop(doc_id, None)

    def finalize(self, spec: TargetSpec) -> None:
        pass

    def describe(self, target: str) -> TargetInfo | None:
        if target not in self.targets_:
            return None
        spec = self.specs[target]
        return TargetInfo(target, len(self.targets_[target]), spec.dim, spec.fingerprint, spec.model)

    def scan_index(self, target: str, dim: int) -> Iterator[IndexEntry]:
        for doc_id, (_, vector, digest, fp) in list(self.targets_[target].items()):
            yield IndexEntry(doc_id, digest, fp, vector_problem(vector, dim))

    def fetch(self, target: str, ids: Sequence[str]) -> dict[str, Vectors]:
        stored = self.targets_[target]
        return {i: stored[i][1] for i in ids if i in stored}

    def alias(self, alias: str) -> AliasInfo:
        if alias not in self.aliases:
            return AliasInfo(alias, None)
        target, meta = self.aliases[alias]
        return AliasInfo(alias, target, fingerprint=meta.get("fingerprint"), model=meta.get("model"))

    def move_alias(
        self, alias: str, target: str, *, expected: str | None, meta: Mapping[str, Any]
    ) -> str | None:
        current = self.aliases.get(alias, (None, {}))[0]
        if current != expected:
            raise CutoverRefused(f"alias {alias!r} points to {current!r}, expected {expected!r}")
        if target not in self.targets_:
            raise CutoverRefused(f"target {target!r} does not exist")
        self.aliases[alias] = (target, dict(meta))
        return current

    def targets(self, alias: str) -> list[str]:
        return [name for name in self.targets_ if name.startswith(f"{alias}__")]

    def drop(self, target: str) -> None:
        self.targets_.pop(target, None)
        self.specs.pop(target, None)

    def close(self) -> None:
        pass


class MemoryBatchEmbedder:
    """A provider batch API in memory: jobs advance one state per poll, vectors come from HashEmbedder.

    Scriptable like the real service: `expire_after` lines complete before a job expires, texts
    containing `reject` fail with `invalid_request`. `created` counts jobs per key (no double cost).
    """

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        kind: Literal["memory-batch"]
        dim: int = 32
        price_per_million: float = 0.01

    def __init__(
        self,
        dim: int = 32,
        *,
        expire_after: int | None = None,
        reject: str | None = None,
        polls_to_finish: int = 2,
        price_per_million: float | None = 0.01,
    ) -> None:
        self.inline = HashEmbedder(dim)
        self.info = EmbedderInfo(
            kind="memory-batch",
            model="sha256",
            dim=dim,
            max_tokens=512,
            fingerprint=self.inline.info.fingerprint,
            options={},
        )
        self.expire_after, self.reject, self.polls_to_finish = expire_after, reject, polls_to_finish
        self.price_per_million = price_per_million
        self.jobs: dict[str, tuple[str, list[tuple[str, str]], int]] = {}  # id -> key, lines, polls
        self.created: dict[str, int] = {}
        self.released: set[str] = set()

    @classmethod
    def from_config(cls, config: Config) -> MemoryBatchEmbedder:
        return cls(config.dim, price_per_million=config.price_per_million)

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        return self.inline.tokenize(texts)

    def submit(self, key: str, items: Sequence[Any], *, isolate: bool = False) -> str:
        for job_id, (existing, _, _) in self.jobs.items():
            if existing == key:
                return job_id
        job_id = f"batch_{len(self.jobs)}"
        self.jobs[job_id] = (key, [(item.custom_id, str(item.tokens.data)) for item in items], 0)
        self.created[key] = self.created.get(key, 0) + 1
        return job_id

    def poll(self, job_id: str) -> Any:
        from reindex.ports import JobResult

        key, lines, polls = self.jobs[job_id]
        self.jobs[job_id] = (key, lines, polls + 1)
        if polls + 1 < self.polls_to_finish:
            return JobResult("in_progress", is_terminal=False)
        done = lines if self.expire_after is None else lines[: self.expire_after]
        vectors, failed = {}, {}
        for custom_id, text in lines:
            if self.reject and self.reject in text:
                failed[custom_id] = "invalid_request"
            elif (custom_id, text) in done:
                vectors[custom_id] = self.inline.vector(text)
            else:
                failed[custom_id] = "batch_expired"
        billed = sum(len(text.split()) for cid, text in lines if cid in vectors)
        status = "completed" if self.expire_after is None else "expired"
        return JobResult(status, is_terminal=True, vectors=vectors, failed=failed, billed_tokens=billed)

    def release(self, job_id: str) -> None:
        self.released.add(job_id)
