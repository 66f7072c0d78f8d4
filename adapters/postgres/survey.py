"""What `reindex init` sees in a Postgres table or view: key, text and vector columns, rows, alias state.

Uses the source adapter's own catalog helpers and checks, so what init proposes `PostgresSource` accepts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reindex.errors import ConfigError, validate
from reindex.ports import AliasInfo
from reindex.survey import SAMPLE_ROWS, VECTOR_NAMES, Choice, Overrides, Survey, choose_by_name, choose_text
from reindex_adapters.postgres.alias import resolve_alias
from reindex_adapters.postgres.catalog import (
    BOOKKEEPING,
    Attribute,
    base_tables,
    index_distance,
    read_source_shape,
    regclass,
)
from reindex_adapters.postgres.catalog import _attributes as _catalog_columns
from reindex_adapters.postgres.connection import Database, first_value, identifier
from reindex_adapters.postgres.source import PostgresSource

if TYPE_CHECKING:
    from reindex_adapters.postgres.connection import Connection

_TEXT_TYPES = frozenset({"text", "varchar", "bpchar", "citext"})
_RELATIONS = {
    "r": "table",
    "p": "partitioned table",
    "v": "view",
    "m": "materialized view",
    "f": "foreign table",
}
# Single-column unique indexes without a predicate, the primary key first: keys a keyset scan can use.
_KEYS_SQL = """
SELECT a.attname, i.indisprimary FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
WHERE i.indrelid = ANY(%s::oid[]) AND i.indnatts = 1 AND i.indisunique AND i.indpred IS NULL
ORDER BY i.indisprimary DESC, a.attnum"""


def survey(section: dict[str, Any], given: Overrides) -> Survey:
    """Read the catalog and a small sample of `section`'s table; the DSN comes from its environment variable."""
    config = validate("source", PostgresSource.Config, section)
    db = Database(config.resolved_dsn("source"), "source", vectors=False)
    try:
        with db.errors():
            return _survey(db.connection(), config.table, given)
    finally:
        db.close()


def _survey(conn: Connection, table: str, given: Overrides) -> Survey:
    oid = regclass(conn, table)
    if oid is None:
        raise ConfigError(
            f"table or view {table!r} not found",
            hint="check --table (schema.table) and the database of the DSN",
        )
    columns = [a for a in _catalog_columns(conn, oid) if a.name not in BOOKKEEPING]
    key = _choose_key(conn, oid, [a.name for a in columns], given.id_field)
    texts = [a.name for a in columns if a.type_name[1] in _TEXT_TYPES and a.name != key.field]
    lengths = _average_lengths(conn, table, texts)
    text = choose_text(lengths, given.text_field)
    vector = choose_by_name([a.name for a in columns if a.is_vector], VECTOR_NAMES, given.vector_field)
    if key.field is not None and text.field is not None:
        read_source_shape(conn, table, key.field, text.field, vector.field)  # the source's own checks
    relkind = str(
        first_value(conn.execute("SELECT relkind::text FROM pg_class WHERE oid = %s::oid", [oid]).fetchone())
    )
    alias, note = _alias_state(conn, table, oid, relkind)
    attribute = next((a for a in columns if a.name == vector.field), None)
    return Survey(
        kind="postgres",
        name=table,
        relation=_RELATIONS.get(relkind, "relation"),
        documents=_count(conn, table),
        units="rows",
        unknown_distance="distance unknown (no ANN index)",
        id=key,
        text=text,
        vector=vector,
        vector_type=attribute.type if attribute else None,
        dim=_dim(attribute),
        distance=index_distance(conn, oid, attribute.name) if attribute else None,
        alias=alias,
        text_lengths=lengths,
        notes=(note,),
    )


def _choose_key(conn: Connection, oid: int, names: list[str], given: str | None) -> Choice:
    """The given column, else the primary key or a unique column (a view's: its one table's), else `id`."""
    if given is not None:
        return Choice(given, "given on the command line")
    bases = base_tables(conn, oid)
    relations = [oid, *bases] if len(bases) <= 1 else [oid]
    for name, is_primary in conn.execute(_KEYS_SQL, [relations]).fetchall():
        if name in names:
            return Choice(str(name), "the primary key" if is_primary else "a unique column")
    if "id" in names:
        return Choice("id", "named id (no primary key or unique index: ids must be unique)")
    return Choice(None, "no primary key, unique column or column named id")


def _average_lengths(conn: Connection, table: str, names: list[str]) -> dict[str, float | None]:
    """Average characters of each text column over the first SAMPLE_ROWS rows; None for no rows."""
    from psycopg import sql

    if not names:
        return {}
    averages = sql.SQL(", ").join(sql.SQL("avg(length({}))").format(sql.Identifier(n)) for n in names)
    query = sql.SQL("SELECT {} FROM (SELECT {} FROM {} LIMIT %s) AS sample").format(
        averages, sql.SQL(", ").join(sql.Identifier(n) for n in names), identifier(table)
    )
    row = conn.execute(query, [SAMPLE_ROWS]).fetchone()
    assert row is not None
    return {name: None if value is None else float(value) for name, value in zip(names, row, strict=True)}


def _alias_state(conn: Connection, table: str, oid: int, relkind: str) -> tuple[AliasInfo | None, str]:
    """Whether the name is an alias (a view over one table) today, and what its first cutover will do."""
    if relkind in ("r", "p"):
        return None, (
            f"{table} is a plain table today, and stays the table applications use: the new vectors go in a"
            ' column beside the old ones ([target] mode = "column"), and cutover renames the two'
        )
    if relkind != "v" or len(base_tables(conn, oid)) != 1:
        kind = _RELATIONS.get(relkind, "relation") if relkind != "v" else "view over several tables"
        return None, f"{table} is a {kind}: the cutover cannot replace it, so choose another --alias"
    info = resolve_alias(conn, table).info
    if info.fingerprint:
        return info, f"{table} is already an alias: a view an earlier migration made over {info.target}"
    return (
        info,
        f"{table} is a view over {info.target}: the first cutover replaces it with a view over the new target",
    )


def _count(conn: Connection, table: str) -> int:
    from psycopg import sql

    return int(
        first_value(conn.execute(sql.SQL("SELECT count(*) FROM {}").format(identifier(table))).fetchone())
    )


def _dim(attribute: Attribute | None) -> int | None:
    """pgvector keeps a column's dimension as its type modifier (-1 when declared without one)."""
    return attribute.typmod if attribute is not None and attribute.typmod > 0 else None
