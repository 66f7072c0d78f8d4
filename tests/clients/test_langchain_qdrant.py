"""A LangChain `QdrantVectorStore` (langchain-qdrant) migrated behind a collection alias in local mode: the
application reads *and* writes through the alias before and after cutover, with the model it uses on each
side of the flip. Local storage takes one client at a time, so the application closes its client while a
`reindex` command runs (each command closes its own before it returns)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_qdrant import QdrantVectorStore
from qdrant_client import QdrantClient, models
from typer.testing import CliRunner

from reindex.fingerprint import content_hash
from reindex.ui.cli import app
from tests.clients.support import Hashed, aliased_collection

runner = CliRunner()
OLD_DIM, NEW_DIM = 16, 24
ALIAS = "notes_live"  # Qdrant puts no alias over a collection: the application reads notes_live -> notes


def invoke(*args: str, exit_code: int = 0) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == exit_code, result.stdout + result.stderr
    return json.loads(result.stdout)


@contextmanager
def application(storage: Path, dim: int) -> Iterator[tuple[QdrantVectorStore, QdrantClient]]:
    """The application's store over the alias, with its own client, closed before reindex opens one."""
    client = QdrantClient(path=str(storage))
    try:
        yield QdrantVectorStore(client, ALIAS, Hashed(dim)), client
    finally:
        client.close()


def uid(n: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"note-{n}"))


def documents(ids: Sequence[int], version: str = "") -> list[Document]:
    return [Document(f"note {i} about topic {i % 7}{version}", metadata={"n": i}) for i in ids]


def add(store: QdrantVectorStore, ids: Sequence[int], version: str = "") -> None:
    store.add_documents(documents(ids, version), ids=[uid(i) for i in ids])


def point(client: QdrantClient, n: int) -> Any:
    (found,) = client.retrieve(ALIAS, [uid(n)], with_payload=True, with_vectors=True)
    return found


def test_langchain_reads_and_writes_through_the_alias_before_and_after_cutover(tmp_path: Path) -> None:
    storage = tmp_path / "qdrant"
    aliased_collection(storage, "notes", ALIAS, OLD_DIM)
    with application(storage, OLD_DIM) as (old, _):
        add(old, range(120))
    config = tmp_path / "notes.toml"
    config.write_text(
        f'[source]\nkind = "qdrant"\npath = "{storage}"\ncollection = "{ALIAS}"\n\n'
        f'[embedder]\nkind = "hash"\ndim = {NEW_DIM}\n\n'
        f'[target]\nkind = "qdrant"\npath = "{storage}"\nalias = "{ALIAS}"\n\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 50\n'
    )
    assert invoke("run", "-c", str(config))["written"] == 120
    with application(storage, OLD_DIM) as (old, _):
        add(old, [500])  # still the old index: written before the flip, carried over by the final sync
        assert old.similarity_search("note 7 about topic 0", k=1)[0].metadata["n"] == 7
    assert invoke("cutover", "-c", str(config), "--sync")["changed"]
    fingerprint = invoke("plan", "-c", str(config), "--no-calibrate")["fingerprint"]

    with application(storage, NEW_DIM) as (new, client):  # the application switches its model with the alias
        assert new.similarity_search("note 7 about topic 0", k=1)[0].metadata["n"] == 7
        assert new.similarity_search("note 500 about topic 3", k=1)[0].metadata["n"] == 500
        add(new, range(200, 210))  # new points
        add(new, [3, 4], version=" (edited)")  # upserts of the tool's points, same ids: whole payloads
        new.delete(ids=[uid(5)])
        assert new.similarity_search("note 204 about topic 1", k=1)[0].metadata["n"] == 204
        assert new.similarity_search("note 3 about topic 3 (edited)", k=1)[0].page_content.endswith(
            "(edited)"
        )
        assert "reindex_content_hash" not in (point(client, 3).payload or {})  # the upsert dropped it

    report = invoke("verify", "-c", str(config), "--sample", "130")  # re-embeds every point: the app's too
    assert report["complete"] and report["target_vectors"] == 130 and report["stale"] == 0
    assert report["unhashed"] == 0 and report["fingerprints"] == {fingerprint: 130}
    assert report["application_rows"] == 12 and report["sample"]["checked"] == 130
    shown = runner.invoke(app, ["verify", "-c", str(config)]).stdout
    assert re.search(r"written by the application\s+12\b", shown), shown
    caught_up = invoke("sync", "-c", str(config))
    assert caught_up["added"] == caught_up["changed"] == caught_up["deleted"] == 0  # nothing to redo
    assert caught_up["adopted"] == 12  # given their bookkeeping, vectors untouched

    with application(storage, NEW_DIM) as (new, client):
        edited = point(client, 3)
        payload = edited.payload or {}
        assert payload["reindex_content_hash"] == content_hash(payload["page_content"])
        assert payload["reindex_fingerprint"] == fingerprint and payload["metadata"] == {"n": 3}
        assert np.allclose(edited.vector, Hashed(NEW_DIM).embed_query(payload["page_content"]), atol=1e-6)
        # texts changed under their old vectors, on an adopted point and on one of the tool's
        for n in (3, 8):
            client.set_payload(ALIAS, {"page_content": f"note {n} rewritten in place"}, points=[uid(n)])
    report = invoke("verify", "-c", str(config), exit_code=3)  # 3: incomplete
    assert not report["complete"] and report["stale"] == 2 and report["application_rows"] == 12
    assert sorted(report["examples"]["stale"]) == sorted([uid(3), uid(8)])
    assert invoke("sync", "-c", str(config))["changed"] == 2
    report = invoke("verify", "-c", str(config), "--sample", "130")
    assert report["complete"] and report["sample"]["failures"] == 0
    assert report["application_rows"] == 11  # the re-embedded point 3 is the tool's again
    assert invoke("sync", "-c", str(config))["changed"] == 0

    with application(storage, NEW_DIM) as (new, client):
        rewritten = point(client, 8)
        assert np.allclose(
            rewritten.vector, Hashed(NEW_DIM).embed_query("note 8 rewritten in place"), atol=1e-6
        )
        assert new.similarity_search("note 8 rewritten in place", k=1)[0].metadata["n"] == 8
        with pytest.raises(
            Exception, match="with 24 dimensions"
        ):  # the old model after the flip: refused on its dimension
            QdrantVectorStore(client, ALIAS, Hashed(OLD_DIM))
        with pytest.raises(ValueError, match="Vector dimension error"):
            client.upsert(ALIAS, [models.PointStruct(id=uid(900), vector=[1.0] * OLD_DIM, payload={})])
        assert client.count(ALIAS).count == 130


def test_langchain_writes_through_the_alias_survive_a_rollback_and_the_roll_forward(tmp_path: Path) -> None:
    """Issue 41, item 4, with the application's own LangChain calls: adds, an edit and a delete made while
    the new collection is live go back with `rollback`; the texts the old model never embedded are kept
    without a vector and named; `cutover --sync` serves them all again, embedded."""
    storage = tmp_path / "qdrant"
    aliased_collection(storage, "notes", ALIAS, OLD_DIM)
    with application(storage, OLD_DIM) as (old, _):
        add(old, range(40))
    config = tmp_path / "notes.toml"
    config.write_text(
        f'[source]\nkind = "qdrant"\npath = "{storage}"\ncollection = "{ALIAS}"\n\n'
        f'[embedder]\nkind = "hash"\ndim = {NEW_DIM}\n\n'
        f'[target]\nkind = "qdrant"\npath = "{storage}"\nalias = "{ALIAS}"\n\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 50\n'
    )
    invoke("run", "-c", str(config))
    invoke("cutover", "-c", str(config))
    with application(storage, NEW_DIM) as (new, _):
        add(new, [300, 301])
        add(new, [3], version=" (edited)")
        new.delete(ids=[uid(5)])

    back = invoke("rollback", "-c", str(config))
    assert sorted(back["unserved_ids"]) == sorted([uid(300), uid(301), uid(3)])
    with application(storage, OLD_DIM) as (old, client):  # the old model again, as it was
        assert old.similarity_search("note 7 about topic 0", k=1)[0].metadata["n"] == 7
        assert not client.retrieve(ALIAS, [uid(5)])
        edited = point(client, 3)
        assert (edited.payload or {})["page_content"].endswith("(edited)") and not edited.vector
        assert client.count(ALIAS).count == 41

    assert invoke("cutover", "-c", str(config), "--sync")["changed"]
    with application(storage, NEW_DIM) as (new, client):
        assert new.similarity_search("note 301 about topic 0", k=1)[0].metadata["n"] == 301
        assert new.similarity_search("note 3 about topic 3 (edited)", k=1)[0].metadata["n"] == 3
        assert not client.retrieve(ALIAS, [uid(5)])
    assert invoke("verify", "-c", str(config), "--sample", "41")["complete"]
