"""The alias view: read in one snapshot, locked, adopted from a real table, replaced, its grants carried."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from reindex.errors import BackendError, CutoverRefused
from reindex.ports import AliasInfo
from reindex_adapters.postgres import rules as postgres_rules
from reindex_adapters.postgres.catalog import json_object, one_oid, regclass
from reindex_adapters.postgres.connection import identifier, split_name

if TYPE_CHECKING:
    from psycopg import sql

    from reindex_adapters.postgres.connection import Connection


_PRIVILEGES = frozenset(
    {"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER", "MAINTAIN"}
)


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
DEPENDENT_VIEWS_SQL = """
SELECT DISTINCT r.ev_class::regclass::text FROM pg_depend d
JOIN pg_rewrite r ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = %s::oid AND r.ev_class <> %s::oid"""
_GRANTS_SQL = """
SELECT CASE WHEN g.grantee = 0 THEN NULL ELSE pg_get_userbyid(g.grantee)::text END,
       g.privilege_type, g.is_grantable
FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) g
WHERE c.oid = %s::oid AND g.grantee <> c.relowner"""
TARGETS_SQL = r"""
SELECT c.oid::int8, n.nspname, c.relname, obj_description(c.oid, 'pg_class')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND c.relname LIKE %s ESCAPE '\'
  AND ((%s::text IS NULL AND pg_table_is_visible(c.oid)) OR n.nspname = %s::text)"""


def resolve_alias(conn: Connection, alias: str) -> _ResolvedAlias:
    """Read the alias, its comment and what it serves in one statement: one snapshot, never half a swap."""
    parts = split_name(alias)
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
    meta = json_object(comment)
    shown = f"{base_schema}.{base_name}" if schema is not None or not is_visible else str(base_name)
    info = AliasInfo(alias, shown, fingerprint=meta.get("fingerprint"), model=meta.get("model"))
    return _ResolvedAlias(info, oid, relkind, int(base))


def _lock_alias(
    conn: Connection, alias: str, mode: Literal["EXCLUSIVE", "ACCESS EXCLUSIVE"] = "ACCESS EXCLUSIVE"
) -> None:
    """Serialise movers of this alias, then hold the alias itself until commit (compare-and-swap)."""
    from psycopg import sql

    parts = split_name(alias)
    conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended("
        "'reindex alias ' || coalesce(%s::text, current_schema()) || '.' || %s::text, 0))",
        [parts[0] if len(parts) == 2 else None, parts[-1]],
    )
    if regclass(conn, alias) is not None:
        # On a view this also locks the target it reads; the swap is one short transaction.
        conn.execute(sql.SQL("LOCK TABLE {} IN {} MODE").format(identifier(alias), sql.SQL(mode)))


def hold(conn: Connection, alias: str, lock_timeout_ms: int, settle: Callable[[], None] | None) -> None:
    """In the move's transaction: bound every lock wait by `lock_timeout_ms`; with `settle`, hold writers
    (EXCLUSIVE: readers pass) while it runs; then take the alias for the move itself."""
    conn.execute("SELECT set_config('lock_timeout', %s, true)", [f"{lock_timeout_ms}ms"])
    if settle is not None:
        # Writers wait from here to the commit; a writer that waited is sent to what the alias serves after
        # the move when it gets the lock (Postgres looks the name up again after waiting).
        _lock_alias(conn, alias, mode="EXCLUSIVE")
        settle()
    _lock_alias(conn, alias)


def serves(conn: Connection, resolved: _ResolvedAlias, expected: str | None) -> bool:
    if expected is None or resolved.target_oid is None:
        return expected is None and resolved.target_oid is None
    return resolved.target_oid == regclass(conn, expected)


def adopt(
    conn: Connection, resolved: _ResolvedAlias, target: str, expected: str | None, meta: Mapping[str, Any]
) -> str:
    """First cutover onto a real table: rename it `<alias>__adopted` and put the view in its place."""
    from psycopg import sql

    alias = resolved.info.alias
    adopted = f"{alias}__adopted"
    split_name(adopted)
    if resolved.relkind not in ("r", "p") or expected not in (None, alias):
        raise CutoverRefused(
            f"alias {alias!r} is a physical relation, expected {expected!r}",
            hint="only a plain table can be adopted, once, with no expected target",
        )
    if regclass(conn, adopted) is not None:
        raise CutoverRefused(f"cannot adopt {alias!r}: {adopted!r} already exists")
    assert resolved.oid is not None
    postgres_rules.continue_numbering(conn, resolved.oid, one_oid(conn, target))
    grants = grants_of(conn, resolved.oid)
    conn.execute(
        sql.SQL("ALTER TABLE {} RENAME TO {}").format(
            identifier(alias), sql.Identifier(split_name(adopted)[-1])
        )
    )
    replace_view(conn, alias, target, meta, grants, drop=False)
    return adopted


def replace_view(
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

    view = identifier(alias)
    if drop:
        conn.execute(sql.SQL("DROP VIEW {}").format(view))
    conn.execute(sql.SQL("CREATE VIEW {} AS SELECT * FROM {}").format(view, identifier(target)))
    grant(conn, view, grants)
    conn.execute(
        sql.SQL("COMMENT ON VIEW {} IS {}").format(view, sql.Literal(json.dumps(dict(meta), default=str)))
    )


def grants_of(conn: Connection, oid: int) -> list[tuple[str | None, str, bool]]:
    return [
        (role, str(privilege), bool(grantable))
        for role, privilege, grantable in conn.execute(_GRANTS_SQL, [oid]).fetchall()
    ]


def grant(conn: Connection, relation: sql.Identifier, grants: list[tuple[str | None, str, bool]]) -> None:
    from psycopg import sql

    for role, privilege, grantable in grants:
        if privilege not in _PRIVILEGES:
            continue
        grantee = sql.SQL("PUBLIC") if role is None else sql.Identifier(role)
        option = sql.SQL(" WITH GRANT OPTION" if grantable else "")
        conn.execute(sql.SQL("GRANT {} ON {} TO {}{}").format(sql.SQL(privilege), relation, grantee, option))
