"""PgvectorSink's bulk write path: one binary COPY per batch straight into the target, the stage + upsert
fallback on a replay, writer connections for big batches, rows refused for their content, index timing."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql

from reindex.columns import Documents
from reindex.errors import RowsRejected
from reindex.fingerprint import content_hash
from reindex.ports import Column, Record, Rows, SourceSchema, TargetSpec
from reindex_adapters.postgres import sink as postgres
from reindex_adapters.postgres.sink import PgvectorSink

TARGET = "docs__bulk0001"
AWKWARD = [
    "plain",
    "héllo wörld ✓ 日本語 🙂",
    "quotes ' \" and `ticks`",
    "back\\slash \\N \\\\ \\x00",
    "new\nline\r\ntab\tend",
    "",
    '{"json": [1, 2]} looks like json',
]


def spec(name: str = TARGET, dim: int = 8, text_field: str = "body") -> TargetSpec:
    return TargetSpec(name, "docs", dim, "f" * 16, {"model": "test"}, SourceSchema("key", text_field))


def rows_of(
    docs: Documents | list[Record], dim: int = 8, seed: int = 0, hashes: list[str] | None = None
) -> Rows:
    vectors = np.random.default_rng(seed).standard_normal((len(docs), dim)).astype(np.float32)
    texts = docs.texts if isinstance(docs, Documents) else [r.text for r in docs]
    return Rows(docs, vectors, hashes or [content_hash(t) for t in texts], "f" * 16)


def plain(n: int, prefix: str = "doc", text: str = "words") -> Documents:
    ids = [f"{prefix}-{i:06d}" for i in range(n)]
    return Documents(ids, [f"{text} {i}" for i in range(n)], fields=("key", "body"))


def query(dsn: str, statement: str | sql.Composed) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement).fetchall()


def prepared(dsn: str, target: TargetSpec, writers: int) -> Iterator[PgvectorSink]:
    built = PgvectorSink(dsn, writers=writers)
    built.prepare(target)
    yield built
    built.close()


@pytest.fixture
def sink(pg_dsn: str) -> Iterator[PgvectorSink]:
    yield from prepared(pg_dsn, spec(), writers=3)


def test_bulk_rows_round_trip_exactly_texts_payloads_and_vectors(pg_dsn: str, sink: PgvectorSink) -> None:
    ids = [f"id {i} ✓'\"\\" for i in range(len(AWKWARD))]
    payloads: list[dict[str, Any]] = [
        {"key": key, "body": text, "n": i, "nested": {"list": [1, "two", None, {"deep": True}]}}
        for i, (key, text) in enumerate(zip(ids, AWKWARD, strict=True))
    ]
    payloads[1]["score"] = math.nan
    payloads[2]["inf"] = [math.inf, 1.5]
    mappings: list[Mapping[str, Any]] = list(payloads)
    rows = rows_of(Documents(ids, AWKWARD, mappings, ("key", "body")))
    sink.write(TARGET, rows)

    stored = query(
        pg_dsn, f"SELECT id, body, payload, reindex_fingerprint, reindex_content_hash FROM {TARGET}"
    )
    by_id = {row[0]: row[1:] for row in stored}
    assert len(stored) == len(ids)
    for i, key in enumerate(ids):
        expected = {k: v for k, v in payloads[i].items() if k not in ("key", "body")}
        expected |= {"score": None} if i == 1 else {}
        expected |= {"inf": [None, 1.5]} if i == 2 else {}
        assert by_id[key] == (AWKWARD[i], expected, "f" * 16, content_hash(AWKWARD[i]))
    fetched = sink.fetch(TARGET, ids)
    for i, key in enumerate(ids):
        assert fetched[key].tobytes() == rows.vectors[i].tobytes()


def test_documents_with_nothing_but_id_and_text_store_an_empty_payload(
    pg_dsn: str, sink: PgvectorSink
) -> None:
    docs = Documents(["a", "b"], AWKWARD[1:3], fields=("key", "body"))
    sink.write(TARGET, rows_of(docs))
    assert query(pg_dsn, f"SELECT id, body, payload FROM {TARGET} ORDER BY id") == [
        ("a", AWKWARD[1], {}),
        ("b", AWKWARD[2], {}),
    ]


def test_record_lists_and_content_hashes_of_any_length_round_trip(pg_dsn: str, sink: PgvectorSink) -> None:
    records = [Record("x", "text x", {"key": "x", "tag": 1}), Record("y", "text y", {"key": "y"})]
    sink.write(TARGET, rows_of(records, hashes=["short", "a much longer hash ✓"]))
    assert query(pg_dsn, f"SELECT id, payload, reindex_content_hash FROM {TARGET} ORDER BY id") == [
        ("x", {"tag": 1}, "short"),
        ("y", {}, "a much longer hash ✓"),
    ]


def test_replaying_rows_upserts_them_without_duplicates_or_failure(pg_dsn: str, sink: PgvectorSink) -> None:
    sink.write(TARGET, rows_of(plain(10), seed=1))
    replay = rows_of(plain(15, text="changed"), seed=2)  # ten already there, five new
    sink.write(TARGET, replay)
    sink.write(TARGET, replay)  # straight to the upsert after a conflict: the same result
    sink.write(TARGET, rows_of(plain(3, prefix="new")))  # and back to COPY into the table
    assert query(pg_dsn, f"SELECT count(*), count(DISTINCT id) FROM {TARGET}") == [(18, 18)]
    assert query(pg_dsn, f"SELECT body FROM {TARGET} WHERE id = 'doc-000003'") == [("changed 3",)]
    assert sink.fetch(TARGET, ["doc-000003"])["doc-000003"].tobytes() == replay.vectors[3].tobytes()


@pytest.mark.parametrize("poison", ["text", "id"])
def test_a_nul_byte_in_one_row_rejects_the_batch_with_22021(
    pg_dsn: str, sink: PgvectorSink, poison: str
) -> None:
    docs = plain(5)
    if poison == "text":
        docs.texts[3] = "bad\x00text"
    else:
        docs.ids[3] = "bad\x00id"
    with pytest.raises(RowsRejected) as refused:
        sink.write(TARGET, rows_of(docs))
    assert refused.value.reason == "sink_rejected:22021"
    assert query(pg_dsn, f"SELECT count(*) FROM {TARGET}") == [(0,)]
    sink.write(TARGET, rows_of(docs[:3]))  # the core's halves replay on the same connections
    assert query(pg_dsn, f"SELECT count(*) FROM {TARGET}") == [(3,)]


def test_a_text_that_is_not_utf8_is_rejected_like_the_server_would(sink: PgvectorSink) -> None:
    docs = plain(3)
    docs.texts[1] = "lone \ud800 surrogate"
    with pytest.raises(RowsRejected) as refused:
        sink.write(TARGET, rows_of(docs, hashes=["h"] * 3))
    assert refused.value.reason == "sink_rejected:22021"


def test_a_big_write_lands_every_row_across_writer_connections(pg_dsn: str, sink: PgvectorSink) -> None:
    rows = rows_of(plain(6500), seed=3)
    sink.write(TARGET, rows)
    assert query(pg_dsn, f"SELECT count(*), count(DISTINCT id) FROM {TARGET}") == [(6500, 6500)]
    connections = query(pg_dsn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
    assert connections[0][0] >= 1 + 3  # the sink's own and three writers (this query's is one more)
    sink.write(TARGET, rows_of(plain(7000, text="again"), seed=4))  # every slice replays: upserts
    assert query(pg_dsn, f"SELECT count(*), min(body) FROM {TARGET}") == [(7000, "again 0")]
    fetched = sink.fetch(TARGET, ["doc-006499"])
    assert fetched["doc-006499"].tobytes() == rows_of(plain(7000), seed=4).vectors[6499].tobytes()


def test_a_refused_row_in_one_slice_of_a_big_write_raises_rows_rejected(
    pg_dsn: str, sink: PgvectorSink
) -> None:
    docs = plain(4000)
    docs.texts[3900] = "nul \x00 in the last slice"
    with pytest.raises(RowsRejected) as refused:
        sink.write(TARGET, rows_of(docs))
    assert refused.value.reason == "sink_rejected:22021"
    assert query(pg_dsn, f"SELECT count(*) FROM {TARGET} WHERE id >= 'doc-002666'") == [(0,)]
    sink.write(TARGET, rows_of(docs[:3900]))  # replaying the good rows is safe, committed slices or not
    assert query(pg_dsn, f"SELECT count(*) FROM {TARGET}") == [(3900,)]


def test_finalize_reports_the_index_build_seconds(pg_dsn: str, sink: PgvectorSink) -> None:
    sink.write(TARGET, rows_of(plain(300)))
    sink.finalize(spec())
    assert sink.index_seconds is not None and sink.index_seconds > 0
    assert query(pg_dsn, f"SELECT count(*) FROM pg_indexes WHERE tablename = '{TARGET}'") == [(2,)]
    sink.finalize(spec())  # a resumed finalize finds the index: nothing built
    assert sink.index_seconds is None


def test_no_index_build_leaves_index_seconds_unset(pg_dsn: str) -> None:
    sink = PgvectorSink(pg_dsn, build_index=False)
    try:
        sink.prepare(spec())
        sink.write(TARGET, rows_of(plain(5)))
        sink.finalize(spec())
        assert sink.index_seconds is None
    finally:
        sink.close()


# A target with the source table's own columns: the same bulk COPY, values dumped by their types' dumpers.

SCHEMA_TARGET = "kb__bulk0001"
SCHEMA_COLUMNS = (
    Column("id", "bigint"),
    Column("body", "text"),
    Column("meta", "jsonb"),
    Column("seen", "timestamp with time zone"),
    Column("score", "numeric"),
    Column("tags", "text[]"),
    Column("flag", "boolean"),
)


def schema_spec(name: str = SCHEMA_TARGET) -> TargetSpec:
    source = SourceSchema("id", "body", "embedding", SCHEMA_COLUMNS)
    return TargetSpec(name, "kb", 8, "f" * 16, {"model": "test"}, source)


def schema_records(n: int, start: int = 0, text: str = "words") -> list[Record]:
    """Rows as PostgresSource reads them: every column in the payload, NULLs as None, the id as text."""
    seen = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    records = []
    for i in range(start, start + n):
        payload = {
            "id": i,
            "body": f"{text} {i} ✓",
            "meta": None if i % 3 == 0 else {"n": i, "nested": {"list": [1, "two", None]}},
            "seen": None if i % 4 == 0 else seen + timedelta(seconds=i),
            "score": Decimal(f"{i}.125") if i % 5 else None,
            "tags": [f"t{i}", "", "x y"] if i % 2 else [],
            "flag": i % 2 == 0,
        }
        records.append(Record(str(i), str(payload["body"]), payload))
    return records


@pytest.fixture
def schema_sink(pg_dsn: str) -> Iterator[PgvectorSink]:
    yield from prepared(pg_dsn, schema_spec(), writers=2)


def on(table: str, template: str) -> sql.Composed:
    """`template` with its `{}` the table's identifier."""
    return sql.SQL(template).format(sql.Identifier(table))


def stored_rows(dsn: str, table: str) -> list[tuple[Any, ...]]:
    names = [sql.Identifier(column.name) for column in SCHEMA_COLUMNS]
    statement = sql.SQL(
        "SELECT {}, embedding::text, reindex_fingerprint, reindex_content_hash FROM {} ORDER BY id"
    ).format(sql.SQL(", ").join(names), sql.Identifier(table))
    return query(dsn, statement)


def test_a_schema_target_takes_one_bulk_copy_that_stores_what_row_by_row_would(
    pg_dsn: str, schema_sink: PgvectorSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = rows_of(schema_records(2500), seed=5)  # big enough for two writer slices
    with monkeypatch.context() as patched:
        patched.setattr(postgres, "write_rows", _no_row_by_row)
        schema_sink.write(SCHEMA_TARGET, rows)

    reference = PgvectorSink(pg_dsn, writers=1)
    reference.prepare(schema_spec("kb__rows0001"))
    monkeypatch.setattr(postgres, "schema_copy", lambda conn, layout: None)  # the row-by-row path
    reference.write("kb__rows0001", rows)
    reference.close()

    stored = stored_rows(pg_dsn, SCHEMA_TARGET)
    assert len(stored) == 2500
    assert stored == stored_rows(pg_dsn, "kb__rows0001")
    assert stored[1][2] == {"n": 1, "nested": {"list": [1, "two", None]}}
    assert stored[0][2:6] == (None, None, None, [])  # NULLs and an empty array survive
    origin = query(pg_dsn, on(SCHEMA_TARGET, "SELECT count(*) FROM {} WHERE reindex_origin IS NULL"))
    assert origin == [(2500,)]


def _no_row_by_row(*args: object) -> None:
    raise AssertionError("the schema target went row by row")


def test_a_schema_target_upserts_a_replay_and_rejects_a_nul_byte_in_any_column(
    pg_dsn: str, schema_sink: PgvectorSink
) -> None:
    schema_sink.write(SCHEMA_TARGET, rows_of(schema_records(10), seed=1))
    replay = rows_of(schema_records(15, text="changed"), seed=2)  # ten already there, five new
    schema_sink.write(SCHEMA_TARGET, replay)
    assert query(pg_dsn, on(SCHEMA_TARGET, "SELECT count(*), count(DISTINCT id) FROM {}")) == [(15, 15)]
    assert query(pg_dsn, on(SCHEMA_TARGET, "SELECT body FROM {} WHERE id = 3")) == [("changed 3 ✓",)]

    poisoned = schema_records(4, start=100)
    poisoned[2] = Record("102", "t", {**poisoned[2].payload, "tags": ["fine", "nul \x00 inside an array"]})
    with pytest.raises(RowsRejected) as refused:
        schema_sink.write(SCHEMA_TARGET, rows_of(poisoned))
    assert refused.value.reason == "sink_rejected:22021"
    assert query(pg_dsn, on(SCHEMA_TARGET, "SELECT count(*) FROM {} WHERE id >= 100")) == [(0,)]


def test_a_schema_column_without_a_binary_dumper_keeps_the_row_by_row_path(
    pg_dsn: str, schema_sink: PgvectorSink
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TYPE mood AS ENUM ('calm', 'busy')")
    columns = (Column("id", "bigint"), Column("body", "text"), Column("state", "mood"))
    source = SourceSchema("id", "body", "embedding", columns)
    schema_sink.prepare(TargetSpec("kb__enum0001", "kb", 8, "f" * 16, {"model": "test"}, source))
    records = [Record(str(i), f"t{i}", {"id": i, "body": f"t{i}", "state": "busy"}) for i in range(3)]
    schema_sink.write("kb__enum0001", rows_of(records))
    assert query(pg_dsn, "SELECT id, state::text FROM kb__enum0001 ORDER BY id") == [
        (0, "busy"),
        (1, "busy"),
        (2, "busy"),
    ]


def test_every_writer_connection_knows_pgvectors_types(pg_dsn: str, schema_sink: PgvectorSink) -> None:
    """A source table's own columns may be of pgvector's types (halfvec and sparsevec from pgvector 0.7;
    the embedded server here has 0.6, whose only type is the vector column itself), and a big batch
    dumps them on the writer connections: those must know the types as the sink's own connection does."""
    from psycopg.pq import Format

    schema_sink.write(SCHEMA_TARGET, rows_of(schema_records(2500)))  # big enough for the writers
    pool = schema_sink._pool
    assert pool is not None
    vector = query(pg_dsn, "SELECT 'vector'::regtype::oid")[0][0]
    for db in pool._dbs:
        assert db.connection().adapters.get_dumper_by_oid(vector, Format.BINARY)
