"""The `processes` engine (reindex/run/processes): the local engine on every core, the model in its own
process. Driven as users drive it, through the real `reindex` command, into a real pgvector; the workers and
the model process are real processes, killed for real."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil  # type: ignore[import-untyped]
import pytest

from reindex import commands
from reindex.config import load
from reindex.errors import Interrupted
from reindex.run import processes
from reindex.run.backfill import price_of
from reindex.run.cost import Budget
from reindex.run.migration import leased, open_migration
from reindex.run.pipeline import Progress
from reindex_adapters.remote.tokens import cl100k
from reindex_adapters.testing.emulators.openai import Emulator
from reindex_adapters.testing.memory import HashEmbedder
from tests.durability.support import Tool, config_text, write_corpus
from tests.durability.test_crashes import _marked_written, assert_exact_coverage, pg_reader
from tests.lifecycle.support import toml

SHARD = 25


def _tool(
    tmp_path: Path, dsn: str, *, n: int = 600, run: str = "", embedder: str | None = None
) -> tuple[Tool, dict[str, str]]:
    corpus = tmp_path / "docs.jsonl"
    texts = write_corpus(corpus, n, poison=True)
    state = tmp_path / "state.db"
    config = config_text(
        corpus=corpus,
        state=state,
        target=f'kind = "pgvector"\ndsn = "{dsn}"\nalias = "docs"',
        shard_size=SHARD,
        latency_ms=0,
    )
    if embedder is not None:
        config = re.sub(r"\[embedder\]\n(.*\n)*?\n", f"[embedder]\n{embedder}\n\n", config, count=1)
    (tmp_path / "reindex.toml").write_text(config + run)
    return Tool(tmp_path / "reindex.toml", state), texts


PACED = 'kind = "paced"\ndim = 16\nmax_tokens = 128\nrate = 200000\nbatch_tokens = 2048'


def test_two_workers_write_what_one_process_writes(tmp_path: Path, pg_dsn: str) -> None:
    # run-wide dedupe, as a paid embedder has it by default: claims in the ledger, seen by both processes
    tool, texts = _tool(tmp_path, pg_dsn, run='workers = 2\ndedupe = "run"\n')
    report = tool.json("run")
    assert report["processes"] == 2 and report["note"] is None
    assert report["documents"] == len(texts) + 10  # the poison lines are documents too
    assert_exact_coverage(tool, pg_reader(pg_dsn), texts)
    workers = {w["worker"].split(":")[0] for w in tool.json("status")["workers"]}
    assert workers == {"local/worker-0", "local/worker-1"}, workers
    # every distinct text is embedded once across both processes (the ledger's claims are shared): the
    # same tokens as the one-process pipeline's run of the same corpus
    alone = Tool(tmp_path / "alone.toml", tmp_path / "alone.db")
    config = (
        tool.config.read_text()
        .replace('alias = "docs"', 'alias = "alone"')
        .replace("workers = 2", "workers = 1")
    )
    alone.config.write_text(config.replace(str(tool.state), str(alone.state)))
    one = alone.json("run")
    assert one["processes"] == 1
    assert report["tokens"] == one["tokens"] and report["written"] == one["written"]


def test_the_model_runs_in_its_own_process_fed_by_the_workers(tmp_path: Path, pg_dsn: str) -> None:
    tool, texts = _tool(tmp_path, pg_dsn, run="workers = 2\n", embedder=PACED)
    report = tool.json("run")
    assert report["processes"] == 2
    assert 0 < report["device_busy_fraction"] <= 1.0
    assert_exact_coverage(tool, pg_reader(pg_dsn), texts)  # the paced device computes the hash vectors


def test_a_killed_worker_ends_the_run_resumably_naming_it_and_its_shard(tmp_path: Path, pg_dsn: str) -> None:
    tool, texts = _tool(tmp_path, pg_dsn, run="workers = 2\n")
    once = tmp_path / "crashed-once"
    code, _, err = tool.run("run", env={"REINDEX_CRASH_AT": "after_write:3", "REINDEX_CRASH_ONCE": str(once)})
    assert code == 75, err
    assert re.search(
        r"worker \d \(pid \d+\) died \(killed by SIGKILL\) with shard\(s\) [\d, ]+ in flight", err
    ), err
    stored = pg_reader(pg_dsn)(tool.json("plan", "--no-calibrate")["target"])
    assert len(stored) >= _marked_written(tool), "a shard was marked written before its vectors were durable"
    code, _, err = tool.run("run")
    assert code == 0, err
    assert_exact_coverage(tool, pg_reader(pg_dsn), texts)


def test_a_killed_model_process_ends_the_run_resumably(tmp_path: Path, pg_dsn: str) -> None:
    tool, texts = _tool(tmp_path, pg_dsn, run="workers = 2\n", embedder=PACED)
    code, _, err = tool.run("run", env={"REINDEX_CRASH_AT": "model_process:4"})
    assert code == 75, err
    assert re.search(r"model process 0 \(pid \d+\) died \(killed by SIGKILL\)", err), err
    stored = pg_reader(pg_dsn)(tool.json("plan", "--no-calibrate")["target"])
    assert len(stored) >= _marked_written(tool)
    code, _, err = tool.run("run")
    assert code == 0, err
    assert_exact_coverage(tool, pg_reader(pg_dsn), texts)


def test_a_killed_coordinator_takes_its_processes_along(tmp_path: Path, pg_dsn: str) -> None:
    tool, texts = _tool(
        tmp_path, pg_dsn, n=3000, run="workers = 2\n", embedder=PACED.replace("200000", "20000")
    )
    process = tool.start("run")
    children: list[psutil.Process] = []
    deadline = time.monotonic() + 120
    while tool.ledger_written()[0] < 2 and process.poll() is None and time.monotonic() < deadline:
        children = psutil.Process(process.pid).children(recursive=True) or children
        time.sleep(0.05)
    assert process.poll() is None, "the run ended before it could be killed; make the corpus larger"
    children = psutil.Process(process.pid).children(recursive=True)
    assert len(children) >= 4, children  # the fork server, two workers, the model process (and a tracker)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    _, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, f"processes outlived their coordinator: {alive}"
    code, _, err = tool.run("run")
    assert code == 0, err
    assert_exact_coverage(tool, pg_reader(pg_dsn), texts)


def test_more_workers_than_cores_run_on_the_cores_and_say_so(tmp_path: Path, pg_dsn: str) -> None:
    tool, _ = _tool(tmp_path, pg_dsn, n=200, run="workers = 512\n")
    report = tool.json("run")
    cores = len(os.sched_getaffinity(0))
    assert report["processes"] == cores
    assert (
        report["note"] == f"{cores} worker processes: [run] workers = 512, but this machine has {cores} cores"
    )


def test_a_local_mode_target_runs_in_one_process_and_says_why(tmp_path: Path) -> None:
    corpus = tmp_path / "docs.jsonl"
    write_corpus(corpus, 100)
    target = f'kind = "qdrant"\npath = "{tmp_path / "qdrant"}"\nalias = "docs"'
    config = config_text(corpus=corpus, state=tmp_path / "state.db", target=target, latency_ms=0)
    (tmp_path / "reindex.toml").write_text(config)
    report = Tool(tmp_path / "reindex.toml", tmp_path / "state.db").json("run")
    assert report["processes"] == 1
    assert report["note"] == "one process: the [target] (qdrant) is opened by one process at a time"
    assert np.isfinite(report["docs_per_second"])


def test_batches_bigger_than_a_pipe_buffer_flow_both_ways_at_once(tmp_path: Path, pg_dsn: str) -> None:
    """A request of 65,536 tokens and a reply of 384-d vectors each fill a pipe many times over: a worker
    sending its next batch while the model process sends it the last one's vectors must not stall."""
    big = 'kind = "paced"\ndim = 384\nmax_tokens = 128\nrate = 2000000\nbatch_tokens = 65536'
    tool, _ = _tool(tmp_path, pg_dsn, n=4000, run="workers = 2\n", embedder=big)
    code, _, err = tool.run("run", timeout=120)
    assert code == 0, err
    assert tool.json("verify")["complete"]


def test_workers_spend_from_one_budget_and_stop_within_it(
    tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`max_cost_usd` is one budget for every worker (a manager process the coordinator holds): each
    reserves a shard's tokens before sending them, so the run stops (75) within the limit, and a raised
    limit finishes without billing a text twice. `reindex run` keeps an online provider in one process (its
    pacing is one budget too), so the priced model is put on two workers here by calling the engine."""
    key = "REINDEX_TEST_OPENAI_KEY"
    monkeypatch.setenv(key, "sk-test-0123456789abcdef")  # after the fork server started: workers see it
    texts = [f"document {i} about topic {i % 11} and nothing else" for i in range(320)]
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"id": f"d{i:04d}", "text": t}) + "\n" for i, t in enumerate(texts)))
    tokens = sum(len(cl100k().encode(text)) for text in texts)
    with Emulator(HashEmbedder(dim=1536)) as emulator:
        sections: dict[str, dict[str, Any]] = {
            "source": {"kind": "jsonl", "path": str(source)},
            "embedder": {
                "kind": "openai",
                "model": "text-embedding-3-small",  # $0.02 per 1M tokens online
                "dimensions": 64,
                "base_url": emulator.base_url,
                "api_key_env": key,
            },
            "target": {"kind": "pgvector", "dsn": pg_dsn, "alias": "budget_docs", "index": "none"},
            "run": {"state": str(tmp_path / "state.db"), "shard_size": 16},
        }
        (tmp_path / "reindex.toml").write_text(toml(sections))
        config = load(tmp_path / "reindex.toml")

        def on_two_workers(limit: float) -> Progress:
            with leased(config, create=True) as (ledger, lease), open_migration(config) as m:
                m = commands.attach(m, ledger, create=True)
                budget = Budget(limit, price_of(m.embedder))
                progress = processes.run(m, ledger, lease, workers=2, stop=threading.Event(), budget=budget)
                m.sink.finalize(m.spec)  # as every run ends (commands.run): verify wants a finalized target
                ledger.finish(m.plan_id)
                return progress

        limit = tokens / 4 * 0.02 / 1e6  # a quarter of the corpus
        with pytest.raises(Interrupted, match="budget reached") as stopped:
            on_two_workers(limit)
        assert stopped.value.exit_code == 75
        assert 0 < emulator.stats()["billed_tokens"] * 0.02 / 1e6 <= limit
        assert on_two_workers(1.0).processes == 2
        assert emulator.stats()["billed_tokens"] == tokens  # nothing billed twice across the stop
        assert commands.verify(config).complete
        report = commands.run(config)  # what `reindex run` does with it: one process, and it says why
        assert report.processes == 1 and report.note is not None and "one budget" in report.note
