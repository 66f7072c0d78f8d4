"""Qdrant cannot hold writers back for the flip, so `cutover --sync` carries over, after the flip, what reached
the old collection between its final catch-up and the flip, and never overwrites what the application has
written through the alias since. The application here writes through the alias with whichever model it
serves; the writes of the window and after the flip are made at those very instants."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qdrant_client import QdrantClient, models
from typer.testing import CliRunner

from reindex.fingerprint import content_hash
from reindex.flip import choreography, sync
from reindex.flip import window as flip_window
from reindex.ui.cli import app
from reindex_adapters.testing.memory import HashEmbedder
from tests.clients.support import aliased_collection

runner = CliRunner()
OLD_DIM, NEW_DIM = 16, 24
OLD, NEW = HashEmbedder(dim=OLD_DIM), HashEmbedder(dim=NEW_DIM)
ALIAS = "notes_live"


def invoke(*args: str, exit_code: int = 0) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == exit_code, result.stdout + result.stderr
    return json.loads(result.stdout)


def uid(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, name))


def vector(model: HashEmbedder, text: str) -> list[float]:
    return model.embed(model.tokenize([text]))[0].tolist()


def upsert(client: QdrantClient, model: HashEmbedder, texts: dict[str, str]) -> None:
    """The application's write through the alias: text and vector together, its own payload only."""
    client.upsert(
        ALIAS,
        [
            models.PointStruct(id=uid(n), vector=vector(model, t), payload={"text": t})
            for n, t in texts.items()
        ],
        wait=True,
    )


def delete(client: QdrantClient, *names: str) -> None:
    client.delete(ALIAS, models.PointIdsList(points=[uid(n) for n in names]), wait=True)


def served(client: QdrantClient) -> dict[str, tuple[str, list[float]]]:
    points, _ = client.scroll(ALIAS, limit=1000, with_payload=True, with_vectors=True)
    return {str(p.id): ((p.payload or {})["text"], p.vector) for p in points}  # type: ignore[misc]


@pytest.fixture
def migration(tmp_path: Path) -> Path:
    storage = tmp_path / "qdrant"
    aliased_collection(storage, "notes", ALIAS, OLD_DIM)
    client = QdrantClient(path=str(storage))
    upsert(client, OLD, {f"n{i}": f"note {i}" for i in range(40)})
    client.close()
    config = tmp_path / "notes.toml"
    config.write_text(
        f'[source]\nkind = "qdrant"\npath = "{storage}"\ncollection = "{ALIAS}"\ntext_field = "text"\n\n'
        f'[embedder]\nkind = "hash"\ndim = {NEW_DIM}\n\n'
        f'[target]\nkind = "qdrant"\npath = "{storage}"\nalias = "{ALIAS}"\n\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 16\n'
    )
    assert invoke("run", "-c", str(config))["written"] == 40
    return config


def at(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, write: Callable[[QdrantClient], None]) -> None:
    """Make the application write at the instant `owner.name` is called (after it, for Settled.take)."""
    original = getattr(owner, name)

    def patched(*args: Any, **kwargs: Any) -> Any:
        m = args[1] if owner is flip_window.Settled else args[0]  # take(self, m) / after_flip(m, ...)
        if owner is flip_window.Settled:
            result = original(*args, **kwargs)
            write(m.sink._client)  # the tool's own client: local storage takes one at a time
            return result
        write(m.sink._client)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, patched)


def test_the_window_before_the_flip_is_carried_over_and_later_writes_through_the_alias_stand(
    migration: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def window(client: QdrantClient) -> None:  # the alias still serves the old collection
        upsert(client, OLD, {"w": "note w, written in the window", "n1": "note 1, edited in the window"})
        upsert(client, OLD, {"n2": "note 2, edited in the window", "n3": "note 3, edited in the window"})
        delete(client, "n4")

    def after(client: QdrantClient) -> None:  # the alias serves the new target: the application's model too
        upsert(client, NEW, {"n2": "note 2, edited after the flip", "p": "note p, new after the flip"})
        delete(client, "n3", "n5")

    at(monkeypatch, flip_window.Settled, "take", window)
    at(monkeypatch, choreography, "after_flip", after)
    moved = invoke("cutover", "-c", str(migration), "--sync")
    assert moved["changed"] and moved["previous"] == "notes"
    after_flip = moved["after_flip"]
    assert after_flip["read"] == "previous"
    assert (after_flip["carried"], after_flip["deleted"], after_flip["kept"]) == (
        2,
        1,
        2,
    )  # w, n1; n4; n2, n3

    monkeypatch.undo()
    client = QdrantClient(path=str(migration.parent / "qdrant"))
    try:
        now = served(client)
        (raw,) = client.retrieve(ALIAS, [uid("n1")], with_payload=True)
    finally:
        client.close()
    expected = {f"n{i}": f"note {i}" for i in range(40) if i not in (3, 4, 5)}
    expected |= {"w": "note w, written in the window", "n1": "note 1, edited in the window"}
    expected |= {"n2": "note 2, edited after the flip", "p": "note p, new after the flip"}
    assert sorted(now) == sorted(uid(n) for n in expected)  # n4 deleted, n3 and n5 not back
    for name, text in expected.items():
        stored_text, stored_vector = now[uid(name)]
        assert stored_text == text, name
        assert np.allclose(stored_vector, vector(NEW, text), atol=1e-6), name
    assert (raw.payload or {})["reindex_content_hash"] == content_hash("note 1, edited in the window")
    assert invoke("verify", "-c", str(migration), "--sample", "50")["complete"]


def test_nothing_in_the_window_leaves_the_flip_alone(migration: Path) -> None:
    moved = invoke("cutover", "-c", str(migration), "--sync")
    assert moved["after_flip"] == {**moved["after_flip"], "read": "previous", "carried": 0, "deleted": 0}
    assert invoke("verify", "-c", str(migration))["target_vectors"] == 40
    shown = runner.invoke(app, ["rollback", "-c", str(migration)])
    assert shown.exit_code == 0, shown.stdout
    shown = runner.invoke(app, ["cutover", "-c", str(migration), "--sync"])
    assert (
        shown.exit_code == 0
        and "Caught up after the flip from the index it replaced: 0 written" in shown.stdout
    )


def test_a_gap_no_later_write_explains_still_refuses_the_flip(
    migration: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a document changed since the final catch-up read it may differ at the flip: a vector lost from
    the target with its document unchanged is a real gap, and the alias stays where it was."""
    original = sync.catch_up

    def losing(m: Any, ledger: Any, **kwargs: Any) -> Any:
        report = original(m, ledger, **kwargs)
        target = m.spec.name
        m.sink._client.delete(target, models.PointIdsList(points=[uid("n7")]), wait=True)
        return report

    monkeypatch.setattr(choreography, "catch_up", losing)
    refused = invoke("cutover", "-c", str(migration), "--sync", exit_code=3)
    assert "not complete (1 missing)" in refused["error"]["message"]
    monkeypatch.undo()
    assert invoke("resolve", "-c", str(migration))["target"] == "notes"


def foreign_fingerprint(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "reindex_fingerprint": "someothermodel00"}


def no_content_hash(payload: dict[str, Any]) -> dict[str, Any]:
    """Neither a stored hash nor a text to derive one from: staleness unknown."""
    return {k: v for k, v in payload.items() if k not in ("reindex_content_hash", "text")}


@pytest.mark.parametrize(
    ("rewrite", "problem"),
    [
        (foreign_fingerprint, "1 vectors of other fingerprints ['someothermodel00']"),
        (no_content_hash, "1 without content hash"),
    ],
)
def test_a_point_written_into_the_target_in_the_window_refuses_the_flip_as_verify_does(
    migration: Path,
    monkeypatch: pytest.MonkeyPatch,
    rewrite: Callable[[dict[str, Any]], dict[str, Any]],
    problem: str,
) -> None:
    """Something writes straight into the target after the final catch-up, a point whose document did not
    change: plain verify and cutover refuse that target, so `cutover --sync` refuses it too."""
    original = sync.catch_up

    def intruding(m: Any, ledger: Any, **kwargs: Any) -> Any:
        report = original(m, ledger, **kwargs)
        client, target = m.sink._client, m.spec.name
        (point,) = client.retrieve(target, [uid("n7")], with_payload=True, with_vectors=True)
        payload = rewrite(dict(point.payload or {}))
        client.upsert(
            target, [models.PointStruct(id=point.id, vector=point.vector, payload=payload)], wait=True
        )
        return report

    monkeypatch.setattr(choreography, "catch_up", intruding)
    refused = invoke("cutover", "-c", str(migration), "--sync", exit_code=3)
    assert problem in refused["error"]["message"]
    monkeypatch.undo()
    assert invoke("resolve", "-c", str(migration))["target"] == "notes"
    report = invoke("verify", "-c", str(migration), exit_code=3)
    assert not report["complete"] and report["missing"] == report["stale"] == 0
    assert problem in invoke("cutover", "-c", str(migration), exit_code=3)["error"]["message"]


@pytest.mark.parametrize("kept", [True, False], ids=["view-kept", "view-lost"])
@pytest.mark.parametrize("finish", ["cutover", "sync"])
def test_a_cutover_killed_after_the_flip_is_seen_by_verify_and_finished_by_the_next_one(
    migration: Path, monkeypatch: pytest.MonkeyPatch, finish: str, kept: bool
) -> None:
    """Until a `cutover --sync` finishes the catch-up, verify says it is pending, and the next `cutover
    --sync` or `sync` finishes it. The view of the target kept before the flip is durable beside a SQLite
    ledger: with it, the window's insert is carried and the application's delete since stands. Without it
    (lost, as with a Postgres ledger on another machine), the next one rebuilds what it can from the target
    itself: changes and deletes of the window are carried, and a document only the old collection holds
    (inserted in the window, or deleted through the alias since: nothing tells which) is left alone and
    listed."""

    def window(client: QdrantClient) -> None:
        upsert(client, OLD, {"w": "note w, written in the window", "n1": "note 1, edited in the window"})
        delete(client, "n4")

    def killed(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt  # the process dies between the flip and the catch-up after it

    at(monkeypatch, flip_window.Settled, "take", window)
    monkeypatch.setattr(choreography, "after_flip", killed)
    assert runner.invoke(app, ["cutover", "-c", str(migration), "--sync", "--json"]).exit_code != 0
    monkeypatch.undo()
    assert invoke("resolve", "-c", str(migration))["target"] != "notes"  # the flip landed
    pending = invoke("verify", "-c", str(migration), exit_code=3)
    assert pending["after_flip_pending"] == "notes" and not pending["complete"]
    shown = runner.invoke(app, ["verify", "-c", str(migration)]).stdout
    assert "the catch-up after the flip from 'notes' did not finish" in shown and "cutover --sync" in shown

    client = QdrantClient(path=str(migration.parent / "qdrant"))
    try:  # the application goes on through the alias, with the new model
        upsert(client, NEW, {"n2": "note 2, edited after the flip"})
        delete(client, "n5")
    finally:
        client.close()
    views = list(migration.parent.glob("state.db.settled-*"))
    assert views, "the view kept before the flip is not beside the ledger"
    if not kept:
        for view in views:
            view.unlink()
    # finished first, before a catch-up adopts the application's writes since (which would hide them)
    finished = invoke(
        *(
            ["cutover", "-c", str(migration), "--sync"]
            if finish == "cutover"
            else ["sync", "-c", str(migration)]
        )
    )
    assert not finished.get("changed")
    after = finished["after_flip"]
    if kept:
        assert (after["carried"], after["deleted"], after["kept"], after["uncertain"]) == (2, 1, 0, 0)
    else:
        assert (after["carried"], after["deleted"], after["kept"], after["uncertain"]) == (1, 1, 1, 2)
        assert sorted(after["examples"]) == sorted([uid("w"), uid("n5")])
    assert not list(migration.parent.glob("state.db.settled-*")), "the finished view was left behind"
    report = invoke("verify", "-c", str(migration))
    assert report["complete"] and report["after_flip_pending"] is None

    client = QdrantClient(path=str(migration.parent / "qdrant"))
    try:
        now = served(client)
    finally:
        client.close()
    assert uid("n4") not in now and uid("n5") not in now
    if kept:  # the window's insert, carried
        assert now[uid("w")][0] == "note w, written in the window"
        assert np.allclose(now[uid("w")][1], vector(NEW, "note w, written in the window"), atol=1e-6)
    else:
        assert uid("w") not in now
    assert now[uid("n1")][0] == "note 1, edited in the window"
    assert np.allclose(now[uid("n1")][1], vector(NEW, "note 1, edited in the window"), atol=1e-6)
    assert now[uid("n2")][0] == "note 2, edited after the flip"
    again = invoke("cutover", "-c", str(migration), "--sync")
    assert again["after_flip"] is None  # nothing pending any more
