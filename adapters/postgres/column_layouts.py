"""Where the column-mode sink's things are: which column of the application's table holds a target, the
book of each (its identity), the alias a target belongs to, the vector column and key types. The base of
`PgvectorColumnSink`'s alias side (column_alias.py) and of the sink itself (side_by_side.py), so each
layer calls only what a layer below defines."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from reindex.errors import BackendError, ConfigError
from reindex_adapters.postgres import column_targets as columns
from reindex_adapters.postgres.catalog import Layout, column_type, json_object, read_layout, regclass
from reindex_adapters.postgres.connection import first_value, identifier
from reindex_adapters.postgres.sink import PgvectorSink

if TYPE_CHECKING:
    from reindex_adapters.postgres.connection import Connection


class ColumnLayouts(PgvectorSink):
    """The layout helpers of the column-mode sink."""

    def _layout(self, target: str) -> Layout:
        if target not in self._layouts:
            identifier(target)
            with self._db.errors():
                layout = self._find_layout(self._db.connection(), target)
            if layout is None:
                raise BackendError(f"target {target!r} does not exist", hint="run prepare first")
            self._layouts[target] = layout
        return self._layouts[target]

    def _find_layout(self, conn: Connection, target: str) -> Layout | None:
        """The alias's table seen as this target: its key, the target's column as the vector, its meta. The
        alias's own name is the index it serves now (`reindex compare` reads the live index by it)."""
        alias = self._alias_for(target)
        if alias is None:
            return self._served_layout(conn, target)
        found = columns.find(conn, alias, target)
        table = read_layout(conn, alias)
        if found is None or table is None:
            return None
        meta = self._book_meta(conn, columns.bookkeeping_table(alias, target))
        key = next((a for a in table.columns if a.name == meta.get("id_field")), table.key)
        return replace(
            table,
            key=key,
            vector=found.column,
            meta={**meta, "storage": meta.get("storage") or found.column.type_name[1]},
        )

    def _served_layout(self, conn: Connection, alias: str) -> Layout | None:
        """The table `alias` as the index it serves: its served column, or before any flip its own vectors."""
        table = read_layout(conn, alias)
        if table is None:
            return None
        served = columns.served(conn, table.oid)
        if served is not None:
            return self._find_layout(conn, served.target)
        aside = {t.column.name for t in columns.column_targets(conn, table.oid)}
        vector = next((a for a in table.columns if a.is_vector and a.name not in aside), None)
        return replace(table, vector=vector, meta={"storage": vector.type_name[1] if vector else "vector"})

    def _alias_for(self, target: str) -> str | None:
        """The alias a target belongs to: the table its name starts with (`docs__3f9a1c2e` → `docs`)."""
        parts = target.rsplit("__", 1)
        return parts[0] if len(parts) == 2 and parts[0] else None

    def _alias_of(self, found: columns.ColumnTarget) -> str:
        return self._alias_for(found.target) or found.target

    def _book(self, layout: Layout, target: str) -> str | None:
        """The target's bookkeeping table, or None for the application's own vectors (none was built)."""
        if layout.meta.get("mode") != "column":
            return None
        return columns.bookkeeping_table(str(layout.meta["alias"]), target)

    def _built(self, layout: Layout, target: str) -> str:
        book = self._book(layout, target)
        if book is None:
            raise BackendError(
                f"target {target!r} holds the application's own vectors: the tool writes only targets it built"
            )
        return book

    def _book_meta(self, conn: Connection, book: str) -> dict[str, Any]:
        oid = regclass(conn, book)
        if oid is None:
            return {}
        return json_object(
            first_value(conn.execute("SELECT obj_description(%s::oid, 'pg_class')", [oid]).fetchone())
        )

    def _table_oid(self, conn: Connection, alias: str) -> int:
        row = conn.execute(
            "SELECT c.oid::int8, c.relkind::text FROM pg_class c WHERE c.oid = to_regclass(%s)",
            [identifier(alias).as_string(conn)],
        ).fetchone()
        if row is None or row[1] not in ("r", "p"):
            raise ConfigError(
                f'mode = "column" needs alias {alias!r} to be the application\'s table'
                + (
                    ""
                    if row is None
                    else f" (it is a {'view' if row[1] == 'v' else 'relation'} of kind {row[1]!r})"
                ),
                hint=(
                    "`reindex cutover` moves a view the tool made (0.2's mode table) back into the table"
                    if row is not None and row[1] == "v"
                    else 'point [target] alias at the source table, or set mode = "table"'
                ),
            )
        return int(row[0])

    def _served_column(self, conn: Connection, oid: int, vector: str | None) -> str | None:
        served = columns.served(conn, oid)
        return served.column.name if served is not None else vector

    def _vector_name(
        self, conn: Connection, incoming: columns.ColumnTarget, current: columns.ColumnTarget | None
    ) -> str:
        if current is not None:
            return current.column.name
        book = self._book_meta(conn, columns.bookkeeping_table(self._alias_of(incoming), incoming.target))
        return str(book.get("vector_column") or "embedding")

    def _key_type(self, conn: Connection, oid: int, id_field: str) -> str:
        found = column_type(conn, oid, id_field)
        if found is None:
            raise ConfigError(
                f"column {id_field!r} of the source is not a column of the alias's table",
                hint='mode = "column" migrates the table the source reads: point [target] alias at it,'
                ' or set mode = "table"',
            )
        return found
