"""Catalog reads: a relation's columns, a source's shape, a target's layout and the metric of its ANN
index; the names of the bookkeeping columns the sink adds to every target.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from reindex.errors import ConfigError
from reindex.ports import Distance
from reindex_adapters.postgres.connection import first_value, identifier, load_psycopg
from reindex_adapters.postgres.storage import Storage, recorded

if TYPE_CHECKING:
    from psycopg import sql

    from reindex_adapters.postgres.connection import Connection


_DISTANCES: dict[str, Distance] = {"_cosine_ops": "cosine", "_ip_ops": "dot", "_l2_ops": "euclid"}
RESERVED = ("reindex_fingerprint", "reindex_content_hash")  # bookkeeping the sink adds to every target
# 'application' on a row the trigger filled the bookkeeping of (the application wrote it through the alias);
# NULL on the tool's own rows. Nullable and added by finalize where missing: targets older than it lack it.
ORIGIN = "reindex_origin"
BOOKKEEPING = (*RESERVED, ORIGIN)  # never a document field
# Column types that hold embeddings wherever they appear. A `bit` column is one only where a target's
# comment names it (`vector_column`): bit strings are ordinary data elsewhere.
_VECTOR_TYPES = ("vector", "halfvec")


@dataclass(frozen=True, slots=True)
class Attribute:
    """One column as the catalog shows it."""

    name: str
    type: str  # format_type(): 'bigint', 'vector(8)'
    type_name: tuple[str, str]  # (schema, name) of the type, for casts
    oid: int
    typmod: int
    named_vector: bool = False  # a bit column a target's comment names as its vectors

    @property
    def ident(self) -> sql.Identifier:
        from psycopg import sql

        return sql.Identifier(self.name)

    @property
    def cast(self) -> sql.Identifier:
        from psycopg import sql

        return sql.Identifier(*self.type_name)

    @property
    def is_vector(self) -> bool:
        return self.type_name[1] in _VECTOR_TYPES or self.named_vector


@dataclass(frozen=True, slots=True)
class _SourceShape:
    oid: int
    columns: tuple[Attribute, ...]  # every column but vectors and the sink's bookkeeping, in attnum order
    key: Attribute
    text: Attribute
    vector: Attribute | None
    distance: Distance


@dataclass(frozen=True, slots=True)
class Layout:
    """A target table: its columns, key, vector column and the JSON comment prepare() wrote."""

    name: str
    oid: int
    columns: tuple[Attribute, ...]
    key: Attribute
    vector: Attribute | None
    meta: dict[str, Any]

    @property
    def ident(self) -> sql.Identifier:
        return identifier(self.name)

    @property
    def storage(self) -> Storage:
        return recorded(self.meta, self.vector.type_name[1] if self.vector is not None else "vector")


_COLUMNS_SQL = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), n.nspname, t.typname, a.atttypid::int8, a.atttypmod
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid JOIN pg_namespace n ON n.oid = t.typnamespace
WHERE a.attrelid = %s::oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"""
_BASE_TABLES_SQL = """
SELECT DISTINCT d.refobjid::int8 FROM pg_rewrite r
JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
WHERE r.ev_class = %s::oid AND d.refclassid = 'pg_class'::regclass AND d.refobjid <> r.ev_class"""
_OPCLASS_SQL = """
SELECT o.opcname FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey::int2[], i.indclass::oid[]) AS k(attnum, opclass)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
JOIN pg_opclass o ON o.oid = k.opclass
WHERE i.indrelid = ANY(%s::oid[]) AND a.attname = %s"""
TARGET_COLUMNS_SQL = """
SELECT a.attname, col_description(a.attrelid, a.attnum) FROM pg_attribute a
WHERE a.attrelid = %s::oid AND a.attnum > 0 AND NOT a.attisdropped
  AND col_description(a.attrelid, a.attnum) LIKE '{"reindex":%%'"""
_PRIMARY_KEY_SQL = """
SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = %s::oid AND i.indisprimary"""


def regclass(conn: Connection, name: str) -> int | None:
    quoted = identifier(name).as_string(conn)
    row = conn.execute("SELECT to_regclass(%s)::oid::int8", [quoted]).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def one_oid(conn: Connection, name: str) -> int:
    oid = regclass(conn, name)
    assert oid is not None
    return oid


def server_identity(conn: Connection) -> str:
    """`<system identifier>/<database>`: the cluster's own id survives renamed hosts, ports and users."""
    psycopg = load_psycopg()
    try:
        with conn.transaction():
            system = first_value(
                conn.execute("SELECT system_identifier::text FROM pg_control_system()").fetchone()
            )
    except psycopg.errors.InsufficientPrivilege:  # some managed services revoke it: name the server
        system = first_value(
            conn.execute(
                "SELECT coalesce(host(inet_server_addr()), 'local') || ':' || current_setting('port')"
            ).fetchone()
        )
    return f"{system}/{first_value(conn.execute('SELECT current_database()').fetchone())}"


def writable_columns(conn: Connection, oid: int) -> list[tuple[str, bool]]:
    """The columns a row copy may write, in order: not generated (the table computes them), each with
    whether it is an identity GENERATED ALWAYS (an INSERT overrides it; an UPDATE may not set it)."""
    rows = conn.execute(
        "SELECT a.attname::text, a.attidentity = 'a' FROM pg_attribute a WHERE a.attrelid = %s::oid"
        " AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum",
        [oid],
    ).fetchall()
    return [(str(name), bool(always)) for name, always in rows]


def column_type(conn: Connection, oid: int, column: str) -> str | None:
    """`format_type` of a column (`bigint`, `vector(384)`), or None where the relation has no such column."""
    row = conn.execute(
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::oid AND attname = %s"
        " AND NOT attisdropped",
        [oid, column],
    ).fetchone()
    return None if row is None else str(row[0])


def qualified_name(conn: Connection, oid: int) -> str:
    row = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.oid = %s::oid",
        [oid],
    ).fetchone()
    assert row is not None
    return f"{row[0]}.{row[1]}"


def _attributes(conn: Connection, oid: int) -> tuple[Attribute, ...]:
    rows = conn.execute(_COLUMNS_SQL, [oid]).fetchall()
    return tuple(
        Attribute(name, kind, (nsp, typ), int(toid), int(mod)) for name, kind, nsp, typ, toid, mod in rows
    )


def json_object(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _comment(conn: Connection, oid: int) -> dict[str, Any]:
    return json_object(
        first_value(conn.execute("SELECT obj_description(%s::oid, 'pg_class')", [oid]).fetchone())
    )


def base_tables(conn: Connection, oid: int) -> list[int]:
    return [int(row[0]) for row in conn.execute(_BASE_TABLES_SQL, [oid]).fetchall()]


def read_source_shape(
    conn: Connection, table: str, id_column: str, text_column: str, vector_column: str | None
) -> _SourceShape:
    oid = regclass(conn, table)
    if oid is None:
        raise ConfigError(
            f"table or view {table!r} not found", hint="check [source] table and dsn (schema.table)"
        )
    named = _stored_vector_columns(conn, oid)
    aside = _unserved_target_columns(conn, oid)
    attributes = {
        a.name: replace(a, named_vector=True) if a.name in named and a.type_name[1] == "bit" else a
        for a in _attributes(conn, oid)
        if a.name not in aside
    }
    for option, column in (
        ("id_column", id_column),
        ("text_column", text_column),
        ("vector_column", vector_column),
    ):
        if column in BOOKKEEPING:
            raise ConfigError(
                f"[source] {option} {column!r} is a column this tool writes, not a document field"
            )
        if column is not None and column not in attributes:
            raise ConfigError(
                f"column {column!r} not found in {table!r}",
                hint=f"check [source] {option}; columns: {', '.join(attributes)}",
            )
    vector = _pick_vector(table, attributes, vector_column)
    distance = detect_distance(conn, oid, vector.name) if vector else "cosine"
    # A source named like the alias reads an earlier target through the view: its bookkeeping columns
    # are not the application's data, and the next target adds its own.
    columns = tuple(a for a in attributes.values() if not a.is_vector and a.name not in BOOKKEEPING)
    return _SourceShape(oid, columns, attributes[id_column], attributes[text_column], vector, distance)


def _unserved_target_columns(conn: Connection, oid: int) -> set[str]:
    """Columns of the table that hold targets it does not serve (mode "column": column_targets.py): the
    tool's, never the application's documents or vectors."""
    rows = conn.execute(TARGET_COLUMNS_SQL, [oid]).fetchall()
    marks = {name: json_object(comment).get("reindex") for name, comment in rows}
    return {name for name, mark in marks.items() if isinstance(mark, dict) and not mark.get("served")}


def _stored_vector_columns(conn: Connection, oid: int) -> set[str]:
    """The vector columns that the comments of the relation and its base tables name (a view over a
    target whose vectors are stored as bits: the source of the next migration)."""
    names = set()
    for relation in (oid, *base_tables(conn, oid)):
        name = _comment(conn, relation).get("vector_column")
        if isinstance(name, str):
            names.add(name)
    return names


def _pick_vector(table: str, attributes: dict[str, Attribute], name: str | None) -> Attribute | None:
    if name is not None:
        if not attributes[name].is_vector:
            raise ConfigError(
                f"column {name!r} of {table!r} is not a vector", hint="check [source] vector_column"
            )
        return attributes[name]
    vectors = [a for a in attributes.values() if a.is_vector]
    if len(vectors) > 1:
        raise ConfigError(f"{table!r} has several vector columns", hint="set [source] vector_column")
    return vectors[0] if vectors else None


def detect_distance(conn: Connection, oid: int, column: str) -> Distance:
    """The metric of the column's ANN index; cosine when it has none (the common choice)."""
    return index_distance(conn, oid, column) or "cosine"


def index_distance(conn: Connection, oid: int, column: str) -> Distance | None:
    """Read the metric from the ANN index opclass (the table's, or the base table's for a view)."""
    relations = [oid, *base_tables(conn, oid)]
    for (opclass,) in conn.execute(_OPCLASS_SQL, [relations, column]).fetchall():
        for suffix, distance in _DISTANCES.items():
            if str(opclass).endswith(suffix):
                return distance
    return None


def read_layout(conn: Connection, name: str) -> Layout | None:
    oid = regclass(conn, name)
    if oid is None:
        return None
    columns = _attributes(conn, oid)
    by_name = {a.name: a for a in columns}
    primary = [row[0] for row in conn.execute(_PRIMARY_KEY_SQL, [oid]).fetchall()]
    key = by_name[primary[0]] if len(primary) == 1 else by_name.get("id", columns[0])
    meta = _comment(conn, oid)
    named = meta.get("vector_column")
    columns = tuple(replace(a, named_vector=a.name == named and a.type_name[1] == "bit") for a in columns)
    vector = next((a for a in columns if a.is_vector), None)
    return Layout(name, oid, columns, key, vector, meta)
