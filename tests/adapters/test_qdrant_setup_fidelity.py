"""A Qdrant target is set up like the collection it replaces: the application's payload indexes with their
parameters, the re-embedded vector's memory placement and datatype, the collection's metadata, strict mode,
optimizer, WAL and payload storage settings; what it cannot keep is named by `plan` and refused (exit 2)
unless `[target] accept` names it; every distance of a carried vector is carried.

Local mode keeps the vectors' params and the metadata but neither payload indexes nor the collection-wide
settings (it reports its defaults), so those are given here as a server reports them, and the test reads
what the tool sends: the create request and the index requests, through the real client, recorded.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from qdrant_client import QdrantClient, models
from typer.testing import CliRunner

from reindex.errors import ConfigError
from reindex.ports import TargetSpec
from reindex.ui.cli import app
from reindex_adapters.qdrant.sink import QdrantSink
from reindex_adapters.qdrant.source import QdrantSource

runner = CliRunner()


class Recorded(QdrantClient):
    """The real local client, keeping what it was asked to create (what a server would be sent)."""

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.created: dict[str, dict[str, Any]] = {}
        self.indexed: dict[str, dict[str, Any]] = {}

    def create_collection(self, collection_name: str, *args: Any, **kwargs: Any) -> bool:
        self.created[collection_name] = kwargs
        return super().create_collection(collection_name, *args, **kwargs)

    def create_payload_index(self, collection_name: str, field_name: str, *args: Any, **kwargs: Any) -> Any:
        self.indexed.setdefault(collection_name, {})[field_name] = (
            args[0] if args else kwargs.get("field_schema")
        )
        return super().create_payload_index(collection_name, field_name, *args, **kwargs)


# what a server reports for an application's collection (local mode reports none of it)
SERVER_SIDE = {
    "payload_schema": {
        "page_content": {"data_type": "text", "params": {"type": "text", "tokenizer": "word", "lowercase": True,
                                                         "min_token_len": 2, "stopwords": "english"}},
        "tenant": {"data_type": "keyword", "params": {"type": "keyword", "is_tenant": True, "on_disk": True}},
        "metadata.doc_id": {"data_type": "keyword"},
        "created": {"data_type": "datetime", "params": {"type": "datetime", "is_principal": True}},
    },
    "collection": {
        "strict_mode_config": {"enabled": True, "max_query_limit": 100, "unindexed_filtering_retrieve": False},
        "optimizer_config": {"deleted_threshold": 0.1, "vacuum_min_vector_number": 500, "default_segment_number": 4,
                             "indexing_threshold": 5000, "flush_interval_sec": 10},
        "wal_config": {"wal_capacity_mb": 64, "wal_segments_ahead": 1},
        "payload": {"memory": "cold"},
    },
}  # fmt: skip


def application(client: QdrantClient, **vector: Any) -> None:
    """The application's collection: `body` (re-embedded), `grid` (Manhattan, carried), its metadata."""
    client.create_collection(
        "kb",
        vectors_config={
            "body": models.VectorParams(size=8, distance=models.Distance.COSINE, **vector),
            "grid": models.VectorParams(size=3, distance=models.Distance.MANHATTAN),
        },
        metadata={"owner": "search-team", "schema": 3},
    )
    client.upsert(
        "kb",
        [
            models.PointStruct(
                id=n,
                vector={"body": [1.0, n, 0, 2, 0, 1, 3, n % 2], "grid": [n, -1.0, 2.5]},
                payload={"page_content": f"entry {n}", "tenant": f"t{n % 2}"},
            )
            for n in range(1, 9)
        ],
    )


def spec_of(client: QdrantClient, server_side: dict[str, Any] | None = None) -> TargetSpec:
    source = QdrantSource(client, collection="kb", vector_name="body").schema()
    layout = dict(source.layout)
    if server_side is not None:
        layout["payload_schema"] = server_side["payload_schema"]
        layout["collection"] = {**layout["collection"], **server_side["collection"]}
    return TargetSpec("kb__new", "kb_live", 6, "f" * 16, {}, replace(source, layout=layout))


def test_the_new_collection_gets_the_payload_indexes_and_settings_a_server_reports() -> None:
    client = Recorded(":memory:")
    application(client, memory=models.Memory.COLD, datatype=models.Datatype.FLOAT16)
    spec = spec_of(client, SERVER_SIDE)
    sink = QdrantSink(client)

    planned = sink.layout(spec)
    assert set(planned["payload_indexes"]) == set(SERVER_SIDE["payload_schema"])
    assert any("payload indexes: created, metadata.doc_id" in line for line in planned["summary"])
    sink.prepare(spec)

    sent = client.created["kb__new"]
    body = sent["vectors_config"]["body"]
    assert (body.size, body.memory, body.datatype) == (6, models.Memory.COLD, models.Datatype.FLOAT16)
    assert sent["vectors_config"]["grid"].distance == models.Distance.MANHATTAN  # carried unchanged
    assert sent["strict_mode_config"] == models.StrictModeConfig(
        enabled=True, max_query_limit=100, unindexed_filtering_retrieve=False
    )
    assert sent["optimizers_config"].indexing_threshold == 5000
    assert sent["optimizers_config"].default_segment_number == 4
    assert sent["wal_config"] == models.WalConfigDiff(wal_capacity_mb=64, wal_segments_ahead=1)
    assert sent["payload"] == models.PayloadStorageParams(memory=models.Memory.COLD)
    metadata = client.get_collection("kb__new").config.metadata or {}
    assert (metadata["owner"], metadata["schema"]) == ("search-team", 3) and "reindex" in metadata

    indexed = client.indexed["kb__new"]  # created before the first point, as Qdrant advises for tenants
    assert indexed["tenant"] == models.KeywordIndexParams(type="keyword", is_tenant=True, on_disk=True)
    assert indexed["page_content"] == models.TextIndexParams(
        type="text", tokenizer=models.TokenizerType.WORD, lowercase=True, min_token_len=2, stopwords="english"
    )
    assert indexed["metadata.doc_id"] == models.PayloadSchemaType.KEYWORD
    assert indexed["created"] == models.DatetimeIndexParams(type="datetime", is_principal=True)
    assert client.count("kb__new").count == 0


def test_what_the_new_collection_cannot_keep_is_named_and_refused_unless_accepted() -> None:
    client = Recorded(":memory:")
    application(client, datatype=models.Datatype.UINT8)
    server_side = {**SERVER_SIDE, "collection": {**SERVER_SIDE["collection"], "sharding_method": "custom"}}
    spec = spec_of(client, server_side)

    found = {loss.key: loss for loss in QdrantSink(client).losses(spec)}
    assert set(found) == {"vector_datatype", "shard_keys"}
    assert not any(loss.accepted for loss in found.values())
    assert "uint8" in found["vector_datatype"].what and found["vector_datatype"].objects == ("body",)
    with pytest.raises(ConfigError) as refused:
        QdrantSink(client).prepare(spec)
    assert refused.value.exit_code == 2 and 'accept = ["shard_keys", "vector_datatype"]' in (
        refused.value.hint or ""
    )
    assert "kb__new" not in client.created  # refused before anything is created

    accepting = QdrantSink.Config(
        kind="qdrant", path=":memory:", alias="kb_live", accept=["vector_datatype", "shard_keys"]
    )
    sink = QdrantSink(client, options=replace_options(accepting))
    sink.prepare(spec)
    assert (
        client.created["kb__new"]["vectors_config"]["body"].datatype is None
    )  # float32: what the model gives


def replace_options(config: QdrantSink.Config) -> Any:
    from reindex_adapters.qdrant.layout import TargetOptions

    return TargetOptions.model_validate(config.model_dump(include=set(TargetOptions.model_fields)))


def test_a_carried_manhattan_vector_is_carried_and_a_re_embedded_one_is_refused_at_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = tmp_path / "qdrant"
    client = QdrantClient(path=str(storage))
    application(client)
    client.close()
    config = tmp_path / "grid.toml"
    section = f'path = "{storage}"'
    config.write_text(
        f'[source]\nkind = "qdrant"\n{section}\ncollection = "kb"\nvector_name = "body"\n'
        '[embedder]\nkind = "hash"\ndim = 6\n'
        f'[target]\nkind = "qdrant"\n{section}\nalias = "kb_live"\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\n'
    )
    planned = runner.invoke(app, ["plan", "-c", str(config), "--no-calibrate", "--json"])
    assert planned.exit_code == 0, planned.stdout + planned.stderr
    assert "grid" in json.loads(planned.stdout)["target_layout"]["carried"]
    ran = runner.invoke(app, ["run", "-c", str(config), "--json"])
    assert ran.exit_code == 0, ran.stdout + ran.stderr
    verified = runner.invoke(app, ["verify", "-c", str(config), "--json"])
    assert verified.exit_code == 0 and json.loads(verified.stdout)["complete"]

    config.write_text(config.read_text().replace('vector_name = "body"', 'vector_name = "grid"'))
    refused = runner.invoke(app, ["plan", "-c", str(config), "--no-calibrate", "--json"])
    assert refused.exit_code == 2
    assert "vector 'grid' of collection 'kb' uses distance Manhattan" in refused.stdout


def test_the_applications_text_query_works_through_the_alias_after_cutover_in_local_mode(
    tmp_path: Path,
) -> None:
    """Local mode keeps one kind of payload index, a text index with `scoring` (its BM25 text queries),
    and reports none: the tool reads it from the collection so the target has it too."""
    storage = tmp_path / "qdrant"

    def text_query() -> list[Any]:
        client = QdrantClient(path=str(storage))
        try:
            found = client.query_points("kb_live", query=models.TextQuery(text="entry"), using="page_content")
            return sorted(point.id for point in found.points)
        finally:
            client.close()

    client = QdrantClient(path=str(storage))
    application(client)
    client.create_payload_index(
        "kb",
        "page_content",
        models.TextIndexParams(type="text", tokenizer=models.TokenizerType.WORD, scoring=True),
    )
    client.update_collection_aliases(
        [
            models.CreateAliasOperation(
                create_alias=models.CreateAlias(collection_name="kb", alias_name="kb_live")
            )
        ]
    )
    client.close()
    before = text_query()
    assert before == list(range(1, 9))
    config = tmp_path / "kb.toml"
    config.write_text(
        f'[source]\nkind = "qdrant"\npath = "{storage}"\ncollection = "kb_live"\nvector_name = "body"\n'
        '[embedder]\nkind = "hash"\ndim = 6\n'
        f'[target]\nkind = "qdrant"\npath = "{storage}"\nalias = "kb_live"\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\n'
    )
    planned = runner.invoke(app, ["plan", "-c", str(config), "--no-calibrate", "--json"])
    assert planned.exit_code == 0, planned.stdout + planned.stderr
    assert set(json.loads(planned.stdout)["target_layout"]["payload_indexes"]) == {"page_content"}
    for verb in ("run", "cutover"):
        done = runner.invoke(app, [verb, "-c", str(config), "--json"])
        assert done.exit_code == 0, done.stdout + done.stderr
    assert text_query() == before  # through the alias, now on the new collection
