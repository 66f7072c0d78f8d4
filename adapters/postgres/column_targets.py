"""Targets that are columns of the application's own table (`[target] mode = "column"`): where each lives.

A target `docs__3f9a1c2e` is the column `embedding__3f9a1c2e` of the table `docs` while it is not served,
and `embedding` itself while it is; the flip renames two columns (side_by_side.py). Each such column's
comment names its target (`{"reindex": {"target": ..., "served": ...}}`), so a rename never loses which is
which. Beside each built target stands a table of the same name that holds the content hash of the text
each stored vector was embedded from (the target's bookkeeping stays out of the application's table). The
table's own vector column, the one the application had before the first flip, becomes the target
`<alias>__adopted`: a column with no bookkeeping table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reindex.errors import ConfigError
from reindex_adapters.postgres.catalog import (
    TARGET_COLUMNS_SQL,
    Attribute,
    _attributes,
    json_object,
    regclass,
)
from reindex_adapters.postgres.connection import MAX_IDENTIFIER_BYTES, split_name

if TYPE_CHECKING:
    from psycopg import sql

    from reindex_adapters.postgres.connection import Connection


ADOPTED = "adopted"  # the suffix of the application's own vectors once the first flip has moved them aside


@dataclass(frozen=True, slots=True)
class ColumnTarget:
    """One target of a table: its column as named now, and whether the table serves it."""

    target: str
    column: Attribute
    served: bool
    meta: dict[str, Any]  # what the column's comment records (fingerprint, model, moved_at where served)


def suffix_of(alias: str, target: str) -> str:
    """`docs__3f9a1c2e` → `3f9a1c2e`; a ConfigError for a target not named after the alias."""
    table, name = split_name(alias)[-1], split_name(target)[-1]
    if not name.startswith(f"{table}__") or len(name) == len(table) + 2:
        raise ConfigError(
            f"target {target!r} is not named <alias>__<suffix> for alias {alias!r}",
            hint='in [target] mode = "column" leave [target] name unset, or name it "<alias>__<suffix>"',
        )
    return name[len(table) + 2 :]


def unserved_name(vector: str, alias: str, target: str) -> str:
    """The column a target lives in while it is not served: `<vector>__<suffix>`."""
    name = f"{vector}__{suffix_of(alias, target)}"
    if len(name.encode()) > MAX_IDENTIFIER_BYTES:
        raise ConfigError(
            f"column name {name!r} is longer than {MAX_IDENTIFIER_BYTES} bytes",
            hint="choose a shorter [target] name",
        )
    return name


def bookkeeping_table(alias: str, target: str) -> str:
    """The table of a column target's content hashes: the target's own name, in the alias's schema."""
    parts = split_name(alias)
    return f"{parts[0]}.{split_name(target)[-1]}" if len(parts) == 2 else split_name(target)[-1]


def column_targets(conn: Connection, table_oid: int) -> list[ColumnTarget]:
    """Every column of the table that holds a target, as its comment says."""
    attributes = {a.name: a for a in _attributes(conn, table_oid)}
    found = []
    for name, comment in conn.execute(TARGET_COLUMNS_SQL, [table_oid]).fetchall():
        mark = json_object(comment).get("reindex")
        if isinstance(mark, dict) and isinstance(mark.get("target"), str) and name in attributes:
            found.append(ColumnTarget(mark["target"], attributes[name], bool(mark.get("served")), mark))
    return found


def find(conn: Connection, alias: str, target: str) -> ColumnTarget | None:
    oid = regclass(conn, alias)
    if oid is None:
        return None
    return next((t for t in column_targets(conn, oid) if t.target == target), None)


def served(conn: Connection, table_oid: int) -> ColumnTarget | None:
    return next((t for t in column_targets(conn, table_oid) if t.served), None)


def mark(
    conn: Connection, table: sql.Composable, column: str, target: str, served: bool, meta: Mapping[str, Any]
) -> None:
    """Record on the column which target it holds, whether it is served, and what the move recorded."""
    from psycopg import sql

    kept = {k: v for k, v in meta.items() if k not in ("target", "served")}
    mark = {"target": target, "served": served, **kept}
    comment = json.dumps({"reindex": mark}, default=str, separators=(",", ":"))
    conn.execute(
        sql.SQL("COMMENT ON COLUMN {}.{} IS {}").format(table, sql.Identifier(column), sql.Literal(comment))
    )


def content_hash_sql(text: sql.Composable) -> sql.Composable:
    """`reindex.fingerprint.content_hash` of a text column, computed by the server."""
    from psycopg import sql

    return sql.SQL("left(encode(sha256(convert_to(coalesce({}::text, ''), 'UTF8')), 'hex'), 32)").format(text)


def split_last(alias: str) -> str:
    return alias.rsplit(".", 1)[-1]


def attnum(conn: Connection, oid: int, name: str) -> int:
    row = conn.execute(
        "SELECT attnum FROM pg_attribute WHERE attrelid = %s::oid AND attname = %s AND NOT attisdropped",
        [oid, name],
    ).fetchone()
    assert row is not None
    return int(row[0])


def column_exists(conn: Connection, oid: int, name: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM pg_attribute WHERE attrelid = %s::oid AND attname = %s AND NOT attisdropped",
        [oid, name],
    ).fetchone()
    return row is not None


def carry_column_grants(conn: Connection, table: sql.Composable, served: str, incoming: str) -> None:
    """Roles granted the served vector column get the same on the column that takes its place."""
    from psycopg import sql

    rows = conn.execute(
        "SELECT CASE WHEN g.grantee = 0 THEN NULL ELSE pg_get_userbyid(g.grantee)::text END, g.privilege_type,"
        " g.is_grantable FROM pg_attribute a CROSS JOIN LATERAL aclexplode(a.attacl) g"
        " WHERE a.attrelid = to_regclass(%s) AND a.attname = %s",
        [table.as_string(conn), served],
    ).fetchall()
    for role, privilege, grantable in rows:
        grantee = sql.SQL("PUBLIC") if role is None else sql.Identifier(role)
        conn.execute(
            sql.SQL("GRANT {} ({}) ON {} TO {}{}").format(
                sql.SQL(privilege),
                sql.Identifier(incoming),
                table,
                grantee,
                sql.SQL(" WITH GRANT OPTION" if grantable else ""),
            )
        )
