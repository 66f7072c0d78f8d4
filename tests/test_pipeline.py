"""The shard loop on the shipped fakes: reconciliation, dedupe, dead letters, resume after a crash."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from reindex.columns import TokenColumns
from reindex.config import RunConfig
from reindex.errors import BackendError, BudgetRefused, Interrupted
from reindex.fingerprint import content_hash
from reindex.ports import Record, Rows, TargetSpec, Vectors
from reindex.prove.verify import coverage
from reindex.run.claims import LedgerClaims
from reindex.run.cost import Budget
from reindex.run.pipeline import Pipeline
from reindex.run.shards import prepare_shard, pretokenize
from reindex.state.sqlite import SqliteLedger
from reindex_adapters.testing.memory import HashEmbedder, MemorySink, MemorySource


class FlakySink(MemorySink):
    """Fails the k-th write with a non-transient error, like a crash mid-run."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at = fail_at

    def write(self, target: str, rows: Rows) -> None:
        if self.writes + 1 == self.fail_at:
            self.writes += 1
            raise BackendError("injected failure")
        super().write(target, rows)


class BrokenEmbedder(HashEmbedder):
    """Returns NaN for texts containing 'nan' and zeros for 'zero', like runtimes that fail silently."""

    def embed_columns(self, tokens: TokenColumns) -> Vectors:
        vectors = super().embed_columns(tokens)
        for row, item in enumerate(tokens):
            if "nan" in str(item.data):
                vectors[row] = np.nan
            elif "zero" in str(item.data):
                vectors[row] = 0.0
        return vectors


class CountingEmbedder(HashEmbedder):
    """Counts the texts it is asked to embed."""

    embedded = 0

    def embed_columns(self, tokens):
        self.embedded += len(tokens)
        return super().embed_columns(tokens)


def corpus(n: int) -> list[Record]:
    return [Record(str(i), f"document {i} text", {}) for i in range(n)]


def migrate(records, sink, ledger, *, embedder=None, shard_size=100, **run):
    embedder = embedder or HashEmbedder(dim=16, max_tokens=8)
    source = MemorySource(records)
    spec = TargetSpec(
        "docs__t", "docs", 16, embedder.info.fingerprint, embedder.info.describe(), source.schema()
    )
    sink.prepare(spec)
    ledger.begin("plan", alias="docs", target=spec.name, fingerprint=spec.fingerprint, model={})
    Pipeline(
        source=source,
        embedder=embedder,
        sink=sink,
        ledger=ledger,
        spec=spec,
        plan_id="plan",
        run=RunConfig(shard_size=shard_size, **run),
    ).run()
    dead = {d.doc_id: d.content_hash for d in ledger.dead_letters("plan")}
    return coverage(source, sink, spec.name, dim=16, fingerprint=spec.fingerprint, dead_letters=dead)


@pytest.fixture
def ledger(tmp_path: Path) -> SqliteLedger:
    return SqliteLedger(tmp_path / "state.db")


def test_run_writes_every_document_and_reconciles(ledger):
    report = migrate(corpus(1234), MemorySink(), ledger)
    summary = ledger.summary("plan")
    assert report.complete and report.target_vectors == 1234
    assert summary.shards == 13 and summary.reconciled and summary.written == 1234


def test_rerun_after_crash_skips_written_shards_and_ends_identical(ledger):
    records = corpus(1000)
    flaky = FlakySink(fail_at=4)
    with pytest.raises(BackendError):
        migrate(records, flaky, ledger)
    written_before = ledger.summary("plan").written
    assert written_before == 300
    resumed = MemorySink()
    resumed.targets_, resumed.specs = flaky.targets_, flaky.specs
    report = migrate(records, resumed, ledger)
    assert report.complete and resumed.writes == 7  # shards 4..10 only


def test_identical_texts_are_embedded_once_and_written_to_every_id(ledger):
    records = [Record(str(i), f"same text {i % 10}", {}) for i in range(200)]
    report = migrate(records, MemorySink(), ledger)
    summary = ledger.summary("plan")
    assert report.complete and summary.written == 200
    assert summary.reused == 200 - 10  # 10 unique texts, each embedded once for the whole run


class SlowLedger(SqliteLedger):
    """Takes its time to record a shard, as a remote ledger under load does."""

    def record_shard(self, plan_id, shard):
        time.sleep(0.05)
        super().record_shard(plan_id, shard)


def test_a_shard_recorded_while_the_next_is_written_still_hands_its_texts_to_copies(tmp_path):
    # The recorder commits shard n while shard n+1 is written; n+1's copies of n's texts must wait for
    # that record (a claim is no stored vector) rather than embed those texts a second time.
    ledger = SlowLedger(tmp_path / "state.db")
    records = [Record(str(i), f"same text {i % 50}", {}) for i in range(500)]
    embedder = CountingEmbedder(dim=16, max_tokens=8)
    report = migrate(records, MemorySink(), ledger, embedder=embedder, shard_size=50)
    summary = ledger.summary("plan")
    assert summary is not None
    assert report.complete and summary.written == 500 and summary.shards == 10
    assert embedder.embedded == 50 and summary.reused == 450


def test_poison_documents_become_dead_letters_with_reasons(ledger):
    records = [
        *corpus(50),
        Record("empty", "   "),
        Record("bad-utf8", "abc\udcff"),
        Record("nan", "nan here"),
        Record("zero", "zero here"),
        Record("unreadable", "", defect="invalid_json"),
        Record("dup", "one text"),
        Record("dup", "another text"),
        Record("same", "x y"),
        Record("same", "x y"),
    ]
    report = migrate(records, MemorySink(), ledger, embedder=BrokenEmbedder(dim=16))
    reasons = {d.doc_id: d.reason for d in ledger.dead_letters("plan")}
    assert reasons == {
        "empty": "empty_text",
        "bad-utf8": "invalid_encoding",
        "nan": "non_finite_vector",
        "zero": "zero_vector",
        "unreadable": "invalid_json",
        "dup": "duplicate_id_conflict",
    }
    summary = ledger.summary("plan")
    # "same" twice with one text and "dup" twice with two: two rows folded, one dead letter for "dup"
    assert summary.reconciled and summary.duplicates == 2 and summary.written == 51
    assert summary.dead_letters == 6
    assert report.complete


def test_too_long_policy_dead_letters_or_truncates_and_counts(ledger, tmp_path):
    records = [Record("long", " ".join(["w"] * 20)), Record("short", "two words")]
    migrate(records, MemorySink(), ledger, too_long="dead-letter")
    assert [d.reason for d in ledger.dead_letters("plan")] == ["too_long"]
    other = SqliteLedger(tmp_path / "other.db")
    migrate(records, MemorySink(), other, too_long="truncate")
    summary = other.summary("plan")
    assert summary is not None and summary.truncated == 1 and other.dead_letters("plan") == []


def test_stop_request_releases_in_flight_work_and_raises_interrupted(ledger):
    stop = threading.Event()
    stop.set()
    embedder = HashEmbedder(dim=16)
    source = MemorySource(corpus(500))
    spec = TargetSpec(
        "docs__t", "docs", 16, embedder.info.fingerprint, embedder.info.describe(), source.schema()
    )
    sink = MemorySink()
    sink.prepare(spec)
    ledger.begin("plan", alias="docs", target=spec.name, fingerprint=spec.fingerprint, model={})
    with pytest.raises(Interrupted) as raised:
        Pipeline(
            source=source,
            embedder=embedder,
            sink=sink,
            ledger=ledger,
            spec=spec,
            plan_id="plan",
            run=RunConfig(shard_size=100),
            stop=stop,
        ).run()
    assert raised.value.exit_code == 75
    assert ledger.summary("plan").written == len(sink.targets_["docs__t"])


def test_the_sort_window_spans_shards_so_small_shards_still_pad_little(tmp_path):
    records = [Record(str(i), " ".join(["w"] * (3 if i % 2 else 60)) + f" {i}") for i in range(400)]
    padding = {}
    for window in (1, 400):
        ledger = SqliteLedger(tmp_path / f"w{window}.db")
        embedder = HashEmbedder(dim=16, max_tokens=128, latency_ms=20)  # a slow model: the reader gets ahead
        source = MemorySource(records)
        spec = TargetSpec(
            "docs__t", "docs", 16, embedder.info.fingerprint, embedder.info.describe(), source.schema()
        )
        sink = MemorySink()
        sink.prepare(spec)
        ledger.begin("plan", alias="docs", target=spec.name, fingerprint=spec.fingerprint, model={})
        run = RunConfig(shard_size=4, sort_window=window, batch_tokens=256, queue_depth=64)
        progress = Pipeline(
            source=source, embedder=embedder, sink=sink, ledger=ledger, spec=spec, plan_id="plan", run=run
        ).run()
        padding[window] = 1 - progress.tokens / progress.padded_tokens
        assert len(sink.targets_["docs__t"]) == 400
    assert padding[400] < 0.05 < padding[1]


class TokenizeCounter(HashEmbedder):
    """Counts the texts its own `tokenize_columns` is asked for."""

    tokenized = 0

    def tokenize_columns(self, texts):
        self.tokenized += len(texts)
        return super().tokenize_columns(texts)


def test_a_shard_prepared_from_texts_tokenized_ahead_is_the_shard_tokenized_here(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ray engine's read tasks tokenize a shard's distinct texts before its claims are known; the actor
    takes the rows of the texts it still owns, and must end with the shard it would have made itself,
    without tokenizing or hashing the texts again."""
    embedder = TokenizeCounter(dim=16, max_tokens=12, tokenizer=str(tiny_model))
    records = [
        Record("a", "alpha beta", {}),
        Record("b", "alpha beta", {}),  # the same text: one row of tokens
        Record("c", "gamma " * 30, {}),  # over max_tokens
        Record("d", "", {}),  # dead-lettered by screening
        Record("e", "delta epsilon", {}),  # claimed elsewhere: a copy, its tokens unused
        Record("f", "zeta", {}),
    ]

    def claim(owners: dict[str, str]) -> dict[str, tuple[str, str]]:
        return {digest: ("x", "written") for digest, doc in owners.items() if doc == "e"}

    run = RunConfig(too_long="truncate")
    assert embedder.column_tokenizer is not None
    ahead = pretokenize(embedder.column_tokenizer, records)
    assert len(ahead.tokens) == 4  # alpha beta, gamma..., delta epsilon, zeta
    with monkeypatch.context() as patched:
        patched.setattr("reindex.run.validation.content_hashes", lambda texts: pytest.fail("hashed again"))
        shard = prepare_shard(embedder, run, 0, None, records, claim, ahead)
    assert embedder.tokenized == 0
    here = prepare_shard(embedder, run, 0, None, records, claim)
    assert embedder.tokenized == 3
    assert (shard.records.ids, shard.hashes, shard.owner) == (here.records.ids, here.hashes, here.owner)
    assert [copy[0].id for copy in shard.copies] == [copy[0].id for copy in here.copies] == ["e"]
    assert (shard.dead, shard.truncated, shard.claimed) == (here.dead, here.truncated, here.claimed)
    for column in ("counts", "original", "ids", "offsets"):
        np.testing.assert_array_equal(getattr(shard.tokens, column), getattr(here.tokens, column))


class BillingEmbedder(HashEmbedder):
    """Bills each token it embeds, as a paid provider does (the pipeline reads `billed_tokens`)."""

    billed_tokens = 0

    def embed_columns(self, tokens):
        self.billed_tokens += int(tokens.counts.sum())
        return super().embed_columns(tokens)


def lane(path: Path, embedder, sink, spec, *, budget=None, claims=None, lock=None) -> Pipeline:
    """A pipeline over its own ledger connection, as each of a ray actor's lanes has."""
    ledger = SqliteLedger(path)
    return Pipeline(
        source=MemorySource([]),
        embedder=embedder,
        sink=sink,
        ledger=ledger,
        spec=spec,
        plan_id="plan",
        run=RunConfig(shard_size=100),
        budget=budget,
        claims=claims(ledger) if claims else None,
        model_lock=lock,
    )


def paid_target(path: Path, embedder, sink) -> TargetSpec:
    spec = TargetSpec(
        "docs__t", "docs", 16, embedder.info.fingerprint, embedder.info.describe(), MemorySource([]).schema()
    )
    sink.prepare(spec)
    SqliteLedger(path).begin("plan", alias="docs", target=spec.name, fingerprint=spec.fingerprint, model={})
    return spec


def test_a_shard_waits_for_the_shard_that_claimed_its_texts_and_copies_them_instead_of_paying_again(
    tmp_path,
):
    """Two lanes share the model: the second shard repeats the first one's texts and claims them while the
    first is in the model. It copies them once the first stores them; embedding them itself would bill each
    text twice, past a budget reserved for them once."""
    embedder = BillingEmbedder(dim=16, max_tokens=8, latency_ms=300)
    sink = MemorySink()
    spec = paid_target(tmp_path / "state.db", embedder, sink)
    ours = [Record(f"a{i}", f"document {i} text", {}) for i in range(8)]
    repeats = [Record(f"b{i}", record.text, {}) for i, record in enumerate(ours)]
    tokens = 3 * len(ours)
    budget = Budget(max_usd=float(tokens), price_per_million=1e6)  # a dollar a token: room for each text once
    model = threading.Lock()
    first, second = (
        lane(tmp_path / "state.db", embedder, sink, spec, budget=budget, claims=claim_rows, lock=model)
        for claim_rows in (lambda ledger: LedgerClaims(ledger, "plan"),) * 2
    )
    done = threading.Thread(target=first.run_shard, args=(0, None, ours))
    done.start()
    time.sleep(0.1)  # the first shard is in the model
    shard = second.run_shard(1, "a7", repeats)
    done.join()
    assert shard is not None and shard.copied == [record.id for record in repeats]
    assert embedder.billed_tokens == tokens and budget.spent_tokens == tokens
    assert ledger_summary(tmp_path).shards == 2


def ledger_summary(tmp_path):
    summary = SqliteLedger(tmp_path / "state.db").summary("plan")
    assert summary is not None
    return summary


@pytest.mark.parametrize("engine", ["local", "ray actor"])
def test_copies_a_shard_must_embed_itself_need_the_budget_too(tmp_path, engine):
    """The ledger names owners for half the texts whose vectors the target no longer holds (a sync moved
    them on): the shard that meets their copies embeds them, and that is spending like any other. Refused,
    the shard stops unrecorded within the limit (the local run with exit 75, the ray actor's shard refused),
    with the texts it stored settled, so that a raised limit finishes without paying for them again."""
    embedder = BillingEmbedder(dim=16, max_tokens=8)
    sink = MemorySink()
    spec = paid_target(tmp_path / "state.db", embedder, sink)
    records = corpus(20)
    gone = {content_hash(record.text): f"gone-{record.id}" for record in records[10:]}
    SqliteLedger(tmp_path / "state.db").settle_texts(
        "plan", [(h, "written") for h in sorted(gone)], owners=gone
    )
    own = 3 * 10  # "document i text": three words each, half of them the shard's own texts
    limit = own + 5.0  # dollars, at a dollar a token: not the copies' 30 tokens more
    budget = Budget(max_usd=limit, price_per_million=1e6)
    if engine == "local":
        pipeline = lane(tmp_path / "state.db", embedder, sink, spec, budget=budget)
        pipeline.source = MemorySource(records)
        with pytest.raises(BudgetRefused, match="budget reached") as stopped:
            pipeline.run()
        assert stopped.value.exit_code == 75
    else:
        claims = lambda ledger: LedgerClaims(ledger, "plan")  # noqa: E731
        pipeline = lane(tmp_path / "state.db", embedder, sink, spec, budget=budget, claims=claims)
        assert pipeline.run_shard(0, None, records) is None
    assert embedder.billed_tokens == own and budget.spent_tokens == own <= limit
    assert budget.reserved_tokens == 0
    assert ledger_summary(tmp_path).shards == 0
    raised = lane(tmp_path / "state.db", embedder, sink, spec, budget=Budget(100.0, 1e6))
    raised.source = MemorySource(records)
    raised.run()
    assert embedder.billed_tokens == own + 30  # the stored texts are copied, not billed again
    dead = {d.doc_id: d.content_hash for d in raised.ledger.dead_letters("plan")}
    assert coverage(
        raised.source, sink, spec.name, dim=16, fingerprint=spec.fingerprint, dead_letters=dead
    ).complete


class Watching(HashEmbedder):
    """Records, at each model call, how far the pipeline says the model has come (`Progress.embedding`)."""

    pipeline: Pipeline | None = None
    seen: list[float]

    def embed_columns(self, tokens):
        assert self.pipeline is not None
        self.seen.append(self.pipeline.progress.embedding)
        return super().embed_columns(tokens)


def test_progress_moves_with_each_model_call_not_a_shard_at_a_time(tmp_path):
    """The bar moved a whole shard at a time (issue 43): within one window of 400 documents, what the
    progress says grows with every call, and ends at the documents read."""
    records = corpus(400)
    embedder = Watching(dim=16, max_tokens=8)
    embedder.seen = []
    source, sink, ledger = MemorySource(records), MemorySink(), SqliteLedger(tmp_path / "state.db")
    spec = TargetSpec(
        "docs__t", "docs", 16, embedder.info.fingerprint, embedder.info.describe(), source.schema()
    )
    sink.prepare(spec)
    ledger.begin("plan", alias="docs", target=spec.name, fingerprint=spec.fingerprint, model={})
    run = RunConfig(shard_size=400, sort_window=1, batch_tokens=64, queue_depth=1)
    embedder.pipeline = Pipeline(
        source=source, embedder=embedder, sink=sink, ledger=ledger, spec=spec, plan_id="plan", run=run
    )
    progress = embedder.pipeline.run()
    assert len(embedder.seen) > 10 and embedder.seen == sorted(embedder.seen)
    assert len({value for value in embedder.seen if 0 < value < 400}) > 5  # between the shard's start and end
    assert progress.embedding == progress.documents == 400


def texts_in_ledger(ledger: SqliteLedger) -> int:
    return int(ledger._db.execute("SELECT count(*) FROM texts").fetchone()[0])


class CountingTexts(HashEmbedder):
    """Counts the texts it embeds (a free model: no `billed_tokens`)."""

    embedded = 0

    def embed_columns(self, tokens):
        self.embedded += len(tokens)
        return super().embed_columns(tokens)


def test_a_free_models_dedupe_reaches_the_recent_texts_and_writes_no_row_per_text(tmp_path, monkeypatch):
    """Issue 44: a ledger row per text made the cost per document grow with the corpus. A local model bills
    nothing, so by default its dedupe keeps the recent texts in memory (bounded) and the ledger none: a
    repeat within reach is copied, one beyond it embedded again, and coverage is exact either way."""
    monkeypatch.setattr("reindex.run.claims.RECENT_TEXTS", 50)
    records = [Record(f"d{i:04d}", f"document {i} text", {}) for i in range(300)]  # read in id order
    records += [Record(f"e-{i}", f"document {i} text", {}) for i in range(280, 300)]  # just after
    records += [Record(f"f-{i}", f"document {i} text", {}) for i in range(20)]  # 300 texts after
    ledger = SqliteLedger(tmp_path / "state.db")
    embedder = CountingTexts(dim=16, max_tokens=8)
    report = migrate(records, MemorySink(), ledger, embedder=embedder, shard_size=20, sort_window=20)
    assert report.complete and report.target_vectors == 340
    assert texts_in_ledger(ledger) == 0
    assert embedder.embedded == 320  # the near repeats copied, the far ones embedded again
    summary = ledger.summary("plan")
    assert summary is not None and summary.reconciled


def test_run_wide_dedupe_embeds_every_repeat_once_with_a_row_per_text(tmp_path):
    records = corpus(300) + [Record(f"far-{i}", f"document {i} text", {}) for i in range(20)]
    ledger = SqliteLedger(tmp_path / "state.db")
    embedder = CountingTexts(dim=16, max_tokens=8)
    report = migrate(records, MemorySink(), ledger, embedder=embedder, shard_size=20, dedupe="run")
    assert report.complete and report.target_vectors == 320
    assert texts_in_ledger(ledger) == 300 and embedder.embedded == 300
