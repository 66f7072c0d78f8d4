"""The keys written to a table from a moment on, for a copy made with writers running to be finished under a
short lock (the shadow-table way, as pg-osc does): a row trigger notes each key an INSERT, UPDATE or DELETE
touches in a log table, the bulk copy runs, and the transaction that holds the writers copies again only the
rows the log names, then drops the trigger and the log.

The trigger is created in a transaction of its own, which waits (under `lock_timeout`) for the writers in
flight: every write that commits after it notes its keys. The function is SECURITY DEFINER, owned by the
tool's role, so the application's roles need no right on the log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from psycopg import sql

    from reindex_adapters.postgres.connection import Connection


@dataclass(frozen=True, slots=True)
class ChangeLog:
    """A log of the keys written to `table` (column `key`), kept in `log` by `function`'s trigger."""

    table: sql.Composable
    key: str
    log: sql.Identifier
    function: sql.Identifier
    trigger: str
    tool_too: bool = True  # False: the tool's own writes (`reindex.writer`, ddl.py) are not noted

    def start(self, conn: Connection, key_type: str) -> None:
        """Create the log, the function and the trigger (idempotent); in a short transaction of its own."""
        from psycopg import sql

        conn.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (id {} PRIMARY KEY)").format(self.log, sql.SQL(key_type))
        )
        key = sql.Identifier(self.key)
        skip = sql.SQL(
            ""
            if self.tool_too
            else "IF current_setting('reindex.writer', true) = 'reindex' THEN RETURN NULL; END IF;"
        )
        body = sql.SQL(
            "BEGIN {skip} IF TG_OP <> 'INSERT' THEN INSERT INTO {log} VALUES (OLD.{k}) ON CONFLICT DO NOTHING; END IF;"
            " IF TG_OP <> 'DELETE' THEN INSERT INTO {log} VALUES (NEW.{k}) ON CONFLICT DO NOTHING; END IF;"
            " RETURN NULL; END"
        ).format(skip=skip, log=self.log, k=key)
        conn.execute(
            sql.SQL(
                "CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER"
                " SET search_path = pg_catalog, pg_temp AS {}"
            ).format(self.function, sql.Literal(body.as_string(conn)))
        )
        trigger = sql.Identifier(self.trigger)
        conn.execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(trigger, self.table))
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER {} AFTER INSERT OR UPDATE OR DELETE ON {} FOR EACH ROW EXECUTE FUNCTION {}()"
            ).format(trigger, self.table, self.function)
        )

    def keys(self) -> sql.Composable:
        """A subquery of the logged keys."""
        from psycopg import sql

        return sql.SQL("(SELECT id FROM {})").format(self.log)

    def stop(self, conn: Connection, *, table_exists: bool = True) -> None:
        """Drop the trigger (where its table is still there), the function and the log."""
        from psycopg import sql

        if table_exists:
            conn.execute(
                sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(sql.Identifier(self.trigger), self.table)
            )
        conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}()").format(self.function))
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self.log))
