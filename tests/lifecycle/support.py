"""A world for lifecycle tests: one named memory store, TOML configs in a folder, a SQLite ledger, and the
oracle: what a fresh migration of the current source computes, derived from the spec, not from the core.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings

from reindex import commands
from reindex.config import Config, load
from reindex.fingerprint import content_hash, target_name
from reindex.ports import Record, Vectors
from reindex.run.migration import open_backends
from reindex_adapters.testing import memory
from reindex_adapters.testing.memory import HashEmbedder, MemoryStore

SOAK = max(1, int(os.environ.get("REINDEX_SOAK", "1")))  # multiplies every machine's examples: a long soak
ALIAS = "docs"
DIM = 8
MAX_TOKENS = 4
NUL_REASON = "sink_rejected:22021"
REJECT_REASON = "provider_rejected:invalid_request"
_worlds = itertools.count()


@dataclass
class Knobs:
    """Settings that must not matter: changing them keeps the migration (plan id) and its progress."""

    shard_size: int = 3
    sort_window: int = 4
    queue_depth: int = 2
    max_batch: int = 4
    batch_tokens: int | None = None


@dataclass(frozen=True)
class Expected:
    """A fresh migration of the source as it is now: the vector of every written id, and the dead ones."""

    vectors: dict[str, Vectors]
    hashes: dict[str, str]
    dead: dict[str, str]  # id -> reason
    documents: int  # source records, duplicates included


class JsonlDocs(MemoryStore):
    """Source documents kept as a JSONL file, rewritten in id order after every edit (as an export job
    would): the model edits it like a MemoryStore, the tool reads only the file."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._dump()

    def _dump(self) -> None:
        lines = [json.dumps({"id": r.id, "text": r.text}) + "\n" for r in self.records()]
        self.path.write_text("".join(lines))

    def put(self, doc_id: str, text: str, **fields: Any) -> None:
        super().put(doc_id, text)
        self._dump()

    def append(self, doc_id: str, text: str, **fields: Any) -> None:
        super().append(doc_id, text)
        self._dump()

    def edit(self, doc_id: str, text: str) -> None:
        super().edit(doc_id, text)
        self._dump()

    def delete(self, doc_id: str) -> None:
        super().delete(doc_id)
        self._dump()


@dataclass
class World:
    """One example's world. Every command reopens its adapters from the TOML files written here.

    `backend`: "memory" (source and sink on the named store), or a JSONL source with a "pgvector" sink
    (`dsn`; it refuses NUL) or a local "qdrant" sink (it stores NUL). The provider state of `memory-batch`
    always lives on the named store. Targets and the alias are read back through the sink port."""

    too_long: str = "truncate"
    reject_nul: bool = True
    # or "memory-batch": the deferred path, provider state on the named store; or "paced": the hash vectors
    # computed in a model process the workers of the processes engine feed
    embedder_kind: str = "hash"
    reject: str | None = None  # memory-batch: the provider refuses texts holding this (invalid_request)
    polls_to_finish: int = 2
    max_dead_letters: int | float = 1.0
    knobs: dict[str, Knobs] = field(default_factory=dict)
    backend: str = "memory"
    dsn: str | None = None
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="reindex-lifecycle-")))
    store_name: str = field(default_factory=lambda: f"lifecycle-{next(_worlds)}")
    _docs: JsonlDocs | None = None

    def __post_init__(self) -> None:
        if self.backend != "memory":
            self._docs = JsonlDocs(self.root / "docs.jsonl")
            self.reject_nul = self.backend == "pgvector"

    @property
    def alias(self) -> str:
        return ALIAS if self.backend == "memory" else f"{ALIAS}_{self.store_name.rsplit('-', 1)[1]}"

    @property
    def store(self) -> MemoryStore:
        """The named store: the memory backends, and the memory-batch provider's state."""
        return memory.store(self.store_name)

    @property
    def docs(self) -> MemoryStore:
        """The source documents, edited between commands."""
        return self._docs if self._docs is not None else self.store

    def config(self, seed: str = "A", **run: Any) -> Config:
        """Write `<seed>.toml` (embedder `hash` with this seed) with the current knobs, and load it."""
        knobs = {k: v for k, v in asdict(self.knobs.setdefault(seed, Knobs())).items() if v is not None}
        embedder: dict[str, Any] = {"kind": "hash", "dim": DIM, "max_tokens": MAX_TOKENS, "seed": seed}
        if self.embedder_kind == "paced":  # the hash vectors, from a model process (reindex.run.processes)
            embedder |= {"kind": "paced", "rate": 10_000_000.0, "batch_tokens": 64}
        if self.embedder_kind == "memory-batch":
            embedder |= {
                "kind": "memory-batch",
                "store": self.store_name,
                "reject": self.reject,
                "polls_to_finish": self.polls_to_finish,
            }
            knobs |= {"poll_seconds": 0.001, "poll_max_seconds": 0.002}
        source: dict[str, Any] = {"kind": "memory", "store": self.store_name}
        target: dict[str, Any] = {
            "kind": "memory",
            "store": self.store_name,
            "alias": ALIAS,
            "reject_nul": self.reject_nul,
        }
        if self.backend != "memory":
            source = {"kind": "jsonl", "path": str(self.root / "docs.jsonl")}
        if self.backend == "pgvector":
            target = {"kind": "pgvector", "dsn": self.dsn, "alias": self.alias, "index": "none"}
        elif self.backend == "qdrant":
            target = {"kind": "qdrant", "path": str(self.root / "qdrant"), "alias": self.alias}
        sections: dict[str, dict[str, Any]] = {
            "source": source,
            "embedder": embedder,
            "target": target,
            "run": {
                "state": str(self.root / "state.db"),
                "too_long": self.too_long,
                "max_dead_letters": self.max_dead_letters,
                **knobs,
                **run,
            },
        }
        path = self.root / f"{seed}{'-variant' if run else ''}.toml"
        path.write_text(toml(sections))
        return load(path)

    def embedder(self, seed: str) -> HashEmbedder:
        return HashEmbedder(DIM, MAX_TOKENS, seed)

    def target(self, seed: str) -> str:
        return target_name(self.alias, self.embedder(seed).info.fingerprint)

    def served(self) -> Served:
        """What the sink holds now, read through its port: the alias, and every target of the alias."""
        with open_backends(self.config("A")) as (_, sink):
            live = sink.alias(self.alias)
            targets: dict[str, Target] = {}
            for name in sink.targets(self.alias):
                info = sink.describe(name)
                if info is None:
                    continue
                entries = {e.id: e for e in sink.scan_index(name, DIM)}
                vectors = sink.fetch(name, sorted(entries))
                stored = {i: (vectors[i], e.content_hash, e.fingerprint) for i, e in entries.items()}
                targets[name] = Target(info.fingerprint, stored)
        return Served(live.target, live.fingerprint, targets)

    @property
    def targets(self) -> set[str]:
        with open_backends(self.config("A")) as (_, sink):
            return {name for name in sink.targets(self.alias) if sink.describe(name) is not None}

    def live(self) -> str | None:
        """The target the alias serves."""
        with open_backends(self.config("A")) as (_, sink):
            return sink.alias(self.alias).target

    def expected(self, seed: str) -> Expected:
        return fresh_migration(
            self.docs.records(),
            self.embedder(seed),
            too_long=self.too_long,
            reject_nul=self.reject_nul,
            reject=self.reject if self.embedder_kind == "memory-batch" else None,
        )

    def ceiling(self, documents: int, limit: int | float | None = None) -> int:
        limit = self.max_dead_letters if limit is None else limit
        return limit if isinstance(limit, int) else int(limit * documents)

    def served_problems(self, seed: str) -> list[str]:
        """How the target of `seed` differs from a fresh migration of the current source (empty: exact)."""
        served = self.served()
        return served_problems(served, self.target(seed), self.expected(seed), self.embedder(seed))

    def reconciled(self, config: Config) -> None:
        status = commands.status(config)
        assert status.reconciled, f"ledger does not reconcile: {status.to_json()}"

    def close(self) -> None:
        memory.forget_store(self.store_name)
        shutil.rmtree(self.root, ignore_errors=True)


def toml(sections: dict[str, dict[str, Any]]) -> str:
    """Flat TOML: JSON scalars are valid TOML scalars (strings, integers, floats, booleans)."""
    lines = []
    for name, values in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items() if value is not None]
    return "\n".join(lines) + "\n"


def fresh_migration(
    records: Sequence[Record],
    embedder: HashEmbedder,
    *,
    too_long: str,
    reject_nul: bool,
    reject: str | None = None,
) -> Expected:
    """The spec, applied to every document id once: one id with two different texts → dead (both
    records); blank → dead; over `max_tokens` words → dead or truncated by policy; a (truncated) text
    the provider refuses → dead; a NUL → refused by a sink that refuses it; otherwise the embedder's
    vector of the (truncated) text."""
    texts: dict[str, list[str]] = defaultdict(list)
    for record in records:
        texts[record.id].append(record.text)
    limit = embedder.info.max_tokens
    vectors: dict[str, Vectors] = {}
    hashes: dict[str, str] = {}
    dead: dict[str, str] = {}
    for doc_id, versions in texts.items():
        text = versions[0]
        words = text.split()
        if len(set(versions)) > 1:
            dead[doc_id] = "duplicate_id_conflict"
        elif not text.strip():
            dead[doc_id] = "empty_text"
        elif len(words) > limit and too_long == "dead-letter":
            dead[doc_id] = "too_long"
        elif reject and reject in " ".join(words[:limit]):
            dead[doc_id] = REJECT_REASON
        elif reject_nul and "\x00" in text:
            dead[doc_id] = NUL_REASON
        else:
            vectors[doc_id] = embedder.vector(" ".join(words[:limit]))
            hashes[doc_id] = content_hash(text)
    return Expected(vectors, hashes, dead, len(records))


@dataclass(frozen=True)
class Target:
    fingerprint: str | None
    stored: dict[str, tuple[Any, str | None, str | None]]  # id -> vector, content hash, fingerprint


@dataclass(frozen=True)
class Served:
    live: str | None  # the target behind the alias
    fingerprint: str | None  # the alias's own fingerprint
    targets: dict[str, Target]


def served_problems(served: Served, target: str, expected: Expected, embedder: HashEmbedder) -> list[str]:
    """Compare a target with the oracle id by id: presence, vector, content hash, fingerprint."""
    if target not in served.targets:
        return [f"target {target!r} does not exist"]
    stored = served.targets[target].stored
    problems = [f"{i}: missing (expected a vector)" for i in sorted(set(expected.vectors) - set(stored))]
    for doc_id in sorted(set(stored) - set(expected.vectors)):
        why = expected.dead.get(doc_id, "not in the source")
        problems.append(f"{doc_id}: has a vector but a fresh migration gives none ({why})")
    for doc_id in sorted(set(stored) & set(expected.vectors)):
        vector, digest, fingerprint = stored[doc_id]
        if not np.allclose(vector, expected.vectors[doc_id], atol=1e-6):
            problems.append(f"{doc_id}: holds a vector that is not its current text's")
        if digest != expected.hashes[doc_id]:
            problems.append(f"{doc_id}: content hash {digest} is not its current text's")
        if fingerprint != embedder.info.fingerprint:
            problems.append(f"{doc_id}: fingerprint {fingerprint} is not {embedder.info.fingerprint}")
    return problems


def machine_settings(examples: int, steps: int) -> settings:
    """A state machine's budget: `examples` histories of up to `steps` steps, times REINDEX_SOAK."""
    return settings(
        max_examples=examples * SOAK,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
