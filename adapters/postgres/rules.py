"""What a pgvector target keeps of its source table's column rules, so writes through the alias behave alike.

    source table ──read_rules──► NOT NULL, defaults, numbered columns, CHECKs  (Column, SourceSchema)
    TargetSpec   ──column_rules / checks──► the target's CREATE TABLE
    alias move   ──continue_numbering──► the target's sequences go on after the previous relation's

A numbered column (an identity column, or a serial: a default drawing on a sequence the column owns) gets
an identity of the target's own, never the source's sequence: that belongs to the source table, and `prune`
drops it with the adopted table. Each alias move (cutover, rollback) carries the numbering on, under the
move's lock, so the relation the alias serves next never hands out a key the previous one already gave.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reindex.ports import Check, Column

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

    Connection = psycopg.Connection[tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class Rules:
    """A source relation's column rules: by column name, and its validated CHECK constraints."""

    columns: Mapping[str, Column]
    checks: tuple[Check, ...]


# A serial is a default that draws on a sequence the column owns (deptype 'a'); generated columns keep their
# expression in pg_attrdef too, and are no default.
_RULES_SQL = """
SELECT a.attname, a.attnotnull,
  a.attidentity <> '' OR EXISTS (
    SELECT 1 FROM pg_depend owned JOIN pg_depend used ON used.refobjid = owned.objid
    WHERE owned.classid = 'pg_class'::regclass AND owned.refclassid = 'pg_class'::regclass
      AND owned.refobjid = a.attrelid AND owned.refobjsubid = a.attnum AND owned.deptype = 'a'
      AND used.classid = 'pg_attrdef'::regclass AND used.objid = ad.oid
      AND used.refclassid = 'pg_class'::regclass),
  CASE WHEN a.attgenerated = '' THEN pg_get_expr(ad.adbin, ad.adrelid) END
FROM pg_attribute a LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
WHERE a.attrelid = %s::oid AND a.attnum > 0 AND NOT a.attisdropped"""
_CHECKS_SQL = """
SELECT c.conname, pg_get_constraintdef(c.oid),
  ARRAY(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey))
FROM pg_constraint c WHERE c.conrelid = %s::oid AND c.contype = 'c' AND c.convalidated ORDER BY c.conname"""
# The tables a view reads (an alias reads one).
_VIEW_BASES_SQL = """
SELECT DISTINCT d.refobjid::int8 FROM pg_class v
JOIN pg_rewrite r ON r.ev_class = v.oid
JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
WHERE v.oid = %s::oid AND v.relkind = 'v' AND d.refclassid = 'pg_class'::regclass AND d.refobjid <> v.oid"""
# A view's columns that pass a write on to the base table's column of that name and type: simple references
# (Postgres' own test for an updatable view column), so that column's rules are the ones a write meets.
_PASSED_ON_SQL = """
SELECT v.attname FROM pg_attribute v
JOIN pg_attribute b ON b.attrelid = %s::oid AND b.attname = v.attname AND b.atttypid = v.atttypid
  AND b.attnum > 0 AND NOT b.attisdropped
WHERE v.attrelid = %s::oid AND v.attnum > 0 AND NOT v.attisdropped
  AND pg_column_is_updatable(v.attrelid, v.attnum, false)"""
# Sequences the relation's columns own (serial 'a', identity 'i'); `indexed`: max() is an index lookup.
_NUMBERING_SQL = """
SELECT a.attname, s.oid::int8, pg_sequence_last_value(s.oid), EXISTS (
    SELECT 1 FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_am am ON am.oid = ic.relam
    WHERE i.indrelid = a.attrelid AND i.indkey[0] = a.attnum AND am.amname = 'btree' AND i.indpred IS NULL)
FROM pg_depend d
JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
  AND d.refobjid = %s::oid AND d.deptype IN ('a', 'i')"""


def read_rules(conn: Connection, oid: int, columns: Sequence[Column]) -> Rules:
    """The rules of `columns` (name and type as read) in relation `oid`. A view over one table (an alias)
    has the table's rules on the columns it passes writes on to, as an INSERT through it meets them; a view
    over several has only its own column defaults. A CHECK is kept only when every column it reads is kept
    (never one on the old vectors)."""
    relation, passed = _written_through(conn, oid)
    found = {
        str(name): (bool(not_null), bool(numbered), default)
        for name, not_null, numbered, default in conn.execute(_RULES_SQL, [relation]).fetchall()
        if passed is None or name in passed
    }
    ruled: dict[str, Column] = {}
    for column in columns:
        not_null, numbered, default = found.get(column.name, (False, False, None))
        ruled[column.name] = Column(
            column.name,
            column.type,
            not_null=not_null or numbered,
            default=None if numbered or default is None else str(default),
            numbered=numbered,
        )
    kept = {name for name in ruled if passed is None or name in passed}
    checks = tuple(
        Check(str(name), str(definition))
        for name, definition, reads in conn.execute(_CHECKS_SQL, [relation]).fetchall()
        if set(reads) <= kept
    )
    return Rules(ruled, checks)


def _written_through(conn: Connection, oid: int) -> tuple[int, set[str] | None]:
    """The relation whose rules a write to `oid` meets, and the columns they hold for (None: all)."""
    bases = conn.execute(_VIEW_BASES_SQL, [oid]).fetchall()
    if len(bases) != 1:
        return oid, None  # a table, or a view over several tables: its own
    base = int(bases[0][0])
    return base, {str(name) for (name,) in conn.execute(_PASSED_ON_SQL, [base, oid]).fetchall()}


def column_rules(column: Column) -> sql.Composable:
    """What follows a target column's type: its identity or default, then NOT NULL. The expression is the
    source server's own rendering (pg_get_expr), spliced in parentheses as pg_dump does without them."""
    from psycopg import sql

    parts: list[sql.Composable] = []
    if column.numbered:
        parts.append(sql.SQL(" GENERATED BY DEFAULT AS IDENTITY"))  # the tool writes the source's keys
    elif column.default is not None:
        parts.append(sql.SQL(" DEFAULT ({})").format(sql.SQL(column.default)))
    if column.not_null:
        parts.append(sql.SQL(" NOT NULL"))
    return sql.Composed(parts)


def checks(constraints: Sequence[Check]) -> list[sql.Composable]:
    """Table constraints for the CHECKs, named as in the source (names are per table)."""
    from psycopg import sql

    return [
        sql.SQL("CONSTRAINT {} {}").format(sql.Identifier(c.name), sql.SQL(c.definition)) for c in constraints
    ]


def continue_numbering(conn: Connection, previous: int | None, target: int, *, scan: bool = False) -> None:
    """Move each sequence `target`'s columns own past every key handed out so far: the previous relation's
    same-named sequence, and the column's largest value where an index answers at once (any table with
    `scan`, as finalize does after the load). Run under the alias move's lock, so no writer draws a key
    between the reading and the flip. Sequences only ever move forward here."""
    earlier = {name: last for name, _, last, _ in _numbering(conn, previous)} if previous is not None else {}
    for name, sequence, last, indexed in _numbering(conn, target):
        largest = _largest(conn, target, name) if indexed or scan else None
        candidates = [v for v in (last, earlier.get(name), largest) if v is not None]
        if candidates and (last is None or max(candidates) > last):
            conn.execute("SELECT setval(%s::oid::regclass, %s)", [sequence, max(candidates)])


def _numbering(conn: Connection, oid: int) -> list[tuple[str, int, int | None, bool]]:
    rows = conn.execute(_NUMBERING_SQL, [oid]).fetchall()
    return [(str(n), int(s), None if v is None else int(v), bool(i)) for n, s, v, i in rows]


def _largest(conn: Connection, oid: int, column: str) -> int | None:
    from psycopg import sql

    row = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.oid = %s::oid",
        [oid],
    ).fetchone()
    assert row is not None
    found = conn.execute(
        sql.SQL("SELECT max({}) FROM {}").format(sql.Identifier(column), sql.Identifier(*row))
    ).fetchone()
    return None if found is None or found[0] is None else int(found[0])
