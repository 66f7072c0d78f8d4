"""The `ray` engine on a real local Ray: the same target as the local engine, resumable, refusals exit 2.

Every test drives `reindex.commands` by TOML: a JSONL source, the free `hash` embedder, a pgvector target
(every worker writes over its own connection) and a SQLite ledger (local Ray) or the Postgres ledger.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql

from reindex import commands, registry
from reindex.commands import RunReport
from reindex.config import Config, load, validated_target
from reindex.errors import ConfigError, Interrupted, MissingDependency
from reindex.run import planning
from reindex.run.io import scan_documents
from reindex.run.migration import leased, open_migration
from reindex.run.pipeline import Progress
from reindex.run.ray import driver as ray_driver
from reindex.run.ray import worker as ray_worker
from reindex.run.validation import screen
from reindex_adapters.remote.tokens import cl100k
from reindex_adapters.testing.emulators.openai import Emulator
from reindex_adapters.testing.memory import HashEmbedder
from tests.lifecycle.support import toml

pytest.importorskip("ray", reason="the ray extra is installed by scripts/setup")
pytestmark = pytest.mark.usefixtures("local_ray")

DOCUMENTS = 240


def corpus(path: Path, documents: int = DOCUMENTS) -> Path:
    """JSONL with repeated texts (dedupe across shards and workers), an empty text and a broken line."""
    lines = []
    for i in range(documents):
        text = f"shared text {i % 17}" if i % 3 == 0 else f"document {i} about topic {i % 11}"
        lines.append(json.dumps({"id": f"d{i:04d}", "text": "" if i == 5 else text}))
    lines.insert(7, "{not json")
    path.write_text("\n".join(lines) + "\n")
    return path


def config(
    tmp_path: Path,
    dsn: str,
    source: Path,
    *,
    alias: str,
    engine: str,
    state: str | None = None,
    shard_size: int = 32,
    env: dict[str, str] | None = None,
    embedder: dict[str, Any] | None = None,
    run: dict[str, Any] | None = None,
    **ray: Any,
) -> Config:
    """`env`: environment variables for the workers, through `[ray] runtime_env`; `run`: more [run] keys."""
    state = state or str(tmp_path / f"{alias}.db")
    sections: dict[str, dict[str, Any]] = {
        "source": {"kind": "jsonl", "path": str(source)},
        "embedder": embedder or {"kind": "hash", "dim": 16},
        "target": {"kind": "pgvector", "dsn": dsn, "alias": alias, "index": "none"},
        "run": {"state": state, "shard_size": shard_size, "engine": engine, **(run or {})},
        "ray": {"num_cpus": 2, **ray},
    }
    text = toml(sections)
    if env:
        variables = ", ".join(f"{key} = {json.dumps(value)}" for key, value in env.items())
        text += f"runtime_env = {{ env_vars = {{ {variables} }} }}\n"
    path = tmp_path / f"{alias}.toml"
    path.write_text(text)
    return load(path)


def stored(dsn: str, table: str) -> dict[str, tuple[str, list[float]]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        query = sql.SQL("SELECT id, reindex_content_hash, embedding::text FROM {}").format(
            sql.Identifier(table)
        )
        rows = conn.execute(query).fetchall()
    return {row[0]: (row[1], json.loads(row[2])) for row in rows}


def same_target(dsn: str, a: str, b: str) -> None:
    left, right = stored(dsn, a), stored(dsn, b)
    assert left.keys() == right.keys()
    for doc_id, (digest, vector) in left.items():
        assert right[doc_id][0] == digest
        np.testing.assert_array_equal(np.asarray(vector), np.asarray(right[doc_id][1]))


def same_as_local(dsn: str, local: RunReport, report: RunReport, config: Config) -> None:
    """The run reconciled, counted what the local engine counted and built its target vector for vector;
    verify says complete. Tokens embedded are the same only with run-wide dedupe: windowed (a free model's
    default), each lane reaches the texts it has in flight, so repeats spread over lanes are embedded again."""
    counts = ("documents", "written", "dead_letters") + (("tokens",) if config.run.dedupe == "run" else ())
    assert report.reconciled
    assert [getattr(report, c) for c in counts] == [getattr(local, c) for c in counts]
    if local.padding_fraction:  # one progress account for every engine: the ray engine reported 0.0
        assert report.padding_fraction
    same_target(dsn, local.target, report.target)
    assert commands.verify(config).complete


@pytest.mark.parametrize("lanes", [1, 2])
def test_a_ray_run_builds_the_same_target_as_the_local_engine(
    tmp_path: Path, pg_dsn: str, lanes: int
) -> None:
    source = corpus(tmp_path / "docs.jsonl")
    local = commands.run(config(tmp_path, pg_dsn, source, alias="local_docs", engine="local"))
    cluster = config(
        tmp_path,
        pg_dsn,
        source,
        alias="ray_docs",
        engine="ray",
        actors=2,
        cpus_per_actor=0.5,
        shards_per_actor=lanes,
    )
    report = commands.run(cluster)
    same_as_local(pg_dsn, local, report, cluster)
    status = commands.status(cluster)
    assert status.shards_done == -(-(DOCUMENTS + 1) // 32)
    assert sum(w["documents"] for w in status.workers) == report.documents
    assert sum(w["shards"] for w in status.workers) == status.shards_done
    assert all(w["docs_per_second"] > 0 for w in status.workers)
    letters = {str(d["doc_id"]): str(d["reason"]) for d in commands.dlq_list(cluster).dead_letters}
    assert letters["d0005"] == "empty_text" and len(letters) == 2
    assert commands.run(cluster).written == report.written  # nothing left: a rerun does nothing new


def test_a_stopped_ray_run_resumes_where_the_plan_left_off(tmp_path: Path, pg_dsn: str) -> None:
    source = corpus(tmp_path / "docs.jsonl")
    cluster = config(tmp_path, pg_dsn, source, alias="ray_docs", engine="ray", shard_size=16)
    stop = threading.Event()

    def halt(progress: Progress) -> None:
        stop.set()

    with pytest.raises(Interrupted):
        commands.run(cluster, stop=stop, on_progress=halt)
    done = commands.status(cluster).shards_done
    assert 0 < done < -(-(DOCUMENTS + 1) // 16)
    # The same vectors from a provider batch (it would run on the driver, which cannot take Ray's plan over)
    batch = config(tmp_path, pg_dsn, source, alias="ray_docs", engine="ray", shard_size=16, embedder=BATCH)
    with pytest.raises(ConfigError, match="not a provider batch one") as refused:
        commands.run(batch)
    assert refused.value.exit_code == 2
    # The local engine finishes the plan as planned: its processes read the same planned shards
    report = commands.run(config(tmp_path, pg_dsn, source, alias="ray_docs", engine="local", shard_size=16))
    assert report.reconciled and commands.status(cluster).state == "complete"
    report = commands.run(cluster)
    assert report.reconciled
    local = commands.run(config(tmp_path, pg_dsn, source, alias="local_docs", engine="local"))
    same_target(pg_dsn, local.target, report.target)
    assert commands.verify(cluster).complete


def test_a_cluster_address_with_a_sqlite_ledger_is_refused(tmp_path: Path, pg_dsn: str) -> None:
    source = corpus(tmp_path / "docs.jsonl", 10)
    cluster = config(tmp_path, pg_dsn, source, alias="ray_docs", engine="ray", address="ray://head:10001")
    with pytest.raises(ConfigError, match="postgresql://") as refused:
        commands.run(cluster)
    assert refused.value.exit_code == 2
    assert commands.status(cluster).state == "not-started"  # refused before the run began


def test_a_qdrant_folder_in_local_mode_is_refused_before_ray_starts(tmp_path: Path, pg_dsn: str) -> None:
    """One process opens a local-mode folder at a time; the workers would each fail to open it."""
    source = corpus(tmp_path / "docs.jsonl", 10)
    cluster = config(tmp_path, pg_dsn, source, alias="ray_docs", engine="ray")
    target = {"kind": "qdrant", "path": str(tmp_path / "qdrant"), "alias": "ray_docs"}
    tables = {**cluster.tables, "target": target}
    cluster = dataclasses.replace(cluster, target=validated_target(target), tables=tables)
    with pytest.raises(
        ConfigError, match=r"\[target\] \(qdrant\) is opened by one process at a time"
    ) as refused:
        commands.run(cluster)
    assert refused.value.exit_code == 2 and "Qdrant server's url" in str(refused.value.hint)


def test_a_worker_that_cannot_open_its_backends_fails_the_run_with_that_error(
    tmp_path: Path, pg_dsn: str
) -> None:
    """The workers' Postgres sessions are refused (a bad setting only they get): the run ends with the
    error the local engine would give (exit 2, naming the section), not a dead actor's traceback."""
    source = corpus(tmp_path / "docs.jsonl", 10)
    cluster = config(
        tmp_path, pg_dsn, source, alias="ray_docs", engine="ray", env={"PGOPTIONS": "-c work_mem=nonsense"}
    )
    with pytest.raises(ConfigError, match="work_mem") as failed:
        commands.run(cluster)
    assert failed.value.exit_code == 2 and "[target] dsn" in str(failed.value)


def test_the_postgres_ledger_runs_a_ray_migration(tmp_path: Path, pg_dsn: str) -> None:
    source = corpus(tmp_path / "docs.jsonl")
    cluster = config(tmp_path, pg_dsn, source, alias="ray_docs", engine="ray", state=pg_dsn)
    report = commands.run(cluster)
    assert report.reconciled and report.documents == DOCUMENTS + 1
    assert commands.verify(cluster).complete


def test_engine_ray_without_ray_installed_exits_2_naming_the_extra(
    tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = corpus(tmp_path / "docs.jsonl", 10)
    cluster = config(tmp_path, pg_dsn, source, alias="ray_docs", engine="ray")
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(MissingDependency) as refused:
        commands.run(cluster)
    assert refused.value.exit_code == 2 and "reindex-embeddings[ray]" in str(refused.value.hint)
    assert not Path(cluster.run.state).exists(), "the refusal came after the ledger was opened"


def test_a_source_rewritten_under_the_plan_is_read_as_it_is_now_and_sync_catches_up(
    tmp_path: Path, pg_dsn: str
) -> None:
    """The plan fixed byte ranges; a line inserted at the top moves every later line. The planned shards
    still to do read their ranges as the file is now (each line once over, as the local engine's cursor
    reads), and `sync` catches up what moved behind them."""
    source = corpus(tmp_path / "docs.jsonl")
    cluster = config(tmp_path, pg_dsn, source, alias="ray_docs", engine="ray", shard_size=16)
    stop = threading.Event()
    with pytest.raises(Interrupted):
        commands.run(cluster, stop=stop, on_progress=lambda progress: stop.set())
    lines = source.read_text().splitlines()
    source.write_text("\n".join([json.dumps({"id": "new", "text": "inserted at the top"}), *lines]) + "\n")
    assert commands.run(cluster).reconciled
    commands.sync(cluster)
    assert commands.verify(cluster).complete


def test_actors_that_leave_no_cpu_for_a_read_task_are_refused(tmp_path: Path, pg_dsn: str) -> None:
    """A local Ray of 2 CPUs: one actor of 2 CPUs would starve the read tasks, and the run wait forever.
    Refused before the run begins."""
    source = corpus(tmp_path / "docs.jsonl", 10)
    cluster = config(tmp_path, pg_dsn, source, alias="ray_docs", engine="ray", cpus_per_actor=2)
    with pytest.raises(ConfigError, match="need 3 CPUs; the local Ray has 2") as refused:
        commands.run(cluster)
    assert refused.value.exit_code == 2
    assert commands.status(cluster).state == "not-started"


# A provider batch in memory (jobs, bills) that every command of a test shares; polled at once.
BATCH = {"kind": "memory-batch", "dim": 16, "polls_to_finish": 1}
QUICK_POLLS = {"poll_seconds": 0.001, "poll_max_seconds": 0.002}


def test_a_provider_batch_embedder_runs_on_the_driver_under_the_ray_engine(
    tmp_path: Path, pg_dsn: str
) -> None:
    """The provider does the embedding, so engine = "ray" runs a batch embedder's migration on this machine:
    the deferred path and its guarantees, whatever [ray] says. An address no one answers at and a SQLite
    ledger (refused for a cluster run) prove that Ray is not used."""
    source = corpus(tmp_path / "docs.jsonl")
    here = config(
        tmp_path, pg_dsn, source, alias="local_docs", engine="local", embedder=BATCH, run=QUICK_POLLS
    )
    local = commands.run(here)
    on_ray = config(
        tmp_path,
        pg_dsn,
        source,
        alias="ray_docs",
        engine="ray",
        embedder=BATCH,
        run=QUICK_POLLS | {"max_cost_usd": 1.0},  # the ray engine refuses a budget; a batch run keeps it
        address="ray://nobody-here:10001",
    )
    report = commands.run(on_ray)
    same_as_local(pg_dsn, local, report, on_ray)
    status = commands.status(on_ray)
    assert status.workers == [] and status.shards_done == commands.status(here).shards_done


def test_a_batch_run_under_the_ray_engine_stops_at_its_budget_and_a_raised_one_finishes(
    tmp_path: Path, pg_dsn: str
) -> None:
    source = corpus(tmp_path / "docs.jsonl")
    batch = BATCH | {"store": f"ray-budget-{tmp_path.name}"}
    tight = config(
        tmp_path,
        pg_dsn,
        source,
        alias="ray_docs",
        engine="ray",
        embedder=batch,
        run=QUICK_POLLS | {"max_cost_usd": 0.000003},  # $0.01 per 1M tokens: 300 of the 846
    )
    with pytest.raises(Interrupted, match="budget reached") as stopped:
        commands.run(tight)
    assert stopped.value.exit_code == 75
    assert 0 < commands.status(tight).documents < DOCUMENTS + 1
    generous = QUICK_POLLS | {"max_cost_usd": 1.0}
    raised = config(tmp_path, pg_dsn, source, alias="ray_docs", engine="ray", embedder=batch, run=generous)
    report = commands.run(raised)
    assert report.reconciled and report.documents == DOCUMENTS + 1
    assert commands.verify(raised).complete


def test_read_tasks_tokenize_with_the_models_tokenizer_and_the_actors_take_their_rows(
    tmp_path: Path, pg_dsn: str, tiny_model: Path
) -> None:
    """A read task that runs apart from the actors (its resources differ, as with an actor on a GPU)
    tokenizes its shard's distinct texts with the tokenizer the driver's model shipped; the run builds the
    local engine's target from those tokens."""
    source = corpus(tmp_path / "docs.jsonl")
    model = {"kind": "hash", "dim": 16, "max_tokens": 8, "tokenizer": str(tiny_model)}
    local = commands.run(config(tmp_path, pg_dsn, source, alias="local_docs", engine="local", embedder=model))
    cluster = config(
        tmp_path, pg_dsn, source, alias="ray_docs", engine="ray", embedder=model, cpus_per_task=0.5
    )
    embedder = registry.build("embedder", model)
    shipped = ray_driver._shipped_tokenizer(embedder)
    assert shipped is not None
    first = next(scan_documents(registry.build("source", cluster.source), None, 32))
    item = {"seq": 0, "after": None, "last": first.last_position, "documents": len(first)}
    row = ray_worker.read_shard(item, cluster, tokenizer=shipped)
    ahead = pickle.loads(row["tokens"])
    texts = list(dict.fromkeys(screen(first).records.texts))  # distinct, in order of first appearance
    assert len(ahead.tokens) == len(texts) < 32
    np.testing.assert_array_equal(ahead.tokens.ids, embedder.tokenize_columns(texts).ids)
    report = commands.run(cluster)
    same_as_local(pg_dsn, local, report, cluster)


def test_an_actor_holds_a_second_shard_in_its_own_lane_while_the_first_is_in_the_model(
    tmp_path: Path, pg_dsn: str
) -> None:
    """`shards_per_actor = 2`: a shard that arrives while another is in the model gets a lane of its own
    (its own ledger and target connections) and the same loaded model; both are recorded, each row counting
    only its own shard. Driven in this process, the way Ray's actor threads call the worker."""
    source = corpus(tmp_path / "docs.jsonl")
    slow = {"kind": "hash", "dim": 16, "latency_ms": 400}  # a model call long enough to arrive during
    cluster = config(tmp_path, pg_dsn, source, alias="ray_docs", engine="ray", embedder=slow)
    with leased(cluster, create=True) as (ledger, lease), open_migration(cluster) as m:
        m = commands.attach(m, ledger, create=True)
        first, second = planning.plan(m, ledger)[:2]
        items = [
            ray_worker.read_shard(
                {"seq": s.seq, "after": s.after_cursor, "last": s.last_cursor, "documents": s.documents},
                cluster,
            )
            for s in (first, second)
        ]
        worker = ray_worker.ShardWorker(cluster, m.plan_id, m.spec.nonce, (lease.key, lease.token))
        rows: dict[int, dict[str, Any]] = {}

        def call(item: dict[str, Any]) -> None:
            rows[int(item["seq"])] = worker(item)

        threads = [threading.Thread(target=call, args=(item,)) for item in items]
        threads[0].start()
        time.sleep(0.2)  # the first shard is in the model now
        threads[1].start()
        for thread in threads:
            thread.join()
        lanes = worker._lanes
        assert len(lanes) == 2 and lanes[0].pipeline.embedder is lanes[1].pipeline.embedder
        assert lanes[0].pipeline.ledger is not lanes[1].pipeline.ledger
        assert [rows[s.seq]["error"] for s in (first, second)] == [b"", b""]
        assert [rows[s.seq]["documents"] for s in (first, second)] == [first.documents, second.documents]
        assert {shard.seq for shard in ledger.shard_plan(m.plan_id) if shard.recorded} == {
            first.seq,
            second.seq,
        }
        for lane in lanes:
            lane.close()


def test_a_paid_online_model_on_ray_workers_stops_at_one_cluster_wide_budget(
    tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two actors reserve from one budget: the cluster spends no more than the limit, stops with exit 75,
    and a raised limit finishes the same target as the local engine without billing a text twice."""
    key = "REINDEX_TEST_OPENAI_KEY"
    monkeypatch.setenv(key, "sk-test-0123456789abcdef")
    texts = [f"document {i} about topic {i % 11} and nothing else" for i in range(DOCUMENTS)]
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"id": f"d{i:04d}", "text": t}) + "\n" for i, t in enumerate(texts)))
    tokens = sum(len(cl100k().encode(text)) for text in texts)
    with Emulator(HashEmbedder(dim=1536)) as emulator:
        online = {
            "kind": "openai",
            "model": "text-embedding-3-small",  # $0.02 per 1M tokens online
            "dimensions": 64,
            "base_url": emulator.base_url,
            "api_key_env": key,
        }
        limit = tokens / 4 * 0.02 / 1e6  # a quarter of the corpus
        common: dict[str, Any] = {
            "engine": "ray",
            "embedder": online,
            "shard_size": 16,
            "env": {key: os.environ[key]},
        }
        tight = config(
            tmp_path,
            pg_dsn,
            source,
            alias="ray_docs",
            run={"max_cost_usd": limit},
            actors=2,
            cpus_per_actor=0.5,
            **common,
        )
        with pytest.raises(Interrupted, match="budget reached") as stopped:
            commands.run(tight)
        assert stopped.value.exit_code == 75
        assert 0 < emulator.stats()["billed_tokens"] * 0.02 / 1e6 <= limit
        assert 0 < commands.status(tight).documents < DOCUMENTS
        raised = config(tmp_path, pg_dsn, source, alias="ray_docs", run={"max_cost_usd": 1.0}, **common)
        report = commands.run(raised)
        assert emulator.stats()["billed_tokens"] == tokens  # nothing billed twice across the stop
        local = config(tmp_path, pg_dsn, source, alias="local_docs", embedder=online, engine="local")
        same_target(pg_dsn, commands.run(local).target, report.target)
    assert report.reconciled and commands.verify(raised).complete


def test_two_lanes_bill_a_text_another_lane_still_embeds_once_and_stay_within_the_budget(
    tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every shard repeats the first one's texts, and an actor's two lanes take two shards at once: the
    second claims while the first is still in a slow model, so its texts are claimed, not yet recorded.
    It copies them once the first stores them, instead of embedding them again: the provider bills each
    distinct text once, and a budget for the distinct texts is enough for the whole run."""
    key = "REINDEX_TEST_OPENAI_KEY"
    monkeypatch.setenv(key, "sk-test-0123456789abcdef")
    texts = [f"text {i} of the shard every other shard repeats" for i in range(16)]
    documents = 64
    source = tmp_path / "docs.jsonl"
    source.write_text(
        "".join(json.dumps({"id": f"d{i:04d}", "text": texts[i % 16]}) + "\n" for i in range(documents))
    )
    tokens = sum(len(cl100k().encode(text)) for text in texts)
    limit = tokens * 1.5 * 0.02 / 1e6  # the distinct texts and half again: a second bill would pass it
    with Emulator(HashEmbedder(dim=1536, latency_ms=300)) as emulator:  # the second lane claims meanwhile
        online = {
            "kind": "openai",
            "model": "text-embedding-3-small",  # $0.02 per 1M tokens online
            "dimensions": 64,
            "base_url": emulator.base_url,
            "api_key_env": key,
        }
        lanes = config(
            tmp_path,
            pg_dsn,
            source,
            alias="ray_docs",
            engine="ray",
            embedder=online,
            shard_size=16,
            env={key: os.environ[key]},
            run={"max_cost_usd": limit},
            actors=1,
            shards_per_actor=2,
        )
        report = commands.run(lanes)
        billed = emulator.stats()["billed_tokens"]
        assert billed == tokens  # each distinct text billed once, across the lanes
        assert billed * 0.02 / 1e6 <= limit
        local = config(tmp_path, pg_dsn, source, alias="local_docs", embedder=online, engine="local")
        same_target(pg_dsn, commands.run(local).target, report.target)
    assert report.documents == documents and report.reconciled and commands.verify(lanes).complete


class _Gated:
    """The actor's second shard waits (at most `patience` s) for a file the driver makes once it holds the
    first shard's row. Second by the actor's clock, not by seq: Ray may run shard 1 before shard 0."""

    def __init__(self, gate: str, patience: float) -> None:
        self.gate, self.patience = Path(gate), patience
        self.calls = 0

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        deadline = time.monotonic() + self.patience
        while self.calls > 1 and not self.gate.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return {"seq": row["seq"], "gate_open": self.gate.exists()}


def test_the_driver_gets_each_shard_row_as_soon_as_its_actor_returns_it(tmp_path: Path) -> None:
    """Progress and the stop check must not lag a shard: `iter_rows` would hand the first shard's row over
    only once the second is done, and the second here waits for the driver to have seen the first."""
    import ray.data

    from reindex.run.ray.driver import results

    gate = tmp_path / "gate"
    actor: Any = _Gated  # a callable class: Ray builds one per actor
    dataset = ray.data.from_items([{"seq": 0}, {"seq": 1}], override_num_blocks=2).map(
        actor,
        fn_constructor_kwargs={"gate": str(gate), "patience": 20.0},
        compute=ray.data.ActorPoolStrategy(size=1),
        num_cpus=0.5,
    )
    rows = []
    for row in results(dataset):
        rows.append(row)
        gate.touch()
    assert sorted(row["seq"] for row in rows) == [0, 1]
    assert [row["gate_open"] for row in rows] == [False, True]
