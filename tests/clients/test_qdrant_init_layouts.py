"""The Qdrant layouts LangChain's and LlamaIndex's `QdrantVectorStore` create with their defaults, each migrated
with the config `reindex init` writes, as written: init → plan → run → verify → cutover. Then the unchanged
application, given only the new model, finds its documents through the alias, adds new ones and finds them
at once, and `verify` stays complete counting them (issue 31). The new model is the tiny test model, loaded
by the tool and by the application alike; the old one is the hash embedder at another dimension."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import TextNode
from llama_index.vector_stores.qdrant import QdrantVectorStore as LlamaQdrant
from pydantic import PrivateAttr
from qdrant_client import QdrantClient
from typer.testing import CliRunner

from reindex.config import load
from reindex.ui.cli import app
from tests.clients.support import Hashed, Tiny, aliased_collection

runner = CliRunner()
OLD_DIM = 16


def invoke(*args: str, exit_code: int = 0) -> dict[str, Any]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == exit_code, result.stdout + result.stderr
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


def uid(n: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"note-{n}"))


def text(n: int) -> str:
    return f"note {n} about topic {n % 7}"


class LlamaTiny(BaseEmbedding):
    _model: Embeddings = PrivateAttr()

    def __init__(self, model: Embeddings) -> None:
        super().__init__(model_name="tiny")
        self._model = model

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._model.embed_query(text)

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._model.embed_documents(texts)

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._model.embed_query(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)


@contextmanager
def client_of(storage: Path) -> Iterator[QdrantClient]:
    """The application's own client, closed before reindex opens one (local storage takes one at a time)."""
    client = QdrantClient(path=str(storage))
    try:
        yield client
    finally:
        client.close()


def migrate_with_init(config: str, *init: str) -> None:
    written = runner.invoke(app, ["init", config, *init])
    assert written.exit_code == 0, written.stdout + written.stderr
    assert invoke("plan", "-c", config)["documents"] == 40
    assert invoke("run", "-c", config)["written"] == 40
    assert invoke("verify", "-c", config)["complete"]
    assert invoke("cutover", "-c", config)["changed"]


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_langchain_qdrant_store_read_through_its_alias(in_tmp: Path, tiny_model: Path) -> None:
    """LangChain's defaults: UUID ids, page_content + metadata; the application reads the alias."""
    from langchain_qdrant import QdrantVectorStore

    storage = in_tmp / "store"
    aliased_collection(storage, "notes", "notes_live", OLD_DIM)
    with client_of(storage) as client:
        old = QdrantVectorStore(client, "notes_live", Hashed(OLD_DIM))
        old.add_documents(
            [Document(text(n), metadata={"n": n}) for n in range(40)], ids=[uid(n) for n in range(40)]
        )
    migrate_with_init(
        "notes.toml", "--collection", "notes_live", "--source-path", "store", "--model", str(tiny_model)
    )
    assert load(Path("notes.toml")).tables["source"]["collection"] == "notes_live"

    model = Tiny(tiny_model)
    with client_of(storage) as client:  # the unchanged application, with the new model only
        store = QdrantVectorStore(client, "notes_live", model)
        assert store.similarity_search(text(7), k=1)[0].metadata["n"] == 7
        store.add_documents(
            [Document(text(n), metadata={"n": n}) for n in (100, 101)], ids=[uid(100), uid(101)]
        )
        assert store.similarity_search(text(101), k=1)[0].metadata["n"] == 101
    report = invoke("verify", "-c", "notes.toml")
    assert report["complete"] and report["application_rows"] == 2 and report["target_vectors"] == 42
    assert (
        report["application_check"]["stale"] == 0
    )  # their vectors are the new model's, re-embedded to check
    assert invoke("sync", "-c", "notes.toml")["adopted"] == 2
    assert invoke("verify", "-c", "notes.toml")["complete"]


def test_a_llamaindex_qdrant_store_read_by_the_collection_name_behind_an_alias(
    in_tmp: Path, tiny_model: Path
) -> None:
    """LlamaIndex's defaults: UUID ids, the text inside the `_node_content` JSON; the documented path for a
    plain collection (an alias in front, the application reads it, `init --alias`)."""
    storage = in_tmp / "store"
    aliased_collection(storage, "kb", "kb_live", OLD_DIM)

    def nodes(numbers: range | tuple[int, ...]) -> list[TextNode]:
        return [
            TextNode(id_=uid(n), text=text(n), metadata={"n": n}, excluded_embed_metadata_keys=["n"])
            for n in numbers
        ]

    def index(client: QdrantClient, embed: BaseEmbedding) -> VectorStoreIndex:
        return VectorStoreIndex.from_vector_store(
            LlamaQdrant(collection_name="kb_live", client=client), embed_model=embed
        )

    with client_of(storage) as client:
        context = StorageContext.from_defaults(
            vector_store=LlamaQdrant(collection_name="kb_live", client=client)
        )
        VectorStoreIndex(nodes(range(40)), storage_context=context, embed_model=LlamaTiny(Hashed(OLD_DIM)))
    migrate_with_init(
        "kb.toml",
        "--collection",
        "kb",
        "--source-path",
        "store",
        "--alias",
        "kb_live",
        "--model",
        str(tiny_model),
    )
    assert load(Path("kb.toml")).tables["source"]["collection"] == "kb"

    embed = LlamaTiny(Tiny(tiny_model))
    with client_of(storage) as client:
        assert (
            index(client, embed).as_retriever(similarity_top_k=1).retrieve(text(7))[0].node.metadata["n"] == 7
        )
        index(client, embed).insert_nodes(nodes((100, 101, 102)))
        found = index(client, embed).as_retriever(similarity_top_k=1).retrieve(text(102))[0]
        assert found.node.metadata["n"] == 102
    report = invoke("verify", "-c", "kb.toml")
    assert report["complete"] and report["application_rows"] == 3 and report["orphaned"] == 0
    assert invoke("sync", "-c", "kb.toml")["deleted"] == 0
    assert invoke("verify", "-c", "kb.toml")["complete"]
