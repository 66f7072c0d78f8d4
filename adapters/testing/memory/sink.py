"""MemorySink: targets and aliases in a MemoryStore, with the real sinks' contract (and pgvector's NUL refusal)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

import numpy as np
from pydantic import ConfigDict

from reindex.errors import BackendError, ConfigError, CutoverRefused, RowsRejected
from reindex.ports import (
    AliasInfo,
    Distance,
    IndexEntry,
    Rows,
    TargetInfo,
    TargetSection,
    TargetSpec,
    Vectors,
)
from reindex.vectors import vector_problem
from reindex_adapters.testing.memory.stores import MemoryStore, Stored, store


class MemorySink:
    """Targets as dicts and aliases as a dict in a MemoryStore; the same contract as the real sinks.

    `reject_nul` refuses a batch holding a NUL character in a text or a payload string, writing none of
    it, as pgvector does (SQLSTATE 22021): the core must isolate and dead-letter the poison rows.
    """

    holds_writers = False  # its settle runs before the lock; no application writes through it anyway
    shareable = False  # its store lives in this process

    class Config(TargetSection):
        model_config = ConfigDict(extra="forbid", frozen=True)
        kind: Literal["memory"]
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

    def scratch(self, spec: TargetSpec, token: str) -> TargetSpec | None:
        return replace(spec, name=f"reindex_rehearsal_{token}")

    def scratches(self) -> list[str]:
        return sorted(name for name in self.targets_ if name.startswith("reindex_rehearsal_"))

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


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(_holds_nul(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_holds_nul(v) for v in value)
    return False
