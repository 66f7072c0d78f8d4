"""A `mode = "table"` rollback keeps what the application wrote through the alias while the newer target was
live: the older target's rows are made the newer one's (rows added, edited, deleted through the alias),
column by column but the vectors.

Once the alias serves a target, that target is the truth (design notes): `sync` and the next `cutover --sync`
read what the alias serves. Without this step the older table would serve the rows as they were before the
flip, and the next roll-forward's catch-up would then delete and revert, in the newer target, what the
application wrote there. A row the older model never embedded (added, or its text edited, while the newer
was live) keeps no vector here: the old vector belongs to the old text. `rollback` names those rows (the
sink's `unserved`), verify counts them missing, and they are served by vector again after the next
cutover. A vector of the older model stays where the row's text is unchanged.

The writes are known from the start: from the move that makes a target live on, a trigger on it notes the
key of each row the application writes through the alias (change_log.py; not the tool's own writes, which
set `reindex.writer`: a document `sync` removes from the live target because it cannot be embedded stays in
the older table), and the next move drops it. A rollback carries exactly the noted rows, in its own transaction with the alias held:
the work is the rows written while the newer target was live, not the table (`scripts/bench rollback`).
A row the newer target never held because it could not be embedded (a dead letter, still in the older
table) was never written there, so it stays. Each write to a live target pays one more row insert into the
log. A target made live by an earlier version has no log: its rollback keeps nothing and names what it can.
The column mode has none of this: the rows never leave the application's table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from reindex_adapters.postgres.catalog import (
    BOOKKEEPING,
    Layout,
    qualified_name,
    read_layout,
    writable_columns,
)
from reindex_adapters.postgres.change_log import ChangeLog
from reindex_adapters.postgres.connection import split_name

if TYPE_CHECKING:
    from reindex_adapters.postgres.connection import Connection


@dataclass(frozen=True, slots=True)
class Writes:
    """The live target of an alias, and the log of the keys written to it since it became live."""

    served: Layout
    log: ChangeLog

    def start(self, conn: Connection) -> None:
        self.log.start(conn, self.served.key.type)

    def started(self, conn: Connection) -> bool:
        return (
            conn.execute(
                "SELECT 1 FROM pg_trigger WHERE tgrelid = %s::oid AND tgname = %s",
                [self.served.oid, self.log.trigger],
            ).fetchone()
            is not None
        )

    def stop(self, conn: Connection) -> None:
        self.log.stop(conn)


def writes_of(conn: Connection, alias: str, oid: int) -> Writes:
    """The writes log of the target `oid` that `alias` serves (or is about to): beside the alias, named after
    it, not like a target; schema-qualified, as the trigger's function runs with `search_path` pg_catalog."""
    from psycopg import sql

    qualified = qualified_name(conn, oid)
    served = read_layout(conn, qualified)
    assert served is not None
    schema = split_name(qualified)[0]
    name = split_name(alias)[-1]
    log = ChangeLog(
        served.ident,
        served.key.name,
        sql.Identifier(schema, f"{name}_reindex_writes"),
        sql.Identifier(schema, f"{name}_reindex_writes_note"),
        "reindex_writes",
        tool_too=False,  # a document sync deletes as a dead letter stays in the older table
    )
    return Writes(served, log)


def keep_writes(conn: Connection, live: Writes, older: Layout | None) -> tuple[int, int, int]:
    """Make the rows of `older` that the log names the live target's, but the vectors (cleared where the
    text changed); rows (deleted, changed, added)."""
    from psycopg import sql

    served = live.served
    if older is None:
        return 0, 0, 0
    present = {a.name for a in served.columns}
    vectors = {a.name for a in (*served.columns, *older.columns) if a.is_vector or a.named_vector}
    names = [
        name
        for name, _ in writable_columns(conn, older.oid)
        if name in present and name not in vectors and name not in BOOKKEEPING
    ]
    key, text = older.key.name, str(older.meta.get("text_field") or "")
    if key not in names:
        return 0, 0, 0
    k, log = sql.Identifier(key), live.log.log
    # driven from the log, which statistics make known as small: index lookups into both tables, not scans
    conn.execute(sql.SQL("ANALYZE {}").format(log))
    deleted = conn.execute(
        sql.SQL(
            "DELETE FROM {o} AS o USING {log} AS l WHERE o.{k} = l.id"
            " AND NOT EXISTS (SELECT 1 FROM {s} AS s WHERE s.{k} = l.id)"
        ).format(o=older.ident, log=log, s=served.ident, k=k)
    ).rowcount
    carried = [n for n in names if n != key]
    changed = 0
    if carried:
        row = sql.SQL("ROW({})::text")
        mine = row.format(sql.SQL(", ").join(sql.SQL("o.{}").format(sql.Identifier(n)) for n in carried))
        theirs = row.format(sql.SQL(", ").join(sql.SQL("s.{}").format(sql.Identifier(n)) for n in carried))
        settings = [sql.SQL("{} = s.{}").format(sql.Identifier(n), sql.Identifier(n)) for n in carried]
        if older.vector is not None and text in carried:
            # the old model's vector of the old text is no vector of the new text
            settings.append(
                sql.SQL("{v} = CASE WHEN o.{t} IS NOT DISTINCT FROM s.{t} THEN o.{v} END").format(
                    v=older.vector.ident, t=sql.Identifier(text)
                )
            )
        changed = conn.execute(
            sql.SQL(
                "UPDATE {o} AS o SET {set} FROM {log} AS l JOIN {s} AS s ON s.{k} = l.id"
                " WHERE o.{k} = l.id AND {mine} IS DISTINCT FROM {theirs}"
            ).format(
                o=older.ident,
                set=sql.SQL(", ").join(settings),
                log=log,
                s=served.ident,
                mine=mine,
                theirs=theirs,
                k=k,
            )
        ).rowcount
    added = conn.execute(
        sql.SQL(
            "INSERT INTO {o} ({names}) OVERRIDING SYSTEM VALUE SELECT {values} FROM {log} AS l"
            " JOIN {s} AS s ON s.{k} = l.id WHERE NOT EXISTS (SELECT 1 FROM {o} AS o WHERE o.{k} = l.id)"
        ).format(
            o=older.ident,
            names=sql.SQL(", ").join(sql.Identifier(n) for n in names),
            values=sql.SQL(", ").join(sql.SQL("s.{}").format(sql.Identifier(n)) for n in names),
            log=log,
            s=served.ident,
            k=k,
        )
    ).rowcount
    return deleted, changed, added
