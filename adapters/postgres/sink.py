"""The pgvector sink: targets are tables `<alias>__<fingerprint8>`, the alias is a view over one of them.

Cutover is one compare-and-swap transaction: lock the view, re-read what it serves, DROP VIEW + CREATE VIEW
under `SET LOCAL lock_timeout`, retried with backoff (the view statements are in alias.py).
"""

from __future__ import annotations

import itertools
import os
import random
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from reindex import crashpoints
from reindex.columns import documents
from reindex.errors import BackendError, CutoverRefused
from reindex.ports import AliasInfo, Distance, IndexEntry, Rows, TargetInfo, TargetSpec, Vectors
from reindex_adapters.postgres import rules as postgres_rules
from reindex_adapters.postgres.alias import (
    _DEPENDENT_VIEWS_SQL,
    _TARGETS_SQL,
    _adopt,
    _grant,
    _grants_of,
    _lock_alias,
    _replace_view,
    _resolve_alias,
    _serves,
)
from reindex_adapters.postgres.catalog import (
    _ORIGIN,
    _RESERVED,
    _detect_distance,
    _json_object,
    _Layout,
    _one_oid,
    _read_layout,
    _regclass,
    _server_identity,
)
from reindex_adapters.postgres.connection import _Database, _DsnConfig, _identifier, _one, _split
from reindex_adapters.postgres.ddl import (
    _HNSW_SQL,
    _INDEX_SETTINGS_SQL,
    _OPCLASSES,
    _accept_application_writes,
    _check_same_target,
    _create_target,
)
from reindex_adapters.postgres.write import (
    _BulkColumns,
    _default_writers,
    _rejections,
    _schema_copy,
    _schemaless_copy,
    _slice,
    _slices,
    _write_bulk,
    _write_rows,
    _Writers,
)

if TYPE_CHECKING:
    from psycopg import sql

    from reindex_adapters.postgres.connection import Connection


_OPERATORS: dict[Distance, str] = {"cosine": "<=>", "dot": "<#>", "euclid": "<->"}
_cursor_names = itertools.count()


class PgvectorSink:
    """Targets are tables `<alias>__<fingerprint8>`; the alias is a view `SELECT * FROM <target>`."""

    shareable = True  # several processes may open it at once (reindex.run.processes)

    holds_writers = True  # move_alias's settle runs under an EXCLUSIVE lock on the view that writers wait on

    class Config(_DsnConfig):
        kind: Literal["pgvector"]
        alias: str
        name: str | None = None
        lock_timeout_ms: int = Field(default=2000, ge=1)
        swap_attempts: int = Field(default=5, ge=1)
        index: Literal["hnsw", "none"] = "hnsw"
        maintenance_work_mem: str = "1GB"
        hnsw_m: int = Field(default=16, ge=2)
        hnsw_ef_construction: int = Field(default=64, ge=4)
        writers: int = Field(default_factory=lambda: _default_writers(), ge=1)

    def __init__(
        self,
        dsn: str,
        *,
        lock_timeout_ms: int = 2000,
        swap_attempts: int = 5,
        build_index: bool = True,
        maintenance_work_mem: str = "1GB",
        hnsw_m: int = 16,
        hnsw_ef_construction: int = 64,
        writers: int | None = None,
    ) -> None:
        self._db = _Database(dsn, "target", vectors=True)
        self.lock_timeout_ms = lock_timeout_ms
        self.swap_attempts = swap_attempts
        self.build_index = build_index
        self.maintenance_work_mem = maintenance_work_mem
        self.hnsw = (hnsw_m, hnsw_ef_construction)
        self.writers = writers or _default_writers()
        self.index_seconds: float | None = None  # the last finalize's CREATE INDEX; None: none built
        self._layouts: dict[str, _Layout] = {}
        self._identity: str | None = None
        self._pool: _Writers | None = None
        self._conflicted: set[str] = set()  # targets whose last direct COPY met keys already there

    @classmethod
    def from_config(cls, config: Config) -> PgvectorSink:
        return cls(
            config.resolved_dsn("target"),
            lock_timeout_ms=config.lock_timeout_ms,
            swap_attempts=config.swap_attempts,
            build_index=config.index == "hnsw",
            maintenance_work_mem=config.maintenance_work_mem,
            hnsw_m=config.hnsw_m,
            hnsw_ef_construction=config.hnsw_ef_construction,
            writers=config.writers,
        )

    def identity(self) -> str:
        """`pgvector:<system identifier>/<database>/<schema>`: where unqualified targets are created."""
        if self._identity is None:
            with self._db.errors():
                conn = self._db.connection()
                schema = _one(conn.execute("SELECT current_schema()").fetchone())
                self._identity = f"pgvector:{_server_identity(conn)}/{schema}"
        return self._identity

    def prepare(self, spec: TargetSpec) -> None:
        _identifier(spec.name)
        self._layouts.pop(spec.name, None)
        with self._db.transaction() as conn:
            layout = _read_layout(conn, spec.name)
            if layout is None:
                _create_target(conn, spec)
            else:
                _check_same_target(spec, layout)

    def write(self, target: str, rows: Rows) -> None:
        """Upsert by id. The batch goes as one binary COPY built per batch, straight into the table; keys
        already there (a replayed shard) roll that back and the batch goes through a stage + INSERT ... ON
        CONFLICT instead. Big batches are cut into `writers` slices written at once on their own
        connections, each its own transaction. A target with the source table's columns takes the same
        path when every column has a binary dumper (its values dumped by their types' dumpers); other
        layouts COPY row by row into the stage.

        A batch refused for its rows' content (a NUL byte, a value its column type cannot hold) is
        rolled back and raised as RowsRejected; the core bisects it (replaying halves is safe).
        """
        layout = self._layout(target)
        if not rows.records:
            return
        columns = self._bulk_columns(layout)
        if columns is None:
            with self._db.transaction() as conn, _rejections(target):
                _write_rows(conn, layout, rows)
            return
        direct = target not in self._conflicted
        slices = _slices(len(rows.records), self.writers)
        if len(slices) == 1:
            conflicted = _write_bulk(self._db, layout, columns, rows, direct=direct)
        else:
            if self._pool is None:
                self._pool = _Writers(self._db.dsn, self.writers)
            whole = Rows(documents(rows.records), rows.vectors, rows.content_hashes, rows.fingerprint)
            conflicted = self._pool.write(layout, columns, [_slice(whole, *s) for s in slices], direct=direct)
        if conflicted:
            self._conflicted.add(target)  # a replay: its next batch likely overlaps too, upsert it at once
        else:
            self._conflicted.discard(target)

    def _bulk_columns(self, layout: _Layout) -> _BulkColumns | None:
        schemaless = _schemaless_copy(layout)
        if schemaless is not None:
            return schemaless
        with self._db.errors():
            return _schema_copy(self._db.connection(), layout)

    def delete(self, target: str, ids: Sequence[str]) -> None:
        from psycopg import sql

        layout = self._layout(target)
        statement = sql.SQL("DELETE FROM {} WHERE {} = ANY(%s::{}[])").format(
            layout.ident, layout.key.ident, layout.key.cast
        )
        with self._db.errors():
            self._db.connection().execute(statement, [list(ids)])

    def finalize(self, spec: TargetSpec) -> None:
        """Build the HNSW index after the load, ANALYZE, carry the live table's grants over, and let the
        application write through the alias once it serves this target (`_accept_application_writes`)."""
        from psycopg import sql

        layout = self._layout(spec.name)
        self.index_seconds = None
        if self.build_index and layout.vector is not None:
            self.index_seconds = self._build_index(layout, spec.source.distance)
        with self._db.errors():
            conn = self._db.connection()
            conn.execute(sql.SQL("ANALYZE {}").format(layout.ident))
            live = self._live_table(conn, spec.alias)
            if live is not None and live != layout.oid:
                _grant(conn, layout.ident, _grants_of(conn, live))
            with conn.transaction():
                _accept_application_writes(conn, layout, spec)
                postgres_rules.continue_numbering(conn, None, layout.oid, scan=True)
        self._layouts.pop(spec.name, None)  # it may have gained the origin column

    def describe(self, target: str) -> TargetInfo | None:
        from psycopg import sql

        _identifier(target)
        with self._db.errors():
            conn = self._db.connection()
            layout = _read_layout(conn, target)
            if layout is None:
                return None
            count = int(
                _one(conn.execute(sql.SQL("SELECT count(*) FROM {}").format(layout.ident)).fetchone())
            )
        dim = layout.vector.typmod if layout.vector is not None and layout.vector.typmod > 0 else None
        meta = layout.meta
        return TargetInfo(
            target,
            count,
            dim,
            meta.get("fingerprint"),
            meta.get("model"),
            plan_id=meta.get("plan_id") or None,
            nonce=meta.get("nonce") or None,
        )

    def scan_index(self, target: str, dim: int) -> Iterator[IndexEntry]:
        layout = self._layout(target)
        name = f"reindex_scan_{next(_cursor_names)}"
        with self._db.transaction() as conn, conn.cursor(name=name) as cursor:
            cursor.itersize = 5000
            cursor.execute(*_index_query(layout, dim))
            for key, digest, fingerprint, problem, application in cursor:
                yield IndexEntry(key, digest, fingerprint, problem, application)

    def fetch(self, target: str, ids: Sequence[str]) -> dict[str, Vectors]:
        from psycopg import sql

        layout = self._layout(target)
        if layout.vector is None:
            return {}
        query = sql.SQL("SELECT {}::text, {} FROM {} WHERE {} = ANY(%s::{}[])").format(
            layout.key.ident, layout.vector.ident, layout.ident, layout.key.ident, layout.key.cast
        )
        with self._db.errors():
            rows = self._db.connection().execute(query, [list(ids)], binary=True).fetchall()
        return {key: _as_vector(value) for key, value in rows if value is not None}

    def fetch_matching(self, target: str, expected: Mapping[str, str]) -> dict[str, Vectors]:
        """One query: the vectors of the ids whose stored content hash is still the expected one."""
        from psycopg import sql

        layout = self._layout(target)
        has_hash = any(a.name == "reindex_content_hash" for a in layout.columns)
        if layout.vector is None or not has_hash or not expected:
            return {}
        query = sql.SQL(
            "SELECT t.{k}::text, t.{v} FROM {t} AS t"
            " JOIN unnest(%s::{cast}[], %s::text[]) AS e(id, content_hash)"
            " ON t.{k} = e.id AND t.reindex_content_hash = e.content_hash"
        ).format(k=layout.key.ident, v=layout.vector.ident, t=layout.ident, cast=layout.key.cast)
        with self._db.errors():
            conn = self._db.connection()
            rows = conn.execute(query, [list(expected), list(expected.values())], binary=True).fetchall()
        return {key: _as_vector(value) for key, value in rows if value is not None}

    def scan_vectors(self, target: str, batch: int = 5000) -> Iterator[tuple[list[str], Vectors]]:
        from psycopg import sql

        layout = self._layout(target)
        if layout.vector is None:
            return
        query = sql.SQL("SELECT {k}::text, {v} FROM {t} WHERE {v} IS NOT NULL").format(
            k=layout.key.ident, v=layout.vector.ident, t=layout.ident
        )
        name = f"reindex_vectors_{next(_cursor_names)}"
        with self._db.transaction() as conn, conn.cursor(name=name, binary=True) as cursor:
            cursor.itersize = batch
            cursor.execute(query)
            while rows := cursor.fetchmany(batch):
                yield [row[0] for row in rows], np.stack([_as_vector(row[1]) for row in rows])

    def search(self, target: str, vectors: Vectors, k: int) -> list[list[str]]:
        """One `ORDER BY vector <op> query LIMIT k` per vector, through the ANN index (ef_search >= k): its
        recall is what `reindex compare` measures, so the planner is not let fall back to an exact scan."""
        from psycopg import sql

        layout = self._layout(target)
        if layout.vector is None:
            return [[] for _ in vectors]
        operator = _OPERATORS[self.distance(target)]
        query = sql.SQL("SELECT {k}::text FROM {t} ORDER BY {v} {op} %s::vector LIMIT %s").format(
            k=layout.key.ident, t=layout.ident, v=layout.vector.ident, op=sql.SQL(operator)
        )
        found: list[list[str]] = []
        with self._db.transaction() as conn:
            conn.execute(sql.SQL("SET LOCAL hnsw.ef_search = {}").format(sql.Literal(max(40, min(k, 1000)))))
            conn.execute("SET LOCAL enable_seqscan = off")  # the index's answer, even where a scan is cheaper
            for vector in vectors:
                rows = conn.execute(query, [np.asarray(vector, dtype=np.float32), k]).fetchall()
                found.append([row[0] for row in rows])
        return found

    def distance(self, target: str) -> Distance:
        layout = self._layout(target)
        if layout.vector is None:
            return "cosine"
        with self._db.errors():
            return _detect_distance(self._db.connection(), layout.oid, layout.vector.name)

    def alias(self, alias: str) -> AliasInfo:
        _identifier(alias)
        with self._db.errors():
            return _resolve_alias(self._db.connection(), alias).info

    def move_alias(
        self,
        alias: str,
        target: str,
        *,
        expected: str | None,
        meta: Mapping[str, Any],
        settle: Callable[[], None] | None = None,
    ) -> str | None:
        """Swap the view in one short transaction; a busy lock is retried, then refused (old target stays).
        With `settle`, writers are held first (EXCLUSIVE: readers pass), then settle runs, then the swap."""
        import psycopg

        _identifier(alias)
        _identifier(target)
        with self._db.errors():
            for attempt in range(1, self.swap_attempts + 1):
                try:
                    previous = self._swap(alias, target, expected, meta, settle)
                except psycopg.errors.LockNotAvailable:
                    if attempt < self.swap_attempts:
                        time.sleep(min(1.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.5))
                    continue
                self._read_back(alias, target)
                return previous
        raise CutoverRefused(
            f"could not lock alias {alias!r} within {self.swap_attempts} x {self.lock_timeout_ms} ms",
            hint="a long-running reader holds it; the old target is still live, retry the cutover later",
        )

    def targets(self, alias: str) -> list[str]:
        parts = _split(alias)
        schema = parts[0] if len(parts) == 2 else None
        pattern = re.sub(r"([\\%_])", r"\\\1", parts[-1]) + r"\_\_%"
        with self._db.errors():
            rows = self._db.connection().execute(_TARGETS_SQL, [pattern, schema, schema]).fetchall()
        ordered = sorted(rows, key=lambda row: (str(_json_object(row[3]).get("created_at", "")), row[0]))
        return [f"{schema}.{relname}" if schema else relname for _, _, relname, _ in ordered]

    def drop(self, target: str) -> None:
        from psycopg import sql

        _identifier(target)
        self._layouts.pop(target, None)
        with self._db.transaction() as conn:
            oid = _regclass(conn, target)
            if oid is None:
                return
            views = [row[0] for row in conn.execute(_DEPENDENT_VIEWS_SQL, [oid, oid]).fetchall()]
            if views:
                raise CutoverRefused(
                    f"target {target!r} is still served by {', '.join(views)}",
                    hint="move the alias to another target before pruning this one",
                )
            conn.execute(sql.SQL("DROP TABLE {}").format(_identifier(target)))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self._db.close()

    def _layout(self, target: str) -> _Layout:
        if target not in self._layouts:
            _identifier(target)
            with self._db.errors():
                layout = _read_layout(self._db.connection(), target)
            if layout is None:
                raise BackendError(f"target table {target!r} does not exist", hint="run prepare first")
            self._layouts[target] = layout
        return self._layouts[target]

    def _build_index(self, layout: _Layout, distance: Distance) -> float | None:
        """CREATE INDEX with `maintenance_work_mem` and parallel workers for the cores; its wall seconds,
        commit included, or None when the index was already there (a resumed finalize)."""
        from psycopg import sql

        assert layout.vector is not None
        statement = sql.SQL(
            "CREATE INDEX ON {} USING hnsw ({} {}) WITH (m = {}, ef_construction = {})"
        ).format(
            layout.ident,
            layout.vector.ident,
            sql.SQL(_OPCLASSES[distance]),
            sql.Literal(self.hnsw[0]),
            sql.Literal(self.hnsw[1]),
        )
        with self._db.transaction() as conn:
            if conn.execute(_HNSW_SQL, [layout.oid]).fetchone() is not None:
                return None
            conn.execute(_INDEX_SETTINGS_SQL, [self.maintenance_work_mem, (os.cpu_count() or 1) - 1])
            started = time.perf_counter()
            conn.execute(statement)
        return time.perf_counter() - started

    def _live_table(self, conn: Connection, alias: str) -> int | None:
        resolved = _resolve_alias(conn, alias)
        return resolved.oid if resolved.info.is_physical else resolved.target_oid

    def _swap(
        self,
        alias: str,
        target: str,
        expected: str | None,
        meta: Mapping[str, Any],
        settle: Callable[[], None] | None = None,
    ) -> str | None:
        conn = self._db.connection()
        with conn.transaction():
            conn.execute("SELECT set_config('lock_timeout', %s, true)", [f"{self.lock_timeout_ms}ms"])
            if settle is not None:
                # Writers wait from here to the commit; a writer that waited on the old table is sent to
                # the new view when it gets the lock (Postgres looks the name up again after waiting).
                _lock_alias(conn, alias, mode="EXCLUSIVE")
                settle()
            _lock_alias(conn, alias)
            if _regclass(conn, target) is None:
                raise CutoverRefused(f"target {target!r} does not exist")
            resolved = _resolve_alias(conn, alias)  # re-read under the lock: what it serves now
            if resolved.info.is_physical:
                previous = _adopt(conn, resolved, target, expected, meta)
                crashpoints.crash_if_armed("cutover_before_commit")
                return previous
            if not _serves(conn, resolved, expected):
                raise CutoverRefused(
                    f"alias {alias!r} serves {resolved.info.target!r}, expected {expected!r}",
                    hint="another cutover moved it meanwhile; check `reindex status`",
                )
            postgres_rules.continue_numbering(conn, resolved.target_oid, _one_oid(conn, target))
            grants = _grants_of(conn, resolved.oid) if resolved.oid is not None else []
            _replace_view(conn, alias, target, meta, grants, drop=resolved.oid is not None)
            crashpoints.crash_if_armed("cutover_before_commit")
            return expected

    def _read_back(self, alias: str, target: str) -> None:
        conn = self._db.connection()
        if _resolve_alias(conn, alias).target_oid != _regclass(conn, target):
            raise BackendError(f"alias {alias!r} does not serve {target!r} after the swap")


def _index_query(layout: _Layout, dim: int) -> tuple[sql.Composed, list[int]]:
    """Vector sanity computed by the server: pgvector stores no NaN, so wrong dims and zeros remain."""
    from psycopg import sql

    present = {a.name for a in layout.columns}
    digest, fingerprint = (sql.Identifier(n) if n in present else sql.NULL for n in _RESERVED[::-1])
    origin: sql.Composable = sql.NULL  # a target older than the column cannot tell: no count, not 0
    if _ORIGIN in present:
        origin = sql.SQL("{} IS NOT DISTINCT FROM 'application'").format(sql.Identifier(_ORIGIN))
    problem: sql.Composable = sql.SQL("'dimension'")
    if layout.vector is not None:
        problem = sql.SQL(
            "CASE WHEN {v} IS NULL OR vector_dims({v}) <> %s THEN 'dimension'"
            " WHEN vector_norm({v}) = 0 THEN 'zero' END"
        ).format(v=layout.vector.ident)
    query = sql.SQL("SELECT {}::text, {}, {}, {}, {} FROM {}").format(
        layout.key.ident, digest, fingerprint, problem, origin, layout.ident
    )
    return query, [dim] if layout.vector is not None else []


def _as_vector(value: Any) -> Vectors:
    """A stored vector as float32. Vectors are read in binary: pgvector's binary loader is one `frombuffer`,
    its text loader parses every number in Python (0.7 ms per 1,536-d vector, measured)."""
    array = value.to_numpy() if hasattr(value, "to_numpy") else value
    return np.asarray(array, dtype=np.float32).copy()
