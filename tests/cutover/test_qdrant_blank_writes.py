"""After a Qdrant flip, a text the application blanks or writes empty through the alias is a dead letter of
what the alias serves: counted once, its point kept (payload and other vectors, less the vector of a text it
no longer has), cleared when the application gives it a text or deletes it, and never brought back from the
collection the run read (issue 41, items 1 and 2). The application uses its ordinary qdrant-client calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qdrant_client import QdrantClient, models

from reindex import commands
from reindex.config import load
from reindex.flip import choreography, window
from tests.cutover.test_qdrant_after_flip import (
    ALIAS,
    BOTH_SOURCES,
    DOCS,
    NEW,
    OLD,
    invoke,
    migration,
    upsert,
    vector,
    with_client,
)


def point(storage: Path, point_id: int) -> models.Record | None:
    """The point the alias serves under this id, with its payload and vectors; None where there is none."""
    client = QdrantClient(path=str(storage))
    try:
        found = client.retrieve(ALIAS, [point_id], with_payload=True, with_vectors=True)
    finally:
        client.close()
    return found[0] if found else None


def served_vector(record: models.Record) -> list[float] | None:
    """The unnamed vector the point serves, or None where it has none."""
    value = record.vector
    if isinstance(value, dict):
        return value.get("") or None  # type: ignore[return-value]
    return value or None  # type: ignore[return-value]


def cut_over(tmp_path: Path, source: str) -> tuple[Path, Path]:
    """Ten notes migrated and cut over, the config reading `source`: (config, the Qdrant storage)."""
    config = migration(tmp_path, source)
    invoke("run", "-c", str(config))
    invoke("cutover", "-c", str(config))
    return config, tmp_path / "qdrant"


def blank(storage: Path, point_id: int, text: str = "") -> None:
    with_client(storage, lambda c: c.set_payload(ALIAS, {"text": text}, points=[point_id], wait=True))


@BOTH_SOURCES
def test_a_text_blanked_through_the_alias_stays_blank_kept_and_dead_lettered_once(
    tmp_path: Path, source: str
) -> None:
    config, storage = cut_over(tmp_path, source)
    with_client(storage, lambda c: c.set_payload(ALIAS, {"text": "", "acl": ["ops"]}, points=[4], wait=True))

    assert invoke("verify", "-c", str(config), exit_code=3)["stale"] == 1  # its vector is of a text now gone
    report = invoke("sync", "-c", str(config))
    assert (report["deleted"], report["dead_letters"]) == (0, 1)
    kept = point(storage, 4)
    assert kept is not None and kept.payload == {"text": "", "acl": ["ops"]} | _bookkeeping(kept.payload)
    assert served_vector(kept) is None  # what the application sees: its point, with no vector to search by

    verified = invoke("verify", "-c", str(config), exit_code=3)  # max_dead_letters = 0
    assert (verified["dead_letters"], verified["missing"], verified["stale"]) == (1, 0, 0)
    retried = invoke("dlq", "retry", "-c", str(config))
    assert retried["total"] == 1 and retried["vanished"] == 0
    invoke("sync", "-c", str(config))
    again = point(storage, 4)
    assert again is not None and (again.payload or {})["text"] == ""  # the old text never comes back
    assert invoke("verify", "-c", str(config), exit_code=3)["dead_letters"] == 1  # counted once

    blank(storage, 4, "note 4, written again")  # the application fixes it: embedded, the letter cleared
    assert invoke("sync", "-c", str(config))["added"] == 1
    fixed = point(storage, 4)
    assert fixed is not None and (fixed.payload or {})["acl"] == ["ops"]
    assert np.allclose(served_vector(fixed) or [], vector(NEW, "note 4, written again"), atol=1e-6)
    assert invoke("verify", "-c", str(config), "--sample", "20")["complete"]
    assert invoke("dlq", "list", "-c", str(config))["total"] == 0


@BOTH_SOURCES
def test_a_point_upserted_blank_through_the_alias_is_a_dead_letter_not_a_served_vector(
    tmp_path: Path, source: str
) -> None:
    config, storage = cut_over(tmp_path, source)
    written = models.PointStruct(id=12, vector=vector(NEW, "anything"), payload={"text": "  "})
    with_client(storage, lambda c: c.upsert(ALIAS, [written], wait=True))

    verified = invoke("verify", "-c", str(config), exit_code=3)
    assert verified["stale"] == 1 and not verified["complete"]
    invoke("sync", "-c", str(config))
    kept = point(storage, 12)
    assert kept is not None and (kept.payload or {})["text"] == "  " and served_vector(kept) is None
    verified = invoke("verify", "-c", str(config), exit_code=3)
    assert (verified["dead_letters"], verified["stale"], verified["missing"]) == (1, 0, 0)
    with_client(storage, lambda c: c.delete(ALIAS, models.PointIdsList(points=[12]), wait=True))
    invoke("sync", "-c", str(config))
    assert point(storage, 12) is None
    assert invoke("verify", "-c", str(config))["complete"]
    assert invoke("dlq", "list", "-c", str(config))["total"] == 0


@BOTH_SOURCES
def test_a_dead_letter_fixed_and_then_deleted_through_the_alias_is_cleared_and_stays_gone(
    tmp_path: Path, source: str
) -> None:
    """The model checker's failure at REINDEX_SOAK=10: a blank note dead-lettered by the run, given a text
    through the alias and deleted again, came back as a dead letter read from the collection the run read."""
    texts = {i: f"note {i}" for i in range(1, DOCS + 1)} | {6: ""}
    config = migration(tmp_path, source, texts)
    storage = tmp_path / "qdrant"
    invoke("run", "-c", str(config))
    invoke("cutover", "-c", str(config), "--force")  # a dead letter past max_dead_letters = 0
    kept = point(storage, 6)  # the application still sees its blank note through the alias
    assert kept is not None and (kept.payload or {})["text"] == "" and served_vector(kept) is None
    assert invoke("verify", "-c", str(config), exit_code=3)["dead_letters"] == 1

    blank(storage, 6, "note 6, at last")
    with_client(storage, lambda c: c.delete(ALIAS, models.PointIdsList(points=[6]), wait=True))
    invoke("sync", "-c", str(config))
    assert point(storage, 6) is None
    assert invoke("verify", "-c", str(config))["complete"]
    assert invoke("dlq", "list", "-c", str(config))["total"] == 0
    invoke("dlq", "retry", "-c", str(config))
    assert point(storage, 6) is None


@BOTH_SOURCES
def test_a_note_fixed_before_the_flip_and_deleted_through_the_alias_after_it_stays_gone(
    tmp_path: Path, source: str
) -> None:
    texts = {i: f"note {i}" for i in range(1, DOCS + 1)} | {6: ""}
    config = migration(tmp_path, source, texts)
    storage = tmp_path / "qdrant"
    invoke("run", "-c", str(config))
    with_client(storage, lambda c: upsert(c, OLD, {6: "note 6, fixed before the flip"}))
    assert invoke("cutover", "-c", str(config), "--sync")["changed"]
    with_client(storage, lambda c: c.delete(ALIAS, models.PointIdsList(points=[6]), wait=True))
    for _ in range(2):
        invoke("sync", "-c", str(config))
        assert point(storage, 6) is None
    assert invoke("verify", "-c", str(config))["complete"]


def _bookkeeping(payload: object) -> dict[str, object]:
    """The tool's own keys of a point's payload (reindex_*), which the application's comparison leaves out."""
    assert isinstance(payload, dict)
    return {k: v for k, v in payload.items() if k.startswith("reindex_")}


@BOTH_SOURCES
def test_the_carry_over_after_a_killed_cutover_never_writes_over_a_field_the_application_set_since(
    tmp_path: Path, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 3: note 5 is edited in the old collection in the window, the cutover dies right after the flip,
    and the application then revokes note 5's ACL through the alias, leaving its text as it was. The
    carry-over compared hash and text only and wrote the old point over the revocation."""
    texts = {i: f"note {i}" for i in range(1, DOCS + 1)}
    config = migration(tmp_path, source, texts)
    storage = tmp_path / "qdrant"
    with_client(storage, lambda c: c.set_payload(ALIAS, {"acl": ["staff"]}, points=[5], wait=True))
    invoke("run", "-c", str(config))
    original_take = window.Settled.take

    def take(self: window.Settled, m: Any, *args: Any) -> None:  # the window: the alias still serves `notes`
        original_take(self, m, *args)
        m.sink._client.set_payload("notes", {"text": "note 5, edited in the window"}, points=[5], wait=True)

    def killed(*args: Any) -> Any:
        raise KeyboardInterrupt  # the process dies right after the flip

    monkeypatch.setattr(window.Settled, "take", take)
    monkeypatch.setattr(choreography, "after_flip", killed)
    with pytest.raises(KeyboardInterrupt):
        commands.cutover(load(config), sync=True)
    monkeypatch.undo()
    with_client(storage, lambda c: c.set_payload(ALIAS, {"acl": []}, points=[5], wait=True))  # revoked

    report = invoke("sync", "-c", str(config))
    assert report["after_flip"]["kept"] == 1  # the application's later write stands
    kept = point(storage, 5)
    assert kept is not None and (kept.payload or {})["acl"] == []
    text = (kept.payload or {})["text"]
    assert np.allclose(served_vector(kept) or [], vector(NEW, text), atol=1e-6)
    assert invoke("verify", "-c", str(config), "--sample", "20")["complete"]


def test_a_blank_note_deleted_while_rolled_back_is_not_served_again_by_the_roll_forward(
    tmp_path: Path,
) -> None:
    texts = {i: f"note {i}" for i in range(1, DOCS + 1)} | {6: ""}
    config = migration(tmp_path, ALIAS, texts)
    storage = tmp_path / "qdrant"
    invoke("run", "-c", str(config))
    invoke("cutover", "-c", str(config), "--force")  # the blank note's point is kept in the new collection
    assert invoke("rollback", "-c", str(config))["target"] == "notes"
    with_client(storage, lambda c: c.delete(ALIAS, models.PointIdsList(points=[6]), wait=True))
    invoke("sync", "-c", str(config))
    assert invoke("verify", "-c", str(config))["complete"]  # no dead letter left: max_dead_letters = 0 holds
    assert invoke("cutover", "-c", str(config), "--sync")["changed"]
    assert point(storage, 6) is None
    assert invoke("verify", "-c", str(config))["complete"]


@BOTH_SOURCES
def test_a_dead_letter_fixed_in_the_window_and_deleted_through_the_alias_after_the_cutover_stays_gone(
    tmp_path: Path, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = {i: f"note {i}" for i in range(1, DOCS + 1)} | {6: ""}
    config = migration(tmp_path, source, texts)
    storage = tmp_path / "qdrant"
    invoke("run", "-c", str(config))
    original_take = window.Settled.take

    def take(self: window.Settled, m: Any, *args: Any) -> None:  # the window: the alias still serves `notes`
        original_take(self, m, *args)
        m.sink._client.set_payload("notes", {"text": "note 6, fixed in the window"}, points=[6], wait=True)

    monkeypatch.setattr(window.Settled, "take", take)
    moved = invoke("cutover", "-c", str(config), "--sync", "--force")  # one dead letter, max 0
    monkeypatch.undo()
    assert moved["after_flip"]["carried"] == 1
    fixed = point(storage, 6)
    assert fixed is not None and np.allclose(
        served_vector(fixed) or [], vector(NEW, "note 6, fixed in the window"), atol=1e-6
    )
    assert invoke("dlq", "list", "-c", str(config))["total"] == 0
    with_client(storage, lambda c: c.delete(ALIAS, models.PointIdsList(points=[6]), wait=True))
    for _ in range(2):
        invoke("sync", "-c", str(config))
        assert point(storage, 6) is None
    assert invoke("verify", "-c", str(config))["complete"]


@BOTH_SOURCES
def test_a_field_set_and_a_blank_note_deleted_in_the_window_are_carried_over(
    tmp_path: Path, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the model checker: the carry-over read the old collection's texts only, so a field set in
    the window was lost, and a blank note (kept without a vector) deleted in the window came back."""
    texts = {i: f"note {i}" for i in range(1, DOCS + 1)} | {6: ""}
    config = migration(tmp_path, source, texts)
    storage = tmp_path / "qdrant"
    invoke("run", "-c", str(config))
    original_take = window.Settled.take

    def take(self: window.Settled, m: Any, *args: Any) -> None:  # the window: the alias still serves `notes`
        original_take(self, m, *args)
        m.sink._client.set_payload("notes", {"acl": ["ops"]}, points=[3], wait=True)
        m.sink._client.delete("notes", models.PointIdsList(points=[6]), wait=True)

    monkeypatch.setattr(window.Settled, "take", take)
    moved = invoke("cutover", "-c", str(config), "--sync", "--force")
    monkeypatch.undo()
    assert (moved["after_flip"]["carried"], moved["after_flip"]["deleted"]) == (1, 1)
    tagged = point(storage, 3)
    assert tagged is not None and (tagged.payload or {})["acl"] == ["ops"]
    assert np.allclose(served_vector(tagged) or [], vector(NEW, "note 3"), atol=1e-6)
    assert point(storage, 6) is None
    assert invoke("verify", "-c", str(config), "--sample", "20")["complete"]
