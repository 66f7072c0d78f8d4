"""LlamaIndex applications reading through the alias before and after cutover, with the model they use on
each side of the flip: a `QdrantVectorStore` (llama-index-vector-stores-qdrant) over Qdrant local mode
behind a collection alias, and a `PGVectorStore` (llama-index-vector-stores-postgres) whose `data_<name>`
table the first cutover adopts, so the application keeps reading it by name, now a view, and keeps adding
nodes through it: the target numbers them with an identity of its own (the table's BIGSERIAL belongs to the
adopted table, which prune drops). The Qdrant source
reads the text inside LlamaIndex's `_node_content` JSON payload (`text_field = "_node_content.text"`)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import BaseNode, MetadataMode, TextNode
from llama_index.core.vector_stores.types import BasePydanticVectorStore
from llama_index.vector_stores.postgres import PGVectorStore
from llama_index.vector_stores.qdrant import QdrantVectorStore
from pydantic import PrivateAttr
from qdrant_client import QdrantClient
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from typer.testing import CliRunner

from reindex import registry
from reindex.config import load
from reindex.ui.cli import app
from reindex_adapters.testing.memory import HashEmbedder
from tests.clients.support import accept_what_plan_names, aliased_collection

runner = CliRunner()
OLD_DIM, NEW_DIM = 16, 24
ALIAS = "notes_live"  # Qdrant puts no alias over a collection: the application reads notes_live -> notes


class Embedded(BaseEmbedding):
    """The application's model: one of the tool's embedders, so its vectors are the ones the tool writes."""

    _model: Any = PrivateAttr()

    def __init__(self, model: Any, name: str) -> None:
        super().__init__(model_name=name)
        self._model = model

    def _embed(self, texts: list[str]) -> list[list[float]]:
        return self._model.embed(self._model.tokenize(texts)).tolist()

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._embed([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._embed(texts)

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._embed([query])[0]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)


class Hashed(Embedded):
    """The tool's hash embedder, so a fresh migration's vectors are known."""

    def __init__(self, dim: int) -> None:
        super().__init__(HashEmbedder(dim=dim), f"hash-{dim}")


def invoke(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def uid(n: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"note-{n}"))


def nodes(ids: Sequence[int]) -> list[TextNode]:
    """The notes, embedded on their text alone (LlamaIndex prepends metadata unless told not to), as the
    tool embeds them."""
    return [
        TextNode(
            id_=uid(i),
            text=f"note {i} about topic {i % 7}",
            metadata={"n": i},
            excluded_embed_metadata_keys=["n"],
        )
        for i in ids
    ]


def build(store: BasePydanticVectorStore, dim: int, ids: Sequence[int]) -> None:
    """The application indexes its notes with its model."""
    context = StorageContext.from_defaults(vector_store=store)
    VectorStoreIndex(nodes(ids), storage_context=context, embed_model=Hashed(dim))


def top(store: BasePydanticVectorStore, dim: int, query: str) -> int:
    """The note the application's retriever ranks first for `query`, embedded with its hash model."""
    return top_with(store, Hashed(dim), query)


def top_with(store: BasePydanticVectorStore, model: BaseEmbedding, query: str) -> int:
    """The note the application's retriever ranks first for `query`, embedded with `model`."""
    index = VectorStoreIndex.from_vector_store(store, embed_model=model)
    (found, *_) = index.as_retriever(similarity_top_k=3).retrieve(query)
    assert found.node.get_content() == query  # the text comes back whole, read through the alias
    n = found.node.metadata["n"]
    assert isinstance(n, int)
    return n


# ---- Qdrant ----


@contextmanager
def qdrant_application(storage: Path) -> Iterator[tuple[QdrantVectorStore, QdrantClient]]:
    """The application's store over the alias, with its own client, closed before reindex opens one."""
    client = QdrantClient(path=str(storage))
    try:
        yield QdrantVectorStore(collection_name=ALIAS, client=client), client
    finally:
        client.close()


def test_llamaindex_qdrant_reads_through_the_alias_before_and_after_cutover(tmp_path: Path) -> None:
    storage = tmp_path / "qdrant"
    aliased_collection(storage, "notes", ALIAS, OLD_DIM)
    with qdrant_application(storage) as (old, _):
        build(old, OLD_DIM, range(120))
    config = tmp_path / "notes.toml"
    config.write_text(
        f'[source]\nkind = "qdrant"\npath = "{storage}"\ncollection = "{ALIAS}"\n'
        'text_field = "_node_content.text"\n\n'  # LlamaIndex keeps the text in a JSON string payload
        f'[embedder]\nkind = "hash"\ndim = {NEW_DIM}\n\n'
        f'[target]\nkind = "qdrant"\npath = "{storage}"\nalias = "{ALIAS}"\n\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 50\n'
    )
    assert invoke("run", "-c", str(config))["written"] == 120
    with qdrant_application(storage) as (old, client):  # before the flip: the old model, old collection
        assert top(old, OLD_DIM, "note 7 about topic 0") == 7
        assert top(old, OLD_DIM, "note 45 about topic 3") == 45
        assert len(client.query_points(ALIAS, query=[1.0] * OLD_DIM, limit=1).points) == 1
    assert invoke("cutover", "-c", str(config))["changed"]

    with qdrant_application(storage) as (new, client):  # the application switches its model with the alias
        assert top(new, NEW_DIM, "note 7 about topic 0") == 7
        assert top(new, NEW_DIM, "note 45 about topic 3") == 45
        assert top(new, NEW_DIM, "note 119 about topic 0") == 119
        assert client.count(ALIAS).count == 120
        # the old model no longer fits the alias (local mode says so in numpy's words: 24 != 16)
        with pytest.raises(Exception, match=r"\b24\b.*\b16\b"):
            top(new, OLD_DIM, "note 7 about topic 0")
    report = invoke("verify", "-c", str(config), "--sample", "40")
    assert report["complete"] and report["target_vectors"] == 120 and report["stale"] == 0


# ---- Postgres ----


@pytest.fixture
def engines(pg_dsn: str) -> Iterator[tuple[sqlalchemy.Engine, AsyncEngine]]:
    """The application's engines (PGVectorStore takes both), psycopg 3 over the fixture's unix socket."""
    url = pg_dsn.replace("postgresql://", "postgresql+psycopg://", 1)
    sync, async_ = sqlalchemy.create_engine(url), create_async_engine(url)
    yield sync, async_
    sync.dispose()
    async_.sync_engine.dispose()


def pg_store(engines: tuple[sqlalchemy.Engine, AsyncEngine], dim: int) -> PGVectorStore:
    engine, async_engine = engines
    return PGVectorStore(
        table_name="notes", embed_dim=dim, use_jsonb=True, engine=engine, async_engine=async_engine
    )  # reads and writes the table data_notes


def test_llamaindex_pgvector_reads_through_the_alias_before_and_after_cutover(
    tmp_path: Path, pg_dsn: str, engines: tuple[sqlalchemy.Engine, AsyncEngine]
) -> None:
    old = pg_store(engines, OLD_DIM)
    build(old, OLD_DIM, range(120))
    config = tmp_path / "notes.toml"
    config.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{pg_dsn}"\ntable = "data_notes"\n'
        'id_column = "id"\ntext_column = "text"\n\n'
        f'[embedder]\nkind = "hash"\ndim = {NEW_DIM}\n\n'
        f'[target]\nkind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "data_notes"\n'
        'accept = ["indexes", "table_statements", "column_order"]\n\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 50\n'
    )
    assert invoke("run", "-c", str(config))["written"] == 120
    assert top(old, OLD_DIM, "note 7 about topic 0") == 7  # before the flip: the old model, the table
    assert top(old, OLD_DIM, "note 45 about topic 3") == 45
    assert invoke("cutover", "-c", str(config))["changed"]
    with psycopg.connect(pg_dsn) as conn:
        kinds = conn.execute("SELECT relkind FROM pg_class WHERE relname = 'data_notes'").fetchall()
    assert kinds == [("v",)]  # data_notes is now the alias view over the new target

    new = pg_store(engines, NEW_DIM)  # the application switches its model with the alias
    assert top(new, NEW_DIM, "note 7 about topic 0") == 7
    assert top(new, NEW_DIM, "note 45 about topic 3") == 45
    assert top(new, NEW_DIM, "note 119 about topic 0") == 119
    with pytest.raises(Exception, match=r"different vector dimensions (16 and 24|24 and 16)"):
        top(pg_store(engines, OLD_DIM), OLD_DIM, "note 7 about topic 0")
    report = invoke("verify", "-c", str(config), "--sample", "40")
    assert report["complete"] and report["target_vectors"] == 120 and report["stale"] == 0


def add(store: PGVectorStore, model: BaseEmbedding, ids: Sequence[int]) -> None:
    """The application adds notes the way LlamaIndex's ingestion does: embedded, then `add()`ed."""
    added: list[BaseNode] = list(nodes(ids))
    for node in added:
        node.embedding = model.get_text_embedding(node.get_content(metadata_mode=MetadataMode.EMBED))
    assert store.add(added) == [uid(i) for i in ids]


def row_ids(pg_dsn: str, ids: Sequence[int]) -> list[int]:
    """The keys Postgres gave the application's notes (`data_notes.id`, a BIGSERIAL), in note order."""
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            "SELECT id FROM data_notes WHERE node_id = ANY(%s) ORDER BY (metadata_->>'n')::int",
            [[uid(i) for i in ids]],
        ).fetchall()
    assert len(rows) == len(ids)
    return [int(row[0]) for row in rows]


def test_llamaindex_pgvector_adds_through_the_alias_after_cutover_rollback_and_prune(
    tmp_path: Path,
    pg_dsn: str,
    engines: tuple[sqlalchemy.Engine, AsyncEngine],
    tiny_model: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    build(pg_store(engines, OLD_DIM), OLD_DIM, range(60))  # ids 1..60 from data_notes_id_seq
    monkeypatch.setenv("REINDEX_SOURCE_DSN", pg_dsn)
    monkeypatch.chdir(tmp_path)
    made = invoke(
        "init", "notes.toml", "--table", "data_notes", "--source-dsn-env", "REINDEX_SOURCE_DSN",
        "--model", str(tiny_model),
    )  # fmt: skip
    assert (made["source"]["id_column"], made["source"]["text_column"]) == ("id", "text")
    # the migration as init wrote it (the column mode: its indexes on metadata stay), with what plan names
    # accepted by name: one column more while in flight
    assert accept_what_plan_names(Path("notes.toml")) == ["extra_column"]
    config = load(Path("notes.toml"))
    invoke("plan", "-c", "notes.toml", "--no-calibrate")
    assert invoke("run", "-c", "notes.toml")["written"] == 60
    assert invoke("verify", "-c", "notes.toml")["complete"]
    target = invoke("cutover", "-c", "notes.toml")["target"]

    model = registry.build("embedder", config.embedder)  # the application switches its model
    new, dim = Embedded(model, "tiny"), model.info.dim
    add(pg_store(engines, dim), new, range(100, 105))  # INSERTs with no id: the table's own sequence
    assert top_with(pg_store(engines, dim), new, "note 103 about topic 5") == 103  # found at once
    assert min(row_ids(pg_dsn, range(100, 105))) > 60
    report = invoke("verify", "-c", "notes.toml")
    assert report["complete"] and report["target_vectors"] == 65 and report["stale"] == 0
    assert report["application_rows"] == 5

    back = invoke("rollback", "-c", "notes.toml")
    assert back["target"] == "data_notes__adopted"
    assert back["unserved"] == 5  # the notes added under the new model have no old vector: named, kept
    add(pg_store(engines, OLD_DIM), Hashed(OLD_DIM), range(200, 202))  # the old model again
    assert top(pg_store(engines, OLD_DIM), OLD_DIM, "note 201 about topic 5") == 201
    # the table stayed the table: its one sequence numbers every row, whichever model was served
    assert min(row_ids(pg_dsn, range(200, 202))) > max(row_ids(pg_dsn, range(100, 105)))

    assert invoke("cutover", "-c", "notes.toml", "--sync")["target"] == target
    add(pg_store(engines, dim), new, range(300, 302))
    assert min(row_ids(pg_dsn, range(300, 302))) > max(row_ids(pg_dsn, range(200, 202)))
    assert invoke("prune", "-c", "notes.toml", "--keep", "1")["dropped"] == ["data_notes__adopted"]
    with psycopg.connect(pg_dsn) as conn:  # prune dropped the old vectors' column, not the table's sequence
        assert conn.execute("SELECT to_regclass('data_notes_id_seq') IS NOT NULL").fetchone() == (True,)
    add(pg_store(engines, dim), new, range(400, 402))
    assert top_with(pg_store(engines, dim), new, "note 401 about topic 2") == 401
    assert min(row_ids(pg_dsn, range(400, 402))) > max(row_ids(pg_dsn, range(300, 302)))
    report = invoke("verify", "-c", "notes.toml")
    assert report["complete"] and report["stale"] == 0


def test_llamaindex_pgvector_reads_and_adds_through_an_alias_stored_as_halfvec(
    tmp_path: Path, pg_dsn: str, engines: tuple[sqlalchemy.Engine, AsyncEngine]
) -> None:
    """A 2,048-d model is wider than pgvector indexes `vector`, so the target stores halfvec by default;
    PGVectorStore(use_halfvec=True) reads and adds through the alias, and verify re-embeds what it added."""
    wide = 2048
    build(pg_store(engines, OLD_DIM), OLD_DIM, range(60))
    config = tmp_path / "notes.toml"
    config.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{pg_dsn}"\ntable = "data_notes"\n'
        'id_column = "id"\ntext_column = "text"\n\n'
        f'[embedder]\nkind = "hash"\ndim = {wide}\n\n'
        f'[target]\nkind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "data_notes"\n'
        'accept = ["indexes", "table_statements", "column_order"]\n\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\n'
    )
    assert invoke("plan", "-c", str(config), "--no-calibrate")["storage"]["type"] == "halfvec"
    assert invoke("run", "-c", str(config))["written"] == 60
    assert invoke("cutover", "-c", str(config))["changed"]
    engine, async_engine = engines
    store = PGVectorStore(
        table_name="notes",
        embed_dim=wide,
        use_jsonb=True,
        use_halfvec=True,
        engine=engine,
        async_engine=async_engine,
    )
    assert top(store, wide, "note 7 about topic 0") == 7
    add(store, Hashed(wide), range(100, 103))  # the application's writes, halfvec through the view
    assert top(store, wide, "note 101 about topic 3") == 101
    report = invoke("verify", "-c", str(config), "--sample", "20")
    assert report["complete"] and report["target_vectors"] == 63 and report["application_rows"] == 3
    assert report["application_check"]["checked"] == 3 and report["application_check"]["stale"] == 0


def test_llamaindex_hybrid_halfvec_store_keeps_its_generated_keyword_column_in_column_mode(
    tmp_path: Path, pg_dsn: str, engines: tuple[sqlalchemy.Engine, AsyncEngine]
) -> None:
    """PGVectorStore(hybrid_search=True) keeps a generated `text_search_tsv` beside the text. The column mode
    leaves the table the table: a node added after the cutover gets its tsvector, and keyword search finds it."""
    from llama_index.core.vector_stores.types import VectorStoreQuery, VectorStoreQueryMode

    engine, async_engine = engines

    def store(dim: int) -> PGVectorStore:
        return PGVectorStore(
            table_name="notes",
            embed_dim=dim,
            use_jsonb=True,
            use_halfvec=True,
            hybrid_search=True,
            text_search_config="english",
            engine=engine,
            async_engine=async_engine,
        )

    build(store(OLD_DIM), OLD_DIM, range(40))
    config = tmp_path / "notes.toml"
    config.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{pg_dsn}"\ntable = "data_notes"\n'
        'id_column = "id"\ntext_column = "text"\n\n'
        f'[embedder]\nkind = "hash"\ndim = {NEW_DIM}\n\n'
        f'[target]\nkind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "data_notes"\nmode = "column"\n'
        'storage = "halfvec"\naccept = ["extra_column", "column_order"]\n\n'  # text_search_tsv follows the vector
        f'[run]\nstate = "{tmp_path / "state.db"}"\n'
    )
    assert invoke("run", "-c", str(config))["written"] == 40
    assert invoke("cutover", "-c", str(config))["changed"]
    new = store(NEW_DIM)
    assert top(new, NEW_DIM, "note 7 about topic 0") == 7
    added: list[BaseNode] = [
        TextNode(id_=uid(900), text="a zeppelin over the harbour", metadata={"n": 900}, embedding=None)
    ]
    added[0].embedding = Hashed(NEW_DIM).get_text_embedding("a zeppelin over the harbour")
    new.add(added)
    with psycopg.connect(pg_dsn) as conn:
        generated = conn.execute(
            "SELECT text_search_tsv IS NOT NULL FROM data_notes WHERE node_id = %s", [uid(900)]
        ).fetchone()
    assert generated == (True,)
    query = VectorStoreQuery(query_str="zeppelin", mode=VectorStoreQueryMode.TEXT_SEARCH, similarity_top_k=3)
    found = new.query(query)
    assert [node.metadata["n"] for node in found.nodes or []] == [900]
    report = invoke("verify", "-c", str(config))
    assert report["complete"] and report["application_rows"] == 1


def word_buckets(texts: list[str]) -> tuple[list[list[int]], list[list[float]]]:
    """A sparse encoder small enough to write here (LlamaIndex's default one downloads a model): each
    word's count at its crc32 bucket."""
    import zlib
    from collections import Counter

    indices, values = [], []
    for text in texts:
        counts = Counter(zlib.crc32(word.encode()) % 50_000 for word in text.lower().split())
        indices.append(sorted(counts))
        values.append([float(counts[i]) for i in sorted(counts)])
    return indices, values


@contextmanager
def hybrid_application(
    storage: Path, collection: str = ALIAS
) -> Iterator[tuple[QdrantVectorStore, QdrantClient]]:
    """LlamaIndex's hybrid store (`enable_hybrid=True`: "text-dense" and "text-sparse-new" per point)."""
    client = QdrantClient(path=str(storage))
    try:
        yield (
            QdrantVectorStore(
                collection_name=collection,
                client=client,
                enable_hybrid=True,
                sparse_doc_fn=word_buckets,
                sparse_query_fn=word_buckets,
            ),
            client,
        )
    finally:
        client.close()


@pytest.mark.filterwarnings("ignore:Payload indexes have no effect in the local Qdrant")  # its doc_id index
def test_llamaindex_hybrid_qdrant_keeps_its_writes_across_cutover_rollback_and_roll_forward(
    tmp_path: Path,
) -> None:
    """Issue 41: a hybrid LlamaIndex store migrated with its sparse vectors carried; the application adds
    and deletes nodes through the alias while the new collection is live, and neither `rollback` nor the
    roll-forward after it loses them."""
    from qdrant_client import models

    storage = tmp_path / "qdrant"
    with hybrid_application(storage, "notes") as (created, client):
        build(created, OLD_DIM, range(60))
        client.update_collection_aliases(
            change_aliases_operations=[
                models.CreateAliasOperation(
                    create_alias=models.CreateAlias(collection_name="notes", alias_name=ALIAS)
                )
            ]
        )
    config = tmp_path / "notes.toml"
    config.write_text(
        f'[source]\nkind = "qdrant"\npath = "{storage}"\ncollection = "{ALIAS}"\n'
        'text_field = "_node_content.text"\nvector_name = "text-dense"\n\n'
        f'[embedder]\nkind = "hash"\ndim = {NEW_DIM}\n\n'
        f'[target]\nkind = "qdrant"\npath = "{storage}"\nalias = "{ALIAS}"\n\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 50\n'
    )
    assert invoke("run", "-c", str(config))["written"] == 60
    assert invoke("cutover", "-c", str(config))["changed"]
    with hybrid_application(storage) as (store, client):
        assert top(store, NEW_DIM, "note 7 about topic 0") == 7
        build(store, NEW_DIM, (200, 201))  # added through the alias, both vectors, with the new model
        store.delete_nodes([uid(9)])  # as LlamaIndex deletes a node
        assert not client.retrieve(ALIAS, [uid(9)])

    back = invoke("rollback", "-c", str(config))
    assert back["target"] == "notes" and back["unserved_ids"] == sorted([uid(200), uid(201)])
    with hybrid_application(storage) as (store, client):
        assert not client.retrieve(ALIAS, [uid(9)])
        assert top(store, OLD_DIM, "note 7 about topic 0") == 7
        (added,) = client.retrieve(ALIAS, [uid(201)], with_vectors=True)
        assert isinstance(added.vector, dict) and set(added.vector) == {"text-sparse-new"}

    assert invoke("cutover", "-c", str(config), "--sync")["changed"]
    with hybrid_application(storage) as (store, client):
        assert top(store, NEW_DIM, "note 201 about topic 5") == 201
        assert not client.retrieve(ALIAS, [uid(9)])
    report = invoke("verify", "-c", str(config), "--sample", "20")
    assert report["complete"] and report["target_vectors"] == 61
