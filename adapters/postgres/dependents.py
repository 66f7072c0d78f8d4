"""The application's views over the vector column, carried across a column-mode flip.

A view binds to a column's number, not its name: renamed aside, the old vector column would go on feeding
`CREATE VIEW nearest AS SELECT id, embedding FROM docs` its old vectors. So the flip reads each such view's
definition before the rename (where it says `embedding`) and, after it, drops and creates the view again from
that text, with its options, grants and comment, in the same transaction: it then reads the column that now
holds the served vectors. `CREATE OR REPLACE` would refuse a changed type (`vector(256)` to `vector(384)`).

What cannot be carried that way is left to `fidelity.py` to name: a materialized view (its rows are the old
vectors until refreshed), a view other views or triggers depend on, a view another role owns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from reindex_adapters.postgres.alias import grant, grants_of

if TYPE_CHECKING:
    from reindex_adapters.postgres.connection import Connection


# The views reading column %(vector)s of table %(oid)s, with what decides whether the flip can carry them.
_BOUND_SQL = """
SELECT DISTINCT v.oid::int8 AS view, v.oid::regclass::text AS name, v.relkind::text AS relkind,
  pg_get_userbyid(v.relowner) = current_user AS owned,
  EXISTS (SELECT 1 FROM pg_depend d2 JOIN pg_rewrite r2 ON d2.classid = 'pg_rewrite'::regclass AND d2.objid = r2.oid
          WHERE d2.refclassid = 'pg_class'::regclass AND d2.refobjid = v.oid AND r2.ev_class <> v.oid)
  OR EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = v.oid) AS depended_on
FROM pg_depend d JOIN pg_rewrite r ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
JOIN pg_class v ON v.oid = r.ev_class
WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = %(oid)s AND d.refobjsubid = %(vector)s
  AND v.oid <> %(oid)s"""
# For fidelity.py: the bound views the flip cannot carry, and why.
UNCARRIED_SQL = f"""
SELECT name || CASE WHEN relkind = 'm' THEN ' (materialized)' WHEN NOT owned THEN ' (owned by another role)'
                    ELSE ' (other views or triggers depend on it)' END
FROM ({_BOUND_SQL}) AS bound WHERE relkind = 'm' OR NOT owned OR depended_on ORDER BY 1"""
_DEFINITION_SQL = """
SELECT pg_get_viewdef(c.oid), array_to_string(c.reloptions, ', '), obj_description(c.oid, 'pg_class')
FROM pg_class c WHERE c.oid = %s::oid"""


@dataclass(frozen=True, slots=True)
class BoundView:
    """A view as it was defined before the flip, to define again after it."""

    name: str  # as regclass prints it: quoted and schema-qualified where needed
    definition: str
    options: str | None
    comment: str | None
    grants: list[tuple[str | None, str, bool]]


def capture(conn: Connection, table_oid: int, attnum: int) -> list[BoundView]:
    """The plain views over the column, defined by its current name (call before the rename)."""
    views = []
    for oid, name, relkind, owned, depended_on in conn.execute(
        _BOUND_SQL, {"oid": table_oid, "vector": attnum}
    ).fetchall():
        if relkind != "v" or not owned or depended_on:
            continue  # fidelity.py names these; the flip is refused unless they are accepted
        row = conn.execute(_DEFINITION_SQL, [oid]).fetchone()
        assert row is not None
        views.append(BoundView(str(name), str(row[0]), row[1], row[2], grants_of(conn, int(oid))))
    return views


def recreate(conn: Connection, views: list[BoundView]) -> None:
    """Each view dropped and defined again from its text: it now reads the column of that name."""
    from psycopg import sql

    for view in views:
        # The server's own text, spliced as it gave it: the name as regclass prints it (quoted where needed),
        # the options as reloptions holds them (validated names and values), the definition pg_get_viewdef's.
        name = sql.SQL(view.name)
        options = sql.SQL(" WITH ({})").format(sql.SQL(view.options)) if view.options else sql.SQL("")
        conn.execute(sql.SQL("DROP VIEW {}").format(name))
        conn.execute(sql.SQL("CREATE VIEW {}{} AS {}").format(name, options, sql.SQL(view.definition)))
        grant(conn, name, view.grants)  # type: ignore[arg-type]
        if view.comment is not None:
            conn.execute(sql.SQL("COMMENT ON VIEW {} IS {}").format(name, sql.Literal(view.comment)))
