"""LangChain's `QdrantVectorStore` in hybrid mode (a dense vector and a sparse one per point) migrated behind its
alias in local mode with the config `reindex init` writes: init → plan → run → verify → cutover. The sparse
vectors and payloads come through unchanged, a hybrid query through the alias with the new dense model finds
its document first, and the application's hybrid writes after the flip count as its rows."""

from __future__ import annotations

import json
import uuid
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_qdrant import QdrantVectorStore, RetrievalMode, SparseEmbeddings, SparseVector
from qdrant_client import QdrantClient, models
from typer.testing import CliRunner

from reindex.ui.cli import app
from tests.clients.support import Hashed, Tiny

runner = CliRunner()
OLD_DIM = 16
TOPICS = ["harbour", "orchard", "glacier", "lantern", "meadow", "quarry", "violin"]


class WordCounts(SparseEmbeddings):
    """A BM25-like sparse model small enough to write here: each word's count at its crc32 bucket."""

    def embed_documents(self, texts: list[str]) -> list[SparseVector]:
        return [self.embed_query(text) for text in texts]

    def embed_query(self, text: str) -> SparseVector:
        counts = Counter(zlib.crc32(word.encode()) % 50_000 for word in text.lower().split())
        indices = sorted(counts)
        return SparseVector(indices=indices, values=[float(counts[i]) for i in indices])


def invoke(*args: str, exit_code: int = 0) -> dict[str, Any]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == exit_code, result.stdout + result.stderr
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


def uid(n: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"hybrid-{n}"))


def documents(numbers: range | tuple[int, ...]) -> list[Document]:
    return [
        Document(f"note {n} on the {TOPICS[n % 7]} by the {TOPICS[n * 3 % 7]}", metadata={"n": n})
        for n in numbers
    ]


@contextmanager
def hybrid(storage: Path, dense: Embeddings) -> Iterator[tuple[QdrantVectorStore, QdrantClient]]:
    """The application's hybrid store over the alias, closed before reindex opens the storage."""
    client = QdrantClient(path=str(storage))
    try:
        store = QdrantVectorStore(
            client,
            "notes_live",
            dense,
            retrieval_mode=RetrievalMode.HYBRID,
            sparse_embedding=WordCounts(),
        )
        yield store, client
    finally:
        client.close()


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def migrated(in_tmp: Path, tiny_model: Path) -> Path:
    """40 hybrid notes behind `notes_live`, migrated to the tiny model with init's config and cut over."""
    storage = in_tmp / "store"
    created = QdrantVectorStore.from_documents(  # as LangChain creates it: the unnamed dense vector + sparse
        documents(range(40)),
        Hashed(OLD_DIM),
        ids=[uid(n) for n in range(40)],
        sparse_embedding=WordCounts(),
        retrieval_mode=RetrievalMode.HYBRID,
        path=str(storage),
        collection_name="notes",
    )
    created.client.update_collection_aliases(
        change_aliases_operations=[
            models.CreateAliasOperation(
                create_alias=models.CreateAlias(collection_name="notes", alias_name="notes_live")
            )
        ]
    )
    created.client.close()

    written = runner.invoke(
        app,
        [
            "init",
            "notes.toml",
            "--collection",
            "notes_live",
            "--source-path",
            "store",
            "--model",
            str(tiny_model),
        ],
    )
    assert written.exit_code == 0, written.stdout + written.stderr
    assert "'langchain-sparse' (sparse)" in written.stdout  # said to be carried
    assert invoke("plan", "-c", "notes.toml", "--no-calibrate")["documents"] == 40
    assert invoke("run", "-c", "notes.toml")["written"] == 40
    assert invoke("verify", "-c", "notes.toml")["complete"]
    assert invoke("cutover", "-c", "notes.toml")["changed"]
    return storage


def test_a_hybrid_langchain_store_keeps_its_sparse_vectors_and_finds_through_the_alias(
    in_tmp: Path, tiny_model: Path
) -> None:
    storage = migrated(in_tmp, tiny_model)

    with hybrid(storage, Tiny(tiny_model)) as (store, client):
        old, _ = client.scroll("notes", limit=100, with_payload=True, with_vectors=True)
        for before in old:
            (after,) = client.retrieve("notes_live", [before.id], with_payload=True, with_vectors=True)
            assert isinstance(after.vector, dict) and isinstance(before.vector, dict) and after.payload
            assert after.vector["langchain-sparse"] == before.vector["langchain-sparse"]
            assert {k: v for k, v in after.payload.items() if not k.startswith("reindex_")} == before.payload
        probe = documents((17,))[0].page_content
        assert store.similarity_search(probe, k=1)[0].metadata["n"] == 17  # dense (new model) + sparse, fused
        store.add_documents(
            documents((100, 101)), ids=[uid(100), uid(101)]
        )  # both vectors, through the alias
        assert store.similarity_search(documents((101,))[0].page_content, k=1)[0].metadata["n"] == 101

    report = invoke("verify", "-c", "notes.toml")
    assert report["complete"] and report["application_rows"] == 2 and report["target_vectors"] == 42
    assert report["carried"] == 0 and report["application_check"]["stale"] == 0
    assert invoke("sync", "-c", "notes.toml")["adopted"] == 2
    assert invoke("verify", "-c", "notes.toml")["complete"]


def test_a_rollback_keeps_the_hybrid_writes_made_through_the_alias_and_roll_forward_serves_them(
    in_tmp: Path, tiny_model: Path
) -> None:
    """Issue 41, item 4: the application adds two notes and deletes one through its hybrid store while the
    new collection is live; `rollback` keeps all three writes, and the next `cutover --sync` serves them."""
    storage = migrated(in_tmp, tiny_model)
    with hybrid(storage, Tiny(tiny_model)) as (store, _):
        store.add_documents(documents((100, 101)), ids=[uid(100), uid(101)])
        store.delete([uid(5)])

    back = invoke("rollback", "-c", "notes.toml")
    assert back["target"] == "notes" and back["unserved_ids"] == sorted([uid(100), uid(101)])
    with hybrid(storage, Hashed(OLD_DIM)) as (_, client):  # the old model again, over the old collection
        assert not client.retrieve("notes_live", [uid(5)])
        (added,) = client.retrieve("notes_live", [uid(101)], with_vectors=True)
        assert isinstance(added.vector, dict) and set(added.vector) == {"langchain-sparse"}  # no old vector
        probe = WordCounts().embed_query(documents((101,))[0].page_content)
        sparse = models.SparseVector(indices=probe.indices, values=probe.values)
        found = client.query_points("notes_live", query=sparse, using="langchain-sparse", limit=1).points
        assert found[0].id == uid(101)  # the keyword half of its hybrid search still finds it

    assert invoke("cutover", "-c", "notes.toml", "--sync")["changed"]
    with hybrid(storage, Tiny(tiny_model)) as (store, client):
        assert not client.retrieve("notes_live", [uid(5)])
        assert store.similarity_search(documents((100,))[0].page_content, k=1)[0].metadata["n"] == 100
    report = invoke("verify", "-c", "notes.toml", "--sample", "10")
    assert report["complete"] and report["target_vectors"] == 41
