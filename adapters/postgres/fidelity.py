"""What an application's table has that a cutover would not keep, in each of the two modes.

`mode = "table"` (0.2's): the first cutover onto a plain table renames it `<alias>__adopted` and puts a view
over a new table in its place (alias.py). The new table gets the columns, defaults, NOT NULLs, CHECKs, primary
key and grants (ddl.py, rules.py); everything else bound to the table stays on the renamed one, and a view is
not a table.

`mode = "column"`: the new vectors go into a column of the application's own table and the flip renames two
columns (side_by_side.py). The table stays the same table, so it keeps everything bound to it; what it may
not keep is bound to the vector column itself (a view that reads it, its NOT NULL, its checks), what fires
on the tool's writes (triggers on every UPDATE, publications), and the one column it adds while in flight.

This module reads the catalog for each such thing, so that `plan`, `run` and `cutover` name it and refuse
unless `[target] accept` names it too. Nothing is discovered after the cutover. Each finding is a key (what
`accept` takes) and the objects found, in the catalog's own words.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, get_args

from reindex.errors import ConfigError
from reindex.ports import Loss
from reindex_adapters.postgres import dependents

if TYPE_CHECKING:
    from reindex_adapters.postgres.connection import Connection


Kept = Literal[
    "row_security",
    "unique_constraints",
    "indexes",
    "triggers",
    "column_grants",
    "generated_columns",
    "dependent_views",
    "foreign_keys",
    "referenced_by",
    "partitions",
    "publications",
    "replica_identity",
    "rules",
    "statistics",
    "table_options",
    "owner",
    "table_statements",
    "column_order",
    "extra_column",
    "vector_not_null",
    "vector_constraints",
    "update_triggers",
]
KEYS: tuple[str, ...] = get_args(Kept)

# What the view mode loses of each, in one line; the objects found follow it.
_WHAT: dict[str, str] = {
    "row_security": "row-level security: the view reads the new table with its owner's rights, so every"
    " role sees and writes every row",
    "unique_constraints": "unique and exclusion constraints besides the primary key: duplicates are accepted"
    " and ON CONFLICT on them fails",
    "indexes": "secondary indexes: filtered queries become sequential scans",
    "triggers": "triggers: they stop firing",
    "column_grants": "column grants: roles granted columns get 'permission denied'",
    "generated_columns": "generated columns: they become plain columns, NULL on new rows",
    "dependent_views": "views over the table: they keep reading the old table and its old vectors",
    "foreign_keys": "foreign keys from the table: new rows are not checked",
    "referenced_by": "foreign keys to the table: new rows cannot be referenced, deletes do not cascade",
    "partitions": "partitioning or inheritance: the new table is one plain table",
    "publications": "publications: writes through the alias are no longer published",
    "replica_identity": "replica identity: the new table has the default",
    "rules": "rules: they stop applying",
    "statistics": "extended statistics: the planner loses them",
    "table_options": "storage parameters: the new table has the defaults",
    "owner": "ownership: the view and the new table are owned by the tool's role",
    "table_statements": "the alias becomes a view: COPY ... FROM, ALTER TABLE and TRUNCATE refuse it",
    "column_order": "column order: SELECT * and INSERT without a column list see the vector column after the"
    " others, then the tool's bookkeeping columns",
}

# The tool's own triggers: the write log of a live target and of a 0.2 move-back (change_log.py), and the
# content hash a table-mode target fills for the application's writes (ddl.py). Not the application's.
_TOOL_TRIGGERS = "('reindex_writes', 'reindex_restore', 'reindex_content_hash')"
# One query per key; each returns the objects found as text. %(oid)s: the table; %(id)s: the id column's
# attnum (the one key the new table gets); %(vector)s: the vector column's attnum or 0 (the tool builds its
# own ANN index on it).
_FOUND_SQL: dict[str, str] = {
    "row_security": """
SELECT 'enabled' || CASE WHEN relforcerowsecurity THEN ' and forced' ELSE '' END FROM pg_class
WHERE oid = %(oid)s AND relrowsecurity
UNION ALL SELECT 'policy ' || quote_ident(polname) FROM pg_policy WHERE polrelid = %(oid)s""",
    "unique_constraints": """
SELECT coalesce(quote_ident(con.conname) || ' ' || pg_get_constraintdef(con.oid),
                quote_ident(ic.relname) || ' ' || substring(pg_get_indexdef(i.indexrelid) from ' USING .*$'))
FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid AND con.conrelid = i.indrelid
WHERE i.indrelid = %(oid)s AND (i.indisunique OR i.indisexclusion)
  AND NOT (i.indisprimary AND i.indnatts = 1 AND i.indkey[0] = %(id)s AND i.indpred IS NULL)
ORDER BY 1""",
    "indexes": """
SELECT quote_ident(ic.relname) || substring(pg_get_indexdef(i.indexrelid) from ' USING .*$')
FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
WHERE i.indrelid = %(oid)s AND NOT i.indisunique AND NOT i.indisexclusion
  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = i.indexrelid
                  AND d.refobjid = %(oid)s AND d.refobjsubid = %(vector)s)
ORDER BY 1""",
    "triggers": f"""
SELECT quote_ident(tgname) FROM pg_trigger WHERE tgrelid = %(oid)s AND NOT tgisinternal
  AND tgname NOT IN {_TOOL_TRIGGERS} ORDER BY 1""",
    "column_grants": """
SELECT quote_ident(attname) || ' (' || array_to_string(attacl, ', ') || ')' FROM pg_attribute
WHERE attrelid = %(oid)s AND attnum > 0 AND NOT attisdropped AND attacl IS NOT NULL ORDER BY attnum""",
    "generated_columns": """
SELECT quote_ident(attname) FROM pg_attribute
WHERE attrelid = %(oid)s AND attnum > 0 AND NOT attisdropped AND attgenerated <> '' ORDER BY attnum""",
    "dependent_views": """
SELECT DISTINCT r.ev_class::regclass::text FROM pg_depend d
JOIN pg_rewrite r ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = %(oid)s AND r.ev_class <> %(oid)s ORDER BY 1""",
    "foreign_keys": """
SELECT quote_ident(conname) || ' ' || pg_get_constraintdef(oid) FROM pg_constraint
WHERE conrelid = %(oid)s AND contype = 'f' AND conparentid = 0 ORDER BY 1""",
    "referenced_by": """
SELECT conrelid::regclass::text || ' ' || quote_ident(conname) || ' ' || pg_get_constraintdef(oid)
FROM pg_constraint WHERE confrelid = %(oid)s AND contype = 'f' AND conparentid = 0 ORDER BY 1""",
    "partitions": """
SELECT 'partitioned ' || pg_get_partkeydef(oid) FROM pg_class WHERE oid = %(oid)s AND relkind = 'p'
UNION ALL SELECT 'inherits from ' || inhparent::regclass::text FROM pg_inherits WHERE inhrelid = %(oid)s
UNION ALL SELECT 'parent of ' || inhrelid::regclass::text FROM pg_inherits WHERE inhparent = %(oid)s""",
    "publications": """
SELECT quote_ident(p.pubname) FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
WHERE pr.prrelid = %(oid)s ORDER BY 1""",
    "replica_identity": """
SELECT CASE relreplident WHEN 'f' THEN 'full' WHEN 'n' THEN 'nothing' ELSE 'using an index' END
FROM pg_class WHERE oid = %(oid)s AND relreplident <> 'd'""",
    "rules": """
SELECT quote_ident(rulename) FROM pg_rewrite WHERE ev_class = %(oid)s ORDER BY 1""",
    "statistics": """
SELECT quote_ident(stxname) FROM pg_statistic_ext WHERE stxrelid = %(oid)s ORDER BY 1""",
    "table_options": """
SELECT array_to_string(reloptions, ', ') FROM pg_class WHERE oid = %(oid)s AND reloptions IS NOT NULL""",
    "owner": """
SELECT 'owned by ' || quote_ident(pg_get_userbyid(relowner)) || ', not ' || quote_ident(current_user)
FROM pg_class WHERE oid = %(oid)s AND pg_get_userbyid(relowner) <> current_user""",
    "table_statements": "SELECT 'the alias becomes a view'",
    "column_order": "SELECT 'the vector column moves after the others'",
}

# mode = "column": the same keys where the meaning is the same; %(vector)s is the served vector column.
_NOT_A_TOOL_COLUMN = "coalesce(col_description(a.attrelid, a.attnum), '') NOT LIKE '{\"reindex\":%%'"
_COLUMN_WHAT: dict[str, str] = {
    "row_security": "row-level security applies to the tool's role: it would read and fill only the rows"
    " its policies show (run as the table's owner, or a role with BYPASSRLS)",
    "dependent_views": "views that read the vector column and that the flip cannot define again over the new"
    " one (dependents.py): they would keep serving the old vectors",
    "partitions": "inheritance, sub-partitions, or a table that is itself a partition: the new column's index"
    " cannot be built over them without holding writers",
    "publications": "publications: the fill updates every row and the new column would be published to"
    " subscribers whose tables lack it",
    "column_order": "column order: after the flip the vector column is the table's last",
    "extra_column": "one more column while a migration is in flight (run to prune): SELECT *, and INSERT or"
    " COPY without a column list, see it",
    "vector_not_null": "NOT NULL on the vector column: the new column accepts NULL",
    "vector_constraints": "checks and other indexes on the vector column stay on the old one",
    "update_triggers": "triggers that fire on every UPDATE fire for the tool's writes too: once per row for"
    " the fill, and for each row sync re-embeds",
}
_COLUMN_FOUND_SQL: dict[str, str] = {
    "row_security": """
SELECT 'enabled' || CASE WHEN relforcerowsecurity THEN ' and forced' ELSE '' END FROM pg_class c
WHERE oid = %(oid)s AND relrowsecurity
  AND (relforcerowsecurity OR pg_get_userbyid(relowner) <> current_user)
  AND NOT (SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user)""",
    "dependent_views": dependents.UNCARRIED_SQL,
    # one level of declarative partitions is kept (each partition's index built CONCURRENTLY, then attached)
    "partitions": """
SELECT 'inherits from ' || i.inhparent::regclass::text FROM pg_inherits i WHERE i.inhrelid = %(oid)s
UNION ALL SELECT CASE WHEN c.relispartition THEN 'sub-partitioned: ' ELSE 'parent of ' END || c.oid::regclass::text
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = %(oid)s AND (NOT c.relispartition OR c.relkind = 'p')""",
    "publications": _FOUND_SQL["publications"],
    "column_order": f"""
SELECT 'followed by ' || string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) FROM pg_attribute a
WHERE a.attrelid = %(oid)s AND a.attnum > %(vector)s AND %(vector)s > 0 AND NOT a.attisdropped
  AND {_NOT_A_TOOL_COLUMN} HAVING count(*) > 0""",
    "extra_column": "SELECT 'the new vectors'",
    "vector_not_null": """
SELECT 'NOT NULL' FROM pg_attribute WHERE attrelid = %(oid)s AND attnum = %(vector)s AND attnotnull""",
    "vector_constraints": """
SELECT quote_ident(conname) || ' ' || pg_get_constraintdef(oid) FROM pg_constraint
WHERE conrelid = %(oid)s AND contype IN ('c', 'u', 'x') AND %(vector)s = ANY(conkey)
UNION ALL
SELECT quote_ident(ic.relname) || substring(pg_get_indexdef(i.indexrelid) from ' USING .*$')
FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_am am ON am.oid = ic.relam
WHERE i.indrelid = %(oid)s AND am.amname NOT IN ('hnsw', 'ivfflat')
  AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
  AND EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = i.indexrelid
              AND d.refobjid = %(oid)s AND d.refobjsubid = %(vector)s)""",
    "update_triggers": f"""
SELECT quote_ident(tgname) FROM pg_trigger
WHERE tgrelid = %(oid)s AND NOT tgisinternal AND tgenabled <> 'D' AND (tgtype & 16) <> 0
  AND cardinality(tgattr::int2[]) = 0 AND tgname NOT IN {_TOOL_TRIGGERS} ORDER BY 1""",
}

_ATTNUM_SQL = "SELECT attnum FROM pg_attribute WHERE attrelid = %s::oid AND attname = %s AND NOT attisdropped"


def losses(
    conn: Connection,
    oid: int,
    id_column: str,
    vector_column: str | None,
    accepted: Sequence[str],
    *,
    column: bool = False,
) -> list[Loss]:
    """What the table `oid` has that the view mode (or, with `column`, the column mode) would not keep,
    each marked accepted or not."""
    params = {"oid": oid, "id": _attnum(conn, oid, id_column), "vector": _attnum(conn, oid, vector_column)}
    queries, what = (_COLUMN_FOUND_SQL, _COLUMN_WHAT) if column else (_FOUND_SQL, _WHAT)
    found = []
    for key in KEYS:
        if key not in queries:
            continue
        objects = [str(row[0]) for row in conn.execute(queries[key], params).fetchall()]
        if objects:
            found.append(Loss(key, what[key], tuple(objects), accepted=key in accepted))
    return found


def refuse_unaccepted(found: Sequence[Loss], alias: str, *, column: bool = False) -> None:
    """ConfigError naming what `[target] accept` must name before the table behind `alias` is adopted (or,
    with `column`, before the column mode adds its column)."""
    refused = [loss.key for loss in found if not loss.accepted]
    if not refused:
        return
    keys = ", ".join(f'"{key}"' for key in refused)
    hint = f"to go ahead anyway, losing them, set [target] accept = [{keys}]"
    if not column:
        hint = f'where the source is this table, mode = "column" keeps them; {hint}'
    raise ConfigError(
        f"the cutover would not keep what table {alias!r} has: {', '.join(refused)} (`reindex plan` lists each)",
        hint=hint,
    )


def _attnum(conn: Connection, oid: int, column: str | None) -> int:
    if column is None:
        return 0
    row = conn.execute(_ATTNUM_SQL, [oid, column]).fetchone()
    return 0 if row is None else int(row[0])
