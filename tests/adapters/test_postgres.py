"""PostgresSource and PgvectorSink details beyond the contract suites: views, typed ids, adoption, locks."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import numpy as np
import psycopg
import pytest

from adapters.postgres import PgvectorSink, PostgresSource, mask_dsn
from reindex.errors import ConfigError, CutoverRefused, TransientError
from reindex.fingerprint import content_hash
from reindex.ports import Record, Rows, SourceSchema, TargetSpec

_roles = itertools.count()


def execute(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def query(dsn: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement).fetchall()


def spec(name: str, source: SourceSchema | None = None, dim: int = 4, alias: str = "docs") -> TargetSpec:
    return TargetSpec(
        name=name,
        alias=alias,
        dim=dim,
        fingerprint="f" * 16,
        model={"model": "test"},
        source=source or SourceSchema(id_field="id", text_field="text"),
    )


def rows_for(records: list[Record], dim: int, seed: int = 0) -> Rows:
    vectors = np.random.default_rng(seed).standard_normal((len(records), dim)).astype(np.float32)
    return Rows(records, vectors, [content_hash(r.text) for r in records], "f" * 16)


def schemaless(ids: list[str]) -> list[Record]:
    return [Record(i, f"text {i}", {"id": i, "lang": "en"}) for i in ids]


@pytest.fixture
def sink(pg_dsn: str) -> Iterator[PgvectorSink]:
    built = PgvectorSink(pg_dsn, lock_timeout_ms=200, swap_attempts=2)
    yield built
    built.close()


def ready_target(sink: PgvectorSink, name: str, ids: list[str]) -> None:
    sink.prepare(spec(name))
    sink.write(name, rows_for(schemaless(ids), 4))
    sink.finalize(spec(name))


@pytest.fixture
def articles(pg_dsn: str) -> str:
    """A schema-qualified table with typed columns, an 8-d vector column under an IP index, and a view."""
    execute(
        pg_dsn,
        "CREATE SCHEMA app",
        "CREATE TABLE app.articles (id bigint PRIMARY KEY, body text, published timestamptz, meta jsonb,"
        " tags text[], embedding vector(8))",
        "INSERT INTO app.articles SELECT i, 'article ' || i,"
        " '2024-01-01'::timestamptz + i * interval '1 day', jsonb_build_object('n', i),"
        " ARRAY['t' || i], array_fill(1.0::real, ARRAY[8])::vector"
        " FROM generate_series(1, 25) i",
        "CREATE INDEX ON app.articles USING hnsw (embedding vector_ip_ops)",
        "CREATE VIEW articles_v AS SELECT * FROM app.articles",
    )
    return pg_dsn


def test_source_reads_a_view_and_reports_its_columns_and_distance(articles: str) -> None:
    source = PostgresSource(articles, table="articles_v", page_size=10)
    schema = source.schema()
    assert (schema.id_field, schema.text_field, schema.vector_field, schema.distance) == (
        "id",
        "body",
        "embedding",
        "dot",
    )
    assert [(c.name, c.type) for c in schema.columns] == [
        ("id", "bigint"),
        ("body", "text"),
        ("published", "timestamp with time zone"),
        ("meta", "jsonb"),
        ("tags", "text[]"),
    ]
    first = next(source.scan())
    assert (first.id, first.text, first.payload["id"], first.payload["meta"]) == (
        "1",
        "article 1",
        1,
        {"n": 1},
    )
    assert "embedding" not in first.payload
    assert source.count() == 25
    source.close()


def test_integer_ids_resume_in_numeric_order(articles: str) -> None:
    source = PostgresSource(articles, table="app.articles", page_size=10)
    assert [r.id for r in source.scan()] == [str(i) for i in range(1, 26)]
    assert [r.id for r in source.scan(after="9")] == [str(i) for i in range(10, 26)]
    assert [r.id for r in source.fetch(["3", "17", "99"])] == ["3", "17"]
    source.close()


def test_source_names_a_missing_table_or_column(articles: str) -> None:
    with pytest.raises(ConfigError, match="nope"):
        PostgresSource(articles, table="nope")
    with pytest.raises(ConfigError, match="text_column"):
        PostgresSource(articles, table="app.articles", text_column="missing")


def test_unreachable_dsn_is_a_config_error_that_hides_the_password() -> None:
    dsn = "postgresql://app:s3cret@127.0.0.1:1/db"
    for build in (lambda: PgvectorSink(dsn), lambda: PostgresSource(dsn, table="docs")):
        with pytest.raises(ConfigError, match="dsn") as caught:
            build()
        assert "s3cret" not in str(caught.value)
    assert mask_dsn("host=x password=hunter2 user=u") == "host=x password=*** user=u"


def test_missing_dsn_env_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REINDEX_TEST_DSN", raising=False)
    config = PgvectorSink.Config(kind="pgvector", dsn_env="REINDEX_TEST_DSN", alias="docs")
    with pytest.raises(ConfigError, match="REINDEX_TEST_DSN"):
        PgvectorSink.from_config(config)


def test_identifiers_longer_than_63_bytes_are_refused(sink: PgvectorSink) -> None:
    with pytest.raises(ConfigError, match="63 bytes"):
        sink.prepare(spec("docs__" + "x" * 58))
    with pytest.raises(ConfigError, match="63 bytes"):
        sink.prepare(spec("é" * 32))


def test_target_mirrors_the_source_columns_with_a_new_vector_dimension(articles: str) -> None:
    source = PostgresSource(articles, table="articles_v")
    target = spec("articles__aaaa0001", source.schema(), alias="articles")
    sink = PgvectorSink(articles)
    sink.prepare(target)
    records = list(source.scan())
    sink.write(target.name, rows_for(records, 4))
    sink.finalize(target)
    columns = query(
        articles,
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = 'articles__aaaa0001'::regclass AND attnum > 0 ORDER BY attnum",
    )
    source_columns = [(c.name, c.type) for c in source.schema().columns]
    assert columns == [
        *source_columns,
        ("embedding", "vector(4)"),
        ("reindex_fingerprint", "text"),
        ("reindex_content_hash", "text"),
    ]
    row = query(articles, "SELECT id, published, meta, tags FROM articles__aaaa0001 WHERE id = 3")[0]
    assert row == (3, datetime(2024, 1, 4, tzinfo=UTC), {"n": 3}, ["t3"])
    assert query(
        articles,
        "SELECT indexdef LIKE '%vector_ip_ops%' FROM pg_indexes"
        " WHERE tablename = 'articles__aaaa0001' AND indexdef LIKE '%hnsw%'",
    ) == [(True,)]
    info = sink.describe(target.name)
    assert info is not None and (info.count, info.dim, info.fingerprint) == (25, 4, "f" * 16)
    sink.close()
    source.close()


def new_role(dsn: str) -> str:
    role = f"reader_{next(_roles)}_{time.time_ns()}"
    execute(dsn, f'CREATE ROLE "{role}"')
    return role


def test_first_cutover_adopts_a_real_table_and_its_grants(pg_dsn: str, sink: PgvectorSink) -> None:
    role = new_role(pg_dsn)
    execute(
        pg_dsn,
        "CREATE TABLE docs (id text PRIMARY KEY, body text)",
        "INSERT INTO docs VALUES ('old', 'x')",
        f'GRANT SELECT ON docs TO "{role}"',
    )
    ready_target(sink, "docs__aaaa0001", ["a", "b"])
    assert sink.alias("docs").is_physical
    previous = sink.move_alias("docs", "docs__aaaa0001", expected=None, meta={"fingerprint": "f" * 16})
    assert previous == "docs__adopted"
    info = sink.alias("docs")
    assert (info.target, info.fingerprint, info.is_physical) == ("docs__aaaa0001", "f" * 16, False)
    assert query(pg_dsn, "SELECT id FROM docs ORDER BY id") == [("a",), ("b",)]
    assert query(pg_dsn, "SELECT id FROM docs__adopted") == [("old",)]
    assert sink.targets("docs") == ["docs__adopted", "docs__aaaa0001"]
    granted = query(
        pg_dsn,
        f"SELECT has_table_privilege('{role}', 'docs', 'SELECT'),"
        f" has_table_privilege('{role}', 'docs__aaaa0001', 'SELECT')",
    )
    assert granted == [(True, True)]


def test_view_and_table_grants_survive_a_move(pg_dsn: str, sink: PgvectorSink) -> None:
    role = new_role(pg_dsn)
    ready_target(sink, "docs__aaaa0001", ["a"])
    sink.move_alias("docs", "docs__aaaa0001", expected=None, meta={})
    execute(pg_dsn, f'GRANT SELECT ON docs TO "{role}"', f'GRANT SELECT ON docs__aaaa0001 TO "{role}"')
    ready_target(sink, "docs__bbbb0002", ["b"])
    sink.move_alias("docs", "docs__bbbb0002", expected="docs__aaaa0001", meta={})
    granted = query(
        pg_dsn,
        f"SELECT has_table_privilege('{role}', 'docs', 'SELECT'),"
        f" has_table_privilege('{role}', 'docs__bbbb0002', 'SELECT')",
    )
    assert granted == [(True, True)]


def test_a_long_reader_makes_the_move_refuse_and_the_old_target_stays(
    pg_dsn: str, sink: PgvectorSink
) -> None:
    ready_target(sink, "docs__aaaa0001", ["a"])
    ready_target(sink, "docs__bbbb0002", ["b"])
    sink.move_alias("docs", "docs__aaaa0001", expected=None, meta={})
    with psycopg.connect(pg_dsn) as reader:
        reader.execute("SELECT count(*) FROM docs").fetchall()
        started = time.monotonic()
        with pytest.raises(CutoverRefused, match="lock"):
            sink.move_alias("docs", "docs__bbbb0002", expected="docs__aaaa0001", meta={})
        assert time.monotonic() - started < 3
        reader.rollback()
    assert sink.alias("docs").target == "docs__aaaa0001"
    sink.move_alias("docs", "docs__bbbb0002", expected="docs__aaaa0001", meta={})
    assert sink.alias("docs").target == "docs__bbbb0002"


def test_drop_refuses_the_target_the_alias_serves(sink: PgvectorSink) -> None:
    ready_target(sink, "docs__aaaa0001", ["a"])
    sink.move_alias("docs", "docs__aaaa0001", expected=None, meta={})
    with pytest.raises(CutoverRefused, match="served"):
        sink.drop("docs__aaaa0001")


def test_targets_treat_underscores_in_the_alias_literally(sink: PgvectorSink) -> None:
    sink.prepare(spec("my_docs__aaaa0001", alias="my_docs"))
    sink.prepare(spec("myxdocs__bbbb0002", alias="myxdocs"))
    assert sink.targets("my_docs") == ["my_docs__aaaa0001"]


def test_schemaless_payload_is_stored_as_json_safe_jsonb(pg_dsn: str, sink: PgvectorSink) -> None:
    sink.prepare(spec("docs__aaaa0001"))
    record = Record("a", "text a", {"when": datetime(2024, 1, 1, tzinfo=UTC), "score": float("nan")})
    sink.write("docs__aaaa0001", rows_for([record], 4))
    payload = query(pg_dsn, "SELECT payload FROM docs__aaaa0001")[0][0]
    assert payload == {"when": "2024-01-01 00:00:00+00:00", "score": None}


def test_copy_write_loads_a_large_batch(pg_dsn: str, sink: PgvectorSink) -> None:
    sink.prepare(spec("docs__aaaa0001", dim=384))
    batch = rows_for(schemaless([f"doc-{i}" for i in range(5000)]), 384, seed=7)
    sink.write("docs__aaaa0001", batch)
    info = sink.describe("docs__aaaa0001")
    assert info is not None and (info.count, info.dim) == (5000, 384)
    np.testing.assert_array_equal(sink.fetch("docs__aaaa0001", ["doc-42"])["doc-42"], batch.vectors[42])


def test_move_alias_changes_the_dimension_behind_the_view(pg_dsn: str, sink: PgvectorSink) -> None:
    for name, dim in (("docs__aaaa0001", 4), ("docs__bbbb0002", 8)):
        sink.prepare(spec(name, dim=dim))
        sink.write(name, rows_for(schemaless(["a"]), dim))
    sink.move_alias("docs", "docs__aaaa0001", expected=None, meta={})
    sink.move_alias("docs", "docs__bbbb0002", expected="docs__aaaa0001", meta={})
    assert query(pg_dsn, "SELECT vector_dims(embedding) FROM docs") == [(8,)]


def test_a_dropped_connection_is_transient_and_reopened(pg_dsn: str, sink: PgvectorSink) -> None:
    sink.prepare(spec("docs__aaaa0001"))
    execute(
        pg_dsn,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    with pytest.raises(TransientError):
        sink.describe("docs__aaaa0001")
    info = sink.describe("docs__aaaa0001")
    assert info is not None and info.count == 0
