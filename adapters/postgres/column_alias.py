"""The alias half of the column mode (side_by_side.py): what a table serves, the flip that renames two columns,
what a rollback leaves unserved, the targets a table holds, dropping one, and moving a 0.2 view back into
the table (restore.py). Mixed into `PgvectorColumnSink`, whose layout helpers it uses."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from reindex import crashpoints
from reindex.errors import BackendError, CutoverRefused
from reindex.ports import AliasInfo, Loss
from reindex_adapters.postgres import column_targets as columns
from reindex_adapters.postgres import dependents, fidelity, restore
from reindex_adapters.postgres.alias import hold
from reindex_adapters.postgres.catalog import regclass
from reindex_adapters.postgres.column_layouts import ColumnLayouts
from reindex_adapters.postgres.connection import first_value, identifier
from reindex_adapters.postgres.sink import retry_locked

if TYPE_CHECKING:
    from reindex_adapters.postgres.connection import Connection


class ColumnAlias(ColumnLayouts):
    """The alias side of `PgvectorColumnSink`, on the layout helpers of column_layouts.py."""

    def alias(self, alias: str) -> AliasInfo:
        identifier(alias)
        with self._db.errors():
            conn = self._db.connection()
            oid = regclass(conn, alias)
            if oid is None:
                return AliasInfo(alias, None)
            if _relkind(conn, oid) == "v":  # a view 0.2 made, until cutover moves it back into the table
                return super().alias(alias)
            served = columns.served(conn, oid)
            if served is None:
                return AliasInfo(alias, None, is_physical=True)
            meta = served.meta
            return AliasInfo(
                alias, served.target, fingerprint=meta.get("fingerprint"), model=meta.get("model")
            )

    def move_alias(
        self,
        alias: str,
        target: str,
        *,
        expected: str | None,
        meta: Mapping[str, Any],
        settle: Callable[[], None] | None = None,
    ) -> str | None:
        """Rename the served vector column aside and the target's into its place, in one short transaction
        under `lock_timeout`, retried; with `settle`, writers are held first (readers pass)."""
        identifier(alias)
        identifier(target)
        try:
            previous = retry_locked(self, lambda: self._flip(alias, target, expected, meta, settle), alias)
        finally:
            self._layouts.clear()  # the columns' names changed
        with self._db.errors():
            served = self.alias(alias).target
        if served != target:
            raise BackendError(f"alias {alias!r} does not serve {target!r} after the flip")
        return previous

    def _flip(
        self,
        alias: str,
        target: str,
        expected: str | None,
        meta: Mapping[str, Any],
        settle: Callable[[], None] | None,
    ) -> str | None:
        from psycopg import sql

        conn = self._db.connection()
        with conn.transaction():
            hold(conn, alias, self.lock_timeout_ms, settle)
            oid = self._table_oid(conn, alias)
            incoming = columns.find(conn, alias, target)
            if incoming is None:
                raise CutoverRefused(f"target {target!r} does not exist")
            current = columns.served(conn, oid)
            served_now = current.target if current is not None else None
            if served_now != expected and not (current is None and expected in (None, alias)):
                raise CutoverRefused(
                    f"alias {alias!r} serves {served_now!r}, expected {expected!r}",
                    hint="another cutover moved it meanwhile; check `reindex status`",
                )
            fidelity.refuse_unaccepted(self._flip_losses(conn, oid, incoming), alias, column=True)
            table = identifier(alias)
            vector = self._vector_name(conn, incoming, current)
            previous = served_now or f"{columns.split_last(alias)}__{columns.ADOPTED}"
            aside = columns.unserved_name(vector, alias, previous)
            if current is None and columns.column_exists(conn, oid, aside):
                raise CutoverRefused(f"cannot move {vector!r} aside: column {aside!r} already exists")
            rename = sql.SQL("ALTER TABLE {} RENAME COLUMN {} TO {}")
            views: list[dependents.BoundView] = []
            # a table that had no vectors yet has nothing to move aside
            if columns.column_exists(conn, oid, vector):
                views = dependents.capture(conn, oid, columns.attnum(conn, oid, vector))
                columns.carry_column_grants(conn, table, vector, incoming.column.name)
                conn.execute(rename.format(table, sql.Identifier(vector), sql.Identifier(aside)))
                columns.mark(conn, table, aside, previous, False, current.meta if current else {})
            conn.execute(rename.format(table, sql.Identifier(incoming.column.name), sql.Identifier(vector)))
            columns.mark(conn, table, vector, target, True, meta)
            dependents.recreate(conn, views)  # the application's views read the served vectors again
            crashpoints.crash_if_armed("cutover_before_commit")
            return previous

    def _flip_losses(self, conn: Connection, oid: int, incoming: columns.ColumnTarget) -> list[Loss]:
        """What the table has now that the flip would not keep (checked again under the lock)."""
        book = self._book_meta(conn, columns.bookkeeping_table(self._alias_of(incoming), incoming.target))
        id_field = str(book.get("id_field") or "id")
        current = columns.served(conn, oid)
        vector = current.column.name if current is not None else book.get("vector_column")
        return fidelity.losses(conn, oid, id_field, vector, self.accept, column=True)

    def unserved(self, alias: str, served: str, replaced: str) -> list[str]:
        """Rows with a vector in the replaced target's column and none in the served one."""
        from psycopg import sql

        now, before = self._layout(served), self._layout(replaced)
        assert now.vector is not None and before.vector is not None
        query = sql.SQL("SELECT {}::text FROM {} WHERE {} IS NULL AND {} IS NOT NULL ORDER BY 1").format(
            now.key.ident, now.ident, now.vector.ident, before.vector.ident
        )
        with self._db.errors():
            return [str(row[0]) for row in self._db.connection().execute(query).fetchall()]

    def targets(self, alias: str) -> list[str]:
        with self._db.errors():
            conn = self._db.connection()
            oid = regclass(conn, alias)
            if oid is None:
                return []
            found = columns.column_targets(conn, oid)
            created = {
                t.target: str(
                    self._book_meta(conn, columns.bookkeeping_table(alias, t.target)).get("created_at", "")
                )
                for t in found
            }
        return sorted(created, key=lambda name: (created[name], name))

    def drop(self, target: str) -> None:
        """Drop a target that is not served: its column (a catalog change) and its bookkeeping table."""
        from psycopg import sql

        identifier(target)
        self._layouts.pop(target, None)
        alias = self._alias_for(target)
        if alias is None:
            return

        def drop_column() -> None:
            with self._db.transaction() as conn:
                conn.execute("SELECT set_config('lock_timeout', %s, true)", [f"{self.lock_timeout_ms}ms"])
                found = columns.find(conn, alias, target)
                if found is not None and found.served:
                    raise CutoverRefused(
                        f"target {target!r} is served by {alias!r}",
                        hint="move the alias to another target before pruning this one",
                    )
                if found is not None:
                    conn.execute(
                        sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(identifier(alias), found.column.ident)
                    )
                conn.execute(
                    sql.SQL("DROP TABLE IF EXISTS {}").format(
                        identifier(columns.bookkeeping_table(alias, target))
                    )
                )

        retry_locked(self, drop_column, alias)
        self._layouts.clear()

    def restore_table(self, alias: str) -> str | None:
        """Move a 0.2 installation (a view over a target table, the application's table renamed
        `<alias>__adopted`) back into the application's table, serving the same vectors (restore.py): the
        target it serves, or None where the alias is no such view."""
        identifier(alias)
        with self._db.errors():
            found = restore.find(self._db.connection(), alias)
        if found is None:
            return None
        try:
            restore.restore(self, found)
        finally:
            self._layouts.clear()
        served = self.alias(alias).target
        if served != (found.served if found.meta else None):
            raise BackendError(f"alias {alias!r} serves {served!r} after it was moved back into its table")
        return found.served if found.meta else alias  # rolled back to its own vectors: the table serves them


def _relkind(conn: Connection, oid: int) -> str:
    return str(
        first_value(conn.execute("SELECT relkind::text FROM pg_class WHERE oid = %s::oid", [oid]).fetchone())
    )
