"""Factories for every Source and Sink: the contract suites run each scenario against all of them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from reindex.ports import Record, Sink, Source

SourceFactory = Callable[[Sequence[Record]], Source]


@pytest.fixture(params=["memory", "pgvector", "qdrant"])
def sink(request: pytest.FixtureRequest) -> Iterator[Sink]:
    kind = request.param
    if kind == "memory":
        from reindex_adapters.testing.memory import MemorySink

        built: Sink = MemorySink()
    elif kind == "pgvector":
        from reindex_adapters.postgres.sink import PgvectorSink

        built = PgvectorSink(request.getfixturevalue("pg_dsn"))
    else:
        from qdrant_client import QdrantClient

        from reindex_adapters.qdrant.sink import QdrantSink

        built = QdrantSink(QdrantClient(":memory:"))
    yield built
    built.close()


@pytest.fixture(params=["memory", "postgres", "qdrant", "parquet", "jsonl"])
def make_source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SourceFactory]:
    """Load records into a fresh backend of the given kind and return a Source reading them."""
    opened: list[Source] = []

    def factory(records: Sequence[Record]) -> Source:
        source = _LOADERS[request.param](request, tmp_path, records)
        opened.append(source)
        return source

    yield factory
    for source in opened:
        source.close()


def _memory(request: pytest.FixtureRequest, tmp_path: Path, records: Sequence[Record]) -> Source:
    from reindex_adapters.testing.memory import MemorySource

    return MemorySource(records)


def _postgres(request: pytest.FixtureRequest, tmp_path: Path, records: Sequence[Record]) -> Source:
    import psycopg

    from reindex_adapters.postgres.source import PostgresSource

    dsn = request.getfixturevalue("pg_dsn")
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE docs (id text PRIMARY KEY, body text, category text)")
        with conn.cursor().copy("COPY docs (id, body, category) FROM STDIN") as copy:
            for r in records:
                copy.write_row((r.id, r.text, r.payload.get("category")))
    return PostgresSource(dsn, table="docs", id_column="id", text_column="body", page_size=100)


def _qdrant(request: pytest.FixtureRequest, tmp_path: Path, records: Sequence[Record]) -> Source:
    from qdrant_client import QdrantClient, models

    from reindex_adapters.qdrant.source import QdrantSource

    client = QdrantClient(":memory:")
    client.create_collection(
        "docs", vectors_config=models.VectorParams(size=4, distance=models.Distance.COSINE)
    )
    points = [
        models.PointStruct(
            id=int(r.id),
            vector=[1.0, 0.0, 0.0, float(i % 7)],
            payload={"page_content": r.text, "metadata": {"category": r.payload.get("category")}},
        )
        for i, r in enumerate(records)
    ]
    for start in range(0, len(points), 256):
        client.upsert("docs", points[start : start + 256])
    return QdrantSource(client, collection="docs", text_field="page_content", page_size=100)


def _parquet(request: pytest.FixtureRequest, tmp_path: Path, records: Sequence[Record]) -> Source:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from reindex_adapters.files.parquet import ParquetSource

    table = pa.table(
        {
            "id": [r.id for r in records],
            "text": [r.text for r in records],
            "category": [r.payload.get("category") for r in records],
        }
    )
    path = tmp_path / "docs.parquet"
    pq.write_table(table, path, row_group_size=97)
    return ParquetSource(path, id_field="id", text_field="text")


def _jsonl(request: pytest.FixtureRequest, tmp_path: Path, records: Sequence[Record]) -> Source:
    from reindex_adapters.files.jsonl import JsonlSource

    path = tmp_path / "docs.jsonl"
    with path.open("w") as out:
        for r in records:
            out.write(json.dumps({"id": r.id, "text": r.text, "category": r.payload.get("category")}) + "\n")
    return JsonlSource(path, id_field="id", text_field="text")


_LOADERS = {"memory": _memory, "postgres": _postgres, "qdrant": _qdrant, "parquet": _parquet, "jsonl": _jsonl}
