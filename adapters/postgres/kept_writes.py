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

It runs twice, the shadow-table way (change_log.py). First with the application writing on (the older table
is served by nothing, so nothing waits for it): a trigger on the served table starts noting the keys
written, then the whole comparison runs, one join of the two tables. Then in the rollback's transaction,
with the alias held: only the rows the log names. `scripts/bench rollback` measures both. The column mode
has none of this: the rows never leave the application's table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reindex_adapters.postgres.catalog import _BOOKKEEPING

if TYPE_CHECKING:
    from psycopg import sql

    from reindex_adapters.postgres.catalog import _Layout
    from reindex_adapters.postgres.change_log import ChangeLog
    from reindex_adapters.postgres.connection import Connection


# The older table's columns a row copy may write (not generated: the table computes them).
_WRITABLE_SQL = """
SELECT a.attname::text FROM pg_attribute a
WHERE a.attrelid = %s::oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY a.attnum"""


def keep_writes(
    conn: Connection, served: _Layout, older: _Layout, *, only: ChangeLog | None = None
) -> tuple[int, int, int]:
    """Make `older`'s rows `served`'s, but the vectors (cleared where the text changed); rows (deleted,
    changed, added). `only`: compare only the rows whose keys the log names."""
    from psycopg import sql

    present = {a.name for a in served.columns}
    vectors = {a.name for a in (*served.columns, *older.columns) if a.is_vector or a.named_vector}
    names = [
        str(name)
        for (name,) in conn.execute(_WRITABLE_SQL, [older.oid]).fetchall()
        if name in present and name not in vectors and name not in _BOOKKEEPING
    ]
    key, text = older.key.name, str(older.meta.get("text_field") or "")
    if key not in names:
        return 0, 0, 0
    k = sql.Identifier(key)
    theirs_only: sql.Composable = sql.SQL("")
    mine_only: sql.Composable = sql.SQL("")
    if only is not None:
        theirs_only = sql.SQL(" AND s.{} IN {}").format(k, only.keys())
        mine_only = sql.SQL(" AND o.{} IN {}").format(k, only.keys())
    deleted = conn.execute(
        sql.SQL("DELETE FROM {} AS o WHERE NOT EXISTS (SELECT 1 FROM {} AS s WHERE s.{k} = o.{k}){}").format(
            older.ident, served.ident, mine_only, k=k
        )
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
                "UPDATE {} AS o SET {} FROM {} AS s WHERE o.{k} = s.{k} AND {} IS DISTINCT FROM {}{}"
            ).format(older.ident, sql.SQL(", ").join(settings), served.ident, mine, theirs, theirs_only, k=k)
        ).rowcount
    added = conn.execute(
        sql.SQL(
            "INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE SELECT {} FROM {} AS s"
            " WHERE NOT EXISTS (SELECT 1 FROM {} AS o WHERE o.{k} = s.{k}){}"
        ).format(
            older.ident,
            sql.SQL(", ").join(sql.Identifier(n) for n in names),
            sql.SQL(", ").join(sql.SQL("s.{}").format(sql.Identifier(n)) for n in names),
            served.ident,
            older.ident,
            theirs_only,
            k=k,
        )
    ).rowcount
    return deleted, changed, added
