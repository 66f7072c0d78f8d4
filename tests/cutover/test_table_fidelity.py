"""What an application's table has that the first cutover would not keep is found before anything is built.

The first cutover onto a plain table puts a view over a new table in its place (adapters/postgres/alias.py);
the new table gets the columns, their rules, the primary key and the table grants, and nothing else. Each
test builds a table the way an application does, runs the application's own statement, and shows that
`plan` names what would be lost (terminal, JSON), that `run` refuses before it creates anything, that
`cutover` checks again under its lock, and that the application's statement still works afterwards: the
table was never touched. `[target] accept` names a loss to go ahead anyway.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.cutover.support import reindex, sql

ROWS = 20
ALWAYS = ["table_statements", "column_order"]  # a view is not a table, whatever the table has


@pytest.fixture
def app_table(pg_dsn: str) -> Iterator[str]:
    """A multi-tenant documents table with old 8-d vectors, as a hosted-Postgres application keeps it."""
    sql(
        pg_dsn,
        "CREATE EXTENSION IF NOT EXISTS vector",
        "CREATE TABLE docs (id bigint PRIMARY KEY, body text NOT NULL, tenant text NOT NULL, url text,"
        " meta jsonb, embedding vector(8))",
        f"INSERT INTO docs SELECT i, 'document ' || i, CASE WHEN i % 2 = 0 THEN 'tenant_a' ELSE 'tenant_b' END,"
        f" 'https://example.com/' || i, jsonb_build_object('n', i), array_fill(i::real, ARRAY[8])::vector"
        f" FROM generate_series(1, {ROWS}) i",
        "CREATE INDEX docs_embedding ON docs USING hnsw (embedding vector_cosine_ops)",
    )
    yield pg_dsn
    # roles belong to the whole server: the ones a test made go with it, or the next test that makes them
    # (test_column_mode's application) fails on this worker
    made = [
        r
        for (r,) in sql(
            pg_dsn, "SELECT rolname FROM pg_roles WHERE rolname IN ('tenant_a', 'tenant_b', 'reader')"
        )
    ]
    if made:
        sql(pg_dsn, f"DROP OWNED BY {', '.join(made)} CASCADE", *(f"DROP ROLE {role}" for role in made))


def config(tmp_path: Path, dsn: str, accept: list[str] | None = None) -> Path:
    path = tmp_path / "docs.toml"
    accepted = f"accept = {json.dumps(accept)}\n" if accept is not None else ""
    path.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{dsn}"\ntable = "docs"\nid_column = "id"\ntext_column = "body"\n'
        '[embedder]\nkind = "hash"\ndim = 16\n'
        f'[target]\nkind = "pgvector"\ndsn = "{dsn}"\nalias = "docs"\n{accepted}'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 50\n'
    )
    return path


def planned_losses(path: Path) -> tuple[int, dict[str, dict[str, Any]]]:
    code, stdout, _ = reindex("plan", "-c", str(path), "--json", "--no-calibrate")
    return code, {loss["key"]: loss for loss in json.loads(stdout)["losses"]}


def assert_refused_untouched(dsn: str, path: Path, *keys: str) -> dict[str, dict[str, Any]]:
    """`plan` names each key and exits 2; `run` refuses with one line naming them; nothing was built."""
    kind = "SELECT relkind::text FROM pg_class WHERE relname = 'docs'"
    before = sql(dsn, kind)
    code, losses = planned_losses(path)
    assert code == 2
    for key in keys:
        assert key in losses and not losses[key]["accepted"], (key, losses)
    code, _, stderr = reindex("run", "-c", str(path))
    assert code == 2
    assert all(key in stderr for key in keys) and "[target] accept" in stderr
    assert sql(dsn, "SELECT relname FROM pg_class WHERE relname LIKE 'docs\\_\\_%'") == []
    assert sql(dsn, kind) == before
    return losses


def test_a_plain_table_is_named_as_becoming_a_view(app_table: str, tmp_path: Path) -> None:
    losses = assert_refused_untouched(app_table, config(tmp_path, app_table), *ALWAYS)
    # the primary key on the id column and the ANN index on the vector column are carried: not losses
    assert set(losses) == set(ALWAYS)
    page = tmp_path / "plan.html"
    code, stdout, _ = reindex(
        "plan", "-c", str(config(tmp_path, app_table)), "--no-calibrate", "--html", str(page)
    )
    assert code == 2 and "The target would not keep what docs has" in stdout
    assert 'accept = ["table_statements", "column_order"]' in " ".join(stdout.split())
    html = page.read_text()  # the page names each loss and the line that accepts them
    assert '<table id="losses">' in html and "<code>table_statements</code>" in html
    assert "accept = [&quot;table_statements&quot;, &quot;column_order&quot;]" in html


def test_row_level_security_is_refused_and_tenants_still_see_only_their_rows(
    app_table: str, tmp_path: Path
) -> None:
    sql(
        app_table,
        "CREATE ROLE tenant_a",
        "CREATE ROLE tenant_b",
        "GRANT SELECT, INSERT ON docs TO tenant_a, tenant_b",
        "ALTER TABLE docs ENABLE ROW LEVEL SECURITY",
        "CREATE POLICY tenants ON docs USING (tenant = current_user) WITH CHECK (tenant = current_user)",
    )
    count = "SELECT count(*) FROM docs"
    assert sql(app_table, count, role="tenant_a") == [(ROWS // 2,)]
    losses = assert_refused_untouched(app_table, config(tmp_path, app_table), "row_security")
    assert losses["row_security"]["objects"] == ["enabled", "policy tenants"]
    assert sql(app_table, count, role="tenant_a") == [(ROWS // 2,)]
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        sql(app_table, "INSERT INTO docs (id, body, tenant) VALUES (999, 'x', 'tenant_b')", role="tenant_a")


def test_unique_constraints_and_on_conflict_are_refused(app_table: str, tmp_path: Path) -> None:
    upsert = (
        "INSERT INTO docs (id, body, tenant, url) VALUES (500, 'new', 'tenant_a', 'https://example.com/3')"
    )
    upsert += " ON CONFLICT (url) DO UPDATE SET body = excluded.body RETURNING id"
    sql(app_table, "ALTER TABLE docs ADD CONSTRAINT docs_url_key UNIQUE (url)")
    assert sql(app_table, upsert) == [(3,)]
    losses = assert_refused_untouched(app_table, config(tmp_path, app_table), "unique_constraints")
    assert losses["unique_constraints"]["objects"] == ["docs_url_key UNIQUE (url)"]
    assert sql(app_table, upsert) == [(3,)]


def test_secondary_indexes_are_refused_by_name(app_table: str, tmp_path: Path) -> None:
    sql(
        app_table,
        "CREATE INDEX docs_tenant ON docs (tenant)",
        "CREATE INDEX docs_meta ON docs USING gin (meta)",
    )
    losses = assert_refused_untouched(app_table, config(tmp_path, app_table), "indexes")
    assert losses["indexes"]["objects"] == ["docs_meta USING gin (meta)", "docs_tenant USING btree (tenant)"]
    plan = sql(app_table, "SET enable_seqscan = off", "EXPLAIN SELECT id FROM docs WHERE tenant = 'tenant_a'")
    assert "docs_tenant" in " ".join(row[0] for row in plan)


def test_triggers_column_grants_and_generated_columns_are_refused(app_table: str, tmp_path: Path) -> None:
    sql(
        app_table,
        "CREATE TABLE audit (doc bigint, at timestamptz DEFAULT now())",
        "CREATE FUNCTION audit_docs() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN INSERT INTO audit (doc) VALUES (NEW.id); RETURN NEW; END$$",
        "CREATE TRIGGER docs_audit AFTER UPDATE ON docs FOR EACH ROW EXECUTE FUNCTION audit_docs()",
        "CREATE ROLE reader",
        "GRANT SELECT (id, body, tenant) ON docs TO reader",
        "ALTER TABLE docs ADD COLUMN tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', body)) STORED",
    )
    keys = ("triggers", "column_grants", "generated_columns")
    losses = assert_refused_untouched(app_table, config(tmp_path, app_table), *keys)
    assert losses["triggers"]["objects"] == ["docs_audit"]
    assert [o.split(" ")[0] for o in losses["column_grants"]["objects"]] == ["id", "body", "tenant"]
    assert losses["generated_columns"]["objects"] == ["tsv"]
    sql(app_table, "UPDATE docs SET body = 'changed' WHERE id = 1")
    assert sql(app_table, "SELECT count(*) FROM audit") == [(1,)]
    assert sql(app_table, "SELECT body FROM docs WHERE id = 1", role="reader") == [("changed",)]


def test_views_and_foreign_keys_both_ways_are_refused(app_table: str, tmp_path: Path) -> None:
    sql(
        app_table,
        "CREATE TABLE tenants (name text PRIMARY KEY)",
        "INSERT INTO tenants VALUES ('tenant_a'), ('tenant_b')",
        "ALTER TABLE docs ADD CONSTRAINT docs_tenant_fk FOREIGN KEY (tenant) REFERENCES tenants (name)",
        "CREATE TABLE citations (doc bigint REFERENCES docs (id) ON DELETE CASCADE)",
        "INSERT INTO citations VALUES (1)",
        "CREATE VIEW recent AS SELECT id, embedding FROM docs WHERE id > 10",
    )
    keys = ("dependent_views", "foreign_keys", "referenced_by")
    losses = assert_refused_untouched(app_table, config(tmp_path, app_table), *keys)
    assert losses["dependent_views"]["objects"] == ["recent"]
    assert losses["foreign_keys"]["objects"] == [
        "docs_tenant_fk FOREIGN KEY (tenant) REFERENCES tenants(name)"
    ]
    assert losses["referenced_by"]["objects"][0].startswith("citations citations_doc_fkey")
    sql(app_table, "DELETE FROM docs WHERE id = 1")
    assert sql(app_table, "SELECT count(*) FROM citations") == [(0,)]


def test_a_partitioned_table_is_refused(pg_dsn: str, tmp_path: Path) -> None:
    sql(
        pg_dsn,
        "CREATE EXTENSION IF NOT EXISTS vector",
        "CREATE TABLE docs (id bigint, body text, embedding vector(8), PRIMARY KEY (id)) PARTITION BY RANGE (id)",
        "CREATE TABLE docs_1 PARTITION OF docs FOR VALUES FROM (0) TO (100)",
        "INSERT INTO docs SELECT i, 'document ' || i FROM generate_series(1, 20) i",
    )
    losses = assert_refused_untouched(pg_dsn, config(tmp_path, pg_dsn), "partitions")
    assert losses["partitions"]["objects"] == ["partitioned RANGE (id)", "parent of docs_1"]
    sql(pg_dsn, "CREATE TABLE docs_2 PARTITION OF docs FOR VALUES FROM (100) TO (200)")


def test_cutover_checks_again_under_its_lock_and_accept_names_the_losses(
    app_table: str, tmp_path: Path
) -> None:
    accepted = config(tmp_path, app_table, ALWAYS)
    code, losses = planned_losses(accepted)
    assert code == 0 and all(loss["accepted"] for loss in losses.values())
    assert reindex("run", "-c", str(accepted))[0] == 0
    # Between the run and the cutover the application gains a unique constraint: the cutover refuses it.
    sql(app_table, "ALTER TABLE docs ADD CONSTRAINT docs_url_key UNIQUE (url)")
    code, _, stderr = reindex("cutover", "-c", str(accepted))
    assert code == 2 and "unique_constraints" in stderr
    assert sql(app_table, "SELECT relkind::text FROM pg_class WHERE relname = 'docs'") == [("r",)]
    # Named, it is given up knowingly: the view goes in and the constraint stays on the adopted table.
    code, _, _ = reindex("cutover", "-c", str(config(tmp_path, app_table, [*ALWAYS, "unique_constraints"])))
    assert code == 0
    assert sql(app_table, "SELECT relkind::text FROM pg_class WHERE relname = 'docs'") == [("v",)]
    assert sql(
        app_table,
        "SELECT conname FROM pg_constraint WHERE conrelid = 'docs__adopted'::regclass AND contype = 'u'",
    ) == [("docs_url_key",)]
