"""Moving a 0.2 installation back into the application's table, for `mode = "column"`.

0.2's first cutover renamed the application's table `<alias>__adopted` and put a view `<alias>` over a
target table of the tool's in its place; the application has written through the view since, and its row
security, constraints, indexes, triggers, grants, foreign keys and views stayed on the renamed table.
`reindex cutover` with `mode = "column"` moves it back, the way a shadow-table tool swaps (pg-osc), with
the application writing on until the last step:

1. a trigger on the served target table records the key of every row written from then on;
2. the adopted table gets the served vectors in a column of their own, `<vector>__<suffix>`, and the served
   table's rows as they are now (inserted, changed, deleted through the view since 0.2's cutover), with its
   own triggers off (they fired where the application wrote); the text hashes of the tool's vectors go in
   a bookkeeping table of their own, as a column target's do (column_targets.py);
3. that column's HNSW index is built CONCURRENTLY;

then, in one transaction under `lock_timeout`, the rows recorded since step 2 are carried again, the view
and the target table are dropped, the adopted table takes the alias's name back, and its vector columns
flip as in column mode: the served vectors become `<vector>`, the application's own from before 0.2's
cutover `<vector>__adopted` (the target `<alias>__adopted`, the way back). Each step before the last is
idempotent: a run killed anywhere is finished by running `cutover` again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reindex import crashpoints
from reindex.errors import BackendError, ConfigError, CutoverRefused
from reindex_adapters.postgres import column_index, column_write, dependents, fidelity
from reindex_adapters.postgres import column_targets as columns
from reindex_adapters.postgres import rules as postgres_rules
from reindex_adapters.postgres.alias import DEPENDENT_VIEWS_SQL, grant, grants_of, hold, resolve_alias
from reindex_adapters.postgres.catalog import (
    ORIGIN,
    RESERVED,
    _comment,
    column_type,
    qualified_name,
    read_layout,
    regclass,
    writable_columns,
)
from reindex_adapters.postgres.change_log import ChangeLog
from reindex_adapters.postgres.connection import identifier, split_name
from reindex_adapters.postgres.kept_writes import writes_of
from reindex_adapters.postgres.sink import PgvectorSink, retry_locked

if TYPE_CHECKING:
    from psycopg import sql

    from reindex_adapters.postgres.catalog import Layout
    from reindex_adapters.postgres.connection import Connection


# Every table named like a target of the alias (`docs__%`), in its schema.
_NAMED_LIKE_SQL = r"""
SELECT c.relname::text FROM pg_class c
WHERE c.relnamespace = quote_ident(%s)::regnamespace AND c.relkind IN ('r', 'p') AND c.relname LIKE %s ESCAPE '\'"""
_USER_TRIGGERS_SQL = """
SELECT tgname::text, tgenabled::text FROM pg_trigger
WHERE tgrelid = %s::oid AND NOT tgisinternal AND tgenabled <> 'D' ORDER BY 1"""
_ENABLE = {"O": "ENABLE TRIGGER", "A": "ENABLE ALWAYS TRIGGER", "R": "ENABLE REPLICA TRIGGER"}


@dataclass(frozen=True, slots=True)
class Restore:
    """A 0.2 view over a target table, and the application's table renamed beside it."""

    alias: str
    schema: str  # the alias's schema: the log, function and bookkeeping table go there
    view_oid: int
    served: str  # the target table the view reads (0.2's target)
    served_oid: int
    table: str  # `<alias>__adopted`
    table_oid: int
    meta: dict[str, Any]  # the served target's comment (fingerprint, model, id and text fields, storage)
    moved: dict[str, Any]  # the view's comment: what 0.2's move recorded

    @property
    def key(self) -> str:
        return str(self.meta.get("id_field") or "id")

    @property
    def vector(self) -> str:
        return str(self.meta.get("vector_column") or "embedding")

    @property
    def column(self) -> str:
        """The served vectors' column in the adopted table until the flip: `<vector>__<suffix>`."""
        return columns.unserved_name(self.vector, self.alias, self.served)

    def beside(self, suffix: str) -> sql.Identifier:
        """An object of the tool's next to the alias, not named like a target (`docs_reindex_restore_log`)."""
        from psycopg import sql

        return sql.Identifier(self.schema, f"{split_name(self.alias)[-1]}_reindex_restore_{suffix}")

    @property
    def changes(self) -> ChangeLog:
        """The keys written through the view since step 1 (change_log.py)."""
        return ChangeLog(
            identifier(self.served), self.key, self.beside("log"), self.beside("note"), "reindex_restore"
        )

    @property
    def staged_book(self) -> sql.Identifier:
        """The text hashes until the flip names them after the served target (its table's name until then)."""
        return self.beside("book")

    @property
    def book(self) -> str:
        return columns.bookkeeping_table(self.alias, self.served)


def find(conn: Connection, alias: str) -> Restore | None:
    """The 0.2 installation behind `alias`, or None where the alias is not a view this tool made; a
    ConfigError where one is found that cannot be moved back whole."""
    resolved = resolve_alias(conn, alias)
    if resolved.relkind != "v" or resolved.target_oid is None or resolved.oid is None:
        return None
    meta = _comment(conn, resolved.target_oid)
    adopted = f"{alias}__{columns.ADOPTED}"
    adopted_oid = regclass(conn, adopted)
    if resolved.target_oid == adopted_oid:
        meta = {}  # rolled back to the application's own table: nothing of the tool's to carry
    elif "fingerprint" not in meta:
        return None
    served = str(resolved.info.target)
    if adopted_oid is None:
        raise ConfigError(
            f"alias {alias!r} is a view over {served!r} (0.2's mode table), and the application's table"
            f" {adopted!r} is gone (pruned): there is no table to move back into",
            hint='keep mode = "table" for this alias',
        )
    if meta.get("storage") == "bit":
        raise ConfigError(
            f"target {served!r} stores bit vectors, which mode column does not",
            hint='keep mode = "table" for this alias, or cut over to a vector or halfvec target first',
        )
    schema = split_name(qualified_name(conn, resolved.oid))[0]
    pattern = re.sub(r"([\\%_])", r"\\\1", split_name(alias)[-1]) + r"\_\_%"
    named = conn.execute(_NAMED_LIKE_SQL, [schema, pattern]).fetchall()
    others = sorted({str(n) for (n,) in named} - {split_name(served)[-1], split_name(adopted)[-1]})
    if others:
        raise ConfigError(
            f"alias {alias!r} has other 0.2 targets, {', '.join(others)}: moving back into {adopted!r} would"
            " leave them behind",
            hint='drop them first (DROP TABLE), or keep mode = "table" for this alias',
        )
    over = [str(row[0]) for row in conn.execute(DEPENDENT_VIEWS_SQL, [resolved.oid, resolved.oid])]
    if over:
        raise ConfigError(
            f"views over the alias view {alias!r} would be dropped with it: {', '.join(over)}",
            hint=f"define them over {adopted!r} instead, then run cutover again",
        )
    return Restore(
        alias,
        schema,
        resolved.oid,
        served,
        resolved.target_oid,
        adopted,
        adopted_oid,
        meta,
        _comment(conn, resolved.oid),
    )


def restore(sink: PgvectorSink, found: Restore) -> None:
    """Steps 1-3 with the application writing on, then the move in one short transaction (retried)."""
    with sink._db.errors():
        conn = sink._db.connection()
        losses = fidelity.losses(conn, found.table_oid, found.key, found.vector, sink.accept, column=True)
    fidelity.refuse_unaccepted(losses, found.alias, column=True)
    if found.meta:
        retry_locked(sink, lambda: _record_writes(sink, found), found.alias)
        with sink._db.transaction() as conn:
            _carry(conn, found, logged=False)
        _index(sink, found)
    retry_locked(sink, lambda: _move(sink, found), found.alias)


def _record_writes(sink: PgvectorSink, found: Restore) -> None:
    """Step 1 and the column of step 2, in one short transaction: from its commit on, every write through
    the view leaves its key in the log (a writer that began earlier finishes before the trigger exists)."""
    from psycopg import sql

    with sink._db.transaction() as conn:
        conn.execute("SELECT set_config('lock_timeout', %s, true)", [f"{sink.lock_timeout_ms}ms"])
        key_type, vector_type = _types(conn, found)
        found.changes.start(conn, key_type)
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                identifier(found.table), sql.Identifier(found.column), sql.SQL(vector_type)
            )
        )
        # marked as the tool's (what fidelity.py counts as the application's columns leaves it out)
        columns.mark(conn, identifier(found.table), found.column, found.served, False, {})
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (id {} PRIMARY KEY, content_hash text NOT NULL,"
                " vector_digest text NOT NULL)"
            ).format(found.staged_book, sql.SQL(key_type))
        )


def _carry(conn: Connection, found: Restore, *, logged: bool) -> None:
    """The served table's rows into the adopted one (all of them, or those the log names), its vectors into
    the column of step 2, the tool's text hashes into the bookkeeping table; the adopted table's own
    triggers are off meanwhile, and on again as they were."""
    from psycopg import sql

    served, table = read_layout(conn, found.served), identifier(found.table)
    assert served is not None and served.vector is not None
    present = {a.name for a in served.columns}
    writable = [
        (name, always)
        for name, always in writable_columns(conn, found.table_oid)
        if name in present and name not in (found.vector, found.column, *RESERVED, ORIGIN)
    ]
    names = [name for name, _ in writable]
    if found.key not in names:
        raise BackendError(f"{found.table!r} has no column {found.key!r} to match {found.served!r} by")
    k = sql.Identifier(found.key)
    only = sql.SQL(" AND t.{} IN {}").format(k, found.changes.keys()) if logged else sql.SQL("")
    gone = sql.SQL(" AND a.{} IN {}").format(k, found.changes.keys()) if logged else sql.SQL("")
    settable = [
        sql.SQL("{} = t.{}").format(sql.Identifier(n), sql.Identifier(n)) for n, a in writable if not a
    ]
    vector = sql.Identifier(found.column)
    triggers = conn.execute(_USER_TRIGGERS_SQL, [found.table_oid]).fetchall()
    for name, _ in triggers:
        conn.execute(sql.SQL("ALTER TABLE {} DISABLE TRIGGER {}").format(table, sql.Identifier(name)))
    conn.execute(
        sql.SQL("DELETE FROM {} AS a WHERE NOT EXISTS (SELECT 1 FROM {} AS t WHERE t.{k} = a.{k}){}").format(
            table, served.ident, gone, k=k
        )
    )
    conn.execute(
        sql.SQL("UPDATE {} AS a SET {} FROM {} AS t WHERE a.{k} = t.{k}{}").format(
            table,
            sql.SQL(", ").join([*settable, sql.SQL("{} = t.{}").format(vector, served.vector.ident)]),
            served.ident,
            only,
            k=k,
        )
    )
    listed = sql.SQL(", ").join(sql.Identifier(n) for n in names)
    conn.execute(
        sql.SQL(
            "INSERT INTO {} ({}, {}) OVERRIDING SYSTEM VALUE SELECT {}, t.{} FROM {} AS t"
            " WHERE NOT EXISTS (SELECT 1 FROM {} AS a WHERE a.{k} = t.{k}){}"
        ).format(
            table,
            listed,
            vector,
            sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(n)) for n in names),
            served.vector.ident,
            served.ident,
            table,
            only,
            k=k,
        )
    )
    for name, state in triggers:
        conn.execute(
            sql.SQL("ALTER TABLE {} {} {}").format(table, sql.SQL(_ENABLE[state]), sql.Identifier(name))
        )
    _book(conn, found, served, logged=logged)


def _book(conn: Connection, found: Restore, served: Layout, *, logged: bool) -> None:
    """The text hash and vector digest of every vector the tool wrote (not those the application wrote
    through the view: verify checks those, as it does any vector without a hash)."""
    from psycopg import sql

    assert served.vector is not None
    book, k = found.staged_book, sql.Identifier(found.key)
    if logged:
        conn.execute(sql.SQL("DELETE FROM {} WHERE id IN {}").format(book, found.changes.keys()))
    else:
        conn.execute(sql.SQL("TRUNCATE {}").format(book))
    mine = (
        sql.SQL(" AND t.{} IS DISTINCT FROM 'application'").format(sql.Identifier(ORIGIN))
        if any(a.name == ORIGIN for a in served.columns)
        else sql.SQL("")
    )
    only = sql.SQL(" AND t.{} IN {}").format(k, found.changes.keys()) if logged else sql.SQL("")
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, content_hash, vector_digest) SELECT t.{}, t.reindex_content_hash, {} FROM {} AS t"
            " WHERE t.reindex_content_hash IS NOT NULL AND t.{} IS NOT NULL{}{}"
        ).format(
            book,
            k,
            column_write.digest(served, sql.SQL("t.{}").format(served.vector.ident)),
            served.ident,
            served.vector.ident,
            mine,
            only,
        )
    )


def _index(sink: PgvectorSink, found: Restore) -> None:
    """Step 3: the served vectors' HNSW index on their column of the adopted table, CONCURRENTLY."""
    from dataclasses import replace

    with sink._db.errors():
        conn = sink._db.connection()
        table = read_layout(conn, found.table)
        assert table is not None
        column = next(a for a in table.columns if a.name == found.column)
        layout = replace(table, vector=column, meta=found.meta)
        index = f"{columns.split_last(found.served)[:57]}_hnsw"
        dim = int(found.meta.get("dim") or column.typmod)
        method = sink.hnsw_method(layout, dim, found.meta.get("distance") or "cosine")
        if sink.build_index:
            column_index.build_concurrently(conn, layout, index, method, sink.maintenance_work_mem)


def _move(sink: PgvectorSink, found: Restore) -> None:
    """The last step, in one transaction with the alias held: carry what was written since the copy, drop
    the view and the target table, give the adopted table its name back, flip its vector columns."""
    from psycopg import sql

    conn = sink._db.connection()
    with conn.transaction():
        hold(conn, found.alias, sink.lock_timeout_ms, None)  # the view and the table it reads
        again = find(conn, found.alias)
        if again is None or again.served_oid != found.served_oid:
            raise CutoverRefused(
                f"alias {found.alias!r} changed while it was moved back into {found.table!r}",
                hint="check `reindex status`, then run cutover again",
            )
        table = identifier(found.table)
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table))
        grants = grants_of(conn, found.view_oid)
        conn.execute(sql.SQL("DROP VIEW {}").format(identifier(found.alias)))
        writes_of(conn, found.alias, found.served_oid).stop(conn)  # the table mode's log of the live target
        if found.meta:
            conn.execute(sql.SQL("ANALYZE {}").format(found.changes.log))  # known small: index lookups
            _carry(conn, found, logged=True)
            postgres_rules.continue_numbering(conn, found.served_oid, found.table_oid, scan=True)
            found.changes.stop(conn)
            conn.execute(sql.SQL("DROP TABLE {}").format(identifier(found.served)))
        conn.execute(
            sql.SQL("ALTER TABLE {} RENAME TO {}").format(table, sql.Identifier(split_name(found.alias)[-1]))
        )
        table = identifier(found.alias)
        grant(conn, table, grants)  # what was granted on the view since 0.2's cutover
        if found.meta:
            _flip_columns(conn, found, table)
        crashpoints.crash_if_armed("cutover_before_commit")


def _flip_columns(conn: Connection, found: Restore, table: sql.Identifier) -> None:
    """As a column-mode flip: the application's own vectors aside as `<alias>__adopted`, the served ones
    into `<vector>`, the application's views over it defined again; the bookkeeping table takes the served
    target's name (its table was just dropped)."""
    import json

    from psycopg import sql

    rename = sql.SQL("ALTER TABLE {} RENAME COLUMN {} TO {}")
    views: list[dependents.BoundView] = []
    if columns.column_exists(conn, found.table_oid, found.vector):
        aside = columns.unserved_name(found.vector, found.alias, f"{found.alias}__{columns.ADOPTED}")
        if columns.column_exists(conn, found.table_oid, aside):
            raise CutoverRefused(f"cannot move {found.vector!r} aside: column {aside!r} already exists")
        views = dependents.capture(conn, found.table_oid, columns.attnum(conn, found.table_oid, found.vector))
        columns.carry_column_grants(conn, table, found.vector, found.column)
        conn.execute(rename.format(table, sql.Identifier(found.vector), sql.Identifier(aside)))
        columns.mark(conn, table, aside, f"{found.alias}__{columns.ADOPTED}", False, {})
    conn.execute(rename.format(table, sql.Identifier(found.column), sql.Identifier(found.vector)))
    columns.mark(conn, table, found.vector, found.served, True, found.moved)
    dependents.recreate(conn, views)
    book = found.staged_book
    name = split_name(found.book)[-1]
    conn.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(book, sql.Identifier(name)))
    pkey = sql.Identifier(found.schema, f"{split_name(found.alias)[-1]}_reindex_restore_book_pkey")
    conn.execute(sql.SQL("ALTER INDEX {} RENAME TO {}").format(pkey, sql.Identifier(f"{name[:58]}_pkey")))
    meta = {**found.meta, "mode": "column", "alias": found.alias, "vector_column": found.vector}
    conn.execute(
        sql.SQL("COMMENT ON TABLE {} IS {}").format(identifier(found.book), sql.Literal(json.dumps(meta)))
    )


def _types(conn: Connection, found: Restore) -> tuple[str, str]:
    """The key's type in the adopted table and the served vector column's type (`vector(384)`)."""
    key = column_type(conn, found.table_oid, found.key)
    vector = column_type(conn, found.served_oid, found.vector)
    if key is None or vector is None:
        raise BackendError(
            f"{found.table!r} has no column {found.key!r}, or {found.served!r} no vector column {found.vector!r}"
        )
    return key, vector
