"""An application writing at full pace (inserts, updates, deletes) through `run` and `cutover --sync`:
nothing it wrote is lost, nothing it deleted comes back, and every document ends with the new model's
vector of its latest text. The application follows the README's pattern: per write, lock the alias
against movers (ROW EXCLUSIVE), read which model it serves, embed with that model, write."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector
from typer.testing import CliRunner

from reindex.ui.cli import app
from reindex_adapters.testing.memory import HashEmbedder
from tests.durability.support import report_figure

pytestmark = pytest.mark.serial  # its writer must keep up 50 writes/s

runner = CliRunner()
OLD, NEW = HashEmbedder(dim=16), HashEmbedder(dim=24)
START = 400


def vector(model: HashEmbedder, text: str) -> np.ndarray:
    return model.embed(model.tokenize([text]))[0]


class Writer(threading.Thread):
    """Writes with whichever model the alias serves at that instant; remembers what must survive."""

    def __init__(self, dsn: str, fingerprint: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.fingerprint = dsn, fingerprint
        self.texts = {f"d{i}": f"document {i} first text" for i in range(START)}
        self.stop, self.writes, self.errors = threading.Event(), 0, []  # type: ignore[var-annotated]
        self.new_model_writes = 0
        self.written_after_flip: set[str] = set()  # the application's rows in the new target (trigger-filled)
        self.random = random.Random(11)

    def run(self) -> None:
        with psycopg.connect(self.dsn) as conn:
            register_vector(conn)
            serial = START
            while not self.stop.is_set():
                try:
                    serial = self._one(conn, serial)
                except psycopg.Error as exc:  # a write is never silently lost: it is retried
                    conn.rollback()
                    self.errors.append(str(exc).splitlines()[0])
                    if len(self.errors) > 50:
                        raise
                time.sleep(0.005)

    def _one(self, conn: psycopg.Connection, serial: int) -> int:
        with conn.transaction():
            conn.execute("LOCK TABLE docs IN ROW EXCLUSIVE MODE")
            comment = conn.execute("SELECT obj_description('docs'::regclass)").fetchone()[0]  # type: ignore[index]
            new = bool(comment) and json.loads(comment).get("fingerprint") == self.fingerprint
            model = NEW if new else OLD
            action = self.random.choice(("insert", "update", "update", "delete"))
            live = sorted(self.texts)
            if action == "insert" or not live:
                doc_id, serial = f"d{serial}", serial + 1
                text = f"document {doc_id} inserted at write {self.writes}"
                conn.execute(
                    "INSERT INTO docs (id, body, embedding) VALUES (%s, %s, %s)",
                    [doc_id, text, vector(model, text)],
                )
                self.texts[doc_id] = text
                if new:
                    self.written_after_flip.add(doc_id)
            elif action == "update":
                doc_id = self.random.choice(live)
                text = f"document {doc_id} edited at write {self.writes}"
                conn.execute(
                    "UPDATE docs SET body = %s, embedding = %s WHERE id = %s",
                    [text, vector(model, text), doc_id],
                )
                self.texts[doc_id] = text
                if new:
                    self.written_after_flip.add(doc_id)
            else:
                doc_id = self.random.choice(live)
                conn.execute("DELETE FROM docs WHERE id = %s", [doc_id])
                del self.texts[doc_id]
                self.written_after_flip.discard(doc_id)
        self.writes += 1
        self.new_model_writes += new
        return serial


def invoke(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def test_writes_during_run_and_cutover_sync_are_never_lost(tmp_path: Path, pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("CREATE TABLE docs (id text PRIMARY KEY, body text NOT NULL, embedding vector(16))")
        register_vector(conn)
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO docs VALUES (%s, %s, %s)",
                [
                    (f"d{i}", f"document {i} first text", vector(OLD, f"document {i} first text"))
                    for i in range(START)
                ],
            )
    config = tmp_path / "docs.toml"
    config.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{pg_dsn}"\ntable = "docs"\nid_column = "id"\ntext_column = "body"\n\n'
        '[embedder]\nkind = "hash"\ndim = 24\nlatency_ms = 60\n\n'  # a slow model: writes land mid-run
        f'[target]\nkind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "docs"\n'
        'accept = ["table_statements", "column_order"]\n\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 40\n'
    )
    fingerprint = invoke("plan", "-c", str(config), "--no-calibrate")["fingerprint"]
    writer = Writer(pg_dsn, fingerprint)
    started = time.monotonic()
    writer.start()
    invoke("run", "-c", str(config))
    moved = invoke("cutover", "-c", str(config), "--sync")
    time.sleep(1.0)  # the application goes on writing through the alias, with the new model
    writer.stop.set()
    writer.join(timeout=30)
    rate = writer.writes / (time.monotonic() - started)
    assert moved["changed"] and rate >= 50, f"{writer.writes} writes at {rate:.0f}/s"
    assert writer.new_model_writes > 10 and not writer.is_alive()

    with psycopg.connect(pg_dsn) as conn:
        register_vector(conn)
        served = {row[0]: (row[1], row[2]) for row in conn.execute("SELECT id, body, embedding FROM docs")}
    assert set(served) == set(writer.texts), "a write was lost, or a deleted document came back"
    for doc_id, text in writer.texts.items():
        body, stored = served[doc_id]
        assert body == text
        np.testing.assert_allclose(stored / np.linalg.norm(stored), vector(NEW, text), atol=1e-5)
    report = invoke("verify", "-c", str(config))
    assert report["complete"] and report["application_rows"] == len(writer.written_after_flip) > 0
    report_figure(
        "writes_through_cutover_sync",
        {
            "writes": writer.writes,
            "per_second": round(rate),
            "new_model_writes": writer.new_model_writes,
            "retried_errors": len(writer.errors),
            "documents_at_end": len(writer.texts),
        },
    )


# Qdrant -------------------------------------------------------------------------------------------------


class QdrantWriter(threading.Thread):
    """The same application on a Qdrant alias: per write, look up which collection the alias serves, embed
    with that model, upsert or delete through the alias. Nothing holds it back for the flip: a write that
    lands in the old collection after the final catch-up is carried over after the flip. A write whose
    lookup the flip overtook fails on the new collection's dimension and is made again, as an application
    retries a failed write."""

    def __init__(self, client: Any, old: str) -> None:
        super().__init__(daemon=True)
        self.client, self.old = client, old
        self.texts = {f"d{i}": f"document {i} first text" for i in range(START)}
        self.stop, self.writes, self.errors = threading.Event(), 0, []  # type: ignore[var-annotated]
        self.new_model_writes = 0
        self.random = random.Random(12)

    def run(self) -> None:
        serial = START
        while not self.stop.is_set():
            try:
                serial = self._one(serial)
            except Exception as exc:  # a write is never silently lost: it is made again
                self.errors.append(str(exc).splitlines()[0])
                if len(self.errors) > 50:
                    raise
            time.sleep(0.005)

    def _one(self, serial: int) -> int:
        from qdrant_client import models

        aliases = {a.alias_name: a.collection_name for a in self.client.get_aliases().aliases}
        new = aliases["docs"] != self.old
        model = NEW if new else OLD
        action = self.random.choice(("insert", "update", "update", "delete"))
        live = sorted(self.texts)
        if action == "delete" and live:
            doc_id = self.random.choice(live)
            self.client.delete("docs", models.PointIdsList(points=[qdrant_id(doc_id)]), wait=True)
            del self.texts[doc_id]
        else:
            if action == "insert" or not live:
                doc_id, serial = f"d{serial}", serial + 1
                text = f"document {doc_id} inserted at write {self.writes}"
            else:
                doc_id = self.random.choice(live)
                text = f"document {doc_id} edited at write {self.writes}"
            point = models.PointStruct(
                id=qdrant_id(doc_id),
                vector=vector(model, text).tolist(),
                payload={"doc": doc_id, "body": text},
            )
            self.client.upsert("docs", [point], wait=True)
            self.texts[doc_id] = text
        self.writes += 1
        self.new_model_writes += new
        return serial


class Serialized:
    """A client whose calls run one at a time, as a Qdrant server applies concurrent requests safely; local
    mode's in-process collections are not safe to write from two threads at once."""

    def __init__(self, client: Any) -> None:
        self._client, self._lock = client, threading.RLock()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._client, name)
        if not callable(found):
            return found

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return found(*args, **kwargs)

        return call


def qdrant_id(doc_id: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, doc_id))


def test_writes_during_run_and_cutover_sync_are_never_lost_on_qdrant(tmp_path: Path) -> None:
    from qdrant_client import models

    from reindex_adapters.qdrant.connection import acquire, clients, release
    from reindex_adapters.qdrant.sink import QdrantSink

    storage = ":memory:"  # one process-wide store; local storage on disk takes no writes from two threads
    config = tmp_path / "docs.toml"
    config.write_text(
        f'[source]\nkind = "qdrant"\npath = "{storage}"\ncollection = "docs"\ntext_field = "body"\n\n'
        '[embedder]\nkind = "hash"\ndim = 24\nlatency_ms = 60\n\n'
        f'[target]\nkind = "qdrant"\npath = "{storage}"\nalias = "docs"\n\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 40\n'
    )
    # the application's client is the one the tool's commands share in this process (local storage takes
    # one client at a time); held here, it stays open between the commands
    client, lease = acquire(QdrantSink.Config(kind="qdrant", path=storage, alias="docs"))
    clients[lease].client = client = Serialized(client)  # type: ignore[assignment]
    try:
        client.create_collection("docs_v1", models.VectorParams(size=16, distance=models.Distance.COSINE))
        client.update_collection_aliases(
            change_aliases_operations=[
                models.CreateAliasOperation(
                    create_alias=models.CreateAlias(collection_name="docs_v1", alias_name="docs")
                )
            ]
        )
        writer = QdrantWriter(client, "docs_v1")
        client.upsert(
            "docs",
            [
                models.PointStruct(
                    id=qdrant_id(d), vector=vector(OLD, t).tolist(), payload={"doc": d, "body": t}
                )
                for d, t in writer.texts.items()
            ],
            wait=True,
        )
        started = time.monotonic()
        writer.start()
        invoke("run", "-c", str(config))
        moved = invoke("cutover", "-c", str(config), "--sync")
        time.sleep(1.0)  # the application goes on writing through the alias, with the new model
        writer.stop.set()
        writer.join(timeout=30)
        rate = writer.writes / (time.monotonic() - started)
        assert moved["changed"] and moved["after_flip"]["read"] == "previous"
        assert rate >= 50, f"{writer.writes} writes at {rate:.0f}/s"
        assert writer.new_model_writes > 10 and not writer.is_alive()

        points, _ = client.scroll("docs", limit=10_000, with_payload=True, with_vectors=True)
        served = {str(p.id): p for p in points}
        assert set(served) == {qdrant_id(d) for d in writer.texts}, (
            "a write was lost, or a deleted one is back"
        )
        for doc_id, text in writer.texts.items():
            point = served[qdrant_id(doc_id)]
            assert (point.payload or {})["body"] == text
            np.testing.assert_allclose(np.asarray(point.vector), vector(NEW, text), atol=1e-5)
        assert invoke("verify", "-c", str(config))["complete"]
    finally:
        release(lease)
    report_figure(
        "writes_through_cutover_sync_qdrant",
        {
            "writes": writer.writes,
            "per_second": round(rate),
            "new_model_writes": writer.new_model_writes,
            "retried_errors": len(writer.errors),
            "carried_after_flip": moved["after_flip"]["carried"],
            "documents_at_end": len(writer.texts),
        },
    )
