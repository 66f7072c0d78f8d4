"""The dry-run estimate: documents, exact tokens with the embedder's own tokenizer, ETA, storage."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from reindex.batching import batch_budget, batch_texts, token_batches
from reindex.columns import Documents, embed
from reindex.config import RunConfig
from reindex.errors import ConfigError
from reindex.plan.rehearsal import Rehearsal
from reindex.ports import (
    DEFAULT_WINDOW_HOURS,
    MODEL_TOKENIZER,
    CaveatsPrices,
    CountsTokens,
    DeferredEmbedder,
    Embedder,
    EmbedderTraits,
    Record,
    Source,
    StoragePlan,
)
from reindex.run.io import scan_documents
from reindex.run.shards import prepare_shard
from reindex.run.validation import screen
from reindex.units import count

CHUNK = 1000
SAMPLE = 10_000
SIZE_SAMPLE = 1_000  # documents whose JSON size estimates what the target copies of them
CALIBRATION_DOCS = 256
STAGE_DOCS = 2000  # documents the real stages are timed on (reindex.plan.estimate._calibrate_stages)
HNSW_M = 16


@dataclass
class PlanReport:
    documents: int = 0
    embeddable: int = 0
    unreadable_or_empty: int = 0
    # an id column that is not unique: ids whose rows hold different texts (each one dead letter,
    # duplicate_id_conflict) and rows folded into the first row of their id (repeats, same text or not)
    id_conflicts: int = 0
    repeated_rows: int = 0
    unique_texts: int = 0
    tokens: int = 0  # tokens of the unique texts that will be embedded (after truncation)
    # exact, in the model's own tokenizer, or estimated, and how (reindex.ports.CountsTokens)
    token_counts: dict[str, Any] = field(
        default_factory=lambda: {"exact": MODEL_TOKENIZER.exact, "basis": MODEL_TOKENIZER.basis}
    )
    tokens_mean: float = 0.0
    tokens_p90: int = 0
    over_max_tokens: int = 0
    too_long_policy: str = "truncate"
    model: dict[str, Any] = field(default_factory=dict)
    fingerprint: str = ""
    dim: int = 0
    max_tokens: int = 0
    calibration_docs_per_second: float | None = None  # the real stages one after another, in one process
    calibration_tokens_per_second: float | None = None  # the model alone
    # the real stages timed on a sample: reading, screening, hashing and tokenizing (a worker's CPU, once per
    # document), and the model; the target's own ingest is not in them, the rehearsal's pace is
    calibration_stage_seconds_per_document: float | None = None
    calibration_model_seconds_per_document: float | None = None
    # the run's engine on the first shards into a scratch target and ledger (reindex.plan.rehearsal): its
    # steady pace per document on `rehearsal_workers` workers, and the time its first shards took beyond it
    rehearsal_documents: int | None = None
    rehearsal_workers: int | None = None
    rehearsal_devices: int | None = None
    rehearsal_seconds_per_document: float | None = None
    rehearsal_model_seconds_per_document: float | None = None  # the model alone on the documents timed
    rehearsal_fill_seconds: float | None = None
    eta_basis: str | None = None  # what the printed ETA counts, or why it counts less, in one line
    devices: int = 0  # model processes a run would feed (GPUs; 1 for a model on the CPU in its own process)
    eta_seconds: float | None = None  # the model alone, on the calibration sample
    # the one ETA `plan` prints: the run's stages and model on its workers where they were timed, else the
    # model's alone (`headline_eta`); the report compares the run with it
    eta_headline_seconds: float | None = None
    vector_bytes: int = 0
    index_bytes_estimate: int = 0  # vectors and their ANN index together (vectors alone: no index is built)
    # the documents as the target copies them beside each vector (a new table's other columns, a Qdrant
    # point's payload): their JSON size on a uniform sample, times the documents; not where the vectors go
    # into the application's own table (mode column)
    document_bytes_estimate: int = 0
    # how the target stores its vectors (reindex.ports.StoragePlan): type, precision, index, bytes per vector
    storage: dict[str, Any] | None = None
    # what the target is created with besides its vector, where the sink says (reindex.ports.DescribingSink:
    # Qdrant's carried vectors and index settings), with a `summary` of lines for the terminal
    target_layout: dict[str, Any] | None = None
    plan_id: str = ""
    target: str = ""
    target_exists: bool = False
    alias: str = ""
    alias_target: str | None = None
    alias_fingerprint: str | None = None
    alias_is_physical: bool = False
    # what the live index has that the first cutover would not keep (reindex.ports.Loss, as JSON); `plan`
    # exits 2 while one is not accepted by `[target] accept`
    losses: list[dict[str, Any]] = field(default_factory=list)
    # what the tool's role may not do for this migration, and the statement that grants it
    # (reindex.ports.ChecksPrivileges); `plan` exits 2 while one is missing, and `run` refuses
    privileges: list[dict[str, str]] = field(default_factory=list)
    coverage: dict[str, Any] | None = None
    cost_online_usd: float | None = None  # paid embedders: unique-text tokens x the online list price
    cost_batch_usd: float | None = None  # the provider batch tier (about half), finished within its window
    batch_window: str | None = None
    # what is not confirmed about the prices or the bill (reindex.ports.CaveatsPrices), each a line
    price_caveats: list[str] = field(default_factory=list)
    backends: dict[str, Any] | None = None  # what this machine can run (CUDA, vLLM, CPU precision flags)
    # Spread over workers (engine "ray": one embedding actor each): the ETA at `worker_docs_per_second` each
    # (measured here by calibration, or given: e.g. the per-GPU rate scripts/gpu-check reports), the shards
    # the run cuts, and what the ledger must absorb; a reclaimed worker redoes at most its shard in flight.
    workers: int = 1
    worker_docs_per_second: float | None = None
    eta_seconds_workers: float | None = None
    shards: int = 0
    ledger_shards_per_second: float | None = None
    redone_documents_per_reclaim: int = 0
    # Cost routing (reindex/plan/routing.py): each way to embed this corpus, and the one `[run] deadline` and
    # `max_cost_usd` pick (`route["name"]` None: none meets them, and `plan` exits 4).
    routes: list[dict[str, Any]] = field(default_factory=list)
    route: dict[str, Any] | None = None
    # tokens of the unique texts per fingerprint, for routes that bill with another tokenizer
    tokens_by_fingerprint: dict[str, int] = field(default_factory=dict)
    ledger_advice: str | None = None  # a SQLite ledger for a corpus past SQLITE_LEDGER_DOCUMENTS

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def refused(self) -> list[str]:
        """The keys of the losses `[target] accept` does not name, and a missing privilege's need."""
        return [loss["key"] for loss in self.losses if not loss["accepted"]] + [
            p["need"] for p in self.privileges
        ]


# Past this many documents a SQLite ledger's text bookkeeping costs more than a Postgres ledger's: each
# shard's commit rewrites pages across the whole text table, so its cost per text grows with the run
# (`scripts/ledger_scale.py`, README "Ledger scale": 1 s for the first 100,000 texts, 10 s for the tenth).
SQLITE_LEDGER_DOCUMENTS = 500_000


def ledger_advice(run: RunConfig, documents: int, *, run_wide: bool = True) -> str | None:
    """The warning `plan` gives when a SQLite ledger would carry more than SQLITE_LEDGER_DOCUMENTS texts:
    only with run-wide dedupe (`reindex.run.claims`), since a windowed one writes no row per text."""
    if documents <= SQLITE_LEDGER_DOCUMENTS or not run_wide:
        return None
    try:
        if run.ledger_on_postgres():
            return None
    except ConfigError:
        return None  # `state_env` is not set here; `run` says so
    return (
        f"{documents:,} documents on a SQLite ledger: its cost per text grows with the run (a Postgres"
        ' ledger stays flat); set [run] state = "postgresql://..."'
    )


def estimate(
    source: Source,
    embedder: Embedder,
    run: RunConfig,
    *,
    calibrate: bool,
    recount: Mapping[str, Any] | None = None,
) -> PlanReport:
    """Count the corpus with `embedder`'s tokenizer; `recount` ({fingerprint: embedder}) counts the same
    unique texts with other tokenizers in the same pass (into `tokens_by_fingerprint`)."""
    info = embedder.info
    report = PlanReport(
        too_long_policy=run.too_long,
        model=info.describe(),
        fingerprint=info.fingerprint,
        dim=info.dim,
        max_tokens=info.max_tokens,
    )
    seen: set[str] = set()
    lengths: list[int] = []
    rng, picks, rows = random.Random(0), random.Random(1), random.Random(2)
    sizes: list[Record] = []  # a uniform sample of the documents, measured by their JSON size
    calibration: list[Any] = []  # a uniform sample of the distinct texts: the ETA's, like the corpus
    sample: list[Record] = []
    others = dict(recount or {})
    report.tokens_by_fingerprint = dict.fromkeys(others, 0)
    scan = source.scan()
    while chunk := list(islice(scan, CHUNK)):
        sample += chunk[: STAGE_DOCS - len(sample)]
        for read, record in enumerate(chunk, start=report.documents):
            _reservoir(sizes, record, read, rows, size=SIZE_SAMPLE)
        texts = _new_texts(report, chunk, seen)
        for fingerprint, other in others.items():
            report.tokens_by_fingerprint[fingerprint] += sum(tokens.count for tokens in other.tokenize(texts))
        for tokens in embedder.tokenize(texts):
            report.tokens += tokens.count
            report.over_max_tokens += tokens.is_truncated
            _reservoir(lengths, tokens.count, report.unique_texts, rng)
            _reservoir(calibration, tokens, report.unique_texts, picks, size=CALIBRATION_DOCS)
            report.unique_texts += 1
    _summarise(report, lengths)
    if sizes:
        measured = [len(json.dumps(dict(r.payload), default=str).encode()) for r in sizes]
        report.document_bytes_estimate = round(sum(measured) / len(measured) * report.documents)
    traits: EmbedderTraits = embedder.traits
    _price(report, dict(traits.prices) or None, traits.completion_window_hours or DEFAULT_WINDOW_HOURS)
    if isinstance(embedder, CaveatsPrices):
        report.price_caveats = list(embedder.price_caveats)
    counts = embedder.token_counts if isinstance(embedder, CountsTokens) else MODEL_TOKENIZER
    report.token_counts = {"exact": counts.exact, "basis": counts.basis}
    deferred = isinstance(embedder, DeferredEmbedder)  # a dry run never spends money
    if calibrate and calibration and not traits.paid and not deferred:
        _calibrate_stages(report, embedder, source, len(sample), run)
        _calibrate(report, embedder, calibration, run)
    return report


def rehearsed(
    report: PlanReport, rehearsal: Rehearsal | str, embedder: Embedder, source: Source, run: RunConfig
) -> None:
    """Keep the rehearsal's figures for `spread`, with the model alone on the documents it timed (the
    model's share of its pace, which `spread` swaps for the uniform sample's), and say what the ETA
    counts."""
    if isinstance(rehearsal, str):
        report.eta_basis = f"stages and model timed, not the target's write or the ledger: {rehearsal}"
        return
    report.rehearsal_model_seconds_per_document = _window_model_seconds(
        embedder, source, run.model_copy(update={"shard_size": rehearsal.shard_size}), *rehearsal.timed
    )
    report.rehearsal_documents = rehearsal.documents
    report.rehearsal_workers, report.rehearsal_devices = rehearsal.workers, rehearsal.devices
    report.rehearsal_seconds_per_document = rehearsal.seconds_per_document
    report.rehearsal_fill_seconds = round(rehearsal.fill_seconds, 3)
    engine = (
        f"by the processes engine, {count(rehearsal.workers, 'worker')} and"
        f" {count(rehearsal.devices, 'model process', 'model processes')}, "
        if rehearsal.processes
        else ""
    )
    report.eta_basis = (
        f"rehearsed {engine}on {rehearsal.documents:,} documents in shards of {rehearsal.shard_size:,} into a"
        " scratch target, write and ledger included; the model timed on a sample like the corpus"
    )


def headline_eta(report: PlanReport) -> None:
    """The one ETA `plan` prints: the run's stages and model on its workers where they were timed, else the
    model's alone; for a provider's online route (never called by a dry run), what its configured
    per-minute limits allow (reindex.plan.routing), when they are given."""
    report.eta_headline_seconds = (
        report.eta_seconds_workers if report.eta_seconds_workers is not None else report.eta_seconds
    )
    if report.eta_headline_seconds is not None:
        return
    configured = next((route for route in report.routes if route.get("is_configured")), None)
    if configured and configured.get("tier") == "online" and configured.get("duration_seconds") is not None:
        report.eta_headline_seconds = configured["duration_seconds"]
        report.eta_basis = configured.get("duration_basis")


def printed_plan(run: RunConfig, plan_id: str) -> Path | None:
    """Where `plan` keeps the estimate it printed, for the report's plan against actual: beside a SQLite
    ledger (a Postgres ledger's plans are recomputed by the report instead)."""
    try:
        if run.ledger_on_postgres():
            return None
        return Path(run.ledger_location()).with_name(f"plan-{plan_id}.json")
    except ConfigError:
        return None


def remember(report: PlanReport, run: RunConfig) -> None:
    """Keep the printed estimate (`printed_plan`); a folder that cannot be written keeps nothing."""
    path = printed_plan(run, report.plan_id)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**report.to_json(), "printed_at": time.time()}))
    except OSError:
        return


def spread(
    report: PlanReport, run: RunConfig, workers: int, docs_per_second: float | None, devices: int = 0
) -> None:
    """The ETA and ledger load of this plan on `workers` workers, each at `docs_per_second` (given: ideal
    scaling; the source reads and the ledger must keep up, which `scripts/bench-ray` and
    `scripts/bench-engine` measure), else at the rehearsed or calibrated rate."""
    report.workers, report.devices = workers, devices
    report.shards = -(-report.documents // run.shard_size)
    report.redone_documents_per_reclaim = min(run.shard_size, report.documents)
    if docs_per_second:
        rate, fill = docs_per_second * workers, 0.0
    else:
        rated = _rehearsed_rate(report, workers, devices) or _calibrated_rate(report, workers, devices)
        if rated is None:
            return
        rate, fill = rated
    report.worker_docs_per_second = round(rate / workers, 1)
    report.eta_seconds_workers = round(fill + report.documents / rate, 1)
    report.ledger_shards_per_second = round(rate / run.shard_size, 3)


def _rehearsed_rate(report: PlanReport, workers: int, devices: int) -> tuple[float, float] | None:
    """(rate, fill) of the rehearsal, where it ran as the run would (the same engine, workers and model
    processes). Its pace holds the write and the ledger, and the model on the documents it timed, the
    corpus's first: that share is swapped for the uniform sample's (a corpus's first texts are often not like
    the rest), spread over the model's copies (a device each, or one in each worker)."""
    pace, model = report.rehearsal_seconds_per_document, report.calibration_model_seconds_per_document
    first = report.rehearsal_model_seconds_per_document
    if pace is None or model is None or first is None:
        return None
    rehearsed_on = report.rehearsal_workers or 1
    if (rehearsed_on, report.rehearsal_devices or 0) != (workers, devices):
        return None
    copies = report.rehearsal_devices or rehearsed_on
    return 1 / max(pace + (model - first) / copies, 1e-9), report.rehearsal_fill_seconds or 0.0


def _calibrated_rate(report: PlanReport, workers: int, devices: int) -> tuple[float, float] | None:
    """(rate, fill) from the stages and the model timed apart: the workers' stages scale with the workers
    and a model on a device with the `devices` model processes (`reindex.run.processes`), whichever is
    slower; a model without one runs in each worker. Where a rehearsal ran on other workers (a Ray run,
    `--workers`), a worker's share of its pace, less the model, stands for the stages."""
    stage, model = (
        report.calibration_stage_seconds_per_document,
        report.calibration_model_seconds_per_document,
    )
    if stage is None or model is None:
        return None
    fill, pace = 0.0, report.rehearsal_seconds_per_document
    first = report.rehearsal_model_seconds_per_document
    if pace is not None and first is not None:
        stage = max(stage, pace * (report.rehearsal_workers or 1) - first)
        fill = report.rehearsal_fill_seconds or 0.0
    rate = min(workers / stage, devices / model) if devices else workers / (stage + model)
    return rate, fill


def _new_texts(report: PlanReport, chunk: list[Record], seen: set[str]) -> list[str]:
    screened = screen(chunk)
    report.documents += len(chunk)
    report.embeddable += len(screened.records)
    conflicts = sum(letter.reason == "duplicate_id_conflict" for letter in screened.dead)
    report.id_conflicts += conflicts
    report.repeated_rows += screened.duplicates
    report.unreadable_or_empty += len(screened.dead) - conflicts
    texts = []
    for text, digest in zip(screened.records.texts, screened.hashes, strict=True):
        if digest not in seen:
            seen.add(digest)
            texts.append(text)
    return texts


def _reservoir(sample: list[Any], value: Any, seen: int, rng: random.Random, *, size: int = SAMPLE) -> None:
    """Algorithm R: after `seen` + 1 values, `sample` holds a uniform `size` of them."""
    if len(sample) < size:
        sample.append(value)
    elif (slot := rng.randrange(seen + 1)) < size:
        sample[slot] = value


def _summarise(report: PlanReport, lengths: list[int]) -> None:
    if report.unique_texts:
        report.tokens_mean = round(report.tokens / report.unique_texts, 1)
        report.tokens_p90 = sorted(lengths)[int(0.9 * (len(lengths) - 1))]
    report.vector_bytes = report.embeddable * report.dim * 4
    report.index_bytes_estimate = report.vector_bytes + report.embeddable * HNSW_M * 2 * 8


def stored(report: PlanReport, storage: StoragePlan) -> None:
    """Storage as the target will hold it: its own bytes per vector, and the index over what it indexes
    (an HNSW element holds the indexed value and about 2 x m neighbour ids of 8 bytes)."""
    report.storage = asdict(storage)
    report.vector_bytes = report.embeddable * storage.bytes_per_vector
    report.index_bytes_estimate = report.vector_bytes
    if not storage.index.startswith("none"):
        indexed = {"float32": 4 * report.dim, "float16": 2 * report.dim, "bit": (report.dim + 7) // 8}
        element = (report.dim + 7) // 8 if "binary_quantize" in storage.index else indexed[storage.precision]
        report.index_bytes_estimate += report.embeddable * (8 + element + HNSW_M * 2 * 8)


def _price(report: PlanReport, prices: dict[str, float | None] | None, window_hours: float = 24.0) -> None:
    """Exact cost from exact tokens: what each tier would bill for the unique texts."""
    if not prices:
        return
    for tier in ("online", "batch"):
        price = prices.get(tier)
        if price is not None:
            setattr(report, f"cost_{tier}_usd", round(report.tokens * price / 1_000_000, 6))
    report.batch_window = f"{window_hours:g}h" if prices.get("batch") is not None else None  # Voyage: 12h


def _calibrate_stages(
    report: PlanReport, embedder: Embedder, source: Source, count: int, run: RunConfig
) -> None:
    """The run's own stage functions on the first `count` documents, timed: the source's read, then
    screening, hashing, tokenizing and the length policy (`prepare_shard`). The model is timed on a uniform
    sample instead (`_calibrate`), and the write by the rehearsal."""
    if not count:
        return
    started = time.perf_counter()
    docs = next(scan_documents(source, None, count), None)
    read = time.perf_counter() - started
    if docs is None or not len(docs):
        return
    started = time.perf_counter()
    prepare_shard(embedder, run, 0, None, docs)
    prepared = time.perf_counter() - started
    report.calibration_stage_seconds_per_document = (read + prepared) / len(docs)


def _timed_model(embedder: Embedder, run: RunConfig, docs: Documents) -> float:
    """Seconds embedding `docs` as a shard of the run (`prepare_shard`: screening, hashing, tokenizing, the
    length policy; not timed) through the run's batcher, its first batch twice (the first call pays for lazy
    initialisation)."""
    tokens = prepare_shard(embedder, run, 0, None, docs).tokens
    batches = token_batches(tokens.counts, batch_budget(run, embedder), batch_texts(run, embedder))
    if batches:
        embed(embedder, tokens.take(batches[0]))
    started = time.perf_counter()
    for batch in batches:
        embed(embedder, tokens.take(batch))
    return time.perf_counter() - started


def _window_model_seconds(
    embedder: Embedder, source: Source, run: RunConfig, start: int, stop: int
) -> float | None:
    """The model alone on documents `start` to `stop` of the source (those a rehearsal timed), per
    document."""
    docs = next(scan_documents(source, None, stop), None)
    if docs is None or len(docs) <= start:
        return None
    window = Documents.from_records(list(docs)[start:stop])
    return _timed_model(embedder, run, window) / len(window)


def _calibrate(report: PlanReport, embedder: Embedder, sample: list[Any], run: RunConfig) -> None:
    """Embed a uniform sample of the distinct texts through the real batcher: the model's time per text,
    and so the ETA, from texts like the corpus's (the first texts of a source are often not: a plan of
    the same corpus once said 4 to 15 minutes for a 3-minute run, its first texts a third as long)."""
    lengths = [tokens.count for tokens in sample]
    batches = token_batches(lengths, batch_budget(run, embedder), batch_texts(run, embedder))
    embedder.embed([sample[i] for i in batches[0]])  # warm-up: first calls pay for lazy init
    started = time.perf_counter()
    for batch in batches:
        embedder.embed([sample[i] for i in batch])
    seconds = max(time.perf_counter() - started, 1e-9)
    report.calibration_docs_per_second = round(len(sample) / seconds, 1)
    report.calibration_tokens_per_second = round(sum(lengths) / seconds, 1)
    per_text = seconds / len(sample)
    report.eta_seconds = round(report.unique_texts * per_text, 1)
    if report.documents:  # the model's share of each document: distinct texts are embedded once
        model = per_text * report.unique_texts / report.documents
        report.calibration_model_seconds_per_document = model
        stage = report.calibration_stage_seconds_per_document
        if stage is not None:  # the stages and the model, one after the other, as in one worker
            report.calibration_docs_per_second = round(1 / max(stage + model, 1e-9), 1)
