"""A run whose Postgres lease vanishes stops (exit 75) instead of writing on; the rerun ends exact.

The real `reindex run` as a subprocess, a Postgres ledger and a pgvector target: the lease's connection is
terminated, or the whole server restarts, while shards are being recorded.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.durability.support import Tool, write_corpus

DOCUMENTS = 1200


@pytest.fixture
def own_server() -> Iterator[Any]:
    """A pgserver instance of this test's own: restarting it must not disturb the session's server."""
    import pgserver

    data = Path(tempfile.mkdtemp(prefix="reindex-test-restart-pg-"))
    data.chmod(0o755)  # as root, pgserver runs postgres as its own user
    server = pgserver.get_server(data, cleanup_mode="stop")
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    yield server
    _pg_ctl(server, "-m", "immediate", "stop")  # pgserver's cleanup only knows the postmaster it started
    server.cleanup()
    shutil.rmtree(data, ignore_errors=True)


def _pg_ctl(server: Any, *args: str) -> None:
    from pgserver._commands import pg_ctl

    pg_ctl(["-w", *args], pgdata=server.pgdata, user=server.system_user, timeout=60)


def _restart(server: Any) -> None:
    """Stop (fast: every session is cut) and start again on the same socket, as pg_ctl does in production."""
    _pg_ctl(server, "-m", "fast", "-l", str(server.log), "restart")


def _tool(tmp_path: Path, dsn: str) -> tuple[Tool, dict[str, str]]:
    """A Postgres source table, the hash embedder (slowed so the run lasts seconds), a pgvector target and
    the ledger, all in one database."""
    texts = write_corpus(tmp_path / "docs.jsonl", DOCUMENTS)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE docs (id text PRIMARY KEY, body text NOT NULL)")
        with conn.cursor().copy("COPY docs (id, body) FROM STDIN") as copy:
            for row in texts.items():
                copy.write_row(row)
    config = tmp_path / "reindex.toml"
    config.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{dsn}"\ntable = "docs"\npage_size = 100\n\n'
        '[embedder]\nkind = "hash"\ndim = 16\nmax_tokens = 128\nlatency_ms = 30\n\n'
        f'[target]\nkind = "pgvector"\ndsn = "{dsn}"\nalias = "docs"\naccept = ["table_statements", "column_order"]\n\n'
        f'[run]\nstate = "{dsn}"\nshard_size = 20\nbatch_tokens = 2048\n'
    )
    return Tool(config, tmp_path / "unused.db"), texts


def _recorded(dsn: str) -> int:
    """Documents the ledger holds as written (0 before its schema exists or while the server is down)."""
    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            row = conn.execute("SELECT coalesce(sum(documents), 0) FROM reindex.shards").fetchone()
    except psycopg.Error:
        return 0
    assert row is not None
    return int(row[0])


def _wait_for_progress(process: subprocess.Popen[str], dsn: str, seconds: float = 60) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        recorded = _recorded(dsn)
        if recorded >= 100:
            return recorded
        time.sleep(0.05)
    _, err = process.communicate() if process.poll() is not None else ("", "")
    raise AssertionError(f"no progress before the fault (exit {process.returncode}): {err[-2000:]}")


def _assert_exact(tool: Tool, dsn: str, texts: dict[str, str]) -> None:
    report = tool.json("verify")
    assert report["complete"], report
    status = tool.json("status")
    assert status["state"] == "complete" and status["reconciled"], status
    assert status["written"] + status["duplicates"] == len(texts)
    with psycopg.connect(dsn) as conn:
        seqs = [r[0] for r in conn.execute("SELECT seq FROM reindex.shards ORDER BY seq")]
        holders = conn.execute("SELECT count(*) FROM reindex.leases").fetchone()
    assert seqs == list(range(len(seqs))), "the shards form one contiguous prefix"
    assert holders == (0,), "a run that ends releases its lease"


def test_a_run_whose_lease_connection_is_terminated_exits_75_within_seconds_and_a_rerun_ends_exact(
    tmp_path: Path, pg_dsn: str
) -> None:
    tool, texts = _tool(tmp_path, pg_dsn)
    process = tool.start("run")
    try:
        _wait_for_progress(process, pg_dsn)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            terminated = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'reindex-lease' AND datname = current_database()"
            ).fetchall()
        started = time.monotonic()
        assert terminated == [(True,)]
        _, err = process.communicate(timeout=30)
        stopped_after = time.monotonic() - started
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 75, err
    assert stopped_after < 10, stopped_after
    assert "lease" in err
    assert _recorded(pg_dsn) < len(texts), "the run stopped before its end"
    code, _, err = tool.run("run", timeout=180)
    assert code == 0, err
    _assert_exact(tool, pg_dsn, texts)


def test_a_ledger_server_restart_mid_run_stops_or_finishes_the_run_and_a_rerun_loses_nothing(
    tmp_path: Path, own_server: Any
) -> None:
    dsn = own_server.get_uri()
    tool, texts = _tool(tmp_path, dsn)
    process = tool.start("run")
    try:
        _wait_for_progress(process, dsn)
        _restart(own_server)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode in (0, 75), err
    code, _, err = tool.run("run", timeout=180)
    assert code == 0, err
    _assert_exact(tool, dsn, texts)
