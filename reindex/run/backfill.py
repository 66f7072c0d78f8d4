"""The `run` verb's body: attach the migration to its ledger run and its target, choose the engine that
does the shards (Ray, a provider's batch API, the processes engine or the one-process pipeline), finish
the target and report. `reindex.commands.run` opens what it needs and calls `backfill`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from reindex import crashpoints, registry
from reindex.capabilities import ReportsTraffic, TimesIndexBuild
from reindex.config import Config
from reindex.errors import ConfigError, CutoverRefused
from reindex.ports import DeferredEmbedder, EmbedderTraits
from reindex.run import processes
from reindex.run.cost import Budget
from reindex.run.deferred import DeferredRun
from reindex.run.migration import (
    Migration,
    config_key,
    with_nonce,
)
from reindex.run.pipeline import Pipeline, Progress
from reindex.run.ray.sizing import slots as ray_slots
from reindex.state.ledger import Ledger
from reindex.state.records import Lease, RunSummary


@dataclass(frozen=True)
class RunReport:
    plan_id: str
    target: str
    documents: int
    written: int
    dead_letters: int
    duplicates: int
    reused: int
    tokens: int
    truncated: int
    seconds: float  # this invocation's, as are the rates; the counts above are the run's totals
    docs_per_second: float
    tokens_per_second: float
    padding_fraction: float | None  # None for a remote model: it pads nothing we pay for or wait on
    model_busy_fraction: float | None  # None for a remote model: its requests overlap, see requests_*
    reconciled: bool
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)
    billed_tokens: int = 0  # from the provider's usage fields
    cost_usd: float | None = None
    finalize_seconds: float = 0.0  # after the load: ANN index, ANALYZE, grants (not in `seconds`)
    index_seconds: float | None = None  # the ANN index build alone, when the sink built one
    # a remote model's traffic (None for a local one): attempts sent, re-sends, 429 answers, and the
    # achieved rates between the first request and the last answer
    requests: int | None = None
    retries: int | None = None
    rate_limited: int | None = None
    requests_per_second: float | None = None
    tokens_per_minute: float | None = None
    processes: int = 1  # worker processes of the local engine (reindex.run.processes)
    # the device's busy fraction after its first batch (a model process's busy time over the rest of the load)
    device_busy_fraction: float | None = None
    note: str | None = None  # why the run used fewer processes than asked for, in one line
    documents_this_run: int | None = None  # what this invocation read, where a resume did less than all

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def attach(m: Migration, ledger: Ledger, *, fresh: bool = False, create: bool = False) -> Migration:
    """Open this migration's run in the ledger and make sure the target is the one it built.

    A target carries the plan id and the nonce of the ledger run that created it. A ledger with progress
    whose target is gone, or a target made by another ledger or migration, is refused: resuming there
    would "finish" a target whose earlier shards it never wrote."""
    if fresh:
        _start_afresh(m, ledger)
    elif not create and ledger.run_info(m.plan_id) is None:
        raise ConfigError("no run of this migration in the ledger", hint="run `reindex run` first")
    key = config_key(m.config, m.source, m.sink)
    nonce = ledger.begin(
        m.plan_id,
        alias=m.spec.alias,
        target=m.spec.name,
        fingerprint=m.spec.fingerprint,
        model=dict(m.spec.model),
        config_key=key,
    )
    m = with_nonce(m, nonce)
    info = m.sink.describe(m.spec.name)
    if info is None and (_has_progress(ledger, m.plan_id) or not create):
        raise ConfigError(
            f"target {m.spec.name!r} is gone, but the ledger holds progress of this migration",
            hint="`reindex run --fresh` starts it again from the first document",
        )
    if info is not None and (info.plan_id, info.nonce) != (m.plan_id, nonce):
        raise ConfigError(
            f"target {m.spec.name!r} was not built by this migration's ledger run"
            f" (it carries plan {info.plan_id or 'none'}, this is plan {m.plan_id})",
            hint="`reindex run --fresh` rebuilds it; or set [target] name to a new target",
        )
    m.sink.prepare(m.spec)
    return m


def _refuse_a_ray_plan(m: Migration, ledger: Ledger) -> None:
    """The local engine resumes after its last shard; shards a ray run planned may be missing before it."""
    if any(not shard.recorded for shard in ledger.shard_plan(m.plan_id)):
        if m.config.run.engine == "ray":  # a provider batch embedder, which runs here, not on Ray
            raise ConfigError(
                "this migration has shards still to do that the ray engine planned for an embedder that is"
                " not a provider batch one",
                hint="finish it with that embedder, or start over with `reindex run --fresh`",
            )
        raise ConfigError(
            'this migration was started with engine = "ray" and has planned shards still to do',
            hint='finish it with [run] engine = "ray", or start over with `reindex run --fresh`',
        )


def _has_progress(ledger: Ledger, plan_id: str) -> bool:
    summary = ledger.summary(plan_id)
    return bool((summary and summary.shards) or ledger.jobs(plan_id))


def _start_afresh(m: Migration, ledger: Ledger) -> None:
    if m.sink.alias(m.spec.alias).target == m.spec.name:
        raise CutoverRefused(
            f"target {m.spec.name!r} is live behind alias {m.spec.alias!r}; it cannot be rebuilt in place",
            hint="set [target] name to a new target, or roll back first",
        )
    if m.sink.describe(m.spec.name) is not None:
        m.sink.drop(m.spec.name)
    ledger.forget(m.plan_id)


def backfill(
    m: Migration,
    ledger: Ledger,
    stop: threading.Event | None,
    on_start: Callable[[int | None, int], None] | None,
    on_progress: Callable[[Progress], None] | None,
    *,
    lease: Lease | None = None,
) -> RunReport:
    before = ledger.summary(m.plan_id)
    if on_start:
        on_start(m.source.count(), before.documents if before else 0)
    budget = Budget(m.config.run.max_cost_usd, price_of(m.embedder), before.billed_tokens if before else 0)
    engine = engine_for(m, ledger)
    progress = engine.run(m, ledger, lease, Shared(stop or threading.Event(), on_progress, budget))
    report = _finish(m, ledger, progress)
    return replace(report, processes=progress.processes, note=engine.note)


@dataclass(frozen=True)
class Shared:
    """What every engine is handed besides the migration, its ledger and its lease."""

    stop: threading.Event
    on_progress: Callable[[Progress], None] | None
    budget: Budget


class Engine(Protocol):
    """How a run's shards get done: each engine reads, embeds and writes them its own way and returns one
    progress account (`Progress`), which `_finish` turns into the report."""

    @property
    def note(self) -> str | None:
        """Why the run used fewer processes than asked for, in one line."""
        ...

    def run(self, m: Migration, ledger: Ledger, lease: Lease | None, shared: Shared) -> Progress: ...


def engine_for(m: Migration, ledger: Ledger) -> Engine:
    """The engine that does this migration's shards. A provider batch embedder runs on this machine under
    either engine: the provider does the embedding, and what is left here (reading, screening, writing the
    vectors) is not what a batch run waits on. Shards planned in the ledger are finished as planned."""
    embedder = m.embedder
    if isinstance(embedder, DeferredEmbedder):
        return _ProviderBatches()
    if m.config.run.engine == "ray":
        return _Ray()
    choice = processes.workers_for(m.config, m.source, m.sink, embedder)
    planned = any(not shard.recorded for shard in ledger.shard_plan(m.plan_id))
    if processes.uses_processes(choice, embedder) or planned:
        return _Processes(choice.workers, choice.note)
    return _OneProcess(choice.note)


def _pipeline_options(m: Migration, ledger: Ledger, shared: Shared) -> dict[str, Any]:
    return {
        "source": m.source,
        "sink": m.sink,
        "ledger": ledger,
        "spec": m.spec,
        "plan_id": m.plan_id,
        "run": m.config.run,
        "stop": shared.stop,
        "on_progress": shared.on_progress,
        "budget": shared.budget,
    }


class _Ray:
    note: str | None = None

    def run(self, m: Migration, ledger: Ledger, lease: Lease | None, shared: Shared) -> Progress:
        assert lease is not None, "the ray engine's workers are fenced with the run's lease"
        progress: Progress = registry.resolve_engine("ray").run(
            m, ledger, lease, stop=shared.stop, on_progress=shared.on_progress, budget=shared.budget
        )
        return progress


class _ProviderBatches:
    note: str | None = None

    def run(self, m: Migration, ledger: Ledger, lease: Lease | None, shared: Shared) -> Progress:
        _refuse_a_ray_plan(m, ledger)
        assert isinstance(m.embedder, DeferredEmbedder)
        return DeferredRun(embedder=m.embedder, **_pipeline_options(m, ledger, shared)).run()


@dataclass(frozen=True)
class _Processes:
    workers: int
    note: str | None

    def run(self, m: Migration, ledger: Ledger, lease: Lease | None, shared: Shared) -> Progress:
        assert lease is not None, "the workers are fenced with the run's lease"
        return processes.run(
            m,
            ledger,
            lease,
            workers=self.workers,
            stop=shared.stop,
            on_progress=shared.on_progress,
            budget=shared.budget,
        )


@dataclass(frozen=True)
class _OneProcess:
    note: str | None

    def run(self, m: Migration, ledger: Ledger, lease: Lease | None, shared: Shared) -> Progress:
        return Pipeline(embedder=m.embedder, **_pipeline_options(m, ledger, shared)).run()


def after_the_flip(m: Migration, ledger: Ledger) -> RunReport:
    """A run once the alias serves its target instead of the index the source reads: nothing is read or
    written. Reading the old index after its cursor would write back into the live target what the
    application changed or deleted through the alias since the flip; `sync` carries those changes."""
    return _finish(m, ledger, Progress())  # finalized as every run is: an older target gains what it lacks


def _finish(m: Migration, ledger: Ledger, progress: Progress) -> RunReport:
    """How every run ends, after the load or with nothing to load: finalize the target, close the run."""
    progress.finish()
    crashpoints.crash_if_armed("before_finalize")
    started = time.monotonic()
    m.sink.finalize(m.spec)
    finalized = time.monotonic() - started
    ledger.finish(m.plan_id)
    summary = ledger.summary(m.plan_id)
    assert summary is not None
    report = _run_report(summary, progress, price_of(m.embedder))
    index = m.sink.index_seconds if isinstance(m.sink, TimesIndexBuild) else None
    report = replace(report, finalize_seconds=round(finalized, 3), index_seconds=index and round(index, 3))
    return _with_traffic(report, m.embedder)


def _with_traffic(report: RunReport, embedder: Any) -> RunReport:
    """A remote model's figures instead of a local model's (padding and busy time mean nothing there)."""
    if not embedder.traits.remote:
        return report
    traffic = embedder.traffic if isinstance(embedder, ReportsTraffic) else None
    report = replace(report, padding_fraction=None, model_busy_fraction=None)
    if traffic is None:
        return report
    return replace(
        report,
        requests=traffic.requests,
        retries=traffic.retries,
        rate_limited=traffic.rate_limited,
        requests_per_second=traffic.requests_per_second,
        tokens_per_minute=traffic.tokens_per_minute,
    )


def price_of(embedder: Any) -> float | None:
    """USD per 1M tokens for this embedder and tier, if it is a paid provider."""
    price = embedder.traits.price_per_million
    return float(price) if price is not None else None


def _run_report(summary: RunSummary, progress: Progress, price: float | None = None) -> RunReport:
    seconds = max(progress.seconds, 1e-9)
    return RunReport(
        plan_id=summary.plan_id,
        target=summary.target,
        documents=summary.documents,
        written=summary.written,
        dead_letters=summary.dead_letters,
        duplicates=summary.duplicates,
        reused=summary.reused,
        tokens=summary.tokens,
        truncated=summary.truncated,
        seconds=round(progress.seconds, 3),
        docs_per_second=round(progress.documents / seconds, 1),
        tokens_per_second=round(progress.tokens / seconds, 1),
        padding_fraction=round(1 - progress.tokens / progress.padded_tokens, 4)
        if progress.padded_tokens
        else 0.0,
        model_busy_fraction=round(progress.model_seconds / seconds, 3),
        device_busy_fraction=_device_busy(progress),
        reconciled=summary.reconciled,
        dead_letter_reasons=summary.dead_letter_reasons,
        billed_tokens=summary.billed_tokens,
        cost_usd=round(summary.billed_tokens * price / 1_000_000, 6) if price is not None else None,
        documents_this_run=progress.documents,
    )


def _device_busy(progress: Progress) -> float | None:
    """A model process's busy time over the load's wall time after its first batch (processes engine)."""
    if progress.device_started is None or progress.finished is None:
        return None
    return round(progress.model_seconds / max(progress.finished - progress.device_started, 1e-9), 3)


def planned_workers(config: Config, m: Migration, documents: int) -> int:
    """The workers a run of this migration would have: `[ray] actors` (or the local machine's share of
    them) on the ray engine, the processes engine's workers, or 1 (a provider batch runs here, see `backfill`)."""
    if isinstance(m.embedder, DeferredEmbedder):
        return 1
    if config.run.engine == "ray":
        if config.ray.actors is not None:
            return config.ray.actors
        if config.ray.address in (None, "local"):
            cpus = config.ray.num_cpus or processes.cores()
            return ray_slots(config.ray, {"CPU": cpus, "GPU": float(_gpus(m.embedder))})
        return 1  # a cluster's size is known once the run joins it: pass --workers to plan for it
    shards = -(-documents // config.run.shard_size)
    return processes.workers_at(processes.workers_for(config, m.source, m.sink, m.embedder).workers, shards)


def planned_devices(config: Config, m: Migration) -> int:
    """Model processes a local run feeds: one per GPU for a model on a device, else none (the model runs in
    each worker)."""
    if config.run.engine == "ray" or m.embedder.traits.device is None:
        return 0
    return max(1, m.embedder.traits.devices)


def _gpus(embedder: Any) -> int:
    """The GPUs a Ray run asks its cluster for: the model's devices where they are CUDA ones."""
    traits: EmbedderTraits = embedder.traits
    return traits.devices if (traits.device or "").startswith("cuda") else 0
