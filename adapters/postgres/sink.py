"""Postgres source (keyset scan of a table or view) and pgvector sink (target = table, alias = view).

Cutover is one compare-and-swap transaction: lock the view, re-read what it serves, DROP VIEW + CREATE VIEW
under `SET LOCAL lock_timeout`, retried with backoff. Errors are translated here, with passwords hidden.
"""

from __future__ import annotations

import itertools
import json
import operator
import os
import random
import re
import struct
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from reindex import crashpoints
from reindex.columns import Documents, documents
from reindex.errors import (
    BackendError,
    ConfigError,
    CutoverRefused,
    MissingDependency,
    RowsRejected,
    TransientError,
)
from reindex.ports import (
    AliasInfo,
    Column,
    Distance,
    IndexEntry,
    Record,
    Rows,
    Sink,
    SourceSchema,
    TargetInfo,
    TargetSpec,
    Vectors,
)
from reindex_adapters.postgres import copy_format as pg_copy
from reindex_adapters.postgres import rules as postgres_rules

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

    Connection = psycopg.Connection[tuple[Any, ...]]

MAX_IDENTIFIER_BYTES = 63  # Postgres truncates longer names silently: refuse them instead
_OPCLASSES: dict[Distance, str] = {
    "cosine": "vector_cosine_ops",
    "dot": "vector_ip_ops",
    "euclid": "vector_l2_ops",
}
_DISTANCES: dict[str, Distance] = {"_cosine_ops": "cosine", "_ip_ops": "dot", "_l2_ops": "euclid"}
_OPERATORS: dict[Distance, str] = {"cosine": "<=>", "dot": "<#>", "euclid": "<->"}
_PRIVILEGES = frozenset(
    {"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER", "MAINTAIN"}
)
_RESERVED = ("reindex_fingerprint", "reindex_content_hash")  # bookkeeping the sink adds to every target
# 'application' on a row the trigger filled the bookkeeping of (the application wrote it through the alias);
# NULL on the tool's own rows. Nullable and added by finalize where missing: targets older than it lack it.
_ORIGIN = "reindex_origin"
_BOOKKEEPING = (*_RESERVED, _ORIGIN)  # never a document field
_TEXT_OID = 25
_PARALLEL_ROWS = 2000  # a write this big is cut into slices for the writer connections...
_SLICE_ROWS = 1000  # ...of at least this many rows each
_cursor_names = itertools.count()
_BulkColumns = pg_copy.Schemaless | pg_copy.Schema


class _DsnConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    dsn: str | None = None
    dsn_env: str | None = None

    @model_validator(mode="after")
    def _one_dsn(self) -> Self:
        if (self.dsn is None) == (self.dsn_env is None):
            raise ValueError("set exactly one of dsn and dsn_env")
        return self

    def resolved_dsn(self, section: str) -> str:
        if self.dsn is not None:
            return self.dsn
        value = os.environ.get(str(self.dsn_env))
        if not value:
            raise ConfigError(
                f"environment variable {self.dsn_env} is not set",
                hint=f"export {self.dsn_env}=postgresql://... or set [{section}] dsn",
            )
        return value


class PostgresSource:
    """Reads a table or view page by page (`WHERE id > cursor ORDER BY id LIMIT n`): memory stays flat."""

    class Config(_DsnConfig):
        kind: Literal["postgres"]
        table: str
        id_column: str = "id"
        text_column: str = "body"
        vector_column: str | None = None
        page_size: int = Field(default=1000, ge=1)

    def __init__(
        self,
        dsn: str,
        *,
        table: str,
        id_column: str = "id",
        text_column: str = "body",
        vector_column: str | None = None,
        page_size: int = 1000,
    ) -> None:
        self._db = _Database(dsn, "source", vectors=False)
        self.table = table
        self.page_size = page_size
        self._columns = (id_column, text_column, vector_column)
        with self._db.setup() as conn:
            self._shape = _read_source_shape(conn, table, id_column, text_column, vector_column)
            columns = [Column(a.name, a.type) for a in self._shape.columns]
            self._rules = postgres_rules.read_rules(conn, self._shape.oid, columns)
            relation = _qualified_name(conn, self._shape.oid)
            self._identity = f"postgres:{_server_identity(conn)}/{relation}#{id_column},{text_column}"

    @classmethod
    def from_config(cls, config: Config) -> PostgresSource:
        return cls(
            config.resolved_dsn("source"),
            table=config.table,
            id_column=config.id_column,
            text_column=config.text_column,
            vector_column=config.vector_column,
            page_size=config.page_size,
        )

    def schema(self) -> SourceSchema:
        shape = self._shape
        return SourceSchema(
            id_field=shape.key.name,
            text_field=shape.text.name,
            vector_field=shape.vector.name if shape.vector else None,
            columns=tuple(self._rules.columns[a.name] for a in shape.columns),
            distance=shape.distance,
            checks=self._rules.checks,
        )

    def count(self) -> int | None:
        from psycopg import sql

        with self._db.errors():
            row = self._db.connection().execute(
                sql.SQL("SELECT count(*) FROM {}").format(_identifier(self.table))
            )
            return int(_one(row.fetchone()))

    def scan(self, after: str | None = None) -> Iterator[Record]:
        while True:
            page = self._page(after)
            yield from page
            if len(page) < self.page_size:
                return
            after = page[-1].id

    def scan_documents(self, after: str | None, size: int) -> Iterator[Documents]:
        """Shards of `size` rows as columns, one keyset query each: the ids and texts taken from the rows
        column-wise and each payload made by one `dict(zip(...))`, with no Record per row."""
        names = [a.name for a in self._shape.columns]
        key, text = names.index(self._shape.key.name), names.index(self._shape.text.name)
        while True:
            rows = self._rows(after, size)
            if not rows:
                return
            columns = list(zip(*rows, strict=True))
            ids = list(map(str, columns[key]))
            texts = columns[text]
            plain = set(map(type, texts)) == {str}
            listed = list(texts) if plain else ["" if t is None else str(t) for t in texts]
            payloads: list[Mapping[str, Any]] = [dict(zip(names, row, strict=True)) for row in rows]
            fields = (self._shape.key.name, self._shape.text.name)
            yield Documents(ids, listed, payloads, fields, last_position=ids[-1])
            if len(rows) < size:
                return
            after = ids[-1]

    def shard_bounds(self, after: str | None, size: int) -> Iterator[tuple[str, int]]:
        """(last id, rows) of each shard of `size` rows after id `after`, in one query over the ids only:
        keyset boundaries a cluster's workers read in parallel (`WHERE id > after ... LIMIT size`)."""
        from psycopg import sql

        key = self._shape.key
        where = sql.SQL("WHERE {} > %s::{}").format(key.ident, key.cast) if after is not None else sql.SQL("")
        query = sql.SQL(
            "SELECT k, n FROM (SELECT {k} AS k, row_number() OVER (ORDER BY {k}) AS n, count(*) OVER () AS total"
            " FROM {t} {w}) AS numbered WHERE n %% %s = 0 OR n = total ORDER BY n"
        ).format(k=key.ident, t=_identifier(self.table), w=where)
        params = [after, size] if after is not None else [size]
        with self._db.errors():
            rows = self._db.connection().execute(query, params).fetchall()
        previous = 0
        for last, number in rows:
            yield str(last), int(number) - previous
            previous = int(number)

    def identity(self) -> str:
        """`postgres:<system identifier>/<database>/<schema>.<table>#<id>,<text>`: no DSN, no knobs."""
        return self._identity

    def fetch(self, ids: Sequence[str]) -> Iterator[Record]:
        from psycopg import sql

        key = self._shape.key
        where = sql.SQL("WHERE {} = ANY(%s::{}[]) ORDER BY {}").format(key.ident, key.cast, key.ident)
        with self._db.errors():
            rows = self._db.connection().execute(self._select() + where, [list(ids)]).fetchall()
        return iter([self._record(row) for row in rows])

    def reading(self, sink: Sink, alias: str, previous: str) -> PostgresSource | None:
        """This source over `previous` when it reads the alias (the view) or `previous` itself, in the
        sink's own database: the table the application wrote to until the flip (`reindex.prove.served`)."""
        if not isinstance(sink, PgvectorSink) or self.table not in (alias, previous):
            return None
        if _database_of(sink.identity()) != _database_of(self._identity):
            return None
        return self.over(previous)

    def over(self, index: str) -> PostgresSource:
        """This source's columns over another table or view of the same database (its own connection)."""
        id_column, text_column, vector_column = self._columns
        return PostgresSource(
            self._db.dsn,
            table=index,
            id_column=id_column,
            text_column=text_column,
            vector_column=vector_column,
            page_size=self.page_size,
        )

    def close(self) -> None:
        self._db.close()

    def _page(self, after: str | None) -> list[Record]:
        return [self._record(row) for row in self._rows(after, self.page_size)]

    def _rows(self, after: str | None, limit: int) -> list[tuple[Any, ...]]:
        """Up to `limit` rows after key `after`, in key order."""
        from psycopg import sql

        key = self._shape.key
        where = (
            sql.SQL("WHERE {} > %s::{} ").format(key.ident, key.cast) if after is not None else sql.SQL("")
        )
        order = sql.SQL("ORDER BY {} LIMIT %s").format(key.ident)
        params = [after, limit] if after is not None else [limit]
        with self._db.errors():
            return self._db.connection().execute(self._select() + where + order, params).fetchall()

    def _select(self) -> sql.Composed:
        from psycopg import sql

        names = sql.SQL(", ").join(a.ident for a in self._shape.columns)
        return sql.SQL("SELECT {} FROM {} ").format(names, _identifier(self.table))

    def _record(self, row: tuple[Any, ...]) -> Record:
        payload = {a.name: value for a, value in zip(self._shape.columns, row, strict=True)}
        text = payload[self._shape.text.name]
        return Record(
            id=str(payload[self._shape.key.name]), text="" if text is None else str(text), payload=payload
        )


class PgvectorSink:
    """Targets are tables `<alias>__<fingerprint8>`; the alias is a view `SELECT * FROM <target>`."""

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


@contextmanager
def _rejections(target: str) -> Iterator[None]:
    """Refusals caused by the rows' content (SQLSTATE class 22, psycopg's NUL check) → RowsRejected."""
    psycopg = _psycopg()
    try:
        yield
    except psycopg.DataError as exc:
        code = exc.sqlstate or ("nul_byte" if "NUL" in str(exc) else "invalid_value")
        raise RowsRejected(
            f"Postgres refused rows for {target!r}: {_first_line(exc)}", reason=f"sink_rejected:{code}"
        ) from exc


class _Database:
    """One autocommit connection, reopened after a drop, and the adapter's only error translator."""

    def __init__(self, dsn: str, section: str, *, vectors: bool, has_connected: bool = False) -> None:
        self._secrets = _check_dsn(dsn, section)
        self.dsn = dsn
        self.section = section
        self.vectors = vectors
        self._conn: Connection | None = None
        self._has_connected = has_connected  # a DSN known to work: failing to connect is then transient
        self.connection()

    def connection(self) -> Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = self._open()
        return self._conn

    @contextmanager
    def errors(self) -> Iterator[None]:
        psycopg = _psycopg()
        try:
            yield
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise TransientError(
                f"Postgres: {_scrub(_first_line(exc), self._secrets)}",
                hint="retry; a dropped connection is reopened on the next call",
            ) from exc
        except psycopg.Error as exc:
            raise BackendError(f"Postgres: {_scrub(_first_line(exc), self._secrets)}") from exc

    @contextmanager
    def setup(self) -> Iterator[Connection]:
        """Translate errors, and close the connection when the adapter cannot be built."""
        try:
            with self.errors():
                yield self.connection()
        except BaseException:
            self.close()
            raise

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        with self.errors():
            conn = self.connection()
            with conn.transaction():
                yield conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def _open(self) -> Connection:
        psycopg = _psycopg()
        try:
            conn: Connection = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            reason = _scrub(_first_line(exc), self._secrets)
            message = f"cannot connect to Postgres at {_scrub(self.dsn, self._secrets)}: {reason}"
            if self._has_connected:
                raise TransientError(message) from None
            raise ConfigError(message, hint=f"check [{self.section}] dsn") from None
        self._has_connected = True
        if self.vectors:
            try:
                self._register_vector(conn)
            except psycopg.OperationalError as exc:  # terminated right after connecting: a transient fault
                conn.close()
                raise TransientError(f"Postgres: {_scrub(_first_line(exc), self._secrets)}") from None
        return conn

    def _register_vector(self, conn: Connection) -> None:
        """Register pgvector's types, first creating the extension where it is missing and the role may
        (a fresh database just works); otherwise a ConfigError naming the statement to run."""
        from pgvector.psycopg import register_vector

        psycopg = _psycopg()
        try:
            register_vector(conn)
        except psycopg.ProgrammingError:
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")  # autocommit: its own transaction
                register_vector(conn)
            except psycopg.Error as exc:
                conn.close()
                reason = _scrub(_first_line(exc), self._secrets)
                raise ConfigError(
                    f"the vector extension is missing in the {self.section} database and cannot be"
                    f" created by this role: {reason}",
                    hint="run CREATE EXTENSION vector there as a role that may (or install pgvector)",
                ) from None
        _register_packed_vectors(conn)


class _Writers:
    """Extra connections, one thread each, for the slices of a big write (psycopg waits without the GIL).
    They know pgvector's types like the sink's own: a source table's columns may hold some."""

    def __init__(self, dsn: str, count: int) -> None:
        self._dbs: list[_Database] = []
        try:
            self._dbs += [_Database(dsn, "target", vectors=True, has_connected=True) for _ in range(count)]
        except BaseException:
            self.close()
            raise
        self._threads = ThreadPoolExecutor(count, thread_name_prefix="pgvector-writer")

    def write(self, layout: _Layout, columns: _BulkColumns, parts: list[Rows], *, direct: bool) -> bool:
        """Every slice, each in its own transaction; after all have ended, the first slice's error."""
        futures = [
            self._threads.submit(_write_bulk, db, layout, columns, part, direct=direct)
            for db, part in zip(self._dbs, parts, strict=False)
        ]
        wait(futures)
        return any([future.result() for future in futures])

    def close(self) -> None:
        if hasattr(self, "_threads"):
            self._threads.shutdown()
        for db in self._dbs:
            db.close()


@dataclass(frozen=True, slots=True)
class _Attribute:
    """One column as the catalog shows it."""

    name: str
    type: str  # format_type(): 'bigint', 'vector(8)'
    type_name: tuple[str, str]  # (schema, name) of the type, for casts
    oid: int
    typmod: int

    @property
    def ident(self) -> sql.Identifier:
        from psycopg import sql

        return sql.Identifier(self.name)

    @property
    def cast(self) -> sql.Identifier:
        from psycopg import sql

        return sql.Identifier(*self.type_name)

    @property
    def is_vector(self) -> bool:
        return self.type_name[1] == "vector"


@dataclass(frozen=True, slots=True)
class _SourceShape:
    oid: int
    columns: tuple[_Attribute, ...]  # every column but vectors and the sink's bookkeeping, in attnum order
    key: _Attribute
    text: _Attribute
    vector: _Attribute | None
    distance: Distance


@dataclass(frozen=True, slots=True)
class _Layout:
    """A target table: its columns, key, vector column and the JSON comment prepare() wrote."""

    name: str
    oid: int
    columns: tuple[_Attribute, ...]
    key: _Attribute
    vector: _Attribute | None
    meta: dict[str, Any]

    @property
    def ident(self) -> sql.Identifier:
        return _identifier(self.name)


@dataclass(frozen=True, slots=True)
class _ResolvedAlias:
    info: AliasInfo
    oid: int | None  # the alias relation itself
    relkind: str | None
    target_oid: int | None


_ALIAS_SQL = """
WITH rel AS (
  SELECT c.oid, c.relkind::text AS relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE c.relname = %(name)s::name AND CASE WHEN %(schema)s::name IS NULL
    THEN n.nspname = ANY (current_schemas(true)) ELSE n.nspname = %(schema)s::name END
  ORDER BY array_position(current_schemas(true), n.nspname) LIMIT 1
)
SELECT rel.oid::int8, rel.relkind,
  (SELECT d.description FROM pg_description d
   WHERE d.objoid = rel.oid AND d.classoid = 'pg_class'::regclass AND d.objsubid = 0),
  (SELECT coalesce(json_agg(json_build_array(b.oid::int8, bn.nspname, b.relname, pg_table_is_visible(b.oid))),
                   '[]')
   FROM pg_class b JOIN pg_namespace bn ON bn.oid = b.relnamespace
   WHERE b.oid IN (
     SELECT d.refobjid FROM pg_rewrite r JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
     WHERE r.ev_class = rel.oid AND d.refclassid = 'pg_class'::regclass AND d.refobjid <> r.ev_class))
FROM rel"""
_COLUMNS_SQL = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), n.nspname, t.typname, a.atttypid::int8, a.atttypmod
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid JOIN pg_namespace n ON n.oid = t.typnamespace
WHERE a.attrelid = %s::oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"""
_BASE_TABLES_SQL = """
SELECT DISTINCT d.refobjid::int8 FROM pg_rewrite r
JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
WHERE r.ev_class = %s::oid AND d.refclassid = 'pg_class'::regclass AND d.refobjid <> r.ev_class"""
_DEPENDENT_VIEWS_SQL = """
SELECT DISTINCT r.ev_class::regclass::text FROM pg_depend d
JOIN pg_rewrite r ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = %s::oid AND r.ev_class <> %s::oid"""
_OPCLASS_SQL = """
SELECT o.opcname FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey::int2[], i.indclass::oid[]) AS k(attnum, opclass)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
JOIN pg_opclass o ON o.oid = k.opclass
WHERE i.indrelid = ANY(%s::oid[]) AND a.attname = %s"""
_PRIMARY_KEY_SQL = """
SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = %s::oid AND i.indisprimary"""
_HNSW_SQL = """
SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam
WHERE i.indrelid = %s::oid AND am.amname = 'hnsw'"""
_INDEX_SETTINGS_SQL = """
SELECT set_config('maintenance_work_mem', %s, true),
  set_config('max_parallel_maintenance_workers',
             greatest(current_setting('max_parallel_maintenance_workers')::int, %s::int)::text, true)"""
_GRANTS_SQL = """
SELECT CASE WHEN g.grantee = 0 THEN NULL ELSE pg_get_userbyid(g.grantee)::text END,
       g.privilege_type, g.is_grantable
FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) g
WHERE c.oid = %s::oid AND g.grantee <> c.relowner"""
_TARGETS_SQL = r"""
SELECT c.oid::int8, n.nspname, c.relname, obj_description(c.oid, 'pg_class')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND c.relname LIKE %s ESCAPE '\'
  AND ((%s::text IS NULL AND pg_table_is_visible(c.oid)) OR n.nspname = %s::text)"""


# `scheme://user:<password>@host`: up to the LAST '@' on the line, so an unescaped '@', ':', '/' or space in
# the password is hidden too (over-masking a later '@' is the safe side).
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)(.*)@", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"([?&](?:ssl)?password=)[^&#\s]*", re.IGNORECASE)
_KEYWORD_PASSWORD = re.compile(
    r"""(?<![?&])(\b(?:ssl|pg)?password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S+)""", re.IGNORECASE
)  # libpq keyword form: a quoted value may hold spaces and \' escapes
_DSN_HINT = (
    "percent-encode reserved characters of a URL password (@ %40, / %2F, : %3A, space %20), "
    "or quote a keyword value: password='a b'"
)


def _database_of(identity: str) -> str:
    """`<system identifier>/<database>` of a source's or sink's identity."""
    return "/".join(identity.partition(":")[2].split("/")[:2])


def mask_dsn(text: str) -> str:
    """Hide passwords of every DSN form in `text`: URLs (encoded or not), query and keyword parameters."""
    text = _URL_PASSWORD.sub(r"\1***@", text)
    text = _QUERY_PASSWORD.sub(r"\1***", text)
    return _KEYWORD_PASSWORD.sub(r"\1***", text)


def _check_dsn(dsn: str, section: str) -> tuple[str, ...]:
    """Refuse a DSN libpq would misread (its errors echo the pieces); return the secrets to scrub."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(dsn)
    except _psycopg().ProgrammingError:
        raise ConfigError(
            f"[{section}] dsn is not a valid Postgres connection string", hint=_DSN_HINT
        ) from None
    found = _URL_PASSWORD.match(dsn)
    raw = found.group(2) if found else ""
    password = str(params.get("password") or "")
    port = str(params.get("port") or "")
    is_port = port.isdigit() and re.split(r"[/?]", raw)[0] == port  # host:port/db?opt=a@b, no password
    if raw and urllib.parse.unquote(raw) != password and not is_port:
        raise ConfigError(f"[{section}] dsn has unescaped characters in its password", hint=_DSN_HINT)
    keyword = _KEYWORD_PASSWORD.search(dsn)
    candidates = {password, raw, urllib.parse.unquote(raw), keyword.group(2) if keyword else ""}
    return tuple(sorted((c for c in candidates if len(c) > 1), key=len, reverse=True))


def _scrub(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return mask_dsn(text)


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise MissingDependency("psycopg", extra="pgvector") from None
    return psycopg


def _split(name: str) -> tuple[str, ...]:
    parts = tuple(name.split("."))
    if len(parts) > 2 or not all(parts):
        raise ConfigError(f"invalid name {name!r}", hint="use name or schema.name")
    for part in parts:
        if len(part.encode()) > MAX_IDENTIFIER_BYTES:
            raise ConfigError(
                f"name {part!r} is longer than {MAX_IDENTIFIER_BYTES} bytes",
                hint="Postgres would truncate it; choose a shorter [target] name or alias",
            )
    return parts


def _identifier(name: str) -> sql.Identifier:
    from psycopg import sql

    return sql.Identifier(*_split(name))


def _one(row: tuple[Any, ...] | None) -> Any:
    assert row is not None
    return row[0]


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _regclass(conn: Connection, name: str) -> int | None:
    quoted = _identifier(name).as_string(conn)
    row = conn.execute("SELECT to_regclass(%s)::oid::int8", [quoted]).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def _one_oid(conn: Connection, name: str) -> int:
    oid = _regclass(conn, name)
    assert oid is not None
    return oid


def _server_identity(conn: Connection) -> str:
    """`<system identifier>/<database>`: the cluster's own id survives renamed hosts, ports and users."""
    psycopg = _psycopg()
    try:
        with conn.transaction():
            system = _one(conn.execute("SELECT system_identifier::text FROM pg_control_system()").fetchone())
    except psycopg.errors.InsufficientPrivilege:  # some managed services revoke it: name the server
        system = _one(
            conn.execute(
                "SELECT coalesce(host(inet_server_addr()), 'local') || ':' || current_setting('port')"
            ).fetchone()
        )
    return f"{system}/{_one(conn.execute('SELECT current_database()').fetchone())}"


def _qualified_name(conn: Connection, oid: int) -> str:
    row = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.oid = %s::oid",
        [oid],
    ).fetchone()
    assert row is not None
    return f"{row[0]}.{row[1]}"


def _attributes(conn: Connection, oid: int) -> tuple[_Attribute, ...]:
    rows = conn.execute(_COLUMNS_SQL, [oid]).fetchall()
    return tuple(
        _Attribute(name, kind, (nsp, typ), int(toid), int(mod)) for name, kind, nsp, typ, toid, mod in rows
    )


def _json_object(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _comment(conn: Connection, oid: int) -> dict[str, Any]:
    return _json_object(_one(conn.execute("SELECT obj_description(%s::oid, 'pg_class')", [oid]).fetchone()))


def _base_tables(conn: Connection, oid: int) -> list[int]:
    return [int(row[0]) for row in conn.execute(_BASE_TABLES_SQL, [oid]).fetchall()]


def _read_source_shape(
    conn: Connection, table: str, id_column: str, text_column: str, vector_column: str | None
) -> _SourceShape:
    oid = _regclass(conn, table)
    if oid is None:
        raise ConfigError(
            f"table or view {table!r} not found", hint="check [source] table and dsn (schema.table)"
        )
    attributes = {a.name: a for a in _attributes(conn, oid)}
    for option, column in (
        ("id_column", id_column),
        ("text_column", text_column),
        ("vector_column", vector_column),
    ):
        if column in _BOOKKEEPING:
            raise ConfigError(
                f"[source] {option} {column!r} is a column this tool writes, not a document field"
            )
        if column is not None and column not in attributes:
            raise ConfigError(
                f"column {column!r} not found in {table!r}",
                hint=f"check [source] {option}; columns: {', '.join(attributes)}",
            )
    vector = _pick_vector(table, attributes, vector_column)
    distance = _detect_distance(conn, oid, vector.name) if vector else "cosine"
    # A source named like the alias reads an earlier target through the view: its bookkeeping columns
    # are not the application's data, and the next target adds its own.
    columns = tuple(a for a in attributes.values() if not a.is_vector and a.name not in _BOOKKEEPING)
    return _SourceShape(oid, columns, attributes[id_column], attributes[text_column], vector, distance)


def _pick_vector(table: str, attributes: dict[str, _Attribute], name: str | None) -> _Attribute | None:
    if name is not None:
        if not attributes[name].is_vector:
            raise ConfigError(
                f"column {name!r} of {table!r} is not a vector", hint="check [source] vector_column"
            )
        return attributes[name]
    vectors = [a for a in attributes.values() if a.is_vector]
    if len(vectors) > 1:
        raise ConfigError(f"{table!r} has several vector columns", hint="set [source] vector_column")
    return vectors[0] if vectors else None


def _detect_distance(conn: Connection, oid: int, column: str) -> Distance:
    """The metric of the column's ANN index; cosine when it has none (the common choice)."""
    return _index_distance(conn, oid, column) or "cosine"


def _index_distance(conn: Connection, oid: int, column: str) -> Distance | None:
    """Read the metric from the ANN index opclass (the table's, or the base table's for a view)."""
    relations = [oid, *_base_tables(conn, oid)]
    for (opclass,) in conn.execute(_OPCLASS_SQL, [relations, column]).fetchall():
        for suffix, distance in _DISTANCES.items():
            if str(opclass).endswith(suffix):
                return distance
    return None


def _read_layout(conn: Connection, name: str) -> _Layout | None:
    oid = _regclass(conn, name)
    if oid is None:
        return None
    columns = _attributes(conn, oid)
    by_name = {a.name: a for a in columns}
    primary = [row[0] for row in conn.execute(_PRIMARY_KEY_SQL, [oid]).fetchall()]
    key = by_name[primary[0]] if len(primary) == 1 else by_name.get("id", columns[0])
    vector = next((a for a in columns if a.is_vector), None)
    return _Layout(name, oid, columns, key, vector, _comment(conn, oid))


def _check_same_target(spec: TargetSpec, layout: _Layout) -> None:
    found = (layout.meta.get("fingerprint"), layout.meta.get("dim"))
    if found != (spec.fingerprint, spec.dim):
        raise ConfigError(
            f"target {spec.name!r} exists with fingerprint {found[0]} and dim {found[1]}",
            hint="choose another [target] name",
        )


def _create_target(conn: Connection, spec: TargetSpec) -> None:
    from psycopg import sql

    ident = _identifier(spec.name)
    definitions = _schema_columns(conn, spec) if spec.source.columns else _schemaless_columns(spec)
    errors = _psycopg().errors
    try:
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(ident, sql.SQL(", ").join(definitions)))
    except (errors.UndefinedFunction, errors.UndefinedTable, errors.UndefinedObject) as exc:
        raise ConfigError(
            f"the target database cannot give {spec.name!r} the source's defaults and checks: "
            + _first_line(exc),
            hint="create what they use there first (a function, a sequence, an extension)",
        ) from None
    meta = {
        "fingerprint": spec.fingerprint,
        "dim": spec.dim,
        "alias": spec.alias,
        "model": dict(spec.model),
        "distance": spec.source.distance,
        "created_at": datetime.now(UTC).isoformat(),
        "schemaless": not spec.source.columns,
        "id_field": spec.source.id_field,
        "text_field": spec.source.text_field,
        "plan_id": spec.plan_id,  # the migration that built it; never re-stamped (prepare only creates)
        "nonce": spec.nonce,
    }
    conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(ident, sql.Literal(json.dumps(meta))))


def _schema_columns(conn: Connection, spec: TargetSpec) -> list[sql.Composable]:
    """The source's columns with the same names and types, so the alias stays a drop-in replacement."""
    from psycopg import sql

    names = [c.name for c in spec.source.columns]
    vector = spec.source.vector_field or "embedding"
    if spec.source.id_field not in names:
        raise ConfigError(f"id column {spec.source.id_field!r} is not among the source columns")
    if vector in names or set(_BOOKKEEPING) & set(names):
        raise ConfigError(f"source columns clash with {vector!r} or {', '.join(_BOOKKEEPING)}")
    definitions: list[sql.Composable] = []
    for column in spec.source.columns:
        key = sql.SQL(" PRIMARY KEY" if column.name == spec.source.id_field else "")
        definitions.append(
            sql.SQL("{} {}{}{}").format(
                sql.Identifier(column.name),
                _checked_type(conn, column.type),
                postgres_rules.column_rules(column),
                key,
            )
        )
    return [
        *definitions,
        _vector_column(vector, spec.dim),
        *_reindex_columns(),
        *postgres_rules.checks(spec.source.checks),
    ]


def _schemaless_columns(spec: TargetSpec) -> list[sql.Composable]:
    from psycopg import sql

    text = sql.SQL("{} text").format(sql.Identifier(spec.source.text_field))
    return [
        sql.SQL("id text PRIMARY KEY"),
        text,
        sql.SQL("payload jsonb"),
        _vector_column("embedding", spec.dim),
        *_reindex_columns(),
    ]


# Rows the application writes through the alias (an INSERT, a LangChain upsert) carry no bookkeeping: the
# fingerprint defaults to the target's, and this trigger fills the content hash from the text column (named
# by TG_ARGV[0]) as `reindex.fingerprint.content_hash` computes it, unless the writer set it (reindex itself
# does). On an UPDATE it does so only when the vector (TG_ARGV[1]) changed with the text: a text rewritten
# under its old vector keeps the old hash, so verify reports it stale and sync re-embeds it, never "complete".
# Where it fills the hash it marks the row `reindex_origin = 'application'`, through jsonb_populate_record:
# the function is shared by every target of the schema, and targets older than that column must still
# accept writes. The tool's own upserts (`_AS_THE_TOOL`) are left as written: bookkeeping whole, origin NULL,
# so a row the tool rewrites is its own again, even where its hash, text and vector look like a fill.
_FILL_CONTENT_HASH = """
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $body$
DECLARE
    body text;
BEGIN
    IF current_setting('reindex.writer', true) = 'reindex' THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' AND NEW.reindex_content_hash IS NOT NULL THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.reindex_content_hash IS DISTINCT FROM OLD.reindex_content_hash THEN
        RETURN NEW;
    END IF;
    body := to_jsonb(NEW) ->> TG_ARGV[0];
    IF TG_OP = 'UPDATE' AND (
        body IS NOT DISTINCT FROM (to_jsonb(OLD) ->> TG_ARGV[0])
        OR (to_jsonb(NEW) -> TG_ARGV[1]) IS NOT DISTINCT FROM (to_jsonb(OLD) -> TG_ARGV[1])
    ) THEN
        RETURN NEW;
    END IF;
    NEW.reindex_content_hash := left(encode(sha256(convert_to(coalesce(body, ''), 'UTF8')), 'hex'), 32);
    NEW := jsonb_populate_record(NEW, jsonb_build_object('reindex_origin', 'application'));
    RETURN NEW;
END
$body$
"""
# This transaction's writes are the tool's (transaction-local: an application's pooled connection never has it).
_AS_THE_TOOL = "SELECT set_config('reindex.writer', 'reindex', true)"


def _accept_application_writes(conn: Connection, layout: _Layout, spec: TargetSpec) -> None:
    """Bookkeeping columns an application's write through the alias may leave out: a default fingerprint
    and a trigger for the content hash and origin. Created after the bulk load, so the load pays no
    trigger; kept idempotent (finalize runs after every run). A target built before the origin column
    gets it here: nullable, no default, so adding it changes only the catalog."""
    from psycopg import sql

    names = {a.name for a in layout.columns}
    if not set(_RESERVED) <= names or spec.source.text_field not in names or layout.vector is None:
        return
    schema = _one(
        conn.execute(
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s",
            [layout.oid],
        ).fetchone()
    )
    function = sql.Identifier(str(schema), "reindex_fill_content_hash")  # beside the target, same owner
    if _ORIGIN not in names:
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} text").format(
                layout.ident, sql.Identifier(_ORIGIN)
            )
        )
    conn.execute(
        sql.SQL("ALTER TABLE {} ALTER COLUMN reindex_fingerprint SET DEFAULT {}").format(
            layout.ident, sql.Literal(spec.fingerprint)
        )
    )
    conn.execute(sql.SQL(_FILL_CONTENT_HASH).format(function=function))
    conn.execute(sql.SQL("DROP TRIGGER IF EXISTS reindex_content_hash ON {}").format(layout.ident))
    conn.execute(
        sql.SQL(
            "CREATE TRIGGER reindex_content_hash BEFORE INSERT OR UPDATE ON {} FOR EACH ROW"
            " EXECUTE FUNCTION {}({}, {})"
        ).format(layout.ident, function, sql.Literal(spec.source.text_field), sql.Literal(layout.vector.name))
    )


def _vector_column(name: str, dim: int) -> sql.Composable:
    from psycopg import sql

    return sql.SQL("{} vector({})").format(sql.Identifier(name), sql.Literal(int(dim)))


def _reindex_columns() -> list[sql.Composable]:
    from psycopg import sql

    required = [sql.SQL("{} text NOT NULL").format(sql.Identifier(name)) for name in _RESERVED]
    return [*required, sql.SQL("{} text").format(sql.Identifier(_ORIGIN))]


def _checked_type(conn: Connection, type_text: str) -> sql.Composable:
    """Accept a type name only if this server parses it as a type (it is then safe to splice)."""
    from psycopg import sql

    psycopg = _psycopg()
    try:
        with conn.transaction():
            found = _one(conn.execute("SELECT to_regtype(%s)", [type_text]).fetchone())
    except psycopg.Error:
        found = None
    if found is None:
        raise ConfigError(
            f"type {type_text!r} does not exist in the target database",
            hint="create the type there (or install its extension) first",
        )
    return sql.SQL(type_text)


def _write_rows(conn: Connection, layout: _Layout, rows: Rows) -> None:
    """Any layout: COPY row by row (psycopg's dumpers) into a temporary stage, then upsert from it."""
    from psycopg import sql

    binary, types = _copy_format(conn, layout)
    copy = sql.SQL("COPY reindex_stage ({}) FROM STDIN (FORMAT {})").format(
        sql.SQL(", ").join(a.ident for a in layout.columns), sql.SQL("BINARY" if binary else "TEXT")
    )
    _create_stage(conn, layout)
    with conn.cursor().copy(copy) as stream:
        stream.set_types(types)
        for values in _row_values(layout, rows):
            stream.write_row(values)
    _upsert_stage(conn, layout)


def _write_bulk(db: _Database, layout: _Layout, columns: _BulkColumns, rows: Rows, *, direct: bool) -> bool:
    """One binary COPY of the whole batch: into the target when `direct`, falling back to stage + upsert
    when a key is already there. True when that fallback was taken."""
    from psycopg import sql

    psycopg = _psycopg()
    with db.errors(), _rejections(layout.name):
        conn = db.connection()
        payload = _encoded(conn, layout.name, columns, rows)
        if direct:
            try:
                with conn.transaction():
                    _copy_payload(conn, layout.ident, payload)
                return False
            except psycopg.errors.UniqueViolation:
                pass
        with conn.transaction():
            _create_stage(conn, layout)
            _copy_payload(conn, sql.Identifier("reindex_stage"), payload)
            _upsert_stage(conn, layout)
        return direct


def _encoded(conn: Connection, target: str, columns: _BulkColumns, rows: Rows) -> pg_copy.Payload:
    docs = documents(rows.records)
    try:
        if isinstance(columns, pg_copy.Schema):
            fields = _dumped(conn, columns, docs)
            return pg_copy.encode_schema(columns, fields, rows.vectors, rows.content_hashes, rows.fingerprint)
        return pg_copy.encode(columns, docs, rows.vectors, rows.content_hashes, rows.fingerprint)
    except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 form, the server would refuse it too
        raise RowsRejected(
            f"Postgres refused rows for {target!r}: text is not valid UTF-8 ({exc.reason})",
            reason="sink_rejected:22021",
        ) from None


def _copy_payload(conn: Connection, table: sql.Identifier, payload: pg_copy.Payload) -> None:
    from psycopg import sql

    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        table, sql.SQL(", ").join(map(sql.Identifier, payload.columns))
    )
    with conn.cursor().copy(statement) as copy:
        copy.write(payload.data)


def _create_stage(conn: Connection, layout: _Layout) -> None:
    from psycopg import sql

    conn.execute(sql.SQL("CREATE TEMP TABLE reindex_stage (LIKE {}) ON COMMIT DROP").format(layout.ident))


def _schemaless_copy(layout: _Layout) -> pg_copy.Schemaless | None:
    """The bulk encoder's columns when `layout` is a schemaless target as prepare() made it, else None."""
    meta = layout.meta
    text = str(meta.get("text_field", ""))
    if not meta.get("schemaless") or layout.vector is None or layout.key.name != "id":
        return None
    found = {a.name: a.type_name[1] for a in layout.columns}
    expected = {"id": "text", text: "text", "payload": "jsonb", layout.vector.name: "vector"}
    bookkeeping = _BOOKKEEPING if _ORIGIN in found else _RESERVED  # older targets lack the origin
    if found != expected | dict.fromkeys(bookkeeping, "text"):
        return None
    carried = frozenset({str(meta.get("id_field", "")), text})
    return pg_copy.Schemaless("id", text, "payload", layout.vector.name, carried)


def _schema_copy(conn: Connection, layout: _Layout) -> pg_copy.Schema | None:
    """The bulk encoder's columns for a target with the source table's columns, when every one of them has
    a binary dumper (else None: row by row, as `_copy_format` decides)."""
    meta = layout.meta
    text = str(meta.get("text_field", ""))
    if meta.get("schemaless") or layout.vector is None:
        return None
    source = [a for a in layout.columns if a != layout.vector and a.name not in _BOOKKEEPING]
    names = {a.name for a in source}
    if (
        layout.key.name not in names
        or text not in names
        or not set(_RESERVED) <= {a.name for a in layout.columns}
    ):
        return None
    if not all(_has_dumper(conn, a.oid, binary=True) for a in source):
        return None
    return pg_copy.Schema(
        tuple(a.name for a in source), tuple(a.oid for a in source), layout.key.name, text, layout.vector.name
    )


def _dumped(conn: Connection, target: pg_copy.Schema, docs: Documents) -> list[tuple[Any, ...]]:
    """Each source column's values as their types' binary dumpers write them, column by column (None:
    NULL): one C call per row (`dump_sequence`), the same dumpers a row-by-row COPY would use."""
    from psycopg.adapt import PyFormat, Transformer
    from psycopg.pq import Format

    transformer = Transformer(conn)
    transformer.set_dumper_types(list(target.types), Format.BINARY)
    formats = [PyFormat.BINARY] * len(target.columns)
    pick = operator.itemgetter(*target.columns)
    single = len(target.columns) == 1
    rows: list[Any] = []
    for i in range(len(docs)):
        payload = docs.payload(i)
        try:
            values = (pick(payload),) if single else pick(payload)
        except KeyError:  # a column the document lacks: NULL, its key and text from the record
            fallback = {target.key: docs.ids[i], target.text: docs.texts[i]}
            values = tuple(payload.get(name, fallback.get(name)) for name in target.columns)
        rows.append(transformer.dump_sequence(values, formats))
    return list(zip(*rows, strict=True)) if rows else [() for _ in target.columns]


def _slices(count: int, writers: int) -> list[tuple[int, int]]:
    parts = min(writers, count // _SLICE_ROWS) if count >= _PARALLEL_ROWS else 1
    bounds = [count * i // max(parts, 1) for i in range(max(parts, 1) + 1)]
    return list(itertools.pairwise(bounds))


def _slice(rows: Rows, start: int, stop: int) -> Rows:
    docs = documents(rows.records)  # already columns: O(1)
    payloads = None if docs.payloads is None else docs.payloads[start:stop]
    part = Documents(docs.ids[start:stop], docs.texts[start:stop], payloads, docs.fields)
    return Rows(part, rows.vectors[start:stop], rows.content_hashes[start:stop], rows.fingerprint)


def _default_writers() -> int:
    return min(4, os.cpu_count() or 1)


def _copy_format(conn: Connection, layout: _Layout) -> tuple[bool, list[int]]:
    """Binary COPY when every column type has a binary dumper; else text, unknown types passed as text."""
    binary = all(_has_dumper(conn, a.oid, binary=True) for a in layout.columns)
    return binary, [a.oid if _has_dumper(conn, a.oid, binary=binary) else _TEXT_OID for a in layout.columns]


def _has_dumper(conn: Connection, oid: int, *, binary: bool) -> bool:
    from psycopg.pq import Format

    try:
        conn.adapters.get_dumper_by_oid(oid, Format.BINARY if binary else Format.TEXT)
    except _psycopg().ProgrammingError:
        return False
    return True


def _row_values(layout: _Layout, rows: Rows) -> Iterator[tuple[Any, ...]]:
    from psycopg.types.json import Jsonb

    is_schemaless = bool(layout.meta.get("schemaless"))
    text_field = str(layout.meta.get("text_field", ""))
    carried = {str(layout.meta.get("id_field", "")), text_field}  # already columns: not again in payload
    vector_name = layout.vector.name if layout.vector else ""
    vectors = np.ascontiguousarray(rows.vectors, dtype=np.float32)
    for i, record in enumerate(rows.records):
        fixed = {
            "reindex_fingerprint": rows.fingerprint,
            "reindex_content_hash": rows.content_hashes[i],
            _ORIGIN: None,  # the tool's own row, also when it rewrites one the application wrote
            vector_name: vectors[i],
        }
        if is_schemaless:
            fixed |= {
                layout.key.name: record.id,
                text_field: record.text,
                "payload": Jsonb(
                    {k: v for k, v in record.payload.items() if k not in carried}, dumps=pg_copy.json_dumps
                ),
            }
        else:
            fixed |= {
                layout.key.name: record.payload.get(layout.key.name, record.id),
                text_field: record.payload.get(text_field, record.text),
            }
        yield tuple(fixed[a.name] if a.name in fixed else record.payload.get(a.name) for a in layout.columns)


def _upsert_stage(conn: Connection, layout: _Layout) -> None:
    """Upsert the stage as the tool: the trigger leaves these rows' bookkeeping (origin NULL) as written."""
    conn.execute(_AS_THE_TOOL)
    conn.execute(_upsert(layout))


def _upsert(layout: _Layout) -> sql.Composed:
    from psycopg import sql

    names = sql.SQL(", ").join(a.ident for a in layout.columns)
    updates = sql.SQL(", ").join(
        sql.SQL("{} = EXCLUDED.{}").format(a.ident, a.ident) for a in layout.columns if a != layout.key
    )
    return sql.SQL(
        "INSERT INTO {} ({}) SELECT {} FROM reindex_stage ON CONFLICT ({}) DO UPDATE SET {}"
    ).format(layout.ident, names, names, layout.key.ident, updates)


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


def _register_packed_vectors(conn: Connection) -> None:
    """Dump numpy rows straight to pgvector's binary format (4-byte header, big-endian float32)."""
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    class PackedVectorDumper(Dumper):
        format = Format.BINARY
        oid = conn.adapters.types["vector"].oid

        def dump(self, obj: Any) -> bytes:
            vector = np.asarray(obj, dtype=">f4")
            return struct.pack(">HH", vector.shape[0], 0) + vector.tobytes()

    conn.adapters.register_dumper(np.ndarray, PackedVectorDumper)


def _as_vector(value: Any) -> Vectors:
    """A stored vector as float32. Vectors are read in binary: pgvector's binary loader is one `frombuffer`,
    its text loader parses every number in Python (0.7 ms per 1,536-d vector, measured)."""
    array = value.to_numpy() if hasattr(value, "to_numpy") else value
    return np.asarray(array, dtype=np.float32).copy()


def _resolve_alias(conn: Connection, alias: str) -> _ResolvedAlias:
    """Read the alias, its comment and what it serves in one statement: one snapshot, never half a swap."""
    parts = _split(alias)
    schema = parts[0] if len(parts) == 2 else None
    row = conn.execute(_ALIAS_SQL, {"name": parts[-1], "schema": schema}).fetchone()
    if row is None:
        return _ResolvedAlias(AliasInfo(alias, None), None, None, None)
    oid, relkind, comment, bases = int(row[0]), str(row[1]), row[2], row[3]
    if relkind != "v":
        return _ResolvedAlias(AliasInfo(alias, None, is_physical=True), oid, relkind, None)
    if len(bases) != 1:
        raise BackendError(
            f"view {alias!r} reads {len(bases)} tables, not one target",
            hint="point [target] alias at a view this tool manages",
        )
    base, base_schema, base_name, is_visible = bases[0]
    meta = _json_object(comment)
    shown = f"{base_schema}.{base_name}" if schema is not None or not is_visible else str(base_name)
    info = AliasInfo(alias, shown, fingerprint=meta.get("fingerprint"), model=meta.get("model"))
    return _ResolvedAlias(info, oid, relkind, int(base))


def _lock_alias(
    conn: Connection, alias: str, mode: Literal["EXCLUSIVE", "ACCESS EXCLUSIVE"] = "ACCESS EXCLUSIVE"
) -> None:
    """Serialise movers of this alias, then hold the alias itself until commit (compare-and-swap)."""
    from psycopg import sql

    parts = _split(alias)
    conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended("
        "'reindex alias ' || coalesce(%s::text, current_schema()) || '.' || %s::text, 0))",
        [parts[0] if len(parts) == 2 else None, parts[-1]],
    )
    if _regclass(conn, alias) is not None:
        # On a view this also locks the target it reads; the swap is one short transaction.
        conn.execute(sql.SQL("LOCK TABLE {} IN {} MODE").format(_identifier(alias), sql.SQL(mode)))


def _serves(conn: Connection, resolved: _ResolvedAlias, expected: str | None) -> bool:
    if expected is None or resolved.target_oid is None:
        return expected is None and resolved.target_oid is None
    return resolved.target_oid == _regclass(conn, expected)


def _adopt(
    conn: Connection, resolved: _ResolvedAlias, target: str, expected: str | None, meta: Mapping[str, Any]
) -> str:
    """First cutover onto a real table: rename it `<alias>__adopted` and put the view in its place."""
    from psycopg import sql

    alias = resolved.info.alias
    adopted = f"{alias}__adopted"
    _split(adopted)
    if resolved.relkind not in ("r", "p") or expected not in (None, alias):
        raise CutoverRefused(
            f"alias {alias!r} is a physical relation, expected {expected!r}",
            hint="only a plain table can be adopted, once, with no expected target",
        )
    if _regclass(conn, adopted) is not None:
        raise CutoverRefused(f"cannot adopt {alias!r}: {adopted!r} already exists")
    assert resolved.oid is not None
    postgres_rules.continue_numbering(conn, resolved.oid, _one_oid(conn, target))
    grants = _grants_of(conn, resolved.oid)
    conn.execute(
        sql.SQL("ALTER TABLE {} RENAME TO {}").format(_identifier(alias), sql.Identifier(_split(adopted)[-1]))
    )
    _replace_view(conn, alias, target, meta, grants, drop=False)
    return adopted


def _replace_view(
    conn: Connection,
    alias: str,
    target: str,
    meta: Mapping[str, Any],
    grants: list[tuple[str | None, str, bool]],
    *,
    drop: bool,
) -> None:
    """DROP + CREATE, not CREATE OR REPLACE: that refuses a vector(1536) → vector(384) change."""
    from psycopg import sql

    view = _identifier(alias)
    if drop:
        conn.execute(sql.SQL("DROP VIEW {}").format(view))
    conn.execute(sql.SQL("CREATE VIEW {} AS SELECT * FROM {}").format(view, _identifier(target)))
    _grant(conn, view, grants)
    conn.execute(
        sql.SQL("COMMENT ON VIEW {} IS {}").format(view, sql.Literal(json.dumps(dict(meta), default=str)))
    )


def _grants_of(conn: Connection, oid: int) -> list[tuple[str | None, str, bool]]:
    return [
        (role, str(privilege), bool(grantable))
        for role, privilege, grantable in conn.execute(_GRANTS_SQL, [oid]).fetchall()
    ]


def _grant(conn: Connection, relation: sql.Identifier, grants: list[tuple[str | None, str, bool]]) -> None:
    from psycopg import sql

    for role, privilege, grantable in grants:
        if privilege not in _PRIVILEGES:
            continue
        grantee = sql.SQL("PUBLIC") if role is None else sql.Identifier(role)
        option = sql.SQL(" WITH GRANT OPTION" if grantable else "")
        conn.execute(sql.SQL("GRANT {} ON {} TO {}{}").format(sql.SQL(privilege), relation, grantee, option))
