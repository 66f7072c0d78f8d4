"""What the tool's role must be allowed before a migration starts, found in the catalog, with the statement
that grants each (issue 43: a role that did not own the table embedded everything, then failed).

Column mode changes the application's table: adding, renaming and indexing a column are its owner's (or a
member of the owner role's). Both modes create in the table's schema (a bookkeeping table; table mode its
target), and table mode replaces the alias: a view or table there is its owner's to replace or rename.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reindex.ports import Privilege

if TYPE_CHECKING:
    from psycopg import Connection

_RELATION = """
SELECT n.nspname, c.relname, pg_get_userbyid(c.relowner), pg_has_role(current_user, c.relowner, 'USAGE'),
       has_schema_privilege(current_user, n.oid, 'CREATE'), current_user, c.relkind::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass(%s)
"""
_SCHEMA = """
SELECT n.nspname, has_schema_privilege(current_user, n.oid, 'CREATE'), current_user
FROM pg_namespace n WHERE n.nspname = coalesce(%s, current_schema())
"""


def missing(conn: Connection, alias: str, *, owns_table: bool) -> list[Privilege]:
    """What the connected role lacks to migrate behind `alias` (quoted as the catalog reads it):
    `owns_table` in column mode (the alias is the application's table, whose columns change). Each fix is
    composed with psycopg.sql, its names quoted as Postgres reads them, ready to paste."""
    from psycopg import sql

    row = conn.execute(_RELATION, [alias]).fetchone()
    if row is None:  # a new alias: only the schema it will be made in
        schema = alias.split(".", 1)[0].strip('"') if "." in alias else None
        found = conn.execute(_SCHEMA, [schema]).fetchone()
        if found is None or found[1]:
            return []
        return [_create_on(conn, str(found[0]), str(found[2]))]
    schema, name, owner, is_owner, may_create, me, kind = row
    needs: list[Privilege] = []
    if not may_create:
        needs.append(_create_on(conn, str(schema), str(me)))
    if not is_owner and (owns_table or kind in ("v", "r", "p")):
        what = (
            "the table whose column it adds, indexes and renames" if owns_table else "the alias it replaces"
        )
        relation = sql.SQL("VIEW" if kind == "v" else "TABLE")
        table, to_me, role = sql.Identifier(schema, name), sql.Identifier(me), sql.Identifier(owner)
        fix = sql.SQL("ALTER {} {} OWNER TO {}; or GRANT {} TO {}").format(
            relation, table, to_me, role, to_me
        )
        needs.append(Privilege(f"to own {schema}.{name} ({what}), owned by {owner}", fix.as_string(conn)))
    return needs


def _create_on(conn: Connection, schema: str, role: str) -> Privilege:
    from psycopg import sql

    grant = sql.SQL("GRANT CREATE ON SCHEMA {} TO {}").format(sql.Identifier(schema), sql.Identifier(role))
    return Privilege(f"CREATE on schema {schema} (the target and its bookkeeping)", grant.as_string(conn))
