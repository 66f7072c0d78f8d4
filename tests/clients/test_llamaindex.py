"""LlamaIndex applications reading through the alias before and after cutover, with the model they use on
each side of the flip: a `QdrantVectorStore` (llama-index-vector-stores-qdrant) over Qdrant local mode
behind a collection alias, and a `PGVectorStore` (llama-index-vector-stores-postgres) whose `data_<name>`
table the first cutover adopts, so the application keeps reading it by name, now a view. The Qdrant source
reads the text inside LlamaIndex's `_node_content` JSON payload (`text_field = "_node_content.text"`)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
import sqlalchemy
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import TextNode
from llama_index.core.vector_stores.types import BasePydanticVectorStore
from llama_index.vector_stores.postgres import PGVectorStore
from llama_index.vector_stores.qdrant import QdrantVectorStore
from pydantic import PrivateAttr
from qdrant_client import QdrantClient
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from typer.testing import CliRunner

from adapters.memory import HashEmbedder
from reindex.cli import app
from tests.clients.support import aliased_collection

runner = CliRunner()
OLD_DIM, NEW_DIM = 16, 24
ALIAS = "notes_live"  # Qdrant puts no alias over a collection: the application reads notes_live -> notes


class Hashed(BaseEmbedding):
    """The application's model: the tool's hash embedder, so a fresh migration's vectors are known."""

    _model: HashEmbedder = PrivateAttr()

    def __init__(self, dim: int) -> None:
        super().__init__(model_name=f"hash-{dim}")
        self._model = HashEmbedder(dim=dim)

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
    """The note the application's retriever ranks first for `query`, embedded with its model."""
    index = VectorStoreIndex.from_vector_store(store, embed_model=Hashed(dim))
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
        f'[target]\nkind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "data_notes"\n\n'
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
    with pytest.raises(Exception, match="different vector dimensions 16 and 24"):  # the old model after it
        top(pg_store(engines, OLD_DIM), OLD_DIM, "note 7 about topic 0")
    report = invoke("verify", "-c", str(config), "--sample", "40")
    assert report["complete"] and report["target_vectors"] == 120 and report["stale"] == 0
