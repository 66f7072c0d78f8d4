"""The pgvector sink: targets are tables `<alias>__<fingerprint8>`, the alias is a view over one of them.

Cutover is one compare-and-swap transaction: lock the view, re-read what it serves, DROP VIEW + CREATE VIEW
under `SET LOCAL lock_timeout`, retried with backoff (the view statements are in alias.py).
"""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from pydantic import Field

from reindex import crashpoints
from reindex.columns import documents
from reindex.errors import BackendError, ConfigError, CutoverRefused
from reindex.offers import TargetOffer
from reindex.ports import (
    AliasInfo,
    Distance,
    IndexEntry,
    Loss,
    Precision,
    Privilege,
    Rows,
    StoragePlan,
    TargetInfo,
    TargetSection,
    TargetSpec,
    Vectors,
)
from reindex_adapters.postgres import fidelity, offers, privileges
from reindex_adapters.postgres import rules as postgres_rules
from reindex_adapters.postgres.alias import (
    DEPENDENT_VIEWS_SQL,
    TARGETS_SQL,
    adopt,
    grant,
    grants_of,
    hold,
    replace_view,
    resolve_alias,
    serves,
)
from reindex_adapters.postgres.catalog import (
    Layout,
    json_object,
    one_oid,
    read_layout,
    regclass,
    server_identity,
)
from reindex_adapters.postgres.connection import Database, DsnConfig, first_value, identifier, split_name
from reindex_adapters.postgres.ddl import (
    AS_THE_TOOL,
    HNSW_SQL,
    INDEX_SETTINGS_SQL,
    accept_application_writes,
    check_same_target,
    create_target,
)
from reindex_adapters.postgres.kept_writes import keep_writes, writes_of
from reindex_adapters.postgres.reads import TargetReads
from reindex_adapters.postgres.storage import Kind, check_server, choose
from reindex_adapters.postgres.storage import plan as plan_storage
from reindex_adapters.postgres.write import (
    BulkColumns,
    Writers,
    _slices,
    default_writers,
    rejections,
    schema_copy,
    schemaless_copy,
    slice,
    write_bulk,
    write_rows,
)

if TYPE_CHECKING:
    from psycopg import sql

    from reindex_adapters.postgres.connection import Connection

_T = TypeVar("_T")
# `[target] mode` -> the sink for it, where it is not this module's: side_by_side.py registers "column" as it
# is imported (the package's __init__ imports it), so this module imports none of its subclasses
MODES: dict[str, type[PgvectorSink]] = {}


SCRATCH_PREFIX = "reindex_rehearsal_"
_SCRATCHES_SQL = r"""
SELECT n.nspname, c.relname, pg_table_is_visible(c.oid) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND c.relname LIKE 'reindex\_rehearsal\_%' AND pg_has_role(c.relowner, 'USAGE')"""


class PgvectorSink:
    """Targets are tables `<alias>__<fingerprint8>`; the alias is a view `SELECT * FROM <target>`."""

    offer: ClassVar[TargetOffer] = offers.TARGET  # what `reindex init` writes for it

    shareable = True  # several processes may open it at once (reindex.run.processes)

    holds_writers = True  # move_alias's settle runs under an EXCLUSIVE lock on the view that writers wait on

    # False: a target is a table of its own and the alias a view over it; True (PgvectorColumnSink): a target
    # is a column of the alias's own table, so a source reading that table sees every write, before and after
    serves_in_place = False

    class Config(DsnConfig, TargetSection):
        kind: Literal["pgvector"]
        lock_timeout_ms: int = Field(default=2000, ge=1)
        swap_attempts: int = Field(default=5, ge=1)
        index: Literal["hnsw", "none"] = "hnsw"
        maintenance_work_mem: str = "1GB"
        hnsw_m: int = Field(default=16, ge=2)
        hnsw_ef_construction: int = Field(default=64, ge=4)
        writers: int = Field(default_factory=lambda: default_writers(), ge=1)
        # the vector column's type (adapters/postgres/storage.py); None: vector up to 2,000 dimensions,
        # halfvec above when an index is built
        storage: Kind | None = None
        full_vector: bool = False  # with storage "bit": keep the full vector too, re-rank searches on it
        # "table": each target a table of its own, the alias a view over one (0.2); "column": each target a
        # column of the alias's own table, the flip a rename of two columns (adapters/postgres/side_by_side.py)
        mode: Literal["table", "column"] = "table"
        # what the application's table has that the first cutover may drop (adapters/postgres/fidelity.py)
        accept: list[fidelity.Kept] = Field(default_factory=list)

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
        storage: Kind | None = None,
        full_vector: bool = False,
        accept: Sequence[str] = (),
    ) -> None:
        self._db = Database(dsn, "target", vectors=True)
        self.lock_timeout_ms = lock_timeout_ms
        self.swap_attempts = swap_attempts
        self.build_index = build_index
        self.maintenance_work_mem = maintenance_work_mem
        self.hnsw = (hnsw_m, hnsw_ef_construction)
        self.writers = writers or default_writers()
        self.storage = storage
        self.full_vector = full_vector
        self.accept = tuple(accept)
        self.index_seconds: float | None = None  # the last finalize's CREATE INDEX; None: none built
        self._layouts: dict[str, Layout] = {}
        self._reads = TargetReads(self._db, self._layout)  # the target's own layout: a subclass's
        self._identity: str | None = None
        self._pool: Writers | None = None
        self._conflicted: set[str] = set()  # targets whose last direct COPY met keys already there

    @classmethod
    def from_config(cls, config: Config) -> PgvectorSink:
        if cls is PgvectorSink and config.mode in MODES:  # the package registers the other modes' sinks
            return MODES[config.mode].from_config(config)
        return cls(
            config.resolved_dsn("target"),
            lock_timeout_ms=config.lock_timeout_ms,
            swap_attempts=config.swap_attempts,
            build_index=config.index == "hnsw",
            maintenance_work_mem=config.maintenance_work_mem,
            hnsw_m=config.hnsw_m,
            hnsw_ef_construction=config.hnsw_ef_construction,
            writers=config.writers,
            storage=config.storage,
            full_vector=config.full_vector,
            accept=config.accept,
        )

    def identity(self) -> str:
        """`pgvector:<system identifier>/<database>/<schema>`: where unqualified targets are created."""
        if self._identity is None:
            with self._db.errors():
                conn = self._db.connection()
                schema = first_value(conn.execute("SELECT current_schema()").fetchone())
                self._identity = f"pgvector:{server_identity(conn)}/{schema}"
        return self._identity

    def plan_storage(self, dim: int, distance: Distance) -> StoragePlan:
        """The column type and index a target of `dim` gets; ConfigError where pgvector (this server's
        version of it) cannot store or index it."""
        storage = choose(self.storage, self.full_vector, dim, index=self.build_index)
        with self._db.errors():
            check_server(self._db.connection(), storage)
        return plan_storage(storage, dim, distance, self.build_index, self.hnsw)

    def precision(self, target: str) -> Precision:
        return self._layout(target).storage.precision

    def losses(self, spec: TargetSpec) -> list[Loss]:
        """What the application's table named like the alias has that adopting it would not keep (the view
        put in its place reads a new table that has only its columns, their rules, its key and grants)."""
        identifier(spec.alias)
        with self._db.errors():
            conn = self._db.connection()
            return self._losses(conn, spec.alias, spec.source.id_field, spec.source.vector_field)

    def _losses(self, conn: Connection, alias: str, id_column: str, vector: str | None) -> list[Loss]:
        resolved = resolve_alias(conn, alias)
        if not resolved.info.is_physical or resolved.oid is None:
            return []
        return fidelity.losses(conn, resolved.oid, id_column, vector, self.accept)

    def missing_privileges(self, spec: TargetSpec) -> list[Privilege]:
        """What this role lacks for `spec` (privileges.py): checked by `plan`, and by `prepare` before a
        document is embedded."""
        with self._db.errors():
            conn = self._db.connection()
            return privileges.missing(
                conn, identifier(spec.alias).as_string(conn), owns_table=self.serves_in_place
            )

    def refuse_missing_privileges(self, spec: TargetSpec) -> None:
        lacking = self.missing_privileges(spec)
        if lacking:
            raise ConfigError(
                "missing privileges: " + "; ".join(p.need for p in lacking),
                hint="run as the table's owner, or: " + "; ".join(p.fix for p in lacking),
            )

    def prepare(self, spec: TargetSpec) -> None:
        """Create the target, or check the one there is for `spec`; first refuse, before anything is
        built, what this role may not do, and a table behind the alias that has what its adoption would not
        keep, unless accepted."""
        identifier(spec.name)
        self._layouts.pop(spec.name, None)
        storage = choose(self.storage, self.full_vector, spec.dim, index=self.build_index)
        self.refuse_missing_privileges(spec)
        fidelity.refuse_unaccepted(self.losses(spec), spec.alias)
        with self._db.transaction() as conn:
            layout = read_layout(conn, spec.name)
            if layout is None:
                check_server(conn, storage)
                create_target(conn, spec, storage)
            else:
                check_same_target(spec, layout, storage)

    def scratch(self, spec: TargetSpec, token: str) -> TargetSpec | None:
        """A table of the target's shape in its schema, named `reindex_rehearsal_<token>`: created plain (the
        application's policies, triggers and grants come onto a target only at its cutover)."""
        return replace(spec, name=".".join([*split_name(spec.name)[:-1], f"{SCRATCH_PREFIX}{token}"]))

    def scratches(self) -> list[str]:
        with self._db.errors():
            rows = self._db.connection().execute(_SCRATCHES_SQL).fetchall()
        return [name if visible else f"{schema}.{name}" for schema, name, visible in rows]  # as `targets`

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
            with self._db.transaction() as conn, rejections(target):
                write_rows(conn, layout, rows)
            return
        direct = target not in self._conflicted
        slices = _slices(len(rows.records), self.writers)
        if len(slices) == 1:
            conflicted = write_bulk(self._db, layout, columns, rows, direct=direct)
        else:
            if self._pool is None:
                self._pool = Writers(self._db.dsn, self.writers)
            whole = Rows(documents(rows.records), rows.vectors, rows.content_hashes, rows.fingerprint)
            conflicted = self._pool.write(layout, columns, [slice(whole, *s) for s in slices], direct=direct)
        if conflicted:
            self._conflicted.add(target)  # a replay: its next batch likely overlaps too, upsert it at once
        else:
            self._conflicted.discard(target)

    def _bulk_columns(self, layout: Layout) -> BulkColumns | None:
        schemaless = schemaless_copy(layout)
        if schemaless is not None:
            return schemaless
        with self._db.errors():
            return schema_copy(self._db.connection(), layout)

    def delete(self, target: str, ids: Sequence[str]) -> None:
        from psycopg import sql

        layout = self._layout(target)
        statement = sql.SQL("DELETE FROM {} WHERE {} = ANY(%s::{}[])").format(
            layout.ident, layout.key.ident, layout.key.cast
        )
        with self._db.transaction() as conn:
            conn.execute(AS_THE_TOOL)  # the tool's: a rollback does not carry it (kept_writes.py)
            conn.execute(statement, [list(ids)])

    def finalize(self, spec: TargetSpec) -> None:
        """Build the HNSW index after the load, ANALYZE, carry the live table's grants over, and let the
        application write through the alias once it serves this target (`accept_application_writes`)."""
        from psycopg import sql

        layout = self._layout(spec.name)
        self.index_seconds = None
        if self.build_index and layout.vector is not None:
            self.index_seconds = self._build_index(layout, spec.dim, spec.source.distance)
        with self._db.errors():
            conn = self._db.connection()
            conn.execute(sql.SQL("ANALYZE {}").format(layout.ident))
            live = self._live_table(conn, spec.alias)
            if live is not None and live != layout.oid:
                grant(conn, layout.ident, grants_of(conn, live))
            with conn.transaction():
                accept_application_writes(conn, layout, spec)
                postgres_rules.continue_numbering(conn, None, layout.oid, scan=True)
        self._layouts.pop(spec.name, None)  # it may have gained the origin column

    def describe(self, target: str) -> TargetInfo | None:
        from psycopg import sql

        identifier(target)
        with self._db.errors():
            conn = self._db.connection()
            layout = read_layout(conn, target)
            if layout is None:
                return None
            count = int(
                first_value(conn.execute(sql.SQL("SELECT count(*) FROM {}").format(layout.ident)).fetchone())
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

    def alias(self, alias: str) -> AliasInfo:
        identifier(alias)
        with self._db.errors():
            return resolve_alias(self._db.connection(), alias).info

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
        identifier(alias)
        identifier(target)
        previous = retry_locked(self, lambda: self._swap(alias, target, expected, meta, settle), alias)
        with self._db.errors():
            self._read_back(alias, target)
        return previous

    def unserved(self, alias: str, served: str, replaced: str) -> list[str]:
        """Documents of the replaced target's table that the served one lacks or holds no vector for."""
        from psycopg import sql

        now, before = self._layout(served), self._layout(replaced)
        if before.vector is None:
            return []
        vector = sql.SQL("n.{}").format(now.vector.ident) if now.vector is not None else sql.SQL("NULL")
        query = sql.SQL(
            "SELECT b.{bk}::text FROM {b} AS b LEFT JOIN {n} AS n ON n.{nk}::text = b.{bk}::text"
            " WHERE b.{bv} IS NOT NULL AND {nv} IS NULL ORDER BY 1"
        ).format(
            bk=before.key.ident,
            b=before.ident,
            n=now.ident,
            nk=now.key.ident,
            bv=before.vector.ident,
            nv=vector,
        )
        with self._db.errors():
            return [str(row[0]) for row in self._db.connection().execute(query).fetchall()]

    def targets(self, alias: str) -> list[str]:
        parts = split_name(alias)
        schema = parts[0] if len(parts) == 2 else None
        pattern = re.sub(r"([\\%_])", r"\\\1", parts[-1]) + r"\_\_%"
        with self._db.errors():
            rows = self._db.connection().execute(TARGETS_SQL, [pattern, schema, schema]).fetchall()
        ordered = sorted(rows, key=lambda row: (str(json_object(row[3]).get("created_at", "")), row[0]))
        return [f"{schema}.{relname}" if schema else relname for _, _, relname, _ in ordered]

    def drop(self, target: str) -> None:
        from psycopg import sql

        identifier(target)
        self._layouts.pop(target, None)
        with self._db.transaction() as conn:
            oid = regclass(conn, target)
            if oid is None:
                return
            views = [row[0] for row in conn.execute(DEPENDENT_VIEWS_SQL, [oid, oid]).fetchall()]
            if views:
                raise CutoverRefused(
                    f"target {target!r} is still served by {', '.join(views)}",
                    hint="move the alias to another target before pruning this one",
                )
            conn.execute(sql.SQL("DROP TABLE {}").format(identifier(target)))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self._db.close()

    # reads (reads.py) --------------------------------------------------------------------------------------

    def scan_index(self, target: str, dim: int) -> Iterator[IndexEntry]:
        return self._reads.scan_index(target, dim)

    def fetch(self, target: str, ids: Sequence[str]) -> dict[str, Vectors]:
        return self._reads.fetch(target, ids)

    def fetch_matching(self, target: str, expected: Mapping[str, str]) -> dict[str, Vectors]:
        return self._reads.fetch_matching(target, expected)

    def scan_vectors(self, target: str, batch: int = 5000) -> Iterator[tuple[list[str], Vectors]]:
        return self._reads.scan_vectors(target, batch)

    def search(self, target: str, vectors: Vectors, k: int) -> list[list[str]]:
        return self._reads.search(target, vectors, k)

    def distance(self, target: str) -> Distance:
        return self._reads.distance(target)

    def _layout(self, target: str) -> Layout:
        if target not in self._layouts:
            identifier(target)
            with self._db.errors():
                layout = read_layout(self._db.connection(), target)
            if layout is None:
                raise BackendError(f"target table {target!r} does not exist", hint="run prepare first")
            self._layouts[target] = layout
        return self._layouts[target]

    def hnsw_method(self, layout: Layout, dim: int, distance: Distance) -> sql.Composable:
        """`USING hnsw (<column> <opclass>) WITH (...)` for the layout's vector column."""
        from psycopg import sql

        assert layout.vector is not None
        return sql.SQL("USING hnsw ({}) WITH (m = {}, ef_construction = {})").format(
            layout.storage.index_target(layout.vector.ident, dim, distance),
            sql.Literal(self.hnsw[0]),
            sql.Literal(self.hnsw[1]),
        )

    def _build_index(self, layout: Layout, dim: int, distance: Distance) -> float | None:
        """CREATE INDEX with `maintenance_work_mem` and parallel workers for the cores; its wall seconds,
        commit included, or None when the index was already there (a resumed finalize)."""
        from psycopg import sql

        assert layout.vector is not None
        statement = sql.SQL("CREATE INDEX ON {} {}").format(
            layout.ident, self.hnsw_method(layout, dim, distance)
        )
        with self._db.transaction() as conn:
            if conn.execute(HNSW_SQL, [layout.oid]).fetchone() is not None:
                return None
            conn.execute(INDEX_SETTINGS_SQL, [self.maintenance_work_mem, (os.cpu_count() or 1) - 1])
            started = time.perf_counter()
            conn.execute(statement)
        return time.perf_counter() - started

    def _live_table(self, conn: Connection, alias: str) -> int | None:
        resolved = resolve_alias(conn, alias)
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
            hold(conn, alias, self.lock_timeout_ms, settle)
            if regclass(conn, target) is None:
                raise CutoverRefused(f"target {target!r} does not exist")
            resolved = resolve_alias(conn, alias)  # re-read under the lock: what it serves now
            if resolved.info.is_physical:
                # re-read under the lock: what the table has now, not what it had when `run` began
                built = read_layout(conn, target)
                meta_of = built.meta if built is not None else {}
                found = self._losses(conn, alias, str(meta_of.get("id_field") or "id"), _vector_of(meta_of))
                fidelity.refuse_unaccepted(found, alias)
                previous = adopt(conn, resolved, target, expected, meta)
                writes_of(conn, alias, one_oid(conn, target)).start(conn)
                crashpoints.crash_if_armed("cutover_before_commit")
                return previous
            if not serves(conn, resolved, expected):
                raise CutoverRefused(
                    f"alias {alias!r} serves {resolved.info.target!r}, expected {expected!r}",
                    hint="another cutover moved it meanwhile; check `reindex status`",
                )
            target_oid = one_oid(conn, target)
            if resolved.target_oid is not None:
                live = writes_of(conn, alias, resolved.target_oid)
                if meta.get("action") == "rollback" and live.started(conn):
                    keep_writes(conn, live, read_layout(conn, target))  # kept_writes.py
                live.stop(conn)
            writes_of(conn, alias, target_oid).start(conn)
            postgres_rules.continue_numbering(conn, resolved.target_oid, target_oid)
            grants = grants_of(conn, resolved.oid) if resolved.oid is not None else []
            replace_view(conn, alias, target, meta, grants, drop=resolved.oid is not None)
            crashpoints.crash_if_armed("cutover_before_commit")
            return expected

    def _read_back(self, alias: str, target: str) -> None:
        conn = self._db.connection()
        if resolve_alias(conn, alias).target_oid != regclass(conn, target):
            raise BackendError(f"alias {alias!r} does not serve {target!r} after the swap")


def retry_locked(sink: PgvectorSink, attempt: Callable[[], _T], alias: str) -> _T:
    """Run one short transaction that takes the alias's lock under `lock_timeout`, retried with jittered
    backoff up to `swap_attempts` times; then refused (nothing changed, the old target still live)."""
    import psycopg

    with sink._db.errors():
        for tried in range(1, sink.swap_attempts + 1):
            try:
                return attempt()
            except psycopg.errors.LockNotAvailable:
                if tried < sink.swap_attempts:
                    time.sleep(min(1.0, 0.05 * 2**tried) * random.uniform(0.5, 1.5))
    raise CutoverRefused(
        f"could not lock alias {alias!r} within {sink.swap_attempts} x {sink.lock_timeout_ms} ms",
        hint="a long-running reader holds it; the old target is still live, retry later",
    )


def _vector_of(meta: Mapping[str, Any]) -> str | None:
    """The source's vector column a target was built from, as its comment records it."""
    name = meta.get("vector_column")  # the source's own name for it, where the source has columns
    return name if isinstance(name, str) else None
