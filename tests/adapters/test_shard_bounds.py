"""`shard_bounds`: the cheap shard cut a ray driver plans with must equal the cut a full read gives
(`scan_documents`), position for position and count for count, from the start and after any cursor."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from qdrant_client import QdrantClient, models

from reindex.ports import Source
from reindex.run.io import scan_documents
from reindex_adapters.files.jsonl import JsonlSource
from reindex_adapters.files.parquet import ParquetSource
from reindex_adapters.postgres.source import PostgresSource
from reindex_adapters.qdrant.source import QdrantSource


def by_reading(source: Source, after: str | None, size: int) -> list[tuple[str, int]]:
    return [(str(docs.last_position), len(docs)) for docs in scan_documents(source, after, size)]


def same_cut(source: Source, sizes: tuple[int, ...] = (1, 3, 7, 50)) -> None:
    for size in sizes:
        whole = by_reading(source, None, size)
        assert list(source.shard_bounds(None, size)) == whole, size  # type: ignore[attr-defined]
        for last, _ in whole[:3]:
            expected = by_reading(source, last, size)
            assert list(source.shard_bounds(last, size)) == expected, (size, last)  # type: ignore[attr-defined]


def test_jsonl_bounds_skip_blank_lines_and_count_broken_ones(tmp_path: Path) -> None:
    lines = [json.dumps({"id": f"d{i}", "text": f"text {i}"}) for i in range(23)]
    lines[4] = "   "  # blank: no document
    lines[9] = "{broken"  # a dead letter, still a document
    lines[15] = ""
    path = tmp_path / "docs.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode() + b"\n\n")
    same_cut(JsonlSource(path))


def test_jsonl_bounds_of_a_file_without_a_final_newline(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"id": i, "text": "t"}) for i in range(10)))
    same_cut(JsonlSource(path))


def test_parquet_bounds_are_row_numbers(tmp_path: Path) -> None:
    path = tmp_path / "docs.parquet"
    table = pa.table({"id": [f"d{i}" for i in range(31)], "text": [f"text {i}" for i in range(31)]})
    pq.write_table(table, path, row_group_size=4)
    same_cut(ParquetSource(path))


def test_postgres_bounds_are_keyset_ids(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE docs (id bigint PRIMARY KEY, body text)")
        conn.execute("INSERT INTO docs SELECT i * 3, 'text ' || i FROM generate_series(1, 40) i")
    source = PostgresSource(pg_dsn, table="docs", page_size=6)
    try:
        same_cut(source)
        assert list(source.shard_bounds("120", 5)) == []  # nothing after the last id
    finally:
        source.close()


@pytest.mark.parametrize("size", [1, 4])
def test_an_empty_jsonl_file_has_no_shards(tmp_path: Path, size: int) -> None:
    path = tmp_path / "docs.jsonl"
    path.write_text("\n  \n")
    assert list(JsonlSource(path).shard_bounds(None, size)) == []


@pytest.mark.parametrize("page", [3, 10_000])
@pytest.mark.parametrize("ids", ["integers", "uuids"])
def test_qdrant_bounds_are_an_ids_only_scroll(ids: str, page: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "reindex_adapters.qdrant.source.BOUNDS_PAGE", page
    )  # shards that span scroll pages, or one page
    client = QdrantClient(":memory:")
    client.create_collection(
        "docs", vectors_config=models.VectorParams(size=2, distance=models.Distance.COSINE)
    )
    keys: list[int | str] = [i * 5 for i in range(37)]
    if ids == "uuids":
        keys = [f"00000000-0000-0000-0000-{i * 5:012d}" for i in range(37)]
    payloads = [{"page_content": f"text {i}"} if i != 11 else {"other": 1} for i in range(37)]  # 11: no text
    points = [
        models.PointStruct(id=k, vector=[1.0, 0.5], payload=p) for k, p in zip(keys, payloads, strict=True)
    ]
    client.upsert("docs", points, wait=True)
    source = QdrantSource(client, collection="docs", page_size=2)
    same_cut(source)
    assert list(source.shard_bounds(str(keys[-1]), 5)) == []  # nothing after the last point


# `scan_range`: a planned shard read as its range is now (the processes engine's workers) ---------------------


def ranges_read(source: Source, planned: list[tuple[str, int]]) -> list[str]:
    """Every id the planned shards' ranges hold now, then the documents after the last one (a rerun plans
    those as new shards)."""
    ids: list[str] = []
    after: str | None = None
    for last, _ in planned:
        ids += source.scan_range(after, last).ids  # type: ignore[attr-defined]
        after = last
    return ids + [i for docs in scan_documents(source, after, 1000) for i in docs.ids]


def test_jsonl_ranges_read_a_file_rewritten_since_it_was_planned_once_over(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    lines = [json.dumps({"id": f"d{i}", "text": f"text {i}"}) for i in range(40)]
    lines[9] = "{broken"
    path.write_text("\n".join(lines) + "\n")
    source = JsonlSource(path)
    planned = list(source.shard_bounds(None, 6))
    whole = [i for docs in scan_documents(source, None, 1000) for i in docs.ids]
    assert ranges_read(source, planned) == whole
    lines[3] = json.dumps({"id": "d3", "text": "a much longer text than before " * 5})  # offsets shift
    del lines[20]
    lines.append(json.dumps({"id": "d40", "text": "appended"}))
    path.write_text("\n".join(lines) + "\n")
    now = [i for docs in scan_documents(source, None, 1000) for i in docs.ids]
    assert sorted(ranges_read(source, planned)) == sorted(now), "a line read twice or never"


def test_postgres_ranges_read_rows_inserted_and_deleted_since_the_plan(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS ranged")
        conn.execute("CREATE TABLE ranged (id bigint PRIMARY KEY, text text)")
        conn.execute("INSERT INTO ranged SELECT g * 10, 'text ' || g FROM generate_series(1, 30) g")
    source = PostgresSource.from_config(
        PostgresSource.Config(kind="postgres", dsn=pg_dsn, table="ranged", text_column="text")
    )
    try:
        planned = list(source.shard_bounds(None, 7))
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO ranged VALUES (15, 'inserted'), (1000, 'after the plan')")
            conn.execute("DELETE FROM ranged WHERE id IN (70, 300)")
        now = [i for docs in scan_documents(source, None, 1000) for i in docs.ids]
        assert ranges_read(source, planned) == now  # key order: each row once, in its range
        assert source.scan_range(planned[0][0], planned[1][0]).last_position == planned[1][0]
    finally:
        source.close()
