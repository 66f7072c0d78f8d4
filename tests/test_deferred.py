"""The deferred (provider batch) path on the shipped in-memory batch API: no double cost, partial results kept."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from adapters.memory import MemoryBatchEmbedder, MemorySink, MemorySource
from reindex.config import RunConfig
from reindex.cost import Budget
from reindex.deferred import DeferredRun
from reindex.errors import Interrupted
from reindex.ledger import SqliteLedger
from reindex.ports import Record, TargetSpec
from reindex.verify import coverage


def corpus(n: int) -> list[Record]:
    return [Record(f"d{i}", f"document {i} says {'more ' * (i % 7)}things", {}) for i in range(n)]


def deferred(records, embedder, sink, ledger, *, budget=None, stop=None, **run):
    source = MemorySource(records)
    spec = TargetSpec(
        "docs__b",
        "docs",
        embedder.info.dim,
        embedder.info.fingerprint,
        embedder.info.describe(),
        source.schema(),
    )
    sink.prepare(spec)
    ledger.begin("plan", alias="docs", target=spec.name, fingerprint=spec.fingerprint, model={})
    config = RunConfig(shard_size=100, poll_seconds=0.001, poll_max_seconds=0.002, **run)
    DeferredRun(
        source=source,
        embedder=embedder,
        sink=sink,
        ledger=ledger,
        spec=spec,
        plan_id="plan",
        run=config,
        budget=budget or Budget(None, None),
        stop=stop,
    ).run()
    dead = {d.doc_id: d.content_hash for d in ledger.dead_letters("plan")}
    return coverage(source, sink, spec.name, dim=spec.dim, fingerprint=spec.fingerprint, dead_letters=dead)


@pytest.fixture
def ledger(tmp_path: Path) -> SqliteLedger:
    return SqliteLedger(tmp_path / "state.db")


def test_every_shard_becomes_one_job_and_the_run_reconciles(ledger):
    embedder = MemoryBatchEmbedder(16)
    report = deferred(corpus(450), embedder, MemorySink(), ledger, max_open_jobs=2)
    assert report.complete and report.target_vectors == 450
    assert set(embedder.created.values()) == {1} and len(embedder.created) == 5
    assert embedder.released == set(embedder.jobs)
    summary = ledger.summary("plan")
    assert summary.reconciled and summary.shards == 5 and summary.billed_tokens > 0


def test_expired_jobs_keep_what_completed_and_resubmit_only_the_rest(ledger):
    embedder = MemoryBatchEmbedder(16, expire_after=60)
    report = deferred(corpus(200), embedder, MemorySink(), ledger, provider_attempts=3)
    assert report.complete and report.target_vectors == 200
    retried = [key for key in embedder.created if not key.endswith("-0")]
    assert retried, "the lost lines must go out again, as new jobs"
    billed = ledger.summary("plan").billed_tokens
    assert billed == sum(len(r.text.split()) for r in corpus(200))  # each text billed once


def test_a_rejected_line_becomes_a_dead_letter_after_bounded_attempts(ledger):
    records = [*corpus(50), Record("poison", "reject this text")]
    embedder = MemoryBatchEmbedder(16, reject="reject")
    report = deferred(records, embedder, MemorySink(), ledger, provider_attempts=2)
    letters = {d.doc_id: d.reason for d in ledger.dead_letters("plan")}
    assert letters == {"poison": "provider_rejected:invalid_request"}
    assert report.complete and sum(1 for key in embedder.created if key.startswith("plan-0-")) == 2


def test_rerun_after_interruption_adopts_jobs_instead_of_creating_them(ledger):
    embedder = MemoryBatchEmbedder(16, polls_to_finish=10_000)
    stop = threading.Event()
    sink = MemorySink()
    timer = threading.Timer(0.3, stop.set)
    timer.start()
    with pytest.raises(Interrupted):
        deferred(corpus(300), embedder, sink, ledger, stop=stop, max_open_jobs=3)
    jobs = ledger.jobs("plan")
    assert {j.state for j in jobs} == {"submitted"} and len(jobs) == 3
    embedder.polls_to_finish = 1
    report = deferred(corpus(300), embedder, sink, ledger, max_open_jobs=3)
    assert report.complete and set(embedder.created.values()) == {1}


def test_intent_without_a_recorded_job_id_is_adopted_not_recreated(ledger):
    embedder = MemoryBatchEmbedder(16, polls_to_finish=10_000)
    stop = threading.Event()
    sink = MemorySink()
    threading.Timer(0.3, stop.set).start()
    with pytest.raises(Interrupted):
        deferred(corpus(100), embedder, sink, ledger, stop=stop)
    from dataclasses import replace

    job = ledger.jobs("plan")[0]
    ledger.record_job("plan", replace(job, state="intent", job_id=None))  # as if killed right after create
    embedder.polls_to_finish = 1
    assert deferred(corpus(100), embedder, sink, ledger).complete
    assert embedder.created == {job.key: 1}


def test_budget_stops_before_it_is_exceeded_and_raising_it_continues(ledger):
    embedder = MemoryBatchEmbedder(16, price_per_million=1000.0)
    sink = MemorySink()
    with pytest.raises(Interrupted, match="budget reached"):
        deferred(corpus(500), embedder, sink, ledger, budget=Budget(1.0, 1000.0))
    spent = ledger.summary("plan").billed_tokens * 1000.0 / 1e6
    assert 0 < spent <= 1.0
    report = deferred(corpus(500), embedder, sink, ledger, budget=Budget(100.0, 1000.0, spent_tokens=1000))
    assert report.complete


def test_texts_repeated_across_shards_are_billed_once_and_written_to_every_id(ledger):
    records = corpus(300) + [Record(f"copy{i}", corpus(300)[i].text, {}) for i in range(0, 300, 7)]
    embedder = MemoryBatchEmbedder(16)
    report = deferred(records, embedder, MemorySink(), ledger, max_open_jobs=4)
    assert report.complete and report.target_vectors == len(records)
    summary = ledger.summary("plan")
    assert summary.billed_tokens == sum(len(t.split()) for t in {r.text for r in records})
    assert summary.reconciled and summary.reused >= 300 // 7
