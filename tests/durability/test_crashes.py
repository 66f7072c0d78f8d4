"""Kill the real `reindex run` and prove nothing is lost, duplicated or silently wrong.

The test process owns the database (pgserver) and the Qdrant folder; only the tool is killed.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psycopg
import pytest
from psycopg import sql

from reindex.crashpoints import POINTS
from reindex_adapters.testing.memory import HashEmbedder
from tests.durability.support import (
    POISON_REASONS,
    Tool,
    assert_crashed,
    config_text,
    fresh_vector,
    report_figure,
    write_corpus,
)

SHARD = 25
Stored = dict[str, list[np.ndarray]]  # id -> every vector stored under it (more than one = duplicate)


@pytest.fixture(params=["pgvector", "qdrant"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Callable[[str], Stored]]:
    """The [target] section and a reader of everything the target stores."""
    if request.param == "pgvector":
        dsn = request.getfixturevalue("pg_dsn")
        return f'kind = "pgvector"\ndsn = "{dsn}"\nalias = "docs"', pg_reader(dsn)

    path = tmp_path / "qdrant"

    def read_qdrant(target: str) -> Stored:
        from qdrant_client import QdrantClient

        stored: Stored = {}
        if not path.exists():
            return stored
        client = QdrantClient(path=str(path))
        try:
            if not client.collection_exists(target):
                return stored
            offset = None
            while True:
                points, offset = client.scroll(target, limit=1000, offset=offset, with_vectors=True)
                for point in points:
                    assert point.payload is not None
                    stored.setdefault(point.payload["reindex_id"], []).append(np.asarray(point.vector))
                if offset is None:
                    return stored
        finally:
            client.close()

    return f'kind = "qdrant"\npath = "{path}"\nalias = "docs"', read_qdrant


def pg_reader(dsn: str) -> Callable[[str], Stored]:
    """A reader of everything a pgvector target stores: id -> every vector under it."""

    def read_pg(target: str) -> Stored:
        stored: Stored = {}
        with psycopg.connect(dsn) as conn:
            from pgvector.psycopg import register_vector

            register_vector(conn)
            exists = conn.execute("SELECT to_regclass(%s)", [target]).fetchone()
            if exists is None or exists[0] is None:
                return stored
            for doc_id, vector in conn.execute(
                sql.SQL("SELECT id, embedding FROM {}").format(sql.Identifier(target))
            ):
                stored.setdefault(doc_id, []).append(_array(vector))
        return stored

    return read_pg


def _array(vector: object) -> np.ndarray:
    return np.asarray(vector.to_numpy() if hasattr(vector, "to_numpy") else vector, dtype=np.float32)


def make_tool(tmp_path: Path, target: str, n: int = 5000, **options: object) -> tuple[Tool, dict[str, str]]:
    corpus = tmp_path / "docs.jsonl"
    texts = write_corpus(corpus, n, poison=True)
    state = tmp_path / "state.db"
    config = tmp_path / "reindex.toml"
    config.write_text(config_text(corpus=corpus, state=state, target=target, shard_size=SHARD, **options))  # type: ignore[arg-type]
    return Tool(config, state), texts


def assert_exact_coverage(tool: Tool, read: Callable[[str], Stored], texts: dict[str, str]) -> None:
    report = tool.json("verify")
    assert report["complete"], report
    stored = read(report["target"])
    assert set(stored) == set(texts), "target ids must equal source ids minus dead letters"
    assert all(len(vectors) == 1 for vectors in stored.values()), "no duplicates"
    embedder = HashEmbedder(dim=16, max_tokens=128)
    for doc_id, text in texts.items():
        expected = fresh_vector(embedder, text)
        got = stored[doc_id][0]
        np.testing.assert_allclose(got / np.linalg.norm(got), expected, atol=1e-5)
    letters = {d["doc_id"]: d["reason"] for d in tool.json("dlq", "list")["dead_letters"]}
    assert {k: v for k, v in letters.items() if k.startswith("p-")} == POISON_REASONS
    assert sorted(v for k, v in letters.items() if k.startswith("line:")) == ["invalid_json", "missing_id"]
    status = tool.json("status")
    assert status["reconciled"] and status["state"] == "complete"


def test_sigkill_at_random_instants_then_resume_ends_exact(tmp_path: Path, backend) -> None:
    target, read = backend
    tool, texts = make_tool(tmp_path, target, latency_ms=6)
    rng = np.random.default_rng(20261129)
    target_name = tool.json("plan", "--no-calibrate")["target"]
    kills, redone = 0, []
    while kills < 10:
        process = tool.start("run")
        if not tool.kill_after_progress(process, rng, deadline=120):
            pytest.fail(f"the run finished after only {kills} kills; make the corpus larger")
        kills += 1
        stored = read(target_name)
        in_target = sum(1 for i in stored if i in texts)  # rows the target holds now
        marked = _marked_written(tool)
        assert in_target >= marked, "a shard was marked written before its vectors were durable"
        # the shard being recorded and the one being written (reindex/run/pipeline.py `_write_all`)
        assert in_target - marked <= 2 * SHARD, "more than the two shards in flight were unmarked"
        redone.append(in_target - marked)
    code, _, err = tool.run("run")
    assert code == 0, err
    assert_exact_coverage(tool, read, texts)
    report_figure(f"sigkill_loop[{target.split()[2]}]", {"kills": kills, "redone_documents_per_kill": redone})


def _marked_written(tool: Tool) -> int:
    import sqlite3

    with sqlite3.connect(f"file:{tool.state}?mode=ro", uri=True) as db:
        return int(db.execute("SELECT coalesce(sum(written), 0) FROM shards").fetchone()[0])


@pytest.mark.parametrize("point", [p for p in POINTS if not p.startswith(("cutover", "job", "model"))])
def test_named_crash_points_in_a_run_resume_to_a_verified_end(tmp_path: Path, backend, point: str) -> None:
    target, read = backend
    tool, texts = make_tool(tmp_path, target, n=600, latency_ms=0)
    nth = 1 if point == "before_finalize" else 3  # a run finalizes once
    code, _, err = tool.run("run", env={"REINDEX_CRASH_AT": f"{point}:{nth}"})
    assert_crashed(code, err)
    code, _, err = tool.run("run")
    assert code == 0, err
    assert_exact_coverage(tool, read, texts)


@pytest.mark.parametrize("point", ["after_embed", "mid_write", "after_write"])
def test_named_crash_points_in_one_process_on_pgvector(tmp_path: Path, pg_dsn: str, point: str) -> None:
    """`[run] workers = 1`: the one-process pipeline, which a crash point kills whole."""
    tool, texts = make_tool(
        tmp_path, f'kind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "docs"', n=600, latency_ms=0
    )
    tool.config.write_text(tool.config.read_text() + "workers = 1\n")
    code, _, err = tool.run("run", env={"REINDEX_CRASH_AT": f"{point}:3"})
    assert code == -signal.SIGKILL, err
    code, _, err = tool.run("run")
    assert code == 0, err
    assert_exact_coverage(tool, pg_reader(pg_dsn), texts)


@pytest.mark.parametrize("point", ["after_embed", "mid_write", "after_write"])
def test_named_crash_points_in_worker_processes_on_pgvector(tmp_path: Path, pg_dsn: str, point: str) -> None:
    """`[run] workers = 2`: the processes engine, where a crash point kills a worker and the run ends (75)
    naming it and the shards it held."""
    tool, texts = make_tool(
        tmp_path, f'kind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "docs"', n=600, latency_ms=0
    )
    tool.config.write_text(tool.config.read_text() + "workers = 2\n")
    code, _, err = tool.run("run", env={"REINDEX_CRASH_AT": f"{point}:3"})
    assert code == 75 and "died (killed by SIGKILL) with shard(s)" in err, err
    stored = pg_reader(pg_dsn)(tool.json("plan", "--no-calibrate")["target"])
    assert sum(1 for i in stored if i in texts) >= _marked_written(tool), "marked before it was written"
    code, _, err = tool.run("run")
    assert code == 0, err
    assert_exact_coverage(tool, pg_reader(pg_dsn), texts)


@pytest.mark.parametrize("point", ["cutover_after_intent", "cutover_before_commit", "cutover_after_move"])
def test_crash_during_cutover_is_resolved_by_rerunning_it(tmp_path: Path, backend, point: str) -> None:
    target, _ = backend
    tool, _ = make_tool(tmp_path, target, n=200, latency_ms=0)
    assert tool.run("run")[0] == 0
    code, _, err = tool.run("cutover", env={"REINDEX_CRASH_AT": point})
    assert code == -signal.SIGKILL, err
    code, _, err = tool.run("cutover")
    assert code == 0, err
    status = tool.json("status")
    assert status["is_live"]
    assert [h["state"] for h in status["history"]][-1] == "done"
    assert all(h["state"] in ("done", "aborted") for h in status["history"])


def test_sigterm_exits_75_quickly_and_resumes(tmp_path: Path, backend) -> None:
    target, read = backend
    tool, texts = make_tool(tmp_path, target, latency_ms=40)
    process = tool.start("run")
    while tool.ledger_written()[0] < 2 and process.poll() is None:
        time.sleep(0.05)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    elapsed = time.monotonic() - sent
    assert process.returncode == 75, err
    assert elapsed < 25, f"took {elapsed:.1f}s to stop"
    report_figure(f"sigterm_exit_seconds[{target.split()[2]}]", round(elapsed, 2))
    code, _, err = tool.run("run", env={})
    assert code == 0, err
    assert_exact_coverage(tool, read, texts)


def test_second_run_of_the_same_migration_is_refused(tmp_path: Path, backend) -> None:
    target, _ = backend
    tool, _ = make_tool(tmp_path, target, latency_ms=40)
    first = tool.start("run")
    while tool.ledger_written()[0] < 1 and first.poll() is None:
        time.sleep(0.05)
    code, _, err = tool.run("run")
    first.send_signal(signal.SIGKILL)
    first.communicate()
    assert code == 1 and "another `reindex run`" in err


def test_terminated_connections_never_lose_a_vector(tmp_path: Path, pg_dsn: str) -> None:
    tool, texts = make_tool(tmp_path, f'kind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "docs"', latency_ms=10)
    stop = threading.Event()

    def terminate_backends() -> None:
        while not stop.wait(0.4):
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )

    killer = threading.Thread(target=terminate_backends, daemon=True)
    killer.start()
    codes = []
    try:
        for _ in range(20):
            code, _, err = tool.run("run")
            codes.append(code)
            assert code in (0, 75), err
            if code == 0:
                break
    finally:
        stop.set()
        killer.join()
    assert codes[-1] == 0 or tool.run("run")[0] == 0

    def read(target: str) -> Stored:
        stored: Stored = {}
        with psycopg.connect(pg_dsn) as conn:
            from pgvector.psycopg import register_vector

            register_vector(conn)
            for doc_id, vector in conn.execute(
                sql.SQL("SELECT id, embedding FROM {}").format(sql.Identifier(target))
            ):
                stored.setdefault(doc_id, []).append(_array(vector))
        return stored

    assert_exact_coverage(tool, read, texts)
