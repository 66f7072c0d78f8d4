"""After a Qdrant flip the alias is where the application writes, so what it serves is the truth, with the
dead letters the migration met in the collection it read (issue 31, defects 1, 2, 3 and 5). Each case here
is an application writing through the alias with its ordinary client calls, then the tool's own commands;
the source is read through the alias and by the old collection's own name (what `reindex init` writes)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qdrant_client import QdrantClient, models
from typer.testing import CliRunner

from reindex import commands
from reindex.config import load
from reindex.flip import choreography, window
from reindex.ui.cli import app
from reindex_adapters.testing.memory import HashEmbedder
from tests.clients.support import aliased_collection

runner = CliRunner()
OLD_DIM, NEW_DIM = 16, 24
OLD, NEW = HashEmbedder(dim=OLD_DIM), HashEmbedder(dim=NEW_DIM)
ALIAS = "notes_live"
DOCS = 10


def invoke(*args: str, exit_code: int = 0) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == exit_code, result.stdout + result.stderr
    return json.loads(result.stdout)


def vector(model: HashEmbedder, text: str) -> list[float]:
    return model.embed(model.tokenize([text]))[0].tolist()


def upsert(client: QdrantClient, model: HashEmbedder, texts: dict[int, str], collection: str = ALIAS) -> None:
    """The application's upsert: integer point ids, text and vector together, its own payload only."""
    points = [
        models.PointStruct(id=i, vector=vector(model, t), payload={"text": t}) for i, t in texts.items()
    ]
    client.upsert(collection, points, wait=True)


def served(storage: Path) -> dict[Any, tuple[str, list[float]]]:
    client = QdrantClient(path=str(storage))
    try:
        points, _ = client.scroll(ALIAS, limit=1000, with_payload=True, with_vectors=True)
    finally:
        client.close()
    return {p.id: ((p.payload or {})["text"], p.vector) for p in points}  # type: ignore[misc]


def served_exactly(storage: Path, expected: dict[int, str]) -> None:
    """The alias serves these integer points, each with the new model's vector of its text."""
    now = served(storage)
    assert sorted(now) == sorted(expected)
    for point, text in expected.items():
        stored_text, stored_vector = now[point]
        assert stored_text == text, point
        assert np.allclose(stored_vector, vector(NEW, text), atol=1e-6), point


def with_client(storage: Path, write: Callable[[QdrantClient], object]) -> None:
    client = QdrantClient(path=str(storage))
    try:
        write(client)
    finally:
        client.close()


def migration(tmp_path: Path, source: str, texts: dict[int, str] | None = None) -> Path:
    """Ten notes with integer ids in `notes`, behind the alias; a config reading `source`."""
    storage = tmp_path / "qdrant"
    aliased_collection(storage, "notes", ALIAS, OLD_DIM)
    with_client(storage, lambda c: upsert(c, OLD, texts or {i: f"note {i}" for i in range(1, DOCS + 1)}))
    config = tmp_path / "notes.toml"
    config.write_text(
        f'[source]\nkind = "qdrant"\npath = "{storage}"\ncollection = "{source}"\ntext_field = "text"\n\n'
        f'[embedder]\nkind = "hash"\ndim = {NEW_DIM}\n\n'
        f'[target]\nkind = "qdrant"\npath = "{storage}"\nalias = "{ALIAS}"\n\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 4\nmax_dead_letters = 0\n'
    )
    return config


BOTH_SOURCES = pytest.mark.parametrize("source", [ALIAS, "notes"], ids=["by-alias", "by-name"])


@BOTH_SOURCES
def test_integer_point_ids_stay_addressable_through_the_alias_and_sync_keeps_every_live_document(
    tmp_path: Path, source: str
) -> None:
    config = migration(tmp_path, source)
    storage = tmp_path / "qdrant"
    assert invoke("run", "-c", str(config))["written"] == DOCS
    assert invoke("cutover", "-c", str(config))["changed"]
    served_exactly(storage, {i: f"note {i}" for i in range(1, DOCS + 1)})  # the same ids, new vectors

    def application(client: QdrantClient) -> None:  # the new model, by the ids it has always used
        client.delete(ALIAS, models.PointIdsList(points=[3]), wait=True)
        upsert(client, NEW, {4: "note 4, edited after the flip", 11: "note 11, new after the flip"})

    with_client(storage, application)
    expected = {i: f"note {i}" for i in range(1, DOCS + 1) if i != 3}
    expected |= {4: "note 4, edited after the flip", 11: "note 11, new after the flip"}
    served_exactly(storage, expected)  # the delete took, the upsert made no second point

    report = invoke("sync", "-c", str(config))
    assert (report["deleted"], report["added"], report["changed"]) == (0, 0, 0)
    served_exactly(storage, expected)
    verified = invoke("verify", "-c", str(config), "--sample", "20")
    assert verified["complete"] and verified["orphaned"] == 0 and verified["application_rows"] == 2


@BOTH_SOURCES
def test_an_edit_through_the_alias_after_the_flip_outlives_the_window_edit_it_follows(
    tmp_path: Path, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = migration(tmp_path, source)
    storage = tmp_path / "qdrant"
    invoke("run", "-c", str(config))
    original_take, original_after_flip = window.Settled.take, window.after_flip

    def take(self: window.Settled, m: Any, *args: Any) -> None:  # the window: the alias still serves `notes`
        original_take(self, m, *args)
        upsert(m.sink._client, OLD, {5: "note 5, edited in the window"})

    def after_flip(m: Any, *args: Any) -> Any:  # after the flip, a documented in-place edit of the text
        m.sink._client.set_payload(ALIAS, {"text": "note 5, edited after the flip"}, points=[5], wait=True)
        return original_after_flip(m, *args)

    monkeypatch.setattr(window.Settled, "take", take)
    monkeypatch.setattr(choreography, "after_flip", after_flip)
    moved = invoke("cutover", "-c", str(config), "--sync")
    monkeypatch.undo()
    assert moved["changed"] and (moved["after_flip"]["kept"], moved["after_flip"]["edited"]) == (1, 1)

    expected = {i: f"note {i}" for i in range(1, DOCS + 1)} | {5: "note 5, edited after the flip"}
    served_exactly(storage, expected)  # the later edit stands, embedded
    assert invoke("verify", "-c", str(config), "--sample", "20")["complete"]
    assert invoke("sync", "-c", str(config))["changed"] == 0


def test_sync_after_a_killed_cutover_keeps_what_the_application_wrote_through_the_alias(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source by the old collection's own name; `cutover --sync` dies right after the flip."""
    config = migration(tmp_path, "notes")
    storage = tmp_path / "qdrant"
    invoke("run", "-c", str(config))

    def killed(*args: Any) -> Any:
        raise KeyboardInterrupt  # the process dies before the carry-over starts

    monkeypatch.setattr(choreography, "after_flip", killed)
    with pytest.raises(KeyboardInterrupt):
        commands.cutover(load(config), sync=True)
    monkeypatch.undo()

    def application(client: QdrantClient) -> None:
        upsert(client, NEW, {2: "note 2, edited after the flip", 12: "note 12, new after the flip"})

    with_client(storage, application)
    assert not invoke("verify", "-c", str(config), exit_code=3)["complete"]  # the carry-over is pending
    invoke("sync", "-c", str(config))
    expected = {i: f"note {i}" for i in range(1, DOCS + 1)}
    expected |= {2: "note 2, edited after the flip", 12: "note 12, new after the flip"}
    served_exactly(storage, expected)
    assert invoke("verify", "-c", str(config), "--sample", "20")["complete"]


def test_documents_added_through_the_alias_after_an_init_config_cutover_keep_verify_complete(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`init --collection kb --alias kb_live` reads the source by the collection's own name."""
    from sentence_transformers import SentenceTransformer

    monkeypatch.chdir(tmp_path)
    model = SentenceTransformer(str(tiny_model))
    dim = model.get_embedding_dimension()
    assert dim is not None
    aliased_collection(tmp_path / "store", "kb", "kb_live", dim)

    def write(collection: str, texts: dict[int, str]) -> None:
        vectors = model.encode(list(texts.values()), normalize_embeddings=True).tolist()
        points = [models.PointStruct(id=i, vector=v, payload={"page_content": t}) for (i, t), v in
                  zip(texts.items(), vectors, strict=True)]  # fmt: skip
        with_client(tmp_path / "store", lambda c: c.upsert(collection, points, wait=True))

    write("kb", {i: f"kb note {i}" for i in range(1, 9)})
    init = ["init", "kb.toml", "--collection", "kb", "--source-path", "store", "--alias", "kb_live"]
    result = runner.invoke(app, [*init, "--model", str(tiny_model)])
    assert result.exit_code == 0, result.stdout + result.stderr
    assert 'collection = "kb"' in Path("kb.toml").read_text()
    for verb in ("plan", "run", "verify", "cutover"):
        invoke(verb, "-c", "kb.toml")

    write("kb_live", {i: f"kb note {i}, new through the alias" for i in (20, 21, 22)})
    verified = invoke("verify", "-c", "kb.toml")
    assert verified["complete"] and verified["orphaned"] == 0 and verified["application_rows"] == 3


@BOTH_SOURCES
def test_dead_letters_keep_counting_after_the_flip_and_dlq_retry_keeps_them(
    tmp_path: Path, source: str
) -> None:
    """Two notes without a text are dead letters; with max_dead_letters = 0 verify is never complete, so the
    flip is forced, and after it verify must go on counting them against the collection the run read."""
    texts = {i: f"note {i}" for i in range(1, DOCS + 1)} | {6: "", 7: "   "}
    config = migration(tmp_path, source, texts)
    invoke("run", "-c", str(config))
    before = invoke("verify", "-c", str(config), exit_code=3)
    assert before["dead_letters"] == 2 and not before["complete"]
    invoke("cutover", "-c", str(config), "--force")

    after = invoke("verify", "-c", str(config), exit_code=3)
    assert after["dead_letters"] == 2 and after["dead_letter_ceiling"] == 0 and not after["complete"]
    retried = invoke("dlq", "retry", "-c", str(config))
    assert retried["vanished"] == 0 and retried["total"] == 2
    assert invoke("verify", "-c", str(config), exit_code=3)["dead_letters"] == 2


@BOTH_SOURCES
def test_a_run_after_the_flip_brings_back_nothing_the_application_deleted_through_the_alias(
    tmp_path: Path, source: str
) -> None:
    """Found by the lifecycle checker: a document written into the old collection after the run's last shard
    is carried over by `cutover --sync` and then deleted through the alias. The old collection still holds
    it after the run's cursor; a `run` reading on from there wrote it back into the live target."""
    config = migration(tmp_path, source)
    storage = tmp_path / "qdrant"
    assert invoke("run", "-c", str(config))["written"] == DOCS
    with_client(storage, lambda client: upsert(client, OLD, {99: "note 99, written before the flip"}))
    assert invoke("cutover", "-c", str(config), "--sync")["changed"]
    with_client(storage, lambda client: client.delete(ALIAS, models.PointIdsList(points=[99, 3]), wait=True))
    expected = {i: f"note {i}" for i in range(1, DOCS + 1) if i != 3}
    served_exactly(storage, expected)

    report = invoke("run", "-c", str(config))
    assert report["reconciled"] and report["written"] == DOCS  # what the backfill wrote; nothing since
    served_exactly(storage, expected)
    invoke("sync", "-c", str(config))
    served_exactly(storage, expected)
    assert invoke("verify", "-c", str(config))["complete"]


@BOTH_SOURCES
def test_a_field_set_before_a_sync_is_carried_and_a_plain_cutover_then_rollback_keep_it(
    tmp_path: Path, source: str
) -> None:
    """A payload field the application sets through the alias, the text untouched, is part of what a fresh
    migration copies: verify holds it against the target until a sync carries it (the vector kept, nothing
    embedded again), and after a plain cutover and a rollback the alias still serves it (the model
    checker's history: the rollback read its absence in the newer collection as a removal)."""
    config = migration(tmp_path, source)
    storage = tmp_path / "qdrant"
    invoke("run", "-c", str(config))
    with_client(storage, lambda c: c.set_payload(ALIAS, {"acl": "team-a"}, points=[8], wait=True))

    verified = invoke("verify", "-c", str(config), exit_code=3)
    assert not verified["complete"] and verified["carried"] == 1, verified
    report = invoke("sync", "-c", str(config))
    assert (report["carried"], report["changed"], report["added"]) == (1, 0, 0), report
    assert invoke("verify", "-c", str(config))["complete"]

    invoke("cutover", "-c", str(config))
    assert acl(storage) == {8: "team-a"}
    served_exactly(storage, {i: f"note {i}" for i in range(1, DOCS + 1)})
    invoke("rollback", "-c", str(config))
    assert acl(storage) == {8: "team-a"}


def acl(storage: Path) -> dict[Any, str]:
    found: dict[Any, str] = {}

    def read(client: QdrantClient) -> None:
        points, _ = client.scroll(ALIAS, limit=1000, with_payload=True)
        found.update({p.id: p.payload["acl"] for p in points if p.payload and "acl" in p.payload})

    with_client(storage, read)
    return found
