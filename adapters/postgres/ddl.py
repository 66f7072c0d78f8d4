"""Creating a target: its table, columns and comment, the settings of its HNSW index, and the default
and trigger that let the application write through the alias.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from reindex.errors import ConfigError
from reindex.ports import TargetSpec
from reindex_adapters.postgres import rules as postgres_rules
from reindex_adapters.postgres.catalog import BOOKKEEPING, ORIGIN, RESERVED, Layout
from reindex_adapters.postgres.connection import first_line, first_value, identifier, load_psycopg
from reindex_adapters.postgres.storage import Storage

if TYPE_CHECKING:
    from psycopg import sql

    from reindex_adapters.postgres.connection import Connection


HNSW_SQL = """
SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam
WHERE i.indrelid = %s::oid AND am.amname = 'hnsw'"""
INDEX_SETTINGS_SQL = """
SELECT set_config('maintenance_work_mem', %s, true),
  set_config('max_parallel_maintenance_workers',
             greatest(current_setting('max_parallel_maintenance_workers')::int, %s::int)::text, true)"""


def check_same_target(spec: TargetSpec, layout: Layout, storage: Storage) -> None:
    found = (layout.meta.get("fingerprint"), layout.meta.get("dim"))
    if found != (spec.fingerprint, spec.dim):
        raise ConfigError(
            f"target {spec.name!r} exists with fingerprint {found[0]} and dim {found[1]}",
            hint="choose another [target] name",
        )
    if layout.storage != storage:
        raise ConfigError(
            f"target {spec.name!r} exists storing {layout.storage.label}, not {storage.label}",
            hint="choose another [target] name, or the storage it was built with",
        )


def create_target(conn: Connection, spec: TargetSpec, storage: Storage) -> None:
    from psycopg import sql

    ident = identifier(spec.name)
    vector = (spec.source.vector_field or "embedding") if spec.source.columns else "embedding"
    definitions = (
        _schema_columns(conn, spec, storage) if spec.source.columns else _schemaless_columns(spec, storage)
    )
    errors = load_psycopg().errors
    try:
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(ident, sql.SQL(", ").join(definitions)))
    except (errors.UndefinedFunction, errors.UndefinedTable, errors.UndefinedObject) as exc:
        raise ConfigError(
            f"the target database cannot give {spec.name!r} the source's defaults and checks: "
            + first_line(exc),
            hint="create what they use there first (a function, a sequence, an extension)",
        ) from None
    meta = target_meta(spec, storage, vector) | {"schemaless": not spec.source.columns}
    conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(ident, sql.Literal(json.dumps(meta))))


def target_meta(spec: TargetSpec, storage: Storage, vector: str) -> dict[str, Any]:
    """What a target's table comment records: its identity, what it was built from, how it stores."""
    return {
        "fingerprint": spec.fingerprint,
        "dim": spec.dim,
        "alias": spec.alias,
        "model": dict(spec.model),
        "distance": spec.source.distance,
        "created_at": datetime.now(UTC).isoformat(),
        "id_field": spec.source.id_field,
        "text_field": spec.source.text_field,
        "plan_id": spec.plan_id,  # the migration that built it; never re-stamped (prepare only creates)
        "nonce": spec.nonce,
        "storage": storage.kind,  # the stored precision (adapters/postgres/storage.py)
        "full_vector": storage.full_vector,
        "vector_column": vector,
    }


def _schema_columns(conn: Connection, spec: TargetSpec, storage: Storage) -> list[sql.Composable]:
    """The source's columns with the same names and types, so the alias stays a drop-in replacement."""
    from psycopg import sql

    names = [c.name for c in spec.source.columns]
    vector = spec.source.vector_field or "embedding"
    if spec.source.id_field not in names:
        raise ConfigError(f"id column {spec.source.id_field!r} is not among the source columns")
    if vector in names or set(BOOKKEEPING) & set(names):
        raise ConfigError(f"source columns clash with {vector!r} or {', '.join(BOOKKEEPING)}")
    definitions: list[sql.Composable] = []
    for column in spec.source.columns:
        key = sql.SQL(" PRIMARY KEY" if column.name == spec.source.id_field else "")
        definitions.append(
            sql.SQL("{} {}{}{}").format(
                sql.Identifier(column.name),
                _checked_type(conn, column.type),
                postgres_rules.column_rules(column),
                key,
            )
        )
    return [
        *definitions,
        storage.column_sql(vector, spec.dim),
        *_reindex_columns(),
        *postgres_rules.checks(spec.source.checks),
    ]


def _schemaless_columns(spec: TargetSpec, storage: Storage) -> list[sql.Composable]:
    from psycopg import sql

    text = sql.SQL("{} text").format(sql.Identifier(spec.source.text_field))
    return [
        sql.SQL("id text PRIMARY KEY"),
        text,
        sql.SQL("payload jsonb"),
        storage.column_sql("embedding", spec.dim),
        *_reindex_columns(),
    ]


# Rows the application writes through the alias (an INSERT, a LangChain upsert) carry no bookkeeping: the
# fingerprint defaults to the target's, and this trigger fills the content hash from the text column (named
# by TG_ARGV[0]) as `reindex.fingerprint.content_hash` computes it, unless the writer set it (reindex itself
# does). On an UPDATE it does so only when the vector (TG_ARGV[1]) changed with the text: a text rewritten
# under its old vector keeps the old hash, so verify reports it stale and sync re-embeds it, never "complete".
# Where it fills the hash it marks the row `reindex_origin = 'application'`, through jsonb_populate_record:
# the function is shared by every target of the schema, and targets older than that column must still
# accept writes. The tool's own upserts (`AS_THE_TOOL`) are left as written: bookkeeping whole, origin NULL,
# so a row the tool rewrites is its own again, even where its hash, text and vector look like a fill.
_FILL_CONTENT_HASH = """
CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $body$
DECLARE
    body text;
BEGIN
    IF current_setting('reindex.writer', true) = 'reindex' THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' AND NEW.reindex_content_hash IS NOT NULL THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.reindex_content_hash IS DISTINCT FROM OLD.reindex_content_hash THEN
        RETURN NEW;
    END IF;
    body := to_jsonb(NEW) ->> TG_ARGV[0];
    IF TG_OP = 'UPDATE' AND (
        body IS NOT DISTINCT FROM (to_jsonb(OLD) ->> TG_ARGV[0])
        OR (to_jsonb(NEW) -> TG_ARGV[1]) IS NOT DISTINCT FROM (to_jsonb(OLD) -> TG_ARGV[1])
    ) THEN
        RETURN NEW;
    END IF;
    NEW.reindex_content_hash := left(encode(sha256(convert_to(coalesce(body, ''), 'UTF8')), 'hex'), 32);
    NEW := jsonb_populate_record(NEW, jsonb_build_object('reindex_origin', 'application'));
    RETURN NEW;
END
$body$
"""
# Named by a digest of its body: a role that did not create it can neither replace nor alter it ("must be
# owner of function"), and need not: the same name is the same body, so it is created once, by whoever comes
# first, and used by every role's targets (EXECUTE is PUBLIC's unless a database revokes it). A new body is a
# new name; the old function stays for the targets whose triggers still call it.
FILL_FUNCTION = "reindex_fill_content_hash_" + hashlib.sha256(_FILL_CONTENT_HASH.encode()).hexdigest()[:8]
# This transaction's writes are the tool's (transaction-local: an application's pooled connection never has it).
AS_THE_TOOL = "SELECT set_config('reindex.writer', 'reindex', true)"


def accept_application_writes(conn: Connection, layout: Layout, spec: TargetSpec) -> None:
    """Bookkeeping columns an application's write through the alias may leave out: a default fingerprint
    and a trigger for the content hash and origin. Created after the bulk load, so the load pays no
    trigger; kept idempotent (finalize runs after every run). A target built before the origin column
    gets it here: nullable, no default, so adding it changes only the catalog."""
    from psycopg import sql

    names = {a.name for a in layout.columns}
    if not set(RESERVED) <= names or spec.source.text_field not in names or layout.vector is None:
        return
    schema = first_value(
        conn.execute(
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s",
            [layout.oid],
        ).fetchone()
    )
    function = sql.Identifier(str(schema), FILL_FUNCTION)  # beside the target; shared by its schema's targets
    if ORIGIN not in names:
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} text").format(
                layout.ident, sql.Identifier(ORIGIN)
            )
        )
    conn.execute(
        sql.SQL("ALTER TABLE {} ALTER COLUMN reindex_fingerprint SET DEFAULT {}").format(
            layout.ident, sql.Literal(spec.fingerprint)
        )
    )
    _create_shared_function(
        conn, str(schema), FILL_FUNCTION, sql.SQL(_FILL_CONTENT_HASH).format(function=function)
    )
    conn.execute(sql.SQL("DROP TRIGGER IF EXISTS reindex_content_hash ON {}").format(layout.ident))
    conn.execute(
        sql.SQL(
            "CREATE TRIGGER reindex_content_hash BEFORE INSERT OR UPDATE ON {} FOR EACH ROW"
            " EXECUTE FUNCTION {}({}, {})"
        ).format(layout.ident, function, sql.Literal(spec.source.text_field), sql.Literal(layout.vector.name))
    )


def _create_shared_function(conn: Connection, schema: str, name: str, create: sql.Composed) -> None:
    """Create `schema.name` unless it exists; another session creating it at the same moment is fine."""
    import psycopg

    exists = conn.execute(
        "SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s"
        " AND p.proname = %s",
        [schema, name],
    ).fetchone()
    if exists:
        return
    try:
        with conn.transaction():
            conn.execute(create)
    except (psycopg.errors.DuplicateFunction, psycopg.errors.UniqueViolation):
        return  # made by a concurrent session: the same body


def _reindex_columns() -> list[sql.Composable]:
    from psycopg import sql

    required = [sql.SQL("{} text NOT NULL").format(sql.Identifier(name)) for name in RESERVED]
    return [*required, sql.SQL("{} text").format(sql.Identifier(ORIGIN))]


def _checked_type(conn: Connection, type_text: str) -> sql.Composable:
    """Accept a type name only if this server parses it as a type (it is then safe to splice)."""
    from psycopg import sql

    psycopg = load_psycopg()
    try:
        with conn.transaction():
            found = first_value(conn.execute("SELECT to_regtype(%s)", [type_text]).fetchone())
    except psycopg.Error:
        found = None
    if found is None:
        raise ConfigError(
            f"type {type_text!r} does not exist in the target database",
            hint="create the type there (or install its extension) first",
        )
    return sql.SQL(type_text)
