"""PostgresSource and PgvectorSink details beyond the contract suites: views, typed ids, adoption, locks,
identity, rows refused for their content, passwords kept out of errors, compare-and-swap alias moves."""

from __future__ import annotations

import dataclasses
import itertools
import re
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from reindex.errors import ConfigError, CutoverRefused, ReindexError, RowsRejected, TransientError
from reindex.fingerprint import content_hash
from reindex.ports import Record, Rows, SourceSchema, TargetSpec
from reindex_adapters.postgres.connection import mask_dsn
from reindex_adapters.postgres.sink import PgvectorSink
from reindex_adapters.postgres.source import PostgresSource

_roles = itertools.count()


def execute(dsn: str, *statements: str | tuple[str, Sequence[Any]]) -> None:
    """Each statement, or (statement, its parameters)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            text, params = (statement, None) if isinstance(statement, str) else statement
            conn.execute(text, params)


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
        ("reindex_origin", "text"),
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
    accepting = PgvectorSink(pg_dsn, accept=["table_statements", "column_order"])
    ready_target(accepting, "docs__aaaa0001", ["a", "b"])
    assert sink.alias("docs").is_physical
    # A view is not a table: unless the config accepts that by name, the swap refuses it under its lock.
    with pytest.raises(ConfigError, match="table_statements, column_order"):
        sink.move_alias("docs", "docs__aaaa0001", expected=None, meta={})
    assert sink.alias("docs").is_physical
    previous = accepting.move_alias("docs", "docs__aaaa0001", expected=None, meta={"fingerprint": "f" * 16})
    accepting.close()
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


def test_stored_vectors_are_read_in_binary_not_parsed_from_text(
    sink: PgvectorSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copies, `compare` and verify read stored vectors: pgvector's text loader parses each number in Python
    (0.7 ms per 1,536-d vector), its binary loader is one frombuffer. Every read must take the binary one."""
    from pgvector.utils import Vector

    sink.prepare(spec("docs__aaaa0001", dim=1536))
    batch = rows_for(schemaless([f"doc-{i}" for i in range(40)]), 1536, seed=5)
    sink.write("docs__aaaa0001", batch)

    def parse_text(value: str) -> Any:
        raise AssertionError(f"a stored vector was read as text: {value[:20]}")

    monkeypatch.setattr(Vector, "from_text", staticmethod(parse_text))
    fetched = sink.fetch("docs__aaaa0001", ["doc-3"])
    np.testing.assert_array_equal(fetched["doc-3"], batch.vectors[3])
    matched = sink.fetch_matching("docs__aaaa0001", {"doc-4": batch.content_hashes[4], "doc-5": "other"})
    assert list(matched) == ["doc-4"] and matched["doc-4"].dtype == np.float32
    np.testing.assert_array_equal(matched["doc-4"], batch.vectors[4])
    batches = list(sink.scan_vectors("docs__aaaa0001", batch=16))
    scanned = {i: v for ids, vectors in batches for i, v in zip(ids, vectors, strict=True)}
    assert len(scanned) == 40
    np.testing.assert_array_equal(scanned["doc-39"], batch.vectors[39])


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


# identity -------------------------------------------------------------------------------------------------


def keyword_dsn(dsn: str, **extra: str) -> str:
    """The same database as the URL `dsn`, written in libpq's keyword form."""
    parts = urllib.parse.urlsplit(dsn)
    query = dict(urllib.parse.parse_qsl(parts.query))
    fields = {"host": query["host"], "dbname": parts.path.lstrip("/"), "user": parts.username or "", **extra}
    return " ".join(f"{k}='{v}'" for k, v in fields.items())


def test_source_identity_names_the_relation_not_the_dsn_or_knobs(articles: str) -> None:
    execute(articles, "CREATE TABLE docs (id text PRIMARY KEY, body text)")
    plain = PostgresSource(articles, table="docs")
    qualified = PostgresSource(keyword_dsn(articles, connect_timeout="7"), table="public.docs", page_size=3)
    other_text = PostgresSource(articles, table="app.articles")
    try:
        system, database = query(
            articles, "SELECT system_identifier::text, current_database() FROM pg_control_system()"
        )[0]
        assert plain.identity() == qualified.identity() == f"postgres:{system}/{database}/public.docs#id,body"
        assert other_text.identity().endswith("/app.articles#id,body")
        assert "connect_timeout" not in qualified.identity() and "postgres:@" not in plain.identity()
    finally:
        for source in (plain, qualified, other_text):
            source.close()


def test_sink_identity_ignores_the_dsn_form_and_the_swap_knobs(pg_dsn: str) -> None:
    first = PgvectorSink(pg_dsn)
    second = PgvectorSink(keyword_dsn(pg_dsn, application_name="x"), lock_timeout_ms=5, swap_attempts=9)
    try:
        assert first.identity() == second.identity()
        assert re.fullmatch(r"pgvector:\d+/t\d+_\d+/public", first.identity())
    finally:
        first.close()
        second.close()


def test_prepare_stamps_plan_and_nonce_once(pg_dsn: str, sink: PgvectorSink) -> None:
    stamped = dataclasses.replace(spec("docs__aaaa0001"), plan_id="p1", nonce="n1")
    sink.prepare(stamped)
    sink.prepare(dataclasses.replace(stamped, nonce="n2"))
    info = sink.describe("docs__aaaa0001")
    assert info is not None and (info.plan_id, info.nonce) == ("p1", "n1")


def test_fetch_matching_compares_typed_keys_and_hashes_in_one_query(articles: str) -> None:
    source = PostgresSource(articles, table="app.articles")
    target = spec("articles__aaaa0001", source.schema(), alias="articles")
    sink = PgvectorSink(articles)
    try:
        sink.prepare(target)
        records = list(source.scan())
        sink.write(target.name, rows_for(records, 4))
        expected = {"3": content_hash("article 3"), "4": content_hash("edited"), "404": content_hash("x")}
        assert set(sink.fetch_matching(target.name, expected)) == {"3"}
    finally:
        sink.close()
        source.close()


# a source named like the alias ---------------------------------------------------------------------------


def test_a_source_reading_a_target_through_its_view_leaves_out_the_bookkeeping(articles: str) -> None:
    first_source = PostgresSource(articles, table="app.articles")
    first = spec("articles__aaaa0001", first_source.schema(), alias="articles")
    sink = PgvectorSink(articles)
    sink.prepare(first)
    sink.write(first.name, rows_for(list(first_source.scan()), 4))
    sink.move_alias("articles", first.name, expected=None, meta={})
    through_view = PostgresSource(articles, table="articles")
    try:
        assert through_view.schema().columns == first_source.schema().columns
        record = next(through_view.scan())
        bookkeeping = {"reindex_fingerprint", "reindex_content_hash", "reindex_origin"}
        assert not {*bookkeeping, "embedding"} & set(record.payload)
        second = spec("articles__bbbb0002", through_view.schema(), dim=8, alias="articles")
        sink.prepare(second)
        columns = [
            name
            for (name,) in query(
                articles,
                "SELECT attname FROM pg_attribute"
                " WHERE attrelid = 'articles__bbbb0002'::regclass AND attnum > 0 ORDER BY attnum",
            )
        ]
        assert all(columns.count(name) == 1 for name in (*bookkeeping, "embedding"))
    finally:
        for closing in (sink, through_view, first_source):
            closing.close()


# rows the application writes through the alias (issue 17) -------------------------------------------------


INSERT_DOC = "INSERT INTO docs (id, text, embedding) VALUES (%s, %s, %s)"  # as the application writes one


def vector_text(seed: int, dim: int = 4) -> str:
    """A vector as pgvector's text input, as an application without the pgvector adapter sends it."""
    return str(np.random.default_rng(seed).standard_normal(dim).astype(np.float32).tolist())


def origins(sink: PgvectorSink, target: str) -> dict[str, bool | None]:
    """Who wrote each row, as verify reads it: True the application, False the tool, None unknown."""
    return {entry.id: entry.application for entry in sink.scan_index(target, 4)}


def test_rows_the_application_writes_count_as_its_own_until_the_tool_rewrites_them(
    pg_dsn: str, sink: PgvectorSink
) -> None:
    ready_target(sink, "docs__app00001", ["a", "b", "c", "d"])
    sink.move_alias("docs", "docs__app00001", expected=None, meta={})
    execute(
        pg_dsn,
        (INSERT_DOC, ("e", "new text", vector_text(1))),
        ("UPDATE docs SET text = 'b edited', embedding = %s WHERE id = 'b'", (vector_text(2),)),
        "UPDATE docs SET text = 'c edited under its old vector' WHERE id = 'c'",
        "UPDATE docs SET payload = '{\"lang\": \"de\"}' WHERE id = 'a'",  # no text: still the tool's
        (  # the writer set the bookkeeping
            "INSERT INTO docs (id, text, embedding, reindex_content_hash) VALUES ('f', 'own hash', %s, %s)",
            (vector_text(3), content_hash("own hash")),
        ),
        (INSERT_DOC, ("g", "to delete", vector_text(4))),
        "DELETE FROM docs WHERE id = 'g'",
    )
    assert origins(sink, "docs__app00001") == {
        "a": False, "b": True, "c": False, "d": False, "e": True, "f": False
    }  # fmt: skip
    stored = dict(query(pg_dsn, "SELECT id, reindex_content_hash FROM docs WHERE id IN ('b', 'e')"))
    assert stored == {"b": content_hash("b edited"), "e": content_hash("new text")}

    sink.write("docs__app00001", rows_for([Record("h", "h text", {"id": "h"})], 4))  # straight COPY
    # The tool rewrites them (a sync's re-embedding, a replayed batch): its rows again. b is written with a
    # new text under the hash already stored, which the trigger alone would take for an application's fill.
    rewritten = [Record("e", "new text", {"id": "e"}), Record("b", "b by the tool", {"id": "b"})]
    kept_hash = content_hash("b edited")
    rows = rows_for(rewritten, 4, seed=9)
    sink.write(
        "docs__app00001", dataclasses.replace(rows, content_hashes=[content_hash("new text"), kept_hash])
    )
    assert origins(sink, "docs__app00001") == dict.fromkeys("abcdefh", False)
    assert dict(query(pg_dsn, "SELECT id, reindex_content_hash FROM docs WHERE id = 'b'")) == {"b": kept_hash}


def test_a_target_older_than_the_origin_column_tells_no_origin_and_gains_it_at_finalize(
    pg_dsn: str, sink: PgvectorSink
) -> None:
    ready_target(sink, "docs__old00001", ["a", "b"])
    execute(pg_dsn, "ALTER TABLE docs__old00001 DROP COLUMN reindex_origin")  # as built before it existed
    sink.move_alias("docs", "docs__old00001", expected=None, meta={})
    older = PgvectorSink(pg_dsn)  # reads the table as it is now
    try:
        # The trigger function, shared by the schema's targets, still accepts the application's writes.
        execute(pg_dsn, (INSERT_DOC, ("c", "c text", vector_text(1))))
        assert query(pg_dsn, "SELECT reindex_content_hash FROM docs WHERE id = 'c'") == [
            (content_hash("c text"),)
        ]
        assert origins(older, "docs__old00001") == dict.fromkeys("abc", None)  # unknown, never guessed
        older.finalize(spec("docs__old00001"))
        execute(pg_dsn, (INSERT_DOC, ("d", "d text", vector_text(2))))
        # c was written before the column existed: nothing tells it from the tool's rows any more.
        assert origins(older, "docs__old00001") == {"a": False, "b": False, "c": False, "d": True}
    finally:
        older.close()


# rows refused for their content (issue 10, defect 5) -------------------------------------------------------


def test_nul_byte_in_text_rejects_the_whole_batch_as_rows_rejected(pg_dsn: str, sink: PgvectorSink) -> None:
    sink.prepare(spec("docs__aaaa0001"))
    poisoned = [*schemaless(["a", "b"]), Record("c", "bad\x00text", {"id": "c"})]
    with pytest.raises(RowsRejected) as refused:
        sink.write("docs__aaaa0001", rows_for(poisoned, 4))
    assert refused.value.reason == "sink_rejected:22021"
    assert query(pg_dsn, "SELECT count(*) FROM docs__aaaa0001") == [(0,)]
    sink.write("docs__aaaa0001", rows_for(poisoned[:2], 4))  # the halves replay on the same connection
    assert query(pg_dsn, "SELECT count(*) FROM docs__aaaa0001") == [(2,)]


def test_nul_byte_inside_a_jsonb_payload_value_is_rows_rejected(pg_dsn: str, sink: PgvectorSink) -> None:
    sink.prepare(spec("docs__aaaa0001"))
    poisoned = [Record("a", "fine text", {"note": {"deep": "nul \x00 here"}})]
    with pytest.raises(RowsRejected) as refused:
        sink.write("docs__aaaa0001", rows_for(poisoned, 4))
    assert refused.value.reason == "sink_rejected:22P05"


def test_text_copy_refusals_name_the_nul_byte_and_the_sqlstate(pg_dsn: str) -> None:
    """A column type without a binary dumper (money) sends the batch as text COPY: psycopg refuses NUL."""
    execute(pg_dsn, "CREATE TABLE src (id bigint PRIMARY KEY, body text, amount money)")
    source = PostgresSource(pg_dsn, table="src")
    target = spec("src__aaaa0001", source.schema(), alias="src")
    sink = PgvectorSink(pg_dsn, accept=["table_statements", "column_order"])

    def write(*payloads: dict[str, Any]) -> None:
        records = [Record(str(p["id"]), str(p["body"]), p) for p in payloads]
        sink.write(target.name, rows_for(records, 4))

    try:
        sink.prepare(target)
        for payload, reason in (
            ({"id": 1, "body": "a\x00b"}, "nul_byte"),
            ({"id": 1, "body": "fine", "amount": "lots"}, "22P02"),
            ({"id": "one", "body": "fine"}, "invalid_value"),
        ):
            with pytest.raises(RowsRejected) as refused:
                write({"id": 2, "body": "good"}, payload)
            assert refused.value.reason == f"sink_rejected:{reason}"
        write({"id": 2, "body": "ok", "amount": "12.50"})
        assert query(pg_dsn, "SELECT id, amount::numeric FROM src__aaaa0001") == [(2, 12.5)]
    finally:
        sink.close()
        source.close()


def test_a_dropped_connection_during_write_stays_transient(pg_dsn: str, sink: PgvectorSink) -> None:
    sink.prepare(spec("docs__aaaa0001"))
    execute(
        pg_dsn,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    with pytest.raises(TransientError):
        sink.write("docs__aaaa0001", rows_for(schemaless(["a"]), 4))


# passwords never reach an error (issue 10, defect 10) ------------------------------------------------------

SECRET = "s3cret p@ss:w/rd"
WRONG = "wr0ng s3cret@x:y/z"


@pytest.fixture
def password_role(pg_dsn: str) -> Iterator[tuple[str, str, str]]:
    """A role that must log in with SECRET over the socket: (role, socket folder, database)."""
    role = new_role(pg_dsn)
    escaped = SECRET.replace("'", "''")
    execute(
        pg_dsn, f"ALTER ROLE \"{role}\" LOGIN PASSWORD '{escaped}'", f'GRANT ALL ON SCHEMA public TO "{role}"'
    )
    hba = Path(query(pg_dsn, "SHOW hba_file")[0][0])
    original = hba.read_text()
    hba.write_text(f"local all {role} scram-sha-256\n{original}")
    execute(pg_dsn, "SELECT pg_reload_conf()")
    parts = urllib.parse.urlsplit(pg_dsn)
    try:
        yield role, dict(urllib.parse.parse_qsl(parts.query))["host"], parts.path.lstrip("/")
    finally:
        hba.write_text(original)
        execute(pg_dsn, "SELECT pg_reload_conf()")


def pieces(secret: str) -> list[str]:
    return [p for p in re.split(r"[\s@:/]", secret) if len(p) >= 3] + [
        secret,
        urllib.parse.quote(secret, safe=""),
    ]


def assert_hidden(error: ReindexError, secret: str) -> None:
    for text in (str(error), error.message, error.hint or ""):
        for piece in pieces(secret):
            assert piece not in text, (piece, text)


def test_a_wrong_password_in_every_dsn_form_never_reaches_the_error(
    password_role: tuple[str, str, str],
) -> None:
    role, socket, database = password_role
    encoded = urllib.parse.quote(WRONG, safe="")
    forms = [
        f"postgresql://{role}:{encoded}@/{database}?host={socket}",
        f"postgresql://{role}:{WRONG}@/{database}?host={socket}",
        f"postgresql:///{database}?host={socket}&user={role}&password={encoded}",
        f"host={socket} dbname={database} user={role} password='{WRONG}'",
        f"host={socket} dbname={database} user={role} password={WRONG}",
    ]
    for dsn in forms:
        for kind in (PgvectorSink, PostgresSource):
            with pytest.raises(ConfigError) as caught:
                kind(dsn) if kind is PgvectorSink else PostgresSource(dsn, table="docs")
            assert_hidden(caught.value, WRONG)


def test_the_right_password_with_reserved_characters_connects(password_role: tuple[str, str, str]) -> None:
    role, socket, database = password_role
    encoded = urllib.parse.quote(SECRET, safe="")
    for dsn in (
        f"postgresql://{role}:{encoded}@/{database}?host={socket}",
        f"host={socket} dbname={database} user={role} password='{SECRET}'",
    ):
        sink = PgvectorSink(dsn)
        assert sink.describe("docs__aaaa0001") is None
        sink.close()


def test_a_closed_port_error_hides_the_password() -> None:
    encoded = urllib.parse.quote(SECRET, safe="")
    for dsn in (
        f"postgresql://app:{encoded}@127.0.0.1:1/db",
        f"host=127.0.0.1 port=1 dbname=db user=app password='{SECRET}'",
        f"postgresql://app:{SECRET}@127.0.0.1:1/db",
    ):
        with pytest.raises(ConfigError) as caught:
            PgvectorSink(dsn)
        assert_hidden(caught.value, SECRET)


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("postgresql://app:p%40ss@h/db", "postgresql://app:***@h/db"),
        ("postgres://app:a b@c:d/e@h:5432/db", "postgres://app:***@h:5432/db"),
        ("host=h password='a b\\' c' user=u", "host=h password=*** user=u"),
        ("host=h PASSWORD = hunter2", "host=h PASSWORD = ***"),
        (
            "postgresql://h/db?sslmode=require&password=x%20y&application_name=a",
            "postgresql://h/db?sslmode=require&password=***&application_name=a",
        ),
        ('failed: "postgresql://u:pw@h" refused', 'failed: "postgresql://u:***@h" refused'),
        ("postgresql://h:5432/db", "postgresql://h:5432/db"),
    ],
)
def test_mask_dsn_hides_the_password_of_every_form(text: str, masked: str) -> None:
    assert mask_dsn(text) == masked


# compare-and-swap alias moves (issue 10, defect 8) -------------------------------------------------------


def test_two_concurrent_moves_from_the_same_target_let_exactly_one_win(
    pg_dsn: str, sink: PgvectorSink
) -> None:
    for name in ("docs__aaaa0001", "docs__bbbb0002", "docs__cccc0003"):
        ready_target(sink, name, ["a"])
    sink.move_alias("docs", "docs__aaaa0001", expected=None, meta={})
    movers = [PgvectorSink(pg_dsn) for _ in range(2)]
    barrier = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def move(mover: PgvectorSink, target: str) -> None:
        barrier.wait()
        try:
            outcomes[target] = mover.move_alias("docs", target, expected="docs__aaaa0001", meta={})
        except CutoverRefused as refused:
            outcomes[target] = refused

    threads = [
        threading.Thread(target=move, args=(mover, target))
        for mover, target in zip(movers, ("docs__bbbb0002", "docs__cccc0003"), strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for mover in movers:
        mover.close()
    winners = [t for t, outcome in outcomes.items() if outcome == "docs__aaaa0001"]
    losers = [o for o in outcomes.values() if isinstance(o, CutoverRefused)]
    assert len(winners) == 1 and len(losers) == 1
    assert "expected 'docs__aaaa0001'" in str(losers[0])
    assert sink.alias("docs").target == winners[0]


def test_alias_reads_never_see_half_a_swap(pg_dsn: str, sink: PgvectorSink) -> None:
    targets = ("docs__aaaa0001", "docs__bbbb0002")
    for name in targets:
        ready_target(sink, name, ["a"])
    sink.move_alias("docs", targets[0], expected=None, meta={"fingerprint": targets[0]})
    done = threading.Event()
    seen: list[tuple[str | None, str | None]] = []
    failures: list[BaseException] = []

    def read() -> None:
        reader = PgvectorSink(pg_dsn)
        try:
            while not done.is_set():
                info = reader.alias("docs")
                seen.append((info.target, info.fingerprint))
        except BaseException as exc:  # reported by the assertion below
            failures.append(exc)
        finally:
            reader.close()

    thread = threading.Thread(target=read)
    thread.start()
    for i in range(60):
        current, following = targets[i % 2], targets[(i + 1) % 2]
        sink.move_alias("docs", following, expected=current, meta={"fingerprint": following})
    done.set()
    thread.join()
    assert failures == [] and seen
    assert all(target == fingerprint and target in targets for target, fingerprint in seen)
