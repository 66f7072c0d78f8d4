"""The deferred (provider batch) path on the shipped in-memory batch API: no double cost, partial results kept."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from reindex.config import RunConfig
from reindex.errors import Interrupted
from reindex.fingerprint import content_hash
from reindex.ports import Record, TargetSpec
from reindex.prove.verify import coverage
from reindex.run.cost import Budget
from reindex.run.deferred import DeferredRun
from reindex.state.sqlite import SqliteLedger
from reindex_adapters.files.jsonl import JsonlSource
from reindex_adapters.testing.memory import MemoryBatchEmbedder, MemorySink, MemorySource

TARGET = "docs__b"


def corpus(n: int) -> list[Record]:
    return [Record(f"d{i}", f"document {i} says {'more ' * (i % 7)}things", {}) for i in range(n)]


def deferred(records, embedder, sink, ledger, *, budget=None, stop=None, source=None, **run):
    source = source or MemorySource(records)
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
    run.setdefault("shard_size", 100)
    config = RunConfig(poll_seconds=0.001, poll_max_seconds=0.002, **run)
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
    assert report.complete and sum(1 for key in embedder.created if _seq(key) == 0) == 2


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


def interrupted(records, embedder, sink, ledger, source, **run):
    """Run until the first jobs are submitted, then stop: the provider keeps them, the ledger knows them."""
    embedder.polls_to_finish = 10_000
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    with pytest.raises(Interrupted):
        deferred(records, embedder, sink, ledger, stop=stop, source=source, **run)
    embedder.polls_to_finish = 1


def stored(sink, doc_id):
    """(content hash, vector) the target holds for one document."""
    entries = {entry.id: entry.content_hash for entry in sink.scan_index(TARGET, 16)}
    return entries.get(doc_id), sink.fetch(TARGET, [doc_id]).get(doc_id)


class FetchCountingJsonl(JsonlSource):
    """The real JSONL source, counting the ids asked of `fetch`: a file has no index by id, so each fetch
    reads the whole file."""

    fetched = 0

    def fetch(self, ids):
        self.fetched += len(ids)
        return super().fetch(ids)


def test_finished_lines_are_written_from_one_read_of_their_shard_not_a_search_of_the_file(tmp_path, ledger):
    """Fetching a job's documents by id from a file read the whole file once per job: quadratic in the
    corpus (20,000 jobs of 5,000 lines each reading 100 million lines). They are read from the job's shard
    range; `fetch` is left for documents the range no longer holds (edits, see the tests around)."""
    records = corpus(300)
    records.append(Record("e1", records[1].text, {}))  # a copy: written from its owner's vector
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"id": r.id, "text": r.text}) + "\n" for r in records))
    source = FetchCountingJsonl(path)
    embedder, sink = MemoryBatchEmbedder(16), MemorySink()
    interrupted(records, embedder, sink, ledger, source, max_open_jobs=2)  # then collected by a rerun
    report = deferred(records, embedder, sink, ledger, source=source, max_open_jobs=2)
    assert report.complete and report.stale == 0
    assert ledger.summary("plan").reconciled and ledger.summary("plan").written == 301
    assert stored(sink, "e1")[1].tolist() == embedder.inline.vector(records[1].text).tolist()
    assert source.fetched == 0


def test_ledger_holds_no_document_text_while_jobs_are_in_flight_or_after(tmp_path, ledger):
    records = [Record(f"d{i}", f"confidential-marker-{i} body", {}) for i in range(150)]
    embedder, sink, source = MemoryBatchEmbedder(16), MemorySink(), MemorySource(records)
    interrupted(records, embedder, sink, ledger, source, max_open_jobs=2)
    assert {job.state for job in ledger.jobs("plan")} == {"submitted"}
    assert all(len(item) == 4 for job in ledger.jobs("plan") for item in job.items)
    files = [path for path in tmp_path.iterdir() if path.name.startswith("state.db")]
    assert files and not any(b"confidential-marker" in path.read_bytes() for path in files)
    assert deferred(records, embedder, sink, ledger, source=source).complete
    assert not any(b"confidential-marker" in path.read_bytes() for path in files if path.exists())


def test_old_job_rows_that_carry_texts_are_read_and_the_text_is_ignored():
    from reindex.state.records import Job, job_from_row, job_row

    row = list(job_row("plan", Job("plan-0-0", 0, 0, "intent", None, None, "d1", (("0-0", "d1", "h", 3),))))
    row[13] = '[["0-0", "d1", "h", 3, "the old text"]]'
    assert job_from_row(row).items == (("0-0", "d1", "h", 3),)


def test_a_text_edited_before_its_lines_are_resubmitted_is_embedded_under_its_new_hash(ledger):
    records = corpus(100)
    embedder, sink, source = MemoryBatchEmbedder(16), MemorySink(), MemorySource(records)
    interrupted(records, embedder, sink, ledger, source)
    source.store.edit("d99", "a brand new text for d99")  # its line expires, so it goes out again
    source.store.delete("d98")
    embedder.expire_after = 50
    report = deferred(records, embedder, sink, ledger, source=source, provider_attempts=3)
    assert report.complete and report.stale == 0
    digest, vector = stored(sink, "d99")
    assert digest == content_hash("a brand new text for d99")
    assert (
        vector is not None and vector.tolist() == embedder.inline.vector("a brand new text for d99").tolist()
    )
    summary = ledger.summary("plan")
    assert summary.reconciled and summary.vanished == 1 and summary.written == 99


def test_an_adopted_batch_never_gives_an_edited_document_its_old_vector_under_the_new_hash(ledger):
    from dataclasses import replace

    records = corpus(100)
    embedder, sink, source = MemoryBatchEmbedder(16), MemorySink(), MemorySource(records)
    interrupted(records, embedder, sink, ledger, source)
    job = ledger.jobs("plan")[0]
    ledger.record_job("plan", replace(job, state="intent", job_id=None))  # killed right after create
    source.store.edit("d3", "d3 was edited after the batch was created")
    report = deferred(records, embedder, sink, ledger, source=source)
    assert report.complete and report.stale == 0
    digest, vector = stored(sink, "d3")
    assert digest == content_hash("d3 was edited after the batch was created")
    assert vector is not None
    assert vector.tolist() == embedder.inline.vector("d3 was edited after the batch was created").tolist()
    assert embedder.created[job.key] == 1 and ledger.summary("plan").reconciled


def test_copies_whose_owner_vanished_or_whose_text_changed_are_embedded_by_their_shard(ledger):
    records = corpus(100) + [Record(f"e{i}", corpus(100)[i].text, {}) for i in (5, 6)]
    embedder, sink, source = MemoryBatchEmbedder(16), MemorySink(), MemorySource(records)
    interrupted(records, embedder, sink, ledger, source, max_open_jobs=2)
    assert {copy[0] for job in ledger.jobs("plan") for copy in job.copies} == {"e5", "e6"}
    source.store.delete("d5")  # the owner of e5's text is gone before its vector was written
    source.store.edit("e6", "e6 now says something else")
    report = deferred(records, embedder, sink, ledger, source=source)
    assert report.complete and report.stale == 0
    assert stored(sink, "e5") == (
        content_hash(records[5].text),
        pytest.approx(embedder.inline.vector(records[5].text)),
    )
    assert stored(sink, "e6")[0] == content_hash("e6 now says something else")
    summary = ledger.summary("plan")
    assert summary.reconciled and summary.vanished == 1 and summary.dead_letters == 0


def test_provider_rejected_batch_lines_are_dead_lettered_with_every_copy_of_their_text(ledger):
    """Issue 10, defect 4: the refused line and only it ends dead-lettered, in the memory batch API."""
    poison = "reject this text"
    records = [*corpus(150), Record("d049x", poison), Record("d120x", poison)]
    embedder = MemoryBatchEmbedder(16, reject="reject")
    report = deferred(records, embedder, MemorySink(), ledger, provider_attempts=1)
    letters = {d.doc_id: d.reason for d in ledger.dead_letters("plan")}
    assert letters == {
        "d049x": "provider_rejected:invalid_request",
        "d120x": "provider_rejected:invalid_request",
    }
    assert report.complete and report.target_vectors == 150
    assert ledger.summary("plan").reconciled


@pytest.fixture
def provider():
    """The OpenAI batch embedder against the emulator, through the official SDK."""
    from openai import OpenAI

    from reindex_adapters.openai.batch import OpenAIBatchEmbedder
    from reindex_adapters.remote.pacing import Pacer
    from reindex_adapters.testing.emulators.openai import Emulator
    from reindex_adapters.testing.memory import HashEmbedder

    with Emulator(HashEmbedder(dim=1536)) as emulator:
        client = OpenAI(base_url=emulator.base_url, api_key="sk-test", max_retries=0)
        embedder = OpenAIBatchEmbedder(
            client,
            model="text-embedding-3-small",
            dimensions=16,
            inputs_per_request=8,
            pacer=Pacer(backoff_s=0.01),
        )
        yield emulator, embedder
        client.close()


@pytest.mark.parametrize("shape", ["response", "error"])
def test_provider_rejected_batch_lines_in_either_error_file_shape_become_dead_letters(
    ledger, provider, shape
):
    """Issue 10, defect 4: a 400 line (or an error-object line) ends dead-lettered for every document with
    its text, the documents that shared its request line are written, and the run reconciles."""
    from reindex_adapters.testing.emulators.faults import FaultPlan

    emulator, embedder = provider
    emulator.set_faults(FaultPlan(poison_substring="POISON", poison_shape=shape))
    poison = "this POISON text is refused"
    records = [*corpus(150), Record("d049x", poison), Record("d120x", poison)]
    report = deferred(records, embedder, MemorySink(), ledger, provider_attempts=1)
    code = "invalid_request_error" if shape == "response" else "invalid_request"
    letters = {d.doc_id: d.reason for d in ledger.dead_letters("plan")}
    assert letters == {"d049x": f"provider_rejected:{code}", "d120x": f"provider_rejected:{code}"}
    assert report.complete and report.target_vectors == 150
    summary = ledger.summary("plan")
    assert summary.reconciled and summary.documents == 152 and summary.written == 150


@pytest.mark.parametrize("status", [429, 500])
def test_rate_limited_or_failed_batch_lines_are_sent_again_not_dead_lettered(ledger, provider, status):
    from reindex_adapters.testing.emulators.faults import FaultPlan

    emulator, embedder = provider
    emulator.set_faults(FaultPlan(failed_lines=3, failed_line_status=status, faulty_batches=2))
    report = deferred(corpus(200), embedder, MemorySink(), ledger, provider_attempts=2)
    assert report.complete and report.target_vectors == 200 and ledger.dead_letters("plan") == []
    assert len(emulator.stats()["batches"]) == 4  # two shards, each sent once more for its failed lines


def _seq(key: str) -> int:
    """The shard of a job key `<plan>-<nonce>-<seq>-<attempt>`."""
    return int(key.split("-")[-2])
