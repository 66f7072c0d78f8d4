"""Points the application writes through a Qdrant alias: how scan_index reads them and how adopt stores
their bookkeeping (`tests/clients/test_langchain_qdrant.py` drives the same through LangChain and the CLI)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from qdrant_client import QdrantClient, models

from reindex.fingerprint import content_hash, fields_version
from reindex.ports import IndexEntry, Record, Rows, SourceSchema, TargetSpec
from reindex.prove.verify import compare
from reindex_adapters.qdrant.sink import QdrantSink
from reindex_adapters.qdrant.source import QdrantSource
from reindex_adapters.testing.memory import HashEmbedder

FINGERPRINT = "a" * 16
DIM = 4
TARGET = "docs__aaaaaaaa"


@pytest.fixture(params=["memory", "disk"])
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[QdrantClient]:
    opened = QdrantClient(":memory:") if request.param == "memory" else QdrantClient(path=str(tmp_path))
    yield opened
    opened.close()


def uid(n: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"doc-{n}"))


def built(client: QdrantClient) -> QdrantSink:
    """A target the tool built from a LangChain-shaped source, holding two of its own points."""
    sink = QdrantSink(client, upsert_batch=2)
    schema = SourceSchema("id", "page_content", distance="dot")
    sink.prepare(TargetSpec(TARGET, "docs", DIM, FINGERPRINT, {}, schema))
    records = [Record(uid(n), f"text {n}", {"page_content": f"text {n}", "metadata": {}}) for n in (1, 2)]
    vectors = np.ones((2, DIM), dtype=np.float32)
    sink.write(TARGET, Rows(records, vectors, [content_hash(r.text) for r in records], FINGERPRINT))
    return sink


def upsert(client: QdrantClient, collection: str, n: int, payload: dict) -> None:
    """What an application's upsert does: the whole payload replaced, no reindex keys."""
    client.upsert(collection, [models.PointStruct(id=uid(n), vector=[1.0] * DIM, payload=payload)])


def entries(sink: QdrantSink, target: str = TARGET) -> dict[str, IndexEntry]:
    """Each entry, less its payload digest (checked once, in the first test)."""
    return {entry.id: replace(entry, fields=None) for entry in sink.scan_index(target, DIM)}


def test_an_application_point_gets_its_texts_hash_and_the_targets_fingerprint(client: QdrantClient) -> None:
    sink = built(client)
    upsert(client, TARGET, 1, {"page_content": "text 1, edited", "metadata": {}})  # a tool point replaced
    upsert(client, TARGET, 3, {"page_content": "text \u00e9 3", "metadata": {}})  # a new one
    upsert(client, TARGET, 4, {"metadata": {}})  # no text: its hash cannot be known
    found = entries(sink)
    assert found[uid(1)] == IndexEntry(uid(1), content_hash("text 1, edited"), FINGERPRINT, None, True, True)
    assert found[uid(3)] == IndexEntry(uid(3), content_hash("text \u00e9 3"), FINGERPRINT, None, True, True)
    assert found[uid(4)] == IndexEntry(uid(4), None, FINGERPRINT, None, True, True)
    assert found[uid(2)] == IndexEntry(uid(2), content_hash("text 2"), FINGERPRINT, None, False, False)
    digests = {e.id: e.fields for e in sink.scan_index(TARGET, DIM)}  # what verify holds the source's against
    assert digests[uid(1)] == fields_version({"page_content": "text 1, edited", "metadata": {}})
    assert digests[uid(2)] == fields_version({"page_content": "text 2", "metadata": {}})  # less reindex_*


def test_a_collection_reindex_did_not_build_derives_nothing(client: QdrantClient) -> None:
    client.create_collection("legacy", models.VectorParams(size=DIM, distance=models.Distance.DOT))
    upsert(client, "legacy", 1, {"page_content": "text 1"})
    (entry,) = entries(QdrantSink(client), "legacy").values()
    assert (entry.content_hash, entry.fingerprint, entry.application) == (None, None, True)


def test_adopt_stores_the_bookkeeping_only_where_none_is_and_keeps_the_vector(client: QdrantClient) -> None:
    sink = built(client)
    upsert(client, TARGET, 3, {"page_content": "text 3", "metadata": {"k": 1}})
    hashes = {uid(3): content_hash("text 3"), uid(2): "not-its-hash", uid(9): content_hash("gone")}
    assert sink.adopt(TARGET, hashes, FINGERPRINT) == 3  # uid(9) was deleted meanwhile: no error
    (adopted,) = client.retrieve(TARGET, [uid(3)], with_payload=True, with_vectors=True)
    assert adopted.payload == {
        "page_content": "text 3",
        "metadata": {"k": 1},
        "reindex_id": uid(3),
        "reindex_fingerprint": FINGERPRINT,
        "reindex_content_hash": content_hash("text 3"),
        "reindex_origin": "application",
    }
    assert adopted.vector == [1.0] * DIM
    found = entries(sink)
    assert found[uid(2)].content_hash == content_hash("text 2")  # the tool's own point kept its hash
    assert found[uid(3)].application and not found[uid(2)].application
    assert client.count(TARGET).count == 3

    # a text changed under the adopted point's vector keeps the old hash: stale, never fresh
    client.set_payload(TARGET, {"page_content": "text 3, rewritten"}, points=[uid(3)])
    assert entries(sink)[uid(3)].content_hash == content_hash("text 3")


def test_the_tool_rewriting_an_adopted_point_makes_it_its_own(client: QdrantClient) -> None:
    sink = built(client)
    upsert(client, TARGET, 3, {"page_content": "text 3"})
    sink.adopt(TARGET, {uid(3): content_hash("text 3")}, FINGERPRINT)
    (point,) = client.retrieve(TARGET, [uid(3)], with_payload=True)
    record = Record(uid(3), "text 3", dict(point.payload or {}))  # read back through the alias, as sync does
    sink.write(TARGET, Rows([record], np.ones((1, DIM), np.float32), [content_hash("text 3")], FINGERPRINT))
    assert entries(sink)[uid(3)] == IndexEntry(uid(3), content_hash("text 3"), FINGERPRINT, None, False)


def test_only_sound_application_points_are_adoptable_and_counted(client: QdrantClient) -> None:
    """After cutover the alias is the source: compared with itself, a point without text is nothing to adopt,
    and its vector is stale: a migration embeds no text that is not there (issue 41)."""
    sink = built(client)
    upsert(client, TARGET, 3, {"page_content": "text 3"})
    upsert(client, TARGET, 4, {"metadata": {}})  # no text: nothing to hash, nothing to adopt
    source = QdrantSource(client, collection=TARGET)
    with compare(source, sink, TARGET, dim=DIM) as comparison:
        assert list(comparison.adoptable()) == [(uid(3), content_hash("text 3"))]
        report = comparison.report(FINGERPRINT)
    assert (report.application_rows, report.unhashed, report.stale, report.complete) == (2, 0, 1, False)


def test_with_an_embedder_an_application_point_of_another_models_vector_is_stale_never_adoptable(
    client: QdrantClient,
) -> None:
    """Its text's hash is right and the old model has the same dimension: only a fresh embedding tells."""
    sink = built(client)
    new, old = HashEmbedder(dim=DIM), HashEmbedder(dim=DIM, seed="the old model")
    texts = {3: "text 3", 5: "text 5"}
    vectors = {3: old.vectors(["text 3"])[0], 5: new.vectors(["text 5"])[0]}
    client.upsert(
        TARGET,
        [
            models.PointStruct(id=uid(n), vector=vectors[n].tolist(), payload={"page_content": texts[n]})
            for n in texts
        ],
    )
    source = QdrantSource(client, collection=TARGET)
    with compare(source, sink, TARGET, dim=DIM, embedder=new) as comparison:
        assert list(comparison.adoptable()) == [(uid(5), content_hash("text 5"))]
        assert list(comparison.ids("stale")) == [uid(3)]
        report = comparison.report(FINGERPRINT)
    assert (report.stale, report.application_rows, report.complete) == (1, 2, False)
    assert report.application_check is not None
    assert (report.application_check["checked"], report.application_check["stale"]) == (2, 1)
    assert report.application_check["min_cosine"] < 0.999
    with compare(source, sink, TARGET, dim=DIM) as comparison:  # no embedder (inspect): judged by hash only
        assert comparison.report(FINGERPRINT).stale == 0
