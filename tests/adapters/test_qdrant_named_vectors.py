"""A Qdrant collection with several named vectors (a dense one re-embedded, a sparse BM25-style one and a
second dense one carried), migrated behind an alias in local mode with the config `reindex init` writes."""

from __future__ import annotations

import json
import pickle
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from qdrant_client import QdrantClient, models
from typer.testing import CliRunner

from reindex.errors import ConfigError, validate
from reindex.fingerprint import content_hash
from reindex.ports import Rows, TargetSpec
from reindex.prove.verify import coverage
from reindex.run.migration import refuse_uncarried
from reindex.survey import Overrides
from reindex.ui.cli import app
from reindex_adapters.qdrant.carried import PointPayload
from reindex_adapters.qdrant.layout import Hnsw, NoQuantization, ScalarQuantization, TargetOptions
from reindex_adapters.qdrant.sink import QdrantSink
from reindex_adapters.qdrant.source import QdrantSource
from reindex_adapters.qdrant.survey import survey
from reindex_adapters.testing.memory import HashEmbedder, MemorySink

runner = CliRunner()
POINTS = 30


def invoke(*args: str, exit_code: int = 0) -> dict[str, Any]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == exit_code, result.stdout + result.stderr
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


@contextmanager
def client_of(storage: Path) -> Iterator[QdrantClient]:
    """The application's own client, closed before reindex opens one (local storage takes one at a time)."""
    client = QdrantClient(path=str(storage))
    try:
        yield client
    finally:
        client.close()


def uid(n: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"doc-{n}"))


def sparse(n: int) -> models.SparseVector:
    return models.SparseVector(indices=[n % 11, 20 + n % 5, 40 + n], values=[0.5 + n, 1.25, 2.0 / (n + 1)])


def hybrid_collection(storage: Path) -> None:
    """`docs` with a dense vector `dense` and a sparse vector `sparse` (IDF), read through `docs_live`."""
    with client_of(storage) as client:
        client.create_collection(
            "docs",
            vectors_config={"dense": models.VectorParams(size=8, distance=models.Distance.COSINE)},
            sparse_vectors_config={"sparse": models.SparseVectorParams(modifier=models.Modifier.IDF)},
        )
        client.upsert(
            "docs",
            [
                models.PointStruct(
                    id=uid(n),
                    vector={
                        "dense": [1.0, float(n), 0.5, 0.0, 1.0, 2.0, 3.0, float(n % 3)],
                        "sparse": sparse(n),
                    },
                    payload={"page_content": f"document {n} about topic {n % 4}", "metadata": {"n": n}},
                )
                for n in range(POINTS)
            ],
        )
        client.update_collection_aliases(
            change_aliases_operations=[
                models.CreateAliasOperation(
                    create_alias=models.CreateAlias(collection_name="docs", alias_name="docs_live")
                )
            ]
        )


def points(client: QdrantClient, collection: str) -> dict[str, Any]:
    found, _ = client.scroll(collection, limit=1000, with_payload=True, with_vectors=True)
    return {str(p.id): p for p in found}


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_hybrid_collection_keeps_its_sparse_vectors_through_init_run_verify_sync_and_cutover(
    in_tmp: Path, tiny_model: Path
) -> None:
    """The bug: plan, run, verify and cutover all passed while every sparse vector was left behind."""
    storage = in_tmp / "store"
    hybrid_collection(storage)
    written = runner.invoke(
        app,
        [
            "init",
            "docs.toml",
            "--collection",
            "docs_live",
            "--source-path",
            "store",
            "--model",
            str(tiny_model),
        ],
    )
    assert written.exit_code == 0, written.stdout + written.stderr
    assert (
        "carried to the target unchanged" in written.stdout
        and "'sparse' (sparse, modifier idf)" in written.stdout
    )
    planned = invoke("plan", "-c", "docs.toml", "--no-calibrate")
    assert planned["documents"] == POINTS and set(planned["target_layout"]["carried"]) == {"sparse"}
    target = planned["target"]
    assert invoke("run", "-c", "docs.toml")["written"] == POINTS
    assert invoke("verify", "-c", "docs.toml")["complete"]

    with client_of(
        storage
    ) as client:  # the application edits sparse vectors only; one is damaged in the target
        client.update_vectors("docs", [models.PointVectors(id=uid(3), vector={"sparse": sparse(99)})])
        client.delete_vectors("docs", vectors=["sparse"], points=[uid(4)])
        client.update_vectors(target, [models.PointVectors(id=uid(5), vector={"sparse": sparse(98)})])
    report = invoke("verify", "-c", "docs.toml", exit_code=3)
    assert report["carried"] == 3 and report["carried_vectors"] == {"sparse": 3} and report["stale"] == 0
    assert sorted(report["examples"]["carried"]) == sorted([uid(3), uid(4), uid(5)])
    shown = runner.invoke(app, ["verify", "-c", "docs.toml"])
    assert "3 documents whose carried vector 'sparse' is missing or differs" in shown.stdout + shown.stderr
    synced = invoke("sync", "-c", "docs.toml")
    assert synced["carried"] == 3 and synced["added"] == synced["changed"] == synced["deleted"] == 0
    assert invoke("verify", "-c", "docs.toml")["complete"]
    assert invoke("cutover", "-c", "docs.toml")["changed"]

    with client_of(storage) as client:
        old, served = points(client, "docs"), points(client, "docs_live")
        assert set(served) == set(old)
        for point_id, before in old.items():
            after = served[point_id]
            assert after.vector.get("sparse") == before.vector.get("sparse"), point_id
            kept = {k: v for k, v in (after.payload or {}).items() if not k.startswith("reindex_")}
            assert kept == before.payload
        assert "sparse" not in served[uid(4)].vector and served[uid(3)].vector["sparse"] == sparse(99)
        params = client.get_collection("docs_live").config.params
        assert params.sparse_vectors is not None
        assert params.sparse_vectors["sparse"].modifier == models.Modifier.IDF


# the adapter alone: several dense vectors, settings, refusals (in memory, the hash embedder, no ledger) ----


def three_vectors(client: QdrantClient) -> None:
    """`body` (re-embedded), `title` (dense cosine, on disk) and `sparse`."""
    client.create_collection(
        "kb",
        vectors_config={
            "body": models.VectorParams(size=8, distance=models.Distance.COSINE),
            "title": models.VectorParams(size=4, distance=models.Distance.COSINE, on_disk=True),
        },
        sparse_vectors_config={"sparse": models.SparseVectorParams(modifier=models.Modifier.IDF)},
    )
    client.upsert(
        "kb",
        [
            models.PointStruct(
                id=n,
                vector={
                    "body": [1.0, n, 0, 2, 0, 1, 3, n % 2],
                    "title": [0.3, n, 1.7, -n / 3],
                    "sparse": sparse(n),
                },
                payload={"page_content": f"entry {n} on {n % 3}", "n": n},
            )
            for n in range(1, 25)
        ],
    )


def migrate(client: QdrantClient, sink: QdrantSink) -> TargetSpec:
    """What a run does, without the ledger: scan, embed, write (test_qdrant.migrate, less the alias)."""
    source = QdrantSource(client, collection="kb", vector_name="body")
    embedder = HashEmbedder(dim=6)
    info = embedder.info
    spec = TargetSpec("kb__new", "kb_live", 6, info.fingerprint, info.describe(), source.schema())
    sink.prepare(spec)
    records = list(source.scan())
    vectors = embedder.embed(embedder.tokenize([r.text for r in records]))
    sink.write(spec.name, Rows(records, vectors, [content_hash(r.text) for r in records], info.fingerprint))
    return spec


def test_carried_cosine_vectors_pass_verify_through_renormalisation_and_a_real_change_is_named() -> None:
    client = QdrantClient(":memory:")
    three_vectors(client)
    options = TargetOptions(on_disk=True, hnsw=Hnsw(m=32), quantization=NoQuantization(type="none"))
    sink = QdrantSink(client, options=options)
    spec = migrate(client, sink)

    params = client.get_collection(spec.name).config.params
    assert isinstance(params.vectors, dict) and params.sparse_vectors is not None
    new, title = params.vectors["body"], params.vectors["title"]
    assert (new.size, new.on_disk, new.quantization_config) == (6, True, None)
    assert new.hnsw_config is not None and new.hnsw_config.m == 32
    assert (title.size, title.on_disk) == (4, True)  # the carried vector's own params
    assert params.sparse_vectors["sparse"].modifier == models.Modifier.IDF

    source = QdrantSource(client, collection="kb", vector_name="body")
    before = {r.id: dict(r.carried or {}) for r in source.scan()}
    after = {e.id: dict(e.carried or {}) for e in sink.scan_index(spec.name, 6)}
    assert any(before[i]["title"] != after[i]["title"] for i in before)  # Qdrant renormalised them
    assert all(before[i]["sparse"] == after[i]["sparse"] for i in before)
    report = coverage(source, sink, spec.name, dim=6, fingerprint=spec.fingerprint)
    assert report.complete and report.carried == 0

    client.update_vectors(spec.name, [models.PointVectors(id=7, vector={"title": [0.0, 0.0, 1.0, 0.0]})])
    client.delete_vectors(spec.name, vectors=["sparse"], points=[8])
    report = coverage(source, sink, spec.name, dim=6, fingerprint=spec.fingerprint)
    assert not report.complete and report.carried == 2
    assert report.carried_vectors == {"sparse": 1, "title": 1} and report.examples["carried"] == ["7", "8"]
    assert "1 documents whose carried vector 'title' is missing or differs" in report.problems()


def test_source_settings_are_copied_unless_the_target_sets_its_own_and_plan_states_them() -> None:
    """Local mode keeps no collection-wide quantization: the source's is given here as a server reports it."""
    client = QdrantClient(":memory:")
    three_vectors(client)
    wide = {"scalar": {"type": "int8", "quantile": 0.95}}
    source = QdrantSource(client, collection="kb", vector_name="body").schema()
    layout = {**source.layout, "collection": {**source.layout["collection"], "quantization_config": wide}}
    spec = TargetSpec("kb__new", "kb_live", 6, "f" * 16, {}, replace(source, layout=layout))

    copied = QdrantSink(client).layout(spec)
    assert copied["set_in_target"] == {} and copied["collection"]["quantization_config"] == wide
    assert {"hnsw_config", "quantization_config"} <= set(copied["copied_from_source"])
    assert copied["vector"] == {"size": 6, "distance": "Cosine"} and copied["local_mode"]
    assert set(copied["carried"]) == {"sparse", "title"} and copied["carried"]["title"]["on_disk"]
    assert any("brute force" in line for line in copied["summary"])  # local mode says what it ignores

    scalar = TargetOptions(quantization=ScalarQuantization(type="scalar", quantile=0.99, always_ram=True))
    stated = QdrantSink(client, options=scalar).layout(spec)
    assert stated["set_in_target"] == {
        "quantization": {"type": "scalar", "quantile": 0.99, "always_ram": True}
    }
    assert "set in [target]: quantization scalar (quantile 0.99, always_ram true)" in stated["summary"]
    assert stated["vector"]["quantization_config"] == {
        "scalar": {"type": "int8", "quantile": 0.99, "always_ram": True}
    }
    assert stated["collection"]["quantization_config"] == wide  # still the carried vectors'

    off = QdrantSink(client, options=TargetOptions(quantization=NoQuantization(type="none"))).layout(spec)
    assert "quantization_config" not in off["collection"] and "quantization_config" not in off["vector"]
    assert off["carried"]["title"]["quantization_config"] == wide  # moved onto the carried dense vector


def test_a_resume_with_other_settings_or_a_target_without_the_carried_vectors_is_refused() -> None:
    client = QdrantClient(":memory:")
    three_vectors(client)
    spec = migrate(client, QdrantSink(client, options=TargetOptions(on_disk=True)))
    with pytest.raises(ConfigError) as refused:
        QdrantSink(client, options=TargetOptions(on_disk=False)).prepare(spec)
    assert refused.value.exit_code == 2 and "on_disk true" in refused.value.message
    assert "reindex run --fresh" in (refused.value.hint or "")
    QdrantSink(client, options=TargetOptions(on_disk=True)).prepare(spec)  # the same settings: resumed

    old = replace(spec, name="kb__old", source=replace(spec.source, layout={}))
    QdrantSink(client).prepare(old)  # built as before vectors were carried
    with pytest.raises(ConfigError, match="lacks the vectors 'sparse', 'title'"):
        QdrantSink(client).prepare(replace(spec, name="kb__old"))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"quantization": {"type": "scalar", "quantile": 1.5}}, "quantization.scalar.quantile"),
        ({"quantization": {"type": "int4"}}, "quantization"),
        ({"quantization": {"type": "product", "compression": "x3"}}, "compression"),
        ({"hnsw": {"m": 16, "ef_construct": 2}}, "hnsw.ef_construct"),
        ({"hnsw": {"mm": 16}}, "unknown key 'hnsw.mm'"),
        ({"shard_number": 0}, "shard_number"),
    ],
)
def test_bad_target_settings_are_one_line_config_errors(settings: dict[str, Any], message: str) -> None:
    section = {"kind": "qdrant", "path": ":memory:", "alias": "kb_live", **settings}
    with pytest.raises(ConfigError) as refused:
        validate("target", QdrantSink.Config, section)
    assert refused.value.exit_code == 2 and message in refused.value.message
    assert "\n" not in refused.value.message


def test_a_point_payload_keeps_its_carried_vectors_through_pickling() -> None:
    payload = PointPayload({"page_content": "x"}, {"sparse": sparse(1)})
    copied = pickle.loads(pickle.dumps(payload))
    assert copied == {"page_content": "x"} and copied.vectors == {"sparse": sparse(1)}


def test_a_target_that_cannot_carry_the_other_vectors_is_refused_unless_they_are_left_behind() -> None:
    client = QdrantClient(":memory:")
    three_vectors(client)
    carrying = QdrantSource(client, collection="kb", vector_name="body").schema()
    with pytest.raises(ConfigError, match="'sparse', 'title' beside the vector") as refused:
        refuse_uncarried(carrying, MemorySink())
    assert "carry_vectors = false" in (refused.value.hint or "")
    left = QdrantSource(client, collection="kb", vector_name="body", carry_vectors=False)
    refuse_uncarried(left.schema(), MemorySink())
    assert next(iter(left.scan())).carried is None


def test_init_among_several_dense_vectors_writes_its_choice_with_a_comment_and_names_the_carried(
    tmp_path: Path,
) -> None:
    with client_of(tmp_path / "kb") as client:
        three_vectors(client)
    found = survey({"kind": "qdrant", "path": str(tmp_path / "kb"), "collection": "kb"}, Overrides())
    assert (found.vector.field, found.vector.others) == ("body", ("title",))
    assert "nothing tells which one the new model replaces" in found.vector.reason
    assert any("'sparse' (sparse, modifier idf), 'title' (dense 4 cosine, on_disk)" in n for n in found.notes)
    given = survey(
        {"kind": "qdrant", "path": str(tmp_path / "kb"), "collection": "kb"}, Overrides(vector_field="title")
    )
    assert given.vector.field == "title" and any("'body' (dense 8 cosine)" in n for n in given.notes)
