"""A Ray run never hangs (issue 44): an embedding actor that dies at every shard, or one that stalls, ends
the run with exit 75 and one line naming it, and a rerun resumes to a target equal to a local run's. Each
run starts a Ray of its own and shuts it down: what a stalled actor holds goes with it (as with a driver
that exits), never into the next test's Ray."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from reindex import commands
from reindex.errors import Interrupted
from tests.ray.test_ray_engine import config, corpus
from tests.ray.test_ray_faults import complete_and_equal_to_local

ray = pytest.importorskip("ray", reason="the ray extra is installed by scripts/setup")


def test_an_actor_that_dies_at_every_shard_ends_the_run_resumably_instead_of_restarting_forever(
    tmp_path: Path, pg_dsn: str
) -> None:
    """Ray Data restarts a dead actor forever: an actor that dies at each shard held a run (and a node-loss
    test) until its timeout. No shard back for [ray] stall_seconds ends the run with exit 75 and one line,
    and a rerun resumes."""
    source = corpus(tmp_path / "docs.jsonl")
    crash = {"REINDEX_CRASH_AT": "after_write"}  # every actor process, each restart included
    cluster = config(tmp_path, pg_dsn, source, alias="ray_docs", engine="ray", env=crash, stall_seconds=30)
    started = time.monotonic()
    with pytest.raises(Interrupted, match=r"no shard came back .* for 30 s") as ended:
        commands.run(cluster)
    assert ended.value.exit_code == 75 and len(str(ended.value).splitlines()) == 1
    assert time.monotonic() - started < 150
    healthy = config(tmp_path, pg_dsn, source, alias="ray_docs", engine="ray")
    complete_and_equal_to_local(tmp_path, pg_dsn, source, healthy)


def test_an_actor_that_stalls_ends_the_run_after_stall_seconds(tmp_path: Path, pg_dsn: str) -> None:
    source = corpus(tmp_path / "docs.jsonl")
    hang = {"REINDEX_CRASH_AT": "after_embed", "REINDEX_CRASH_HOW": "hang"}
    cluster = config(tmp_path, pg_dsn, source, alias="ray_docs", engine="ray", env=hang, stall_seconds=20)
    started = time.monotonic()
    with pytest.raises(Interrupted, match=r"no shard came back .* for 20 s"):
        commands.run(cluster)
    assert time.monotonic() - started < 120
    healthy = config(tmp_path, pg_dsn, source, alias="ray_docs", engine="ray")
    complete_and_equal_to_local(tmp_path, pg_dsn, source, healthy)
