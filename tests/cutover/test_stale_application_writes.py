"""A write embedded with the old model reaching the new target through the alias (in flight at the flip, or
from a writer that does not follow the README's lock protocol), and a text rewritten in place under its old
vector (Qdrant's `overwrite_payload`, which strips the tool's bookkeeping). The old model has the new one's
dimension, so nothing refuses the write and the text's hash is right: only a fresh embedding tells. Verify
re-embeds the rows the application wrote and calls such a row stale; sync re-embeds it instead of adopting
it; a row written with the new model is still adopted as it is."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector
from qdrant_client import QdrantClient, models
from typer.testing import CliRunner

from reindex import commands
from reindex.config import Config, load
from reindex.flip import choreography, window
from reindex.ui.cli import app
from reindex_adapters.testing.memory import HashEmbedder
from tests.clients.support import aliased_collection

DIM = 16
OLD, NEW = HashEmbedder(dim=DIM, seed="the old model"), HashEmbedder(dim=DIM)  # same dimension
ALIAS = "notes_live"
NOTES = 30


def vector(model: HashEmbedder, text: str) -> np.ndarray:
    return model.embed(model.tokenize([text]))[0]


def uid(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, name))


def unit(values: Any) -> np.ndarray:
    array = np.asarray(values, dtype=np.float32)
    return array / np.linalg.norm(array)


# Qdrant --------------------------------------------------------------------------------------------------


def upsert(client: QdrantClient, model: HashEmbedder, texts: dict[str, str]) -> None:
    """The application's write through the alias: text and vector together, its own payload only."""
    points = [
        models.PointStruct(id=uid(n), vector=vector(model, t).tolist(), payload={"text": t})
        for n, t in texts.items()
    ]
    client.upsert(ALIAS, points, wait=True)


def served(config: Config) -> dict[str, tuple[str, np.ndarray]]:
    client = QdrantClient(path=str(config.path.parent / "qdrant"))
    try:
        points, _ = client.scroll(ALIAS, limit=1000, with_payload=True, with_vectors=True)
    finally:
        client.close()
    return {str(p.id): ((p.payload or {})["text"], unit(p.vector)) for p in points}


def write(config: Config, change: Any) -> None:
    """Write through the alias from outside the tool (local storage takes one client at a time)."""
    client = QdrantClient(path=str(config.path.parent / "qdrant"))
    try:
        change(client)
    finally:
        client.close()


@pytest.fixture
def notes(tmp_path: Path) -> Config:
    storage = tmp_path / "qdrant"
    aliased_collection(storage, "notes", ALIAS, DIM)
    client = QdrantClient(path=str(storage))
    upsert(client, OLD, {f"n{i}": f"note {i}" for i in range(NOTES)})
    client.close()
    path = tmp_path / "notes.toml"
    path.write_text(
        f'[source]\nkind = "qdrant"\npath = "{storage}"\ncollection = "{ALIAS}"\ntext_field = "text"\n\n'
        f'[embedder]\nkind = "hash"\ndim = {DIM}\n\n'
        f'[target]\nkind = "qdrant"\npath = "{storage}"\nalias = "{ALIAS}"\n\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 16\n'
    )
    config = load(path)
    assert commands.run(config).reconciled
    return config


def assert_every_note_has_the_new_models_vector(config: Config, expected: dict[str, str]) -> None:
    now = served(config)
    assert sorted(now) == sorted(uid(n) for n in expected)
    for name, text in expected.items():
        assert now[uid(name)][0] == text, name
        np.testing.assert_allclose(now[uid(name)][1], unit(vector(NEW, text)), atol=1e-6, err_msg=name)


def test_an_old_model_write_in_flight_at_the_flip_is_stale_until_sync_re_embeds_it(
    notes: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = window.after_flip

    def in_flight(m: Any, *args: Any) -> Any:  # the alias serves the new target; this writer is not told
        upsert(
            m.sink._client, OLD, {"n2": "note 2, edited on the old model", "q": "note q, on the old model"}
        )
        upsert(m.sink._client, NEW, {"p": "note p, written with the new model"})
        return original(m, *args)

    monkeypatch.setattr(choreography, "after_flip", in_flight)
    assert commands.cutover(notes, sync=True).changed
    monkeypatch.undo()

    report = commands.verify(notes)
    assert not report.complete and (report.stale, report.missing, report.application_rows) == (2, 0, 3)
    assert sorted(report.examples["stale"]) == sorted([uid("n2"), uid("q")])
    assert report.application_check is not None
    assert (report.application_check["checked"], report.application_check["stale"]) == (3, 2)

    synced = commands.sync(notes)
    assert (synced.changed, synced.adopted) == (2, 1)  # p, written with the new model, is adopted as it is
    report = commands.verify(notes)
    assert report.complete and report.application_rows == 1
    expected = {f"n{i}": f"note {i}" for i in range(NOTES)}
    expected |= {"n2": "note 2, edited on the old model", "q": "note q, on the old model"}
    expected |= {"p": "note p, written with the new model"}
    assert_every_note_has_the_new_models_vector(notes, expected)


@pytest.mark.parametrize("owner", ["tool", "application"])
def test_a_text_overwritten_in_place_under_its_old_vector_is_stale_until_sync_re_embeds_it(
    notes: Config, owner: str
) -> None:
    """`overwrite_payload` replaces the payload and keeps the vector: the tool's keys go with it, so the new
    text's hash reads as the point's own, whether the tool wrote the point or adopted the application's."""
    commands.cutover(notes)
    if owner == "application":
        write(notes, lambda client: upsert(client, NEW, {"n7": "note 7, written with the new model"}))
        assert commands.sync(notes).adopted == 1
    rewritten = "note 7, rewritten in place"
    write(
        notes,
        lambda client: client.overwrite_payload(ALIAS, {"text": rewritten}, points=[uid("n7")], wait=True),
    )

    report = commands.verify(notes)
    assert not report.complete and report.stale == 1 and report.examples["stale"] == [uid("n7")]
    shown = CliRunner().invoke(app, ["verify", "-c", str(notes.path)])
    assert shown.exit_code == 3 and "written by the application re-embedded: 1, 1 differ" in shown.stdout
    synced = commands.sync(notes)
    assert (synced.changed, synced.adopted) == (1, 0)
    assert commands.verify(notes).complete
    expected = {f"n{i}": f"note {i}" for i in range(NOTES)} | {"n7": rewritten}
    assert_every_note_has_the_new_models_vector(notes, expected)


def test_an_adopted_point_whose_vector_the_application_replaces_on_its_own_is_stale_until_sync(
    notes: Config,
) -> None:
    """`update_vectors` keeps the payload, the keys `adopt` stored with it: the hash still reads fresh."""
    commands.cutover(notes)
    text = "note 7, written with the new model"
    write(notes, lambda client: upsert(client, NEW, {"n7": text}))
    assert commands.sync(notes).adopted == 1
    old = models.PointVectors(id=uid("n7"), vector=vector(OLD, text).tolist())
    write(notes, lambda client: client.update_vectors(ALIAS, [old], wait=True))

    report = commands.verify(notes)
    assert not report.complete and report.examples["stale"] == [uid("n7")]
    assert commands.sync(notes).changed == 1
    assert commands.verify(notes).complete
    assert_every_note_has_the_new_models_vector(
        notes, {f"n{i}": f"note {i}" for i in range(NOTES)} | {"n7": text}
    )


# pgvector ------------------------------------------------------------------------------------------------


@pytest.fixture(params=["hash", "memory-batch"])
def docs(request: pytest.FixtureRequest, tmp_path: Path, pg_dsn: str) -> Config:
    """A pgvector migration; with a provider batch embedder (the hash one's vectors), verify's fresh
    embeddings go through one small job each, waited for, as sync's do."""
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(f"CREATE TABLE docs (id text PRIMARY KEY, body text NOT NULL, embedding vector({DIM}))")
        register_vector(conn)
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO docs VALUES (%s, %s, %s)",
                [(f"d{i}", f"document {i}", vector(OLD, f"document {i}")) for i in range(NOTES)],
            )
    path = tmp_path / "docs.toml"
    path.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{pg_dsn}"\ntable = "docs"\nid_column = "id"\ntext_column = "body"\n\n'
        f'[embedder]\nkind = "{request.param}"\ndim = {DIM}\n'
        + ("polls_to_finish = 1\n" if request.param == "memory-batch" else "")
        + f'\n[target]\nkind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "docs"\naccept = ["table_statements", "column_order"]\n\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 16\npoll_seconds = 0.01\n'
    )
    config = load(path)
    assert commands.run(config).reconciled
    return config


def test_an_old_model_write_through_the_view_without_the_lock_protocol_is_stale_until_sync(
    docs: Config, pg_dsn: str
) -> None:
    """A writer that embedded before the flip and writes after it, without locking the alias and reading
    its comment: the trigger fills the hash of its text, which is right; the vector is the old model's."""
    assert commands.cutover(docs, sync=True).changed
    with psycopg.connect(pg_dsn) as conn:
        register_vector(conn)
        conn.execute(
            "INSERT INTO docs (id, body, embedding) VALUES (%s, %s, %s)",
            ["x", "document x, on the old model", vector(OLD, "document x, on the old model")],
        )
        conn.execute(
            "UPDATE docs SET body = %s, embedding = %s WHERE id = 'd3'",
            ["document 3, edited on the old model", vector(OLD, "document 3, edited on the old model")],
        )
        conn.execute(
            "INSERT INTO docs (id, body, embedding) VALUES (%s, %s, %s)",
            ["y", "document y, on the new model", vector(NEW, "document y, on the new model")],
        )
        # written again with the text the tool embedded for it: the ledger names d5 the owner of that text,
        # and its stored hash is that text's, yet its vector must not be copied back
        conn.execute("DELETE FROM docs WHERE id = 'd5'")
        conn.execute(
            "INSERT INTO docs (id, body, embedding) VALUES (%s, %s, %s)",
            ["d5", "document 5", vector(OLD, "document 5")],
        )

    report = commands.verify(docs)
    assert not report.complete and (report.stale, report.missing, report.application_rows) == (3, 0, 4)
    assert sorted(report.examples["stale"]) == ["d3", "d5", "x"]
    assert commands.sync(docs).changed == 3
    report = commands.verify(docs)
    assert report.complete and report.application_rows == 1  # y stays the application's, as written

    expected = {f"d{i}": f"document {i}" for i in range(NOTES)}
    expected |= {"x": "document x, on the old model", "d3": "document 3, edited on the old model"}
    expected |= {"y": "document y, on the new model"}
    with psycopg.connect(pg_dsn) as conn:
        register_vector(conn)
        now = {row[0]: (row[1], unit(row[2])) for row in conn.execute("SELECT id, body, embedding FROM docs")}
    assert sorted(now) == sorted(expected)
    for doc_id, text in expected.items():
        assert now[doc_id][0] == text
        np.testing.assert_allclose(now[doc_id][1], unit(vector(NEW, text)), atol=1e-6, err_msg=doc_id)
