"""A Qdrant rollback loses nothing the application wrote through the alias while the newer collection was
live (issue 41, item 4): adds, edits, field changes and deletes go back with the alias; what the older model
never embedded is kept without a vector and named; the next `cutover --sync` serves every write again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qdrant_client import QdrantClient, models

from reindex.flip import choreography
from reindex_adapters.qdrant.sink import QdrantSink
from tests.cutover.test_qdrant_after_flip import (
    ALIAS,
    BOTH_SOURCES,
    DOCS,
    NEW,
    OLD,
    invoke,
    migration,
    served_exactly,
    upsert,
    vector,
    with_client,
)
from tests.cutover.test_qdrant_blank_writes import cut_over, point, served_vector


def application(client: QdrantClient) -> None:
    """Through the alias, with the newer model: an add, a text edit, a field set, a delete."""
    upsert(client, NEW, {11: "note 11, added after the flip", 4: "note 4, edited after the flip"})
    client.set_payload(ALIAS, {"acl": ["ops"]}, points=[2], wait=True)
    client.delete(ALIAS, models.PointIdsList(points=[3]), wait=True)


@BOTH_SOURCES
def test_rollback_keeps_every_write_made_through_the_alias_and_names_what_is_unserved(
    tmp_path: Path, source: str
) -> None:
    config, storage = cut_over(tmp_path, source)
    with_client(storage, application)

    back = invoke("rollback", "-c", str(config))
    assert back["target"] == "notes" and back["changed"]
    assert (back["unserved"], back["unserved_ids"]) == (2, ["11", "4"])
    assert point(storage, 3) is None
    edited, added, tagged = point(storage, 4), point(storage, 11), point(storage, 2)
    assert edited is not None and (edited.payload or {})["text"] == "note 4, edited after the flip"
    assert served_vector(edited) is None  # the older model never embedded that text
    assert added is not None and served_vector(added) is None
    assert tagged is not None and (tagged.payload or {})["acl"] == ["ops"]
    assert np.allclose(served_vector(tagged) or [], vector(OLD, "note 2"), atol=1e-6)  # its text is the same

    invoke("sync", "-c", str(config))  # the newer target is level with the older collection, nothing reverted
    assert invoke("verify", "-c", str(config))["complete"]
    moved = invoke("cutover", "-c", str(config), "--sync")
    assert moved["changed"]
    expected = {i: f"note {i}" for i in range(1, DOCS + 1) if i != 3}
    expected |= {11: "note 11, added after the flip", 4: "note 4, edited after the flip"}
    served_exactly(storage, expected)
    tagged = point(storage, 2)
    assert tagged is not None and (tagged.payload or {})["acl"] == ["ops"]
    assert invoke("verify", "-c", str(config), "--sample", "20")["complete"]


def test_a_write_that_reaches_the_newer_collection_while_the_alias_moves_back_is_carried_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = migration(tmp_path, ALIAS)
    storage = tmp_path / "qdrant"
    invoke("run", "-c", str(config))
    invoke("cutover", "-c", str(config))
    original = QdrantSink.carry_back

    def carry_back(self: QdrantSink, newer: str, older: str, since: Any = None) -> Any:
        done = original(self, newer, older, since)
        if since is None:  # the alias still serves the newer collection: the application writes on
            upsert(self._client, NEW, {12: "note 12, written while the alias moved back"})
        return done

    monkeypatch.setattr(QdrantSink, "carry_back", carry_back)
    back = invoke("rollback", "-c", str(config))
    monkeypatch.undo()
    assert back["unserved_ids"] == ["12"]
    added = point(storage, 12)
    assert (
        added is not None and (added.payload or {})["text"] == "note 12, written while the alias moved back"
    )


def test_a_rollback_waits_for_the_carry_over_a_killed_cutover_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window's writes are in the older collection only until the carry-over: a rollback before it
    would write the newer collection's older copy over them."""
    from reindex import commands
    from reindex.config import load
    from reindex.flip import window

    config = migration(tmp_path, ALIAS)
    storage = tmp_path / "qdrant"
    invoke("run", "-c", str(config))
    original_take = window.Settled.take

    def take(self: window.Settled, m: Any, *args: Any) -> None:
        original_take(self, m, *args)
        upsert(m.sink._client, OLD, {5: "note 5, edited in the window"})

    def killed(*args: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(window.Settled, "take", take)
    monkeypatch.setattr(choreography, "after_flip", killed)
    with pytest.raises(KeyboardInterrupt):
        commands.cutover(load(config), sync=True)
    monkeypatch.undo()

    refused = invoke("rollback", "-c", str(config), exit_code=4)
    assert "reindex sync" in refused["error"]["hint"]
    invoke("sync", "-c", str(config))
    back = invoke("rollback", "-c", str(config))
    assert back["changed"] and back["target"] == "notes"
    edited = point(storage, 5)
    assert edited is not None and (edited.payload or {})["text"] == "note 5, edited in the window"
    assert np.allclose(served_vector(edited) or [], vector(OLD, "note 5, edited in the window"), atol=1e-6)


@BOTH_SOURCES
def test_a_blank_document_deleted_through_the_alias_stays_deleted_after_a_rollback(
    tmp_path: Path, source: str
) -> None:
    """A blank text is a dead letter whose point the newer collection keeps (the cutover keeps it); the
    application deletes it through the alias; the rollback must not bring it back from the older collection
    (the model checker's history: it read a blank point only the older holds as one an earlier version
    never kept, and left it there)."""
    config = migration(tmp_path, source, {i: ("" if i == 1 else f"note {i}") for i in range(1, DOCS + 1)})
    storage = tmp_path / "qdrant"
    config.write_text(config.read_text().replace("max_dead_letters = 0", "max_dead_letters = 1"))
    invoke("run", "-c", str(config))
    invoke("cutover", "-c", str(config))
    assert point(storage, 1) is not None  # kept, without a vector
    with_client(storage, lambda c: c.delete(ALIAS, models.PointIdsList(points=[1]), wait=True))
    invoke("sync", "-c", str(config))

    invoke("rollback", "-c", str(config))
    assert point(storage, 1) is None
    for i in range(2, DOCS + 1):
        assert point(storage, i) is not None, i


@BOTH_SOURCES
def test_a_blank_document_deleted_after_a_rollback_stays_deleted_when_the_rollback_is_rolled_forward(
    tmp_path: Path, source: str
) -> None:
    """A second `rollback` moves forward again, from the application's own collection to the newer target,
    carrying back what the application wrote meanwhile. A blank document it deleted there must not stay
    served from the target, which kept its point (the model checker's history: only the older collection
    held the blank point, and that was read as a dead letter an earlier version never kept)."""
    config = migration(tmp_path, source, {i: ("" if i == 1 else f"note {i}") for i in range(1, DOCS + 1)})
    storage = tmp_path / "qdrant"
    config.write_text(config.read_text().replace("max_dead_letters = 0", "max_dead_letters = 1"))
    invoke("run", "-c", str(config))
    invoke("cutover", "-c", str(config))
    assert invoke("rollback", "-c", str(config))["target"] == "notes"
    with_client(storage, lambda c: c.delete(ALIAS, models.PointIdsList(points=[1]), wait=True))

    forward = invoke("rollback", "-c", str(config))  # the last move was a rollback: this undoes it
    assert forward["target"] != "notes" and forward["changed"]
    assert point(storage, 1) is None
    for i in range(2, DOCS + 1):
        assert point(storage, i) is not None, i
