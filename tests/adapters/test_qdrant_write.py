"""QdrantSink.write: columnar batches (Documents, numpy rows) stored exactly as per-row records were."""

from __future__ import annotations

import http.server
import json
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from qdrant_client import QdrantClient

from reindex.columns import Documents
from reindex.ports import Record, Rows, SourceSchema, TargetSpec, Vectors
from reindex_adapters.qdrant.points import point_id
from reindex_adapters.qdrant.sink import QdrantSink

FINGERPRINT = "f" * 16
DIM = 6


@pytest.fixture(params=["memory", "disk"])
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[QdrantClient]:
    opened = QdrantClient(":memory:") if request.param == "memory" else QdrantClient(path=str(tmp_path))
    yield opened
    opened.close()


def prepared(client: QdrantClient, target: str, *, vector: str | None = None, batch: int = 64) -> QdrantSink:
    """A sink with `target` prepared; Dot distance, so stored vectors are the written ones, unnormalised."""
    sink = QdrantSink(client, upsert_batch=batch)
    schema = SourceSchema("id", "text", vector_field=vector, distance="dot")
    sink.prepare(TargetSpec(target, "docs", DIM, FINGERPRINT, {}, schema))
    return sink


def rows_of(records: Sequence[Record], vectors: Vectors) -> Rows:
    return Rows(records, vectors, [f"hash-{r.id}" for r in records], FINGERPRINT)


def matrix(n: int, seed: int = 0) -> Vectors:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def stored(client: QdrantClient, target: str) -> dict[str, tuple[dict[str, Any], list[Any]]]:
    """Every point as reindex_id -> (payload, vector), read back through the client."""
    points, offset = [], None
    while True:
        page, offset = client.scroll(target, limit=500, offset=offset, with_payload=True, with_vectors=True)
        points.extend(page)
        if offset is None:
            break
    result = {}
    for point in points:
        payload = dict(point.payload or {})
        vector = point.vector["text-dense"] if isinstance(point.vector, dict) else point.vector
        assert str(point.id) == str(point_id(payload["reindex_id"]))
        result[payload["reindex_id"]] = (payload, list(vector or []))
    return result


def test_bulk_rows_round_trip_ids_payloads_and_vectors_across_chunks(client: QdrantClient) -> None:
    sink = prepared(client, "docs__1", batch=64)
    canonical = str(uuid.uuid5(uuid.NAMESPACE_DNS, "kept"))
    ids = [f"doc-{i}" for i in range(300)] + ["7", "007", "ключ-🙂", canonical]
    records = [
        Record(
            doc_id,
            f"texte {i} — naïve café 漢字",
            {
                "id": doc_id,
                "text": f"texte {i} — naïve café 漢字",
                "meta": {
                    "source": f"doc{i}.md",
                    "page": i,
                    "tags": ["a", "ü"],
                    "at": datetime(2024, 5, 1, tzinfo=UTC),
                },
                "score": i / 3,
                "nothing": None,
            },
        )
        for i, doc_id in enumerate(ids)
    ]
    vectors = matrix(len(records))
    sink.write("docs__1", rows_of(records, vectors))

    points = stored(client, "docs__1")
    assert sorted(points) == sorted(ids)
    payload, _ = points["ключ-🙂"]
    assert payload["meta"] == {
        "source": "doc302.md",
        "page": 302,
        "tags": ["a", "ü"],
        "at": "2024-05-01T00:00:00+00:00",
    }
    assert payload["text"] == "texte 302 — naïve café 漢字"
    assert (payload["score"], payload["nothing"]) == (302 / 3, None)
    assert (payload["reindex_fingerprint"], payload["reindex_content_hash"]) == (FINGERPRINT, "hash-ключ-🙂")
    assert client.retrieve("docs__1", [canonical])[0].payload["reindex_id"] == canonical  # type: ignore[index]
    fetched = sink.fetch("docs__1", ids)
    for row, doc_id in enumerate(ids):
        np.testing.assert_array_equal(fetched[doc_id], vectors[row])


def test_documents_without_payloads_store_id_text_and_the_reindex_keys(client: QdrantClient) -> None:
    sink = prepared(client, "docs__1", batch=7)
    docs = Documents(
        [f"d{i}" for i in range(20)], [f"text {i}" for i in range(20)], fields=("doc_id", "body")
    )
    sink.write("docs__1", rows_of(docs, matrix(20)))
    assert stored(client, "docs__1")["d3"][0] == {
        "doc_id": "d3",
        "body": "text 3",
        "reindex_id": "d3",
        "reindex_fingerprint": FINGERPRINT,
        "reindex_content_hash": "hash-d3",
    }


def test_replaying_a_write_is_idempotent(client: QdrantClient) -> None:
    sink = prepared(client, "docs__1", batch=16)
    docs = Documents([f"d{i}" for i in range(100)], [f"text {i}" for i in range(100)])
    vectors = matrix(100)
    sink.write("docs__1", rows_of(docs, vectors))
    first = stored(client, "docs__1")
    sink.write("docs__1", rows_of(docs, vectors))
    sink.write("docs__1", rows_of(docs[40:70], vectors[40:70]))  # an overlapping shard, replayed
    assert client.count("docs__1", exact=True).count == 100
    assert stored(client, "docs__1") == first


def test_a_replay_with_new_vectors_replaces_the_points_in_place(client: QdrantClient) -> None:
    sink = prepared(client, "docs__1")
    docs = Documents(["a", "b"], ["one", "two"])
    sink.write("docs__1", rows_of(docs, matrix(2, seed=1)))
    newer = matrix(2, seed=2)
    sink.write("docs__1", rows_of(docs, newer))
    assert client.count("docs__1", exact=True).count == 2
    np.testing.assert_array_equal(sink.fetch("docs__1", ["b"])["b"], newer[1])


def test_documents_and_a_plain_list_of_records_store_the_same_points(client: QdrantClient) -> None:
    ids, texts = [f"d{i}" for i in range(50)], [f"text {i} ✓" for i in range(50)]
    vectors = matrix(50)
    columns = prepared(client, "docs__columns", batch=9)
    records = prepared(client, "docs__records", batch=64)
    columns.write("docs__columns", rows_of(Documents(ids, texts), vectors))
    plain = [Record(i, t, {"id": i, "text": t}) for i, t in zip(ids, texts, strict=True)]
    records.write("docs__records", rows_of(plain, vectors))
    assert stored(client, "docs__columns") == stored(client, "docs__records")


def test_documents_with_payloads_and_records_with_them_store_the_same_points(client: QdrantClient) -> None:
    payloads: list[Mapping[str, Any]] = [
        {"id": f"d{i}", "text": f"t{i}", "nested": {"deep": [i, {"x": "ÿ"}]}, "reindex_id": "spoofed"}
        for i in range(30)
    ]
    ids, texts = [p["id"] for p in payloads], [p["text"] for p in payloads]
    vectors = matrix(30)
    prepared(client, "docs__columns").write(
        "docs__columns", rows_of(Documents(ids, texts, payloads), vectors)
    )
    plain = [Record(i, t, p) for i, t, p in zip(ids, texts, payloads, strict=True)]
    prepared(client, "docs__records").write("docs__records", rows_of(plain, vectors))
    points = stored(client, "docs__columns")
    assert points == stored(client, "docs__records")
    assert points["d4"][0]["nested"] == {"deep": [4, {"x": "ÿ"}]}
    assert payloads[0]["reindex_id"] == "spoofed"  # the source's payload is copied, never changed


def test_a_named_vector_target_gets_its_vectors_under_that_name(client: QdrantClient) -> None:
    sink = prepared(client, "docs__1", vector="text-dense", batch=5)
    docs = Documents([f"d{i}" for i in range(12)], [f"text {i}" for i in range(12)])
    vectors = matrix(12)
    sink.write("docs__1", rows_of(docs, vectors))
    points = stored(client, "docs__1")
    np.testing.assert_allclose(points["d11"][1], vectors[11])
    np.testing.assert_array_equal(sink.fetch("docs__1", ["d11"])["d11"], vectors[11])


def test_an_empty_write_stores_nothing_and_mismatched_columns_are_refused(client: QdrantClient) -> None:
    sink = prepared(client, "docs__1")
    sink.write("docs__1", rows_of(Documents([], []), np.zeros((0, DIM), np.float32)))
    assert client.count("docs__1", exact=True).count == 0
    with pytest.raises(ValueError, match="differ"):
        sink.write("docs__1", rows_of(Documents(["a", "b"], ["x", "y"]), matrix(1)))
    assert client.count("docs__1", exact=True).count == 0


class _RecordingServer(http.server.BaseHTTPRequestHandler):
    """A Qdrant server as far as a write needs one: describes one collection, records every upsert."""

    collection: ClassVar[str] = "{}"
    upserts: ClassVar[list[tuple[str, dict[str, Any]]]] = []

    def do_GET(self) -> None:
        self._answer(json.loads(self.collection))

    def do_PUT(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.upserts.append((self.path, body))
        self._answer({"operation_id": len(self.upserts), "status": "completed"})

    def _answer(self, result: Any) -> None:
        body = json.dumps({"result": result, "status": "ok", "time": 0}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_on_a_server_each_chunk_is_one_waited_batch_request() -> None:
    local = QdrantClient(":memory:")
    prepared(local, "docs__1", vector="text-dense")
    _RecordingServer.collection = local.get_collection("docs__1").model_dump_json()
    _RecordingServer.upserts = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RecordingServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    remote = QdrantClient(url=f"http://127.0.0.1:{server.server_address[1]}", check_compatibility=False)
    docs = Documents([f"d{i}" for i in range(10)], [f"text {i}" for i in range(10)])
    vectors = matrix(10)
    try:
        QdrantSink(remote, upsert_batch=4).write("docs__1", rows_of(docs, vectors))
    finally:
        remote.close()
        server.shutdown()
        server.server_close()
    assert [path for path, _ in _RecordingServer.upserts] == ["/collections/docs__1/points?wait=true"] * 3
    batches = [body["batch"] for _, body in _RecordingServer.upserts]
    assert [len(b["ids"]) for b in batches] == [4, 4, 2]
    assert [i for b in batches for i in b["ids"]] == [point_id(i) for i in docs.ids]
    assert batches[2]["payloads"][1] == {
        "id": "d9",
        "text": "text 9",
        "reindex_id": "d9",
        "reindex_fingerprint": FINGERPRINT,
        "reindex_content_hash": "hash-d9",
    }
    sent = np.array([row for b in batches for row in b["vectors"]["text-dense"]], dtype=np.float32)
    np.testing.assert_array_equal(sent, vectors)
