"""What the client tests share: the application's model as LangChain sees it, and a Qdrant collection the
application reads through an alias."""

from __future__ import annotations

from pathlib import Path

from langchain_core.embeddings import Embeddings
from qdrant_client import QdrantClient, models

from reindex_adapters.testing.memory import HashEmbedder


class Hashed(Embeddings):
    """The application's model: the tool's hash embedder, so a fresh migration's vectors are known."""

    def __init__(self, dim: int) -> None:
        self.model = HashEmbedder(dim=dim)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.model.embed(self.model.tokenize(texts)).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


class Tiny(Embeddings):
    """The new model as the application loads it: sentence-transformers, normalised, as init configures."""

    def __init__(self, path: Path) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(path))

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = self.model.encode(texts, normalize_embeddings=True).tolist()
        return vectors

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


def aliased_collection(storage: Path, collection: str, alias: str, dim: int) -> None:
    """An empty collection in local storage with `alias` over it (Qdrant puts none there by itself)."""
    client = QdrantClient(path=str(storage))
    client.create_collection(collection, models.VectorParams(size=dim, distance=models.Distance.COSINE))
    client.update_collection_aliases(
        change_aliases_operations=[
            models.CreateAliasOperation(
                create_alias=models.CreateAlias(collection_name=collection, alias_name=alias)
            )
        ]
    )
    client.close()


def accept_what_plan_names(config: Path) -> list[str]:
    """What a user does when `plan` refuses a plain table: read the losses it names and accept them by name
    on the line `reindex init` wrote commented out. Returns the keys accepted."""
    import json
    import re

    from typer.testing import CliRunner

    from reindex.ui.cli import app

    result = CliRunner().invoke(app, ["plan", "-c", str(config), "--json", "--no-calibrate"])
    assert result.exit_code == 2, result.stdout + result.stderr
    keys = [loss["key"] for loss in json.loads(result.stdout)["losses"] if not loss["accepted"]]
    text, found = re.subn(r"(?m)^# accept = \[.*?\]", f"accept = {json.dumps(keys)}", config.read_text())
    assert found == 1, "init writes the accept line, commented out"
    config.write_text(text)
    return keys
