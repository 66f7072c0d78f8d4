"""SqliteSink: each target a table `<alias>__<fingerprint8>` of one SQLite file, the alias a VIEW over the
target it serves, moved in one `BEGIN IMMEDIATE` transaction. Search is exact (numpy); there is no ANN index.

Bookkeeping lives in two tables of the same file: `reindex_targets` (what `prepare` recorded on each target:
alias, dim, fingerprint, model, distance, plan id, nonce) and `reindex_aliases` (the target each alias view
serves and the meta its move recorded). A view and its row change in the same transaction.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from reindex.errors import BackendError, ConfigError, CutoverRefused
from reindex.offers import TargetOffer
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
from reindex.vectors import exact_neighbours, vector_problem
from reindex_adapters.testing.sqlite import offers
from reindex_adapters.testing.sqlite.connection import errors, open_writable, quote

_CHUNK = 500  # ids bound in one `IN (...)`
_SCRATCH = "reindex_rehearsal_"
_BOOKKEEPING = (
    "CREATE TABLE IF NOT EXISTS reindex_targets (name TEXT PRIMARY KEY, alias TEXT NOT NULL, dim INTEGER NOT NULL,"
    " fingerprint TEXT NOT NULL, model TEXT NOT NULL, distance TEXT NOT NULL, plan_id TEXT, nonce TEXT,"
    " created INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS reindex_aliases (alias TEXT PRIMARY KEY, target TEXT NOT NULL, meta TEXT NOT NULL)",
)


class SqliteSink:
    """Targets as tables (id, vector as float32 bytes, content hash, fingerprint, text, payload as JSON) and
    aliases as views (`SELECT id, vector, text, payload FROM <target>`), in one SQLite file."""

    holds_writers = False  # nothing holds an application's writes back while `settle` runs
    shareable = False  # one process writes: SQLite takes one writer at a time, and the run stays in one
    offer: ClassVar[TargetOffer] = offers.TARGET

    class Config(TargetSection):  # kind, alias and name, as every [target] has them
        PATHS: ClassVar[tuple[str, ...]] = ("path",)  # relative to the config file (reindex.config.anchor)
        kind: Literal["sqlite"]
        path: Path

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path).absolute() if str(path) != ":memory:" else Path(":memory:")
        self._conn = open_writable(self.path) if str(path) != ":memory:" else _in_memory()
        self._lock = threading.RLock()
        with self._lock, errors("create the bookkeeping tables"):
            for statement in _BOOKKEEPING:
                self._conn.execute(statement)

    @classmethod
    def from_config(cls, config: Config) -> SqliteSink:
        return cls(config.path)

    def identity(self) -> str:
        return f"sqlite:{self.path}"

    # targets -------------------------------------------------------------------------------------------

    def prepare(self, spec: TargetSpec) -> None:
        with self._lock, errors(f"prepare {spec.name}"), self._transaction():
            row = self._conn.execute(
                "SELECT fingerprint, dim FROM reindex_targets WHERE name = ?", (spec.name,)
            ).fetchone()
            if row is not None:
                if (row[0], row[1]) != (spec.fingerprint, spec.dim):
                    raise ConfigError(
                        f"target {spec.name!r} holds fingerprint {row[0]} ({row[1]} dimensions)",
                        hint="choose another [target] name",
                    )
                return  # never re-stamps plan_id and nonce
            if self._kind_of(spec.name) is not None:
                raise ConfigError(
                    f"{spec.name!r} already exists in {self.path} and was not built by reindex",
                    hint="choose another [target] name",
                )
            self._conn.execute(
                f"CREATE TABLE {quote(spec.name)} (id TEXT PRIMARY KEY, vector BLOB NOT NULL,"
                " content_hash TEXT, fingerprint TEXT, text TEXT, payload TEXT)"
            )
            self._conn.execute(
                "INSERT INTO reindex_targets VALUES (?, ?, ?, ?, ?, ?, ?, ?,"
                " (SELECT coalesce(max(created), 0) + 1 FROM reindex_targets))",
                (
                    spec.name,
                    spec.alias,
                    spec.dim,
                    spec.fingerprint,
                    json.dumps(dict(spec.model), default=str),
                    spec.source.distance,
                    spec.plan_id,
                    spec.nonce,
                ),
            )

    def scratch(self, spec: TargetSpec, token: str) -> TargetSpec | None:
        return replace(spec, name=f"{_SCRATCH}{token}")

    def scratches(self) -> list[str]:
        with self._lock, errors("list scratch targets"):
            names = self._conn.execute("SELECT name FROM reindex_targets ORDER BY created").fetchall()
        return [name for (name,) in names if name.startswith(_SCRATCH)]

    def write(self, target: str, rows: Rows) -> None:
        """Upsert by id, the whole batch in one transaction."""
        values = [
            (
                record.id,
                np.asarray(vector, dtype="<f4").tobytes(),
                digest,
                rows.fingerprint,
                record.text,
                json.dumps(dict(record.payload), default=str),
            )
            for record, vector, digest in zip(rows.records, rows.vectors, rows.content_hashes, strict=True)
        ]
        with self._lock, errors(f"write to {target}"), self._transaction():
            self._require(target)
            self._conn.executemany(
                f"INSERT INTO {quote(target)} (id, vector, content_hash, fingerprint, text, payload)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET vector = excluded.vector,"
                " content_hash = excluded.content_hash, fingerprint = excluded.fingerprint,"
                " text = excluded.text, payload = excluded.payload",
                values,
            )

    def delete(self, target: str, ids: Sequence[str]) -> None:
        with self._lock, errors(f"delete from {target}"), self._transaction():
            self._require(target)
            for chunk in _chunks(list(ids)):
                marks = ", ".join("?" * len(chunk))
                self._conn.execute(f"DELETE FROM {quote(target)} WHERE id IN ({marks})", chunk)

    def finalize(self, spec: TargetSpec) -> None:
        with self._lock, errors(f"analyze {spec.name}"):
            self._conn.execute(f"ANALYZE {quote(spec.name)}")  # no index to build: search is exact

    def describe(self, target: str) -> TargetInfo | None:
        with self._lock, errors(f"describe {target}"):
            row = self._conn.execute(
                "SELECT dim, fingerprint, model, plan_id, nonce FROM reindex_targets WHERE name = ?",
                (target,),
            ).fetchone()
            if row is None or self._kind_of(target) != "table":
                return None
            count = self._conn.execute(f"SELECT count(*) FROM {quote(target)}").fetchone()[0]
        dim, fingerprint, model, plan_id, nonce = row
        return TargetInfo(
            target,
            int(count),
            int(dim),
            fingerprint,
            json.loads(model),
            plan_id=plan_id or None,
            nonce=nonce or None,
        )

    def scan_index(self, target: str, dim: int) -> Iterator[IndexEntry]:
        for page in self._pages(target, "id, vector, content_hash, fingerprint", 5000):
            for doc_id, blob, digest, fingerprint in page:
                yield IndexEntry(doc_id, digest, fingerprint, vector_problem(_vector(blob), dim))

    def fetch(self, target: str, ids: Sequence[str]) -> dict[str, Vectors]:
        found: dict[str, Vectors] = {}
        with self._lock, errors(f"fetch from {target}"):
            self._require(target)
            for chunk in _chunks(list(dict.fromkeys(ids))):
                marks = ", ".join("?" * len(chunk))
                query = f"SELECT id, vector FROM {quote(target)} WHERE id IN ({marks})"
                found.update((doc_id, _vector(blob)) for doc_id, blob in self._conn.execute(query, chunk))
        return found

    def fetch_matching(self, target: str, expected: Mapping[str, str]) -> dict[str, Vectors]:
        """Only ids whose stored content hash is the expected one: a copy never takes a stale vector."""
        found: dict[str, Vectors] = {}
        with self._lock, errors(f"fetch from {target}"):
            self._require(target)
            for chunk in _chunks(list(expected)):
                marks = ", ".join("?" * len(chunk))
                query = f"SELECT id, vector, content_hash FROM {quote(target)} WHERE id IN ({marks})"
                for doc_id, blob, digest in self._conn.execute(query, chunk):
                    if digest == expected[doc_id]:
                        found[doc_id] = _vector(blob)
        return found

    def scan_vectors(self, target: str, batch: int = 5000) -> Iterator[tuple[list[str], Vectors]]:
        for page in self._pages(target, "id, vector", batch):
            yield [doc_id for doc_id, _ in page], np.stack([_vector(blob) for _, blob in page])

    def search(self, target: str, vectors: Vectors, k: int) -> list[list[str]]:
        """Exact: the SQLite sink has no ANN index."""
        found = exact_neighbours(
            self.scan_vectors(target), vectors, [None] * len(vectors), k, self.distance(target)
        )
        return [ids for ids, _ in found]

    def distance(self, target: str) -> Distance:
        with self._lock, errors(f"read {target}"):
            row = self._conn.execute(
                "SELECT distance FROM reindex_targets WHERE name = ?", (target,)
            ).fetchone()
        if row is None:
            raise BackendError(f"no target {target!r} in {self.path}")
        distance: Distance = row[0]
        return distance

    def targets(self, alias: str) -> list[str]:
        with self._lock, errors("list targets"):
            names = self._conn.execute("SELECT name FROM reindex_targets ORDER BY created").fetchall()
        return [name for (name,) in names if name.startswith(f"{alias}__")]

    def drop(self, target: str) -> None:
        with self._lock, errors(f"drop {target}"), self._transaction():
            serving = self._conn.execute(
                "SELECT alias FROM reindex_aliases WHERE target = ?", (target,)
            ).fetchone()
            if serving is not None:
                raise BackendError(
                    f"alias {serving[0]!r} serves {target!r}: move it before dropping the target"
                )
            if self._kind_of(target) == "table":
                self._conn.execute(f"DROP TABLE {quote(target)}")
            self._conn.execute("DELETE FROM reindex_targets WHERE name = ?", (target,))

    # the alias -----------------------------------------------------------------------------------------

    def alias(self, alias: str) -> AliasInfo:
        with self._lock, errors(f"read alias {alias}"):
            row = self._conn.execute(
                "SELECT target, meta FROM reindex_aliases WHERE alias = ?", (alias,)
            ).fetchone()
            kind = self._kind_of(alias)
        if row is None:
            return AliasInfo(alias, None, is_physical=kind == "table")
        meta = json.loads(row[1])
        return AliasInfo(alias, row[0], fingerprint=meta.get("fingerprint"), model=meta.get("model"))

    def move_alias(
        self,
        alias: str,
        target: str,
        *,
        expected: str | None,
        meta: Mapping[str, Any],
        settle: Callable[[], None] | None = None,
    ) -> str | None:
        """Compare and swap in one `BEGIN IMMEDIATE` transaction: the check, `DROP VIEW`, `CREATE VIEW` and the
        alias's row commit together or not at all; a reader sees the old view or the new one."""
        if settle is not None:
            settle()  # no lock holds writers back here (holds_writers = False)
        with self._lock, errors(f"move alias {alias}"), self._transaction():
            row = self._conn.execute(
                "SELECT target FROM reindex_aliases WHERE alias = ?", (alias,)
            ).fetchone()
            current = None if row is None else str(row[0])
            if current != expected:
                raise CutoverRefused(f"alias {alias!r} points to {current!r}, expected {expected!r}")
            kind = self._kind_of(alias)
            if row is None and kind is not None:
                raise CutoverRefused(
                    f"{alias!r} is a {kind} in {self.path} that reindex did not create; this sink adopts none",
                    hint="set [target] alias to a name that is free in the SQLite file",
                )
            if self._kind_of(target) != "table" or self._recorded(target) is None:
                raise CutoverRefused(f"target {target!r} does not exist in {self.path}")
            self._conn.execute(f"DROP VIEW IF EXISTS {quote(alias)}")
            self._conn.execute(
                f"CREATE VIEW {quote(alias)} AS SELECT id, vector, text, payload FROM {quote(target)}"
            )
            self._conn.execute(
                "INSERT INTO reindex_aliases VALUES (?, ?, ?) ON CONFLICT (alias) DO UPDATE SET"
                " target = excluded.target, meta = excluded.meta",
                (alias, target, json.dumps(dict(meta), default=str)),
            )
        return current

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # helpers -------------------------------------------------------------------------------------------

    def _transaction(self) -> _Immediate:
        return _Immediate(self._conn)

    def _kind_of(self, name: str) -> str | None:
        """'table', 'view' (or 'index', 'trigger') where the file has an object of that name, else None."""
        row = self._conn.execute("SELECT type FROM sqlite_master WHERE name = ?", (name,)).fetchone()
        return None if row is None else str(row[0])

    def _recorded(self, target: str) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._conn.execute(
            "SELECT name FROM reindex_targets WHERE name = ?", (target,)
        ).fetchone()
        return row

    def _require(self, target: str) -> None:
        if self._kind_of(target) != "table" or self._recorded(target) is None:
            raise BackendError(f"no target {target!r} in {self.path}: prepare it first")

    def _pages(self, target: str, columns: str, size: int) -> Iterator[list[tuple[Any, ...]]]:
        """The target's rows in id order, `size` at a time (keyset), the lock released between pages."""
        after: str | None = None
        while True:
            with self._lock, errors(f"scan {target}"):
                self._require(target)
                if after is None:
                    query = f"SELECT {columns} FROM {quote(target)} ORDER BY id LIMIT ?"
                    page = self._conn.execute(query, (size,)).fetchall()
                else:
                    query = f"SELECT {columns} FROM {quote(target)} WHERE id > ? ORDER BY id LIMIT ?"
                    page = self._conn.execute(query, (after, size)).fetchall()
            if page:
                yield page
            if len(page) < size:
                return
            after = page[-1][0]


class _Immediate:
    """`BEGIN IMMEDIATE` ... `COMMIT`, or `ROLLBACK` on any exception (the connection is in autocommit)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.conn.execute("COMMIT" if kind is None else "ROLLBACK")


def _in_memory() -> sqlite3.Connection:
    return sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)


def _vector(blob: bytes) -> Vectors:
    return np.frombuffer(blob, dtype="<f4").astype(np.float32)


def _chunks(ids: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(ids), _CHUNK):
        yield ids[start : start + _CHUNK]
