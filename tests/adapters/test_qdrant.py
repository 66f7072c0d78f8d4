"""Qdrant adapter details: LangChain and LlamaIndex collections migrated behind an alias, local storage."""

from __future__ import annotations

import http.server
import json
import re
import threading
import traceback
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qdrant_client import QdrantClient, models

from reindex.errors import BackendError, ConfigError, CutoverRefused
from reindex.fingerprint import content_hash, target_name
from reindex.ports import Record, Rows, SourceSchema, TargetSpec
from reindex.registry import build
from reindex_adapters.qdrant.alias import GUARD_MARK
from reindex_adapters.qdrant.points import point_id
from reindex_adapters.qdrant.sink import QdrantSink
from reindex_adapters.qdrant.source import QdrantSource
from reindex_adapters.testing.memory import HashEmbedder

TEXTS = [
    f"note {i} about {topic}" for i, topic in enumerate(["qdrant", "postgres", "parquet", "alias", "shard"])
]


def migrate(source: QdrantSource, sink: QdrantSink, alias: str, dim: int = 8) -> TargetSpec:
    """What a run does, without the ledger: scan, embed, write, then move the alias."""
    embedder = HashEmbedder(dim=dim)
    info = embedder.info
    spec = TargetSpec(
        target_name(alias, info.fingerprint), alias, dim, info.fingerprint, info.describe(), source.schema()
    )
    sink.prepare(spec)
    records = [r for r in source.scan() if r.defect is None]
    vectors = embedder.embed(embedder.tokenize([r.text for r in records]))
    sink.write(spec.name, Rows(records, vectors, [content_hash(r.text) for r in records], info.fingerprint))
    sink.finalize(spec)
    sink.move_alias(
        alias, spec.name, expected=sink.alias(alias).target, meta={"fingerprint": info.fingerprint}
    )
    return spec


def langchain_collection(client: QdrantClient, name: str) -> list[str]:
    """As langchain-qdrant stores documents: unnamed vector, uuid ids, page_content + metadata."""
    client.create_collection(
        name, vectors_config=models.VectorParams(size=4, distance=models.Distance.COSINE)
    )
    ids = [str(uuid.uuid5(uuid.NAMESPACE_DNS, text)) for text in TEXTS]
    points = [
        models.PointStruct(
            id=pid,
            vector=[1.0, float(i), 0.5, 0.0],
            payload={"page_content": text, "metadata": {"source": f"doc{i}.md", "page": i}},
        )
        for i, (pid, text) in enumerate(zip(ids, TEXTS, strict=True))
    ]
    client.upsert(name, points, wait=True)
    return ids


def llamaindex_collection(client: QdrantClient, name: str) -> list[str]:
    """As llama-index's QdrantVectorStore stores TextNodes: the node as JSON in `_node_content` (text
    inside), ref doc ids at the top level, node ids as point ids; here under the named vector
    "text-dense" that its hybrid mode uses, with Dot distance."""
    vectors = {"text-dense": models.VectorParams(size=4, distance=models.Distance.DOT)}
    client.create_collection(name, vectors_config=vectors)
    ids = [str(uuid.uuid5(uuid.NAMESPACE_URL, text)) for text in TEXTS]
    points = []
    for i, (node_id, text) in enumerate(zip(ids, TEXTS, strict=True)):
        node = {
            "id_": node_id,
            "embedding": None,
            "metadata": {"file_name": f"f{i}.txt"},
            "text": text,
            "relationships": {"1": {"node_id": f"ref-{i}", "node_type": "4", "metadata": {}}},
            "class_name": "TextNode",
        }
        payload = {
            "file_name": f"f{i}.txt",
            "_node_content": json.dumps(node),
            "_node_type": "TextNode",
            "document_id": f"ref-{i}",
            "doc_id": f"ref-{i}",
            "ref_doc_id": f"ref-{i}",
        }
        points.append(
            models.PointStruct(id=node_id, vector={"text-dense": [0.5, float(i), 1.0, 0.0]}, payload=payload)
        )
    client.upsert(name, points, wait=True)
    return ids


def test_langchain_collection_is_served_through_the_alias_to_unchanged_application_code() -> None:
    client = QdrantClient(":memory:")
    ids = langchain_collection(client, "lc_v1")
    client.update_collection_aliases(
        change_aliases_operations=[
            models.CreateAliasOperation(
                create_alias=models.CreateAlias(collection_name="lc_v1", alias_name="docs")
            )
        ]
    )
    source = QdrantSource(client, collection="docs")
    spec = migrate(source, QdrantSink(client), "docs")

    query = HashEmbedder(dim=8).vector(TEXTS[3]).tolist()
    hits = client.query_points(collection_name="docs", query=query, limit=3, with_payload=True).points
    assert hits[0].payload is not None
    assert hits[0].payload["page_content"] == TEXTS[3]
    assert hits[0].payload["metadata"] == {"source": "doc3.md", "page": 3}
    assert str(hits[0].id) == ids[3]
    assert QdrantSink(client).alias("docs").target == spec.name
    info = QdrantSink(client).describe(spec.name)
    assert info is not None and (info.dim, info.count) == (8, len(TEXTS))


def test_llamaindex_collection_keeps_its_named_vector_and_node_payload() -> None:
    client = QdrantClient(":memory:")
    ids = llamaindex_collection(client, "li_v1")
    source = QdrantSource(client, collection="li_v1", text_field="_node_content.text")
    schema = source.schema()
    assert replace(schema, layout={}) == SourceSchema(
        "id", "_node_content.text", vector_field="text-dense", distance="dot"
    )
    assert schema.layout["vector"] == {"size": 4, "distance": "Dot"} and not schema.layout["sparse"]
    spec = migrate(source, QdrantSink(client), "nodes", dim=6)

    vectors = client.get_collection(spec.name).config.params.vectors
    assert isinstance(vectors, dict) and vectors["text-dense"].size == 6
    query = HashEmbedder(dim=6).vector(TEXTS[1]).tolist()
    hits = client.query_points(
        collection_name="nodes", query=query, using="text-dense", limit=3, with_payload=True
    ).points
    assert hits[0].payload is not None
    assert json.loads(hits[0].payload["_node_content"])["text"] == TEXTS[1]
    assert hits[0].payload["ref_doc_id"] == "ref-1"
    assert str(hits[0].id) == ids[1]


def test_scan_resumes_strictly_after_int_and_uuid_positions() -> None:
    client = QdrantClient(":memory:")
    client.create_collection(
        "mixed", vectors_config=models.VectorParams(size=2, distance=models.Distance.DOT)
    )
    ids: list[int | str] = [3, 10, 2**40, str(uuid.uuid5(uuid.NAMESPACE_DNS, "a")), str(uuid.uuid4())]
    client.upsert(
        "mixed",
        [models.PointStruct(id=i, vector=[1.0, 0.0], payload={"page_content": f"t{i}"}) for i in ids],
        wait=True,
    )
    source = QdrantSource(client, collection="mixed", page_size=2)
    first = [r.id for r in source.scan()]
    assert sorted(first) == sorted(str(i) for i in ids) and first[:3] == ["3", "10", str(2**40)]
    for k, position in enumerate(first):
        assert [r.id for r in source.scan(after=position)] == first[k + 1 :]


def test_scan_reports_missing_and_non_text_payloads_as_defects() -> None:
    client = QdrantClient(":memory:")
    client.create_collection("docs", vectors_config=models.VectorParams(size=2, distance=models.Distance.DOT))
    payloads: list[dict[str, Any]] = [
        {"metadata": {"text": "ok"}},
        {"metadata": {}},
        {"metadata": {"text": 42}},
    ]
    client.upsert(
        "docs", [models.PointStruct(id=i, vector=[1.0, 1.0], payload=p) for i, p in enumerate(payloads)]
    )
    records = list(QdrantSource(client, collection="docs", text_field="metadata.text").scan())
    assert [(r.text, r.defect) for r in records] == [
        ("ok", None),
        ("", "missing_text"),
        ("", "invalid_text_type"),
    ]
    assert records[1].payload == {"metadata": {}}


def test_missing_collection_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="'nope'"):
        QdrantSource(QdrantClient(":memory:"), collection="nope").count()


def test_point_id_keeps_canonical_uuids_and_integers_and_derives_the_rest() -> None:
    canonical = str(uuid.uuid4())
    assert point_id(canonical) == canonical
    assert point_id(canonical.upper()) != canonical
    assert point_id("7") == 7 and point_id("0") == 0 and point_id(str(2**64 - 1)) == 2**64 - 1
    for derived in ("007", "+7", "-7", "7.0", str(2**64), "٧"):  # the last: an Arabic-Indic seven
        assert uuid.UUID(str(point_id(derived))).version == 5, derived
    assert point_id("007") != point_id("7")


def test_write_stores_a_json_safe_payload_with_the_reindex_keys() -> None:
    client = QdrantClient(":memory:")
    sink = QdrantSink(client, upsert_batch=1)
    spec = TargetSpec("t__1", "t", 2, "f" * 16, {}, SourceSchema("id", "text"))
    sink.prepare(spec)
    payload = {
        "at": datetime(2024, 5, 1, tzinfo=UTC),
        "price": Decimal("1.5"),
        "ref": uuid.UUID(int=1),
        "raw": b"\x00\x01",
        "tags": ("a", "b"),
    }
    sink.write("t__1", Rows([Record("42", "hello", payload)], np.ones((1, 2), np.float32), ["h"], "f" * 16))
    stored = client.retrieve("t__1", [point_id("42")])[0].payload
    assert stored == {
        "at": "2024-05-01T00:00:00+00:00",
        "price": 1.5,
        "ref": str(uuid.UUID(int=1)),
        "raw": "AAE=",
        "tags": ["a", "b"],
        "reindex_id": "42",
        "reindex_fingerprint": "f" * 16,
        "reindex_content_hash": "h",
    }


def test_alias_over_a_real_collection_is_refused_with_instructions() -> None:
    client = QdrantClient(":memory:")
    langchain_collection(client, "docs")
    sink = QdrantSink(client)
    sink.prepare(TargetSpec("docs__0000aaaa", "docs", 4, "f" * 16, {}, SourceSchema("id", "page_content")))
    assert sink.alias("docs").is_physical
    with pytest.raises(CutoverRefused, match="cannot put an alias over a collection") as refused:
        sink.move_alias("docs", "docs__0000aaaa", expected=None, meta={})
    assert "docs_live" in str(refused.value)


def test_drop_refuses_a_served_target_and_targets_are_oldest_first() -> None:
    client = QdrantClient(":memory:")
    sink = QdrantSink(client)
    for name in ("docs__bbbb", "docs__aaaa"):
        sink.prepare(TargetSpec(name, "docs", 3, "f" * 16, {}, SourceSchema("id", "text")))
    assert sink.targets("docs") == ["docs__bbbb", "docs__aaaa"]
    sink.move_alias("docs", "docs__aaaa", expected=None, meta={})
    with pytest.raises(CutoverRefused, match="served by alias 'docs'"):
        sink.drop("docs__aaaa")
    with pytest.raises(ConfigError):
        sink.prepare(TargetSpec("docs__aaaa", "docs", 5, "f" * 16, {}, SourceSchema("id", "text")))


def test_source_and_sink_on_one_local_folder_share_a_client(tmp_path: Path) -> None:
    seed = QdrantClient(path=str(tmp_path))
    ids = langchain_collection(seed, "kb")
    seed.close()
    source = build("source", {"kind": "qdrant", "path": str(tmp_path), "collection": "kb"})
    sink = build("target", {"kind": "qdrant", "path": f"{tmp_path}/.", "alias": "kb_live"})
    assert source._client is sink._client
    spec = migrate(source, sink, "kb_live")
    source.close()
    sink.close()

    reopened = QdrantClient(path=str(tmp_path))  # the shared client was closed: the lock is free
    assert QdrantSink(reopened).alias("kb_live").target == spec.name
    assert {str(p.id) for p in reopened.scroll("kb_live", limit=10)[0]} == set(ids)
    reopened.close()


def test_corrupt_local_storage_fails_loudly_and_is_left_as_it_was(tmp_path: Path) -> None:
    seed = QdrantClient(path=str(tmp_path))
    langchain_collection(seed, "kb")
    seed.close()
    (tmp_path / "meta.json").write_text('{"collections": {"kb": {"vect')
    config = QdrantSource.Config(kind="qdrant", path=str(tmp_path), collection="kb")
    with pytest.raises(BackendError, match="unreadable"):
        QdrantSource.from_config(config)
    assert (tmp_path / "meta.json").read_text() == '{"collections": {"kb": {"vect'


def test_a_folder_locked_by_another_client_is_a_config_error(tmp_path: Path) -> None:
    holder = QdrantClient(path=str(tmp_path))
    with pytest.raises(ConfigError, match="another process holds"):
        QdrantSink.from_config(QdrantSink.Config(kind="qdrant", path=str(tmp_path), alias="docs"))
    holder.close()


def test_config_needs_exactly_one_of_url_and_path() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        QdrantSink.Config(kind="qdrant", alias="docs")


def test_unreachable_server_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=re.escape("cannot reach Qdrant at http://127.0.0.1:9")):
        QdrantSink.from_config(QdrantSink.Config(kind="qdrant", url="http://127.0.0.1:9", alias="docs"))


# ---- issue 10: identity, plan id and nonce, hash-checked copies, compare-and-swap alias moves, secrets ----


def two_targets(sink: QdrantSink, *names: str) -> None:
    for name in names:
        sink.prepare(TargetSpec(name, "docs", 3, "f" * 16, {}, SourceSchema("id", "text")))


def guards(client: QdrantClient) -> dict[str, str]:
    return {
        a.alias_name: a.collection_name for a in client.get_aliases().aliases if GUARD_MARK in a.alias_name
    }


def test_identity_names_the_server_without_credentials_or_knobs() -> None:
    client = QdrantClient(
        url="https://reader:pw@Qdrant.Example.COM/?x=1", api_key="sekrit-key", check_compatibility=False
    )
    source = QdrantSource(client, collection="docs", text_field="metadata.text", page_size=7)
    assert QdrantSink(client, upsert_batch=3).identity() == "qdrant:https://qdrant.example.com:6333"
    assert source.identity() == "qdrant:https://qdrant.example.com:6333/docs#id,metadata.text"
    assert source.identity() == QdrantSource(client, collection="docs", text_field="metadata.text").identity()
    assert "sekrit" not in source.identity() and "pw" not in source.identity()
    client.close()


def test_identity_of_local_storage_is_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    client = QdrantClient(path="store/./")
    assert QdrantSink(client).identity() == f"qdrant:{(tmp_path / 'store').resolve()}"
    assert (
        QdrantSource(client, collection="kb").identity()
        == f"qdrant:{(tmp_path / 'store').resolve()}/kb#id,page_content"
    )
    client.close()


def test_prepare_records_plan_id_and_nonce_and_never_restamps_them() -> None:
    sink = QdrantSink(QdrantClient(":memory:"))
    spec = TargetSpec(
        "docs__1", "docs", 3, "f" * 16, {}, SourceSchema("id", "text"), plan_id="p1", nonce="n1"
    )
    sink.prepare(spec)
    sink.prepare(
        TargetSpec("docs__1", "docs", 3, "f" * 16, {}, SourceSchema("id", "text"), plan_id="p2", nonce="n2")
    )
    info = sink.describe("docs__1")
    assert info is not None and (info.plan_id, info.nonce) == ("p1", "n1")
    sink.prepare(TargetSpec("docs__2", "docs", 3, "f" * 16, {}, SourceSchema("id", "text")))
    unowned = sink.describe("docs__2")
    assert unowned is not None and (unowned.plan_id, unowned.nonce) == (None, None)


def test_fetch_matching_returns_only_vectors_whose_stored_hash_is_the_expected_one() -> None:
    sink = QdrantSink(QdrantClient(":memory:"), upsert_batch=2)
    two_targets(sink, "docs__1")
    records = [Record(str(i), f"text {i}") for i in range(5)]
    vectors = np.arange(15, dtype=np.float32).reshape(5, 3) + 1
    sink.write("docs__1", Rows(records, vectors, [f"h{i}" for i in range(5)], "f" * 16))
    expected = {"0": "h0", "1": "stale", "2": "h2", "3": "h3", "missing": "h9"}
    found = sink.fetch_matching("docs__1", expected)
    assert sorted(found) == ["0", "2", "3"]
    stored = sink.fetch("docs__1", ["0", "2", "3"])
    for doc_id, vector in found.items():
        np.testing.assert_array_equal(vector, stored[doc_id])
    assert sink.fetch_matching("docs__1", {}) == {}


def race_two_moves(client: QdrantClient, expected: str, targets: tuple[str, str]) -> dict[str, str]:
    """Two threads, two sinks on one client, released together; each outcome is 'moved' or 'refused'."""
    barrier = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def move(target: str) -> None:
        barrier.wait()
        try:
            QdrantSink(client).move_alias("docs", target, expected=expected, meta={})
            outcomes[target] = "moved"
        except CutoverRefused:
            outcomes[target] = "refused"

    threads = [threading.Thread(target=move, args=(t,)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_concurrent_moves_with_the_same_expected_let_exactly_one_through(tmp_path: Path) -> None:
    for round_ in range(20):  # on disk: saving the aliases releases the GIL mid-move
        client = QdrantClient(path=str(tmp_path / str(round_)))
        sink = QdrantSink(client)
        two_targets(sink, "docs__a", "docs__b", "docs__c")
        sink.move_alias("docs", "docs__a", expected=None, meta={})
        outcomes = race_two_moves(client, "docs__a", ("docs__b", "docs__c"))
        assert sorted(outcomes.values()) == ["moved", "refused"], round_
        winner = next(t for t, outcome in outcomes.items() if outcome == "moved")
        assert sink.alias("docs").target == winner
        assert guards(client) == {f"docs{GUARD_MARK}{winner}": winner}
        client.close()


def test_a_move_with_a_stale_expected_is_refused_and_leaves_the_alias_untouched() -> None:
    client = QdrantClient(":memory:")
    sink = QdrantSink(client)
    two_targets(sink, "docs__a", "docs__b", "docs__c")
    sink.move_alias("docs", "docs__a", expected=None, meta={})
    assert sink.move_alias("docs", "docs__b", expected="docs__a", meta={}) == "docs__a"
    before = client.get_aliases().aliases
    with pytest.raises(CutoverRefused, match="points to 'docs__b', expected 'docs__a'"):
        sink.move_alias("docs", "docs__c", expected="docs__a", meta={})
    with pytest.raises(CutoverRefused, match="expected None"):
        sink.move_alias("docs", "docs__c", expected=None, meta={})
    assert client.get_aliases().aliases == before
    assert sink.alias("docs").target == "docs__b"


class _NoLocalLock(QdrantSink):
    """The server path: no process lock, only the guard inside the one request decides."""

    def _move_lock(self) -> AbstractContextManager[Any]:
        return nullcontext()


class _RacedClient(QdrantClient):
    """Runs `race` once, just before the next request that carries a rename (the compare-and-swap)."""

    race: Callable[[], object] | None = None

    def update_collection_aliases(  # type: ignore[override]  # the hook passes every argument on
        self, change_aliases_operations: Any, **kwargs: Any
    ) -> bool:
        race, self.race = self.race, None
        if race is not None and any(
            isinstance(o, models.RenameAliasOperation) for o in change_aliases_operations
        ):
            race()
        return super().update_collection_aliases(change_aliases_operations, **kwargs)


def test_the_guard_refuses_a_mover_whose_check_passed_before_another_moved_the_alias() -> None:
    client = _RacedClient(":memory:")
    sink = _NoLocalLock(client)
    two_targets(sink, "docs__a", "docs__b", "docs__c")
    sink.move_alias("docs", "docs__a", expected=None, meta={})
    client.race = lambda: QdrantSink(client).move_alias("docs", "docs__c", expected="docs__a", meta={})
    with pytest.raises(CutoverRefused, match="points to 'docs__c', expected 'docs__a'"):
        sink.move_alias("docs", "docs__b", expected="docs__a", meta={})
    assert sink.alias("docs").target == "docs__c"
    assert guards(client) == {f"docs{GUARD_MARK}docs__c": "docs__c"}


def test_an_alias_made_by_hand_is_adopted_only_while_it_points_at_expected() -> None:
    client = QdrantClient(":memory:")
    sink = QdrantSink(client)
    two_targets(sink, "docs__a", "docs__b")
    client.update_collection_aliases(change_aliases_operations=[_create("docs", "docs__a")])
    with pytest.raises(CutoverRefused, match="points to 'docs__a', expected 'docs__b'"):
        sink.move_alias("docs", "docs__a", expected="docs__b", meta={})
    assert guards(client) == {}
    assert _NoLocalLock(client).move_alias("docs", "docs__b", expected="docs__a", meta={}) == "docs__a"
    assert guards(client) == {f"docs{GUARD_MARK}docs__b": "docs__b"}


def test_guard_aliases_are_never_served_aliases_targets_or_readers() -> None:
    client = QdrantClient(":memory:")
    sink = QdrantSink(client)
    two_targets(sink, "docs__a", "docs__b")
    sink.move_alias("docs", "docs__a", expected=None, meta={})
    sink.move_alias("docs", "docs__b", expected="docs__a", meta={})
    leftover = f"docs{GUARD_MARK}docs__a"  # e.g. a mover that died between its two requests
    client.update_collection_aliases(change_aliases_operations=[_create(leftover, "docs__a")])
    assert sink.targets("docs") == ["docs__a", "docs__b"]
    sink.drop("docs__a")  # only a guard points at it: nobody reads it
    assert sink.targets("docs") == ["docs__b"]
    with pytest.raises(CutoverRefused) as refused:
        sink.drop("docs__b")
    assert refused.value.message == "collection 'docs__b' is served by alias 'docs'"
    sink.move_alias("docs", "docs__b", expected="docs__b", meta={})
    assert guards(client) == {f"docs{GUARD_MARK}docs__b": "docs__b"}


def _create(alias: str, collection: str) -> models.CreateAliasOperation:
    return models.CreateAliasOperation(
        create_alias=models.CreateAlias(collection_name=collection, alias_name=alias)
    )


class _EchoingServer(http.server.BaseHTTPRequestHandler):
    """A broken server whose error message repeats the api key it was sent."""

    def do_GET(self) -> None:
        body = json.dumps({"status": {"error": f"bad key {self.headers.get('api-key')}"}, "time": 0}).encode()
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.filterwarnings("ignore:Api key is used with an insecure connection")
def test_an_api_key_echoed_by_the_server_never_reaches_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EchoingServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("QDRANT_TEST_KEY", "sekrit-4f1d")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(ConfigError, match=re.escape("[redacted]")) as refused:
            QdrantSink.from_config(
                QdrantSink.Config(kind="qdrant", url=url, alias="docs", api_key_env="QDRANT_TEST_KEY")
            )
    finally:
        server.shutdown()
        server.server_close()
    printed = "".join(traceback.format_exception(refused.value))
    assert "bad key" in printed and "sekrit-4f1d" not in printed


def test_guarded_writes_and_deletes_touch_only_points_still_as_expected() -> None:
    """After a flip the tool's catch-up writes a point only while it is what the settled target held: the
    application's rewrite (its upsert drops the tool's keys) or delete since then stands."""
    client = QdrantClient(":memory:")
    sink = QdrantSink(client)
    client.create_collection("t", models.VectorParams(size=4, distance=models.Distance.COSINE))
    records = [Record(f"d{i}", f"text {i}") for i in range(5)]
    hashes = [content_hash(r.text) for r in records]
    sink.write("t", Rows(records, np.ones((5, 4), dtype=np.float32), hashes, "fp"))
    client.upsert("t", [models.PointStruct(id=point_id("d1"), vector=[0, 1, 0, 0], payload={"app": 1})])
    client.delete("t", models.PointIdsList(points=[point_id("d2")]))
    client.upsert("t", [models.PointStruct(id=point_id("d4"), vector=[0, 0, 1, 0], payload={"app": 4})])

    def stored() -> dict[str, Any]:
        points, _ = client.scroll("t", limit=10, with_payload=True)
        return {
            (p.payload or {}).get("reindex_id", f"app{(p.payload or {}).get('app')}"): p.payload
            for p in points
        }

    again = [Record(f"d{i}", f"text {i} again") for i in range(5)]
    rows = Rows(again, np.full((5, 4), 2.0, dtype=np.float32), [content_hash(r.text) for r in again], "fp")
    # d0 as settled: updated; d1 rewritten and d2 deleted since: left alone; d3 and d4 expected absent:
    # d3 is there (not inserted over), d4 is the application's (not inserted over either)
    sink.write_guarded("t", rows, {"d0": hashes[0], "d1": hashes[1], "d2": hashes[2], "d3": None, "d4": None})
    now = stored()
    assert now["d0"]["reindex_content_hash"] == content_hash("text 0 again")
    assert now["d3"]["reindex_content_hash"] == hashes[3]
    assert "d2" not in now and now["app1"] == {"app": 1} and now["app4"] == {"app": 4}
    sink.write_guarded("t", Rows(again[2:3], rows.vectors[2:3], rows.content_hashes[2:3], "fp"), {"d2": None})
    assert stored()["d2"]["reindex_content_hash"] == content_hash("text 2 again")  # absent, so inserted

    sink.delete_guarded("t", {"d0": hashes[0], "d1": hashes[1], "d3": hashes[3]})  # d0 changed, d1 the app's
    assert sorted(stored()) == ["app1", "app4", "d0", "d2"]
