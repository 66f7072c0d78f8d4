"""Faults on a local Ray: an embedding actor killed at a crash point, the driver killed with SIGKILL (node
losses: test_ray_cluster). Every case ends with verify complete, the ledger reconciled, no shard recorded
twice, and the target equal, id by id and vector by vector, to a local-engine run of the same source."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from reindex import commands
from reindex.config import Config
from tests.ray.test_ray_engine import config, corpus, same_target

ray = pytest.importorskip("ray", reason="the ray extra is installed by scripts/setup")


def complete_and_equal_to_local(tmp_path: Path, dsn: str, source: Path, cluster: Config) -> None:
    report = commands.run(cluster)  # a rerun finds nothing to do, or finishes what is left
    assert report.reconciled, report.to_json()
    assert commands.verify(cluster).complete
    status = commands.status(cluster)
    assert status.documents == sum(1 for line in source.read_text().splitlines() if line.strip())
    local = commands.run(config(tmp_path, dsn, source, alias="local_docs", engine="local"))
    same_target(dsn, local.target, report.target)


def test_an_actor_killed_after_its_write_is_restarted_and_its_shard_retried(
    tmp_path: Path, pg_dsn: str, local_ray: None
) -> None:
    """The actor dies (SIGKILL) with its second shard written but not recorded; Ray restarts it and
    retries the shard, whose replayed write lands on the same ids."""
    source = corpus(tmp_path / "docs.jsonl")
    once = tmp_path / "crashed"
    crash = {"REINDEX_CRASH_AT": "after_write:2", "REINDEX_CRASH_ONCE": str(once)}  # for the workers only
    cluster = config(tmp_path, pg_dsn, source, alias="ray_docs", engine="ray", env=crash)
    report = commands.run(cluster)
    assert once.exists(), "no actor reached the crash point"
    assert report.reconciled
    complete_and_equal_to_local(tmp_path, pg_dsn, source, cluster)


def test_a_driver_killed_with_sigkill_is_resumed_by_rerunning(
    tmp_path: Path, pg_dsn: str, local_ray: None
) -> None:
    """The driver (a `reindex run` process with a local Ray of its own) dies mid-run; rerunning resumes."""
    source = corpus(tmp_path / "docs.jsonl", 1200)
    cluster = config(tmp_path, pg_dsn, source, alias="ray_docs", engine="ray", shard_size=20)
    driver = subprocess.Popen(
        [sys.executable, "-m", "reindex", "run", "-c", str(cluster.path), "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_shards(Path(cluster.run.state), 3, driver)
    finally:
        children = psutil.Process(driver.pid).children(recursive=True)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
    assert commands.status(cluster).shards_done < 61, "the driver finished before it was killed"
    # The local Ray it started shares its fate, except Ray's own agents, which may outlive a SIGKILLed
    # driver by minutes: this test cleans them up itself.
    _, alive = psutil.wait_procs(children, timeout=5)
    for process in alive:
        process.kill()
    complete_and_equal_to_local(tmp_path, pg_dsn, source, cluster)


def test_a_driver_sent_sigterm_exits_75_and_a_rerun_finishes(
    tmp_path: Path, pg_dsn: str, local_ray: None
) -> None:
    """A reclaimed driver (SIGTERM) stops claiming shards and exits 75, as under the local engine. It
    exited 15 with a stack dump once: `ray.init` had put Ray's own SIGTERM handler in place of the run's."""
    source = corpus(tmp_path / "docs.jsonl", 1200)
    cluster = config(tmp_path, pg_dsn, source, alias="ray_docs", engine="ray", shard_size=20)
    driver = subprocess.Popen(
        [sys.executable, "-m", "reindex", "run", "-c", str(cluster.path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_shards(Path(cluster.run.state), 3, driver)  # type: ignore[arg-type]
        driver.send_signal(signal.SIGTERM)
        _, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 75, err
    assert "rerun the same command" in err and "SIGTERM received" not in err
    assert commands.status(cluster).shards_done < 61, "the driver finished before it was stopped"
    complete_and_equal_to_local(tmp_path, pg_dsn, source, cluster)


def wait_for_shards(state: Path, count: int, driver: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert driver.poll() is None, f"the driver exited with {driver.returncode}"
        if state.exists():
            with sqlite3.connect(state) as db:
                try:
                    if db.execute("SELECT count(*) FROM shards").fetchone()[0] >= count:
                        return
                except sqlite3.OperationalError:
                    pass  # not migrated yet
        time.sleep(0.05)
    raise AssertionError("the driver recorded no shards within 120 s")
