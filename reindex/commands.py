"""The verbs. Each is a plain function from a Config to a result object; cli.py only parses and renders."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from reindex import crashpoints, registry
from reindex.config import Config
from reindex.errors import ConfigError, CutoverRefused, VerificationFailed
from reindex.flip import cutover as alias_moves
from reindex.flip.sync import SyncReport, catch_up, fetch_records
from reindex.flip.window import (
    AFTER_FLIP,
    AfterFlip,
    Settled,
    after_flip,
    keep_dead_letters,
    mark_after_flip,
    pending_after_flip,
    settled_path,
)
from reindex.plan import rehearsal, routing
from reindex.plan.estimate import (
    PlanReport,
    estimate,
    headline_eta,
    ledger_advice,
    rehearsed,
    remember,
    spread,
    stored,
)
from reindex.ports import (
    ChecksPrivileges,
    Closes,
    DeferredEmbedder,
    DescribingSink,
    EmbedderTraits,
    NamesLosses,
    PlansStorage,
    ReportsTraffic,
    RestoresTable,
    Sink,
    TimesIndexBuild,
)
from reindex.prove import quality
from reindex.prove.served import as_served, replaced
from reindex.prove.verify import Comparison, Coverage, coverage
from reindex.run import processes
from reindex.run.arenas import limit_malloc_arenas
from reindex.run.claims import run_wide
from reindex.run.cost import Budget
from reindex.run.deferred import DeferredRun
from reindex.run.migration import (
    Migration,
    MissingLedger,
    config_key,
    known_run,
    lease_key,
    leased,
    ledger_of,
    migration,
    open_backends,
    open_ledger,
    open_migration,
    stop_on_lost_lease,
    with_nonce,
)
from reindex.run.pipeline import Pipeline, Progress
from reindex.run.ray.sizing import slots as ray_slots
from reindex.run.synchronous import online
from reindex.run.validation import excused
from reindex.state.ledger import Ledger
from reindex.state.records import Lease, RunSummary
from reindex.state.sqlite import SqliteLedger
from reindex.units import iso_utc

# plan ---------------------------------------------------------------------------------------------------


def plan(
    config: Config,
    *,
    calibrate: bool = True,
    rehearse: bool = True,
    workers: int | None = None,
    worker_docs_per_second: float | None = None,
) -> PlanReport:
    """Dry run: count documents and tokens, estimate time and storage, report the target's coverage, price
    each route ([embedder] and [[routes]]) and pick the cheapest meeting [run] deadline and max_cost_usd.

    Changes nothing: no target is kept, no ledger is written, no provider is called. The estimate it
    returns is kept beside a SQLite ledger (`plan-<plan id>.json`), for the report's plan against actual.

    Args:
        rehearse: for a calibrated (free) model, run the engine on the first shards into a scratch target
            and ledger, dropped after (`reindex.plan.rehearsal`): the ETA then holds the target's write.
        workers: the ETA on this many workers (default: [ray] actors with engine "ray" and an embedder that
            is not a provider batch one, else 1).
        worker_docs_per_second: each worker's rate (default: the rate calibrated here).
    """
    with open_migration(config) as m:
        exists = m.sink.describe(m.spec.name) is not None
        routes = routing.candidates(config, m.embedder)
        recount = routing.token_counters(routes, m.spec.fingerprint)
        report = estimate(m.source, m.embedder, m.config.run, calibrate=calibrate, recount=recount)
        if rehearse and report.calibration_model_seconds_per_document is not None:  # a free model, called
            stage = report.calibration_stage_seconds_per_document or 0.0
            per_document = stage + report.calibration_model_seconds_per_document
            outcome = rehearsal.rehearse(m, documents=report.documents, seconds_per_document=per_document)
            rehearsed(report, outcome, m.embedder, m.source, config.run)
        if m.storage is not None:
            stored(report, m.storage)
        if isinstance(m.sink, DescribingSink):
            report.target_layout = m.sink.layout(m.spec)
        default = _workers(config, m, report.documents)
        spread(report, config.run, workers or default, worker_docs_per_second, _devices(config, m))
        priced = routing.price(report, config.run, routes, report.tokens_by_fingerprint)
        report.routes, report.route = routing.to_json(priced), routing.choose(priced, config.run)
        report.ledger_advice = ledger_advice(
            config.run, report.documents, run_wide=run_wide(config.run, m.embedder)
        )
        alias = m.sink.alias(m.spec.alias)
        report.plan_id, report.target, report.target_exists = m.plan_id, m.spec.name, exists
        report.alias, report.alias_target, report.alias_fingerprint = (
            alias.alias,
            alias.target,
            alias.fingerprint,
        )
        report.alias_is_physical = alias.is_physical
        if isinstance(m.sink, ChecksPrivileges):
            report.privileges = [asdict(p) for p in m.sink.missing_privileges(m.spec)]
        if isinstance(m.sink, NamesLosses):
            report.losses = [asdict(loss) for loss in m.sink.losses(m.spec)]
        report.backends = registry.probe_backends()
        if exists:
            report.coverage = _coverage(m, dead_letters=None).to_json()
        headline_eta(report)
        remember(report, config.run)
        return report


# run ----------------------------------------------------------------------------------------------------


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


def run(
    config: Config,
    *,
    stop: threading.Event | None = None,
    on_start: Callable[[int | None, int], None] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    fresh: bool = False,
) -> RunReport:
    """Backfill the target from the source; rerunning resumes after the last written shard.

    Args:
        fresh: forget this migration's progress and drop its target (unless an alias serves it) first.
    """
    stop = stop or threading.Event()
    limit_malloc_arenas()
    engine = registry.resolve_engine(config.run.engine) if config.run.engine != "local" else None
    if engine is not None:
        engine.require()  # before anything is opened or written
    with (
        leased(config, create=True) as (ledger, lease),
        open_migration(config) as m,
        stop_on_lost_lease(lease, stop),
    ):
        if engine is not None and not isinstance(m.embedder, DeferredEmbedder):
            engine.check(config, m.embedder, ledger)  # before the run and its target are touched
        m = attach(m, ledger, fresh=fresh, create=True)
        if replaced(m, ledger):
            return _after_the_flip(m, ledger)
        return _run(m, ledger, stop, on_start, on_progress, lease=lease)


def _after_the_flip(m: Migration, ledger: Ledger) -> RunReport:
    """A run once the alias serves its target instead of the index the source reads: nothing is read or
    written. Reading the old index after its cursor would write back into the live target what the
    application changed or deleted through the alias since the flip; `sync` carries those changes."""
    return _finish(m, ledger, Progress())  # finalized as every run is: an older target gains what it lacks


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


def _run(
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
    common: dict[str, Any] = {
        "source": m.source,
        "sink": m.sink,
        "ledger": ledger,
        "spec": m.spec,
        "plan_id": m.plan_id,
        "run": m.config.run,
        "stop": stop,
        "on_progress": on_progress,
        "budget": budget,
    }
    embedder = m.embedder
    # A provider batch embedder runs on this machine under either engine: the provider does the embedding,
    # and what is left here (reading, screening, writing the vectors) is not what a batch run waits on.
    if m.config.run.engine == "ray" and not isinstance(embedder, DeferredEmbedder):
        assert lease is not None, "the ray engine's workers are fenced with the run's lease"
        engine = registry.resolve_engine("ray")
        progress: Progress = engine.run(
            m, ledger, lease, stop=stop or threading.Event(), on_progress=on_progress, budget=budget
        )
    elif isinstance(embedder, DeferredEmbedder):
        _refuse_a_ray_plan(m, ledger)
        progress = DeferredRun(embedder=embedder, **common).run()
    else:
        choice = processes.workers_for(m.config, m.source, m.sink, embedder)
        planned = any(not shard.recorded for shard in ledger.shard_plan(m.plan_id))
        if processes.uses_processes(choice, embedder) or planned:  # planned shards are finished as planned
            assert lease is not None, "the workers are fenced with the run's lease"
            progress = processes.run(
                m,
                ledger,
                lease,
                workers=choice.workers,
                stop=stop or threading.Event(),
                on_progress=on_progress,
                budget=budget,
            )
        else:
            progress = Pipeline(embedder=embedder, **common).run()
        report = _finish(m, ledger, progress)
        return replace(report, processes=progress.processes, note=choice.note)
    return _finish(m, ledger, progress)


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


# status -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StatusReport:
    plan_id: str
    target: str
    state: str  # not-started | running | complete
    documents: int
    written: int
    dead_letters: int
    duplicates: int
    vanished: int  # dead-lettered documents gone from the source when retried
    reconciled: bool
    shards_done: int
    source_documents: int | None
    alias: str
    alias_target: str | None
    alias_is_physical: bool
    is_live: bool
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)  # alias moves, `at` ISO-8601 UTC
    workers: list[dict[str, Any]] = field(default_factory=list)  # engine "ray": who wrote what, how fast

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def status(config: Config) -> StatusReport:
    """Where the migration stands: shards written, reconciliation, where the alias points, history.

    Needs no model: the run is found in the ledger by the config's key. Without a ledger: "no run yet",
    unless the alias carries the tool's mark (then its ledger is elsewhere: MissingLedger, exit 2)."""
    with open_backends(config) as (source, sink), _read_ledger(config, sink) as ledger:
        run = known_run(config, ledger, source, sink)
        summary = ledger.summary(run.plan_id) if run else None
        alias = sink.alias(config.alias)
        history = [{**asdict(c), "at": iso_utc(c.at)} for c in ledger.cutovers(config.alias)]
        counts = (
            (summary.documents, summary.written, summary.dead_letters, summary.duplicates, summary.vanished)
            if summary
            else (0, 0, 0, 0, 0)
        )
        target = run.target if run else str(config.target.get("name") or "")
        return StatusReport(
            plan_id=run.plan_id if run else "",
            target=target,
            state=summary.state if summary else "not-started",
            documents=counts[0],
            written=counts[1],
            dead_letters=counts[2],
            duplicates=counts[3],
            vanished=counts[4],
            reconciled=summary.reconciled if summary else True,
            shards_done=summary.shards if summary else 0,
            source_documents=source.count(),
            alias=alias.alias,
            alias_target=alias.target,
            alias_is_physical=alias.is_physical,
            is_live=bool(target) and alias.target == target,
            dead_letter_reasons=summary.dead_letter_reasons if summary else {},
            history=history,
            workers=[
                {**asdict(w), "last_written_at": iso_utc(w.last_written_at)}
                for w in ledger.workers(run.plan_id)
            ]
            if run
            else [],
        )


@contextmanager
def _read_ledger(config: Config, sink: Sink) -> Iterator[Ledger]:
    """The config's ledger for a verb that only reads it (`status`, `verify`). Where there is none and the
    alias carries no mark of the tool, nothing has run: an empty ledger in memory answers "nothing yet"
    without writing a file. An alias the tool moved, without its ledger, is MissingLedger (exit 2)."""
    try:
        ledger = open_ledger(config, create=False)
    except MissingLedger:
        if sink.alias(config.alias).fingerprint is not None:
            raise
        ledger = SqliteLedger(":memory:")
    try:
        yield ledger
    finally:
        ledger.close()


# verify -------------------------------------------------------------------------------------------------


def verify(config: Config, *, sample: int = 0) -> Coverage:
    """Compare source and target directly (exact ids, content hashes, fingerprints, vector sanity).

    Args:
        sample: also re-embed this many random documents and require cosine >= 0.999 with the stored vectors.
    """
    with open_migration(config, lazy=True) as m, _read_ledger(config, m.sink) as ledger:
        return _verify(m, ledger, sample=sample)


def _verify(
    m: Migration,
    ledger: Ledger,
    *,
    sample: int = 0,
    also: Callable[[Comparison], None] | None = None,
    inline: bool = True,
) -> Coverage:
    """The coverage of this migration's target; before any run, an empty target's (nothing complete).
    After the flip to it, against what the alias serves (`reindex.prove.served`)."""
    with as_served(m, ledger) as served:
        report = coverage(
            served.source,
            m.sink,
            m.spec.name,
            dim=m.spec.dim,
            fingerprint=m.spec.fingerprint,
            dead_letters=excused(ledger.dead_letters(m.plan_id)),
            # re-embeds the application's rows, and any sample; not where a batch job would hold writers
            embedder=online(m.embedder, m.config.run) if inline else None,
            sample=sample,
            ceiling=m.config.run.dead_letter_ceiling,
            also=also,
        )
    previous = pending_after_flip(m, ledger)
    if previous is not None:
        report = replace(report, complete=False, after_flip_pending=previous)
    summary = ledger.summary(m.plan_id)
    if report.target_exists and summary is not None and not summary.finalized:
        report = replace(report, complete=False, run_unfinished=True)
    report = replace(report, is_live=m.sink.alias(m.spec.alias).target == m.spec.name)
    ledger.record_verification(m.plan_id, report.complete, report.to_json())
    return report


def _workers(config: Config, m: Migration, documents: int) -> int:
    """The workers a run of this migration would have: `[ray] actors` (or the local machine's share of
    them) on the ray engine, the processes engine's workers, or 1 (a provider batch runs here, see `_run`)."""
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


def _devices(config: Config, m: Migration) -> int:
    """Model processes a local run feeds: one per GPU for a model on a device, else none (the model runs in
    each worker)."""
    if config.run.engine == "ray" or m.embedder.traits.device is None:
        return 0
    return max(1, m.embedder.traits.devices)


def _gpus(embedder: Any) -> int:
    """The GPUs a Ray run asks its cluster for: the model's devices where they are CUDA ones."""
    traits: EmbedderTraits = embedder.traits
    return traits.devices if (traits.device or "").startswith("cuda") else 0


def _coverage(m: Migration, dead_letters: dict[str, str | None] | None) -> Coverage:
    return coverage(
        m.source,
        m.sink,
        m.spec.name,
        dim=m.spec.dim,
        fingerprint=m.spec.fingerprint,
        dead_letters=dead_letters,
    )


# cutover, rollback, prune -------------------------------------------------------------------------------


def cutover(
    config: Config, *, force: bool = False, sync: bool = False, sample: int = 0
) -> alias_moves.AliasMove:
    """Verify, then point the alias at this target atomically. Refuses (exit 3) unless complete.

    Args:
        force: promote even when verification fails; loud, and recorded in the history.
        sync: first re-embed what changed in the source since the run and delete what vanished.
        sample: also re-embed this many documents as part of the verification.
    """
    _refuse_before_any_run(config)
    with ledger_of(config) as ledger, ledger.alias_lock(config.alias):
        restored = _restore_table(config, ledger)
        if restored is not None:
            return restored
        if sync:
            with ledger.lease(lease_key(config)), open_migration(config) as m:
                return _cutover(attach(m, ledger), ledger, force, sample, sync=True)
        with open_migration(config, lazy=True) as m:
            return _cutover(m, ledger, force, sample)


def _refuse_before_any_run(config: Config) -> None:
    """No ledger where the config says: nothing has run, so there is no target to flip to (exit 3, as for a
    target not built yet), unless the alias carries the tool's mark: then its ledger is elsewhere
    (MissingLedger, exit 2). Either way no ledger is made up."""
    try:
        open_ledger(config, create=False).close()
    except MissingLedger as missing:
        with open_backends(config) as (_, sink):
            if sink.alias(config.alias).fingerprint is not None:
                raise
        raise VerificationFailed(
            f"nothing has run with this config: {missing.message}", hint="run `reindex run` first"
        ) from None


def _restore_table(config: Config, ledger: Ledger) -> alias_moves.AliasMove | None:
    """A sink that can move an earlier version's view back into the application's table does so before
    anything else (`RestoresTable`): the alias serves the same target, from the table; no model is loaded.
    The history gains no move (rollback goes where it went before)."""
    with open_backends(config) as (_, sink):
        if not isinstance(sink, RestoresTable):
            return None
        alias_moves.settle_pending(sink, ledger, config.alias)
        served = sink.restore_table(config.alias)
    if served is None:
        return None
    return alias_moves.AliasMove(config.alias, served, served, changed=True, action="restore")


def _cutover(
    m: Migration, ledger: Ledger, force: bool, sample: int, *, sync: bool = False
) -> alias_moves.AliasMove:
    """Gate, verify, move. With `sync`, catch up first with the application's writers running, then catch
    up again and verify while the sink holds them back (`Sink.move_alias` settle): the flip then serves
    every write, and a write that waited lands in the new target. A sink that cannot hold them (Qdrant)
    lets through only differences written after the final catch-up read, and carries those over right
    after the flip (`reindex.flip.window.after_flip`); a carry-over a killed cutover left is finished first."""
    finished = _finish_pending_flip(m, ledger) if sync else None
    if sync:
        catch_up(m, ledger)  # the bulk of the changes, writers running
    failures: list[str] = []
    if m.config.gate.thresholds:  # measured now, against what the alias serves now: never a stale verdict
        failures = _compare(m, ledger).failures
        if failures and not force:
            raise VerificationFailed(
                f"cutover refused by the quality gate: {'; '.join(failures)}",
                hint=f"see `reindex compare -c {m.config.path} --json`; --force promotes anyway (recorded)",
            )
    checked: list[Coverage] = []
    with Settled(settled_path(ledger, m)) as settled:

        def check() -> None:
            if sync and not m.sink.holds_writers:
                catch_up(m, ledger, keep=settled)  # what came since; writers go on
                keep_dead_letters(m, ledger)  # the alias goes on serving their points (Qdrant)
                checked.append(_complete_but_later_writes_or_refused(m, ledger, force, sample, settled))
                previous = m.sink.alias(m.spec.alias).target
                settled.take(m, previous)  # what the flip will serve, to tell a write that missed it after
                mark_after_flip(m, ledger, previous=previous)
                return
            if sync:
                catch_up(m, ledger, held=True)  # what came since, writers held (no provider batch job)
            keep_dead_letters(m, ledger)
            checked.append(_complete_or_refused(m, ledger, force, sample, held=sync))

        if not sync:
            check()
        complete = checked[0].complete if checked else True
        moved = alias_moves.move(
            m.sink,
            ledger,
            alias=m.spec.alias,
            target=m.spec.name,
            fingerprint=m.spec.fingerprint,
            model=dict(m.spec.model),
            # with --sync the verdict comes under the hold, after the intent: --force is recorded as given
            forced=force and (sync or not complete or bool(failures)),
            report=checked[0].to_json() if checked else None,
            settle=check if sync else None,
        )
        if sync and moved.changed and not m.sink.holds_writers:
            moved = replace(moved, after_flip=after_flip(m, ledger, moved.previous, settled).to_json())
        elif finished is not None and not moved.changed:
            moved = replace(moved, after_flip=finished.to_json())
    return moved


def _finish_pending_flip(m: Migration, ledger: Ledger) -> AfterFlip | None:
    """A `cutover --sync` killed between its flip and the catch-up after it: finish that catch-up first,
    before a catch-up adopts what the application wrote through the alias since, which would hide it."""
    previous = pending_after_flip(m, ledger)
    if previous is None:
        return None
    with Settled(settled_path(ledger, m)) as settled:
        if not settled.recall(m, previous):
            settled.rebuild(m)  # the view kept before the flip died with the process that took it
        return after_flip(m, ledger, previous, settled)


def _complete_but_later_writes_or_refused(
    m: Migration, ledger: Ledger, force: bool, sample: int, settled: Settled
) -> Coverage:
    """Where nothing holds the writers (Qdrant), verify cannot find the target level with a source that
    moved since the final catch-up read it. A difference in a document written since is carried over after
    the flip (`after_flip`); any other refuses the cutover, as an incomplete target does."""
    gaps: list[int] = []
    fingerprint = m.spec.fingerprint
    report = _verify(
        m,
        ledger,
        sample=sample,
        also=lambda comparison: gaps.append(settled.unexplained(comparison, fingerprint)),
    )
    if report.complete or force or not report.target_exists or gaps[0]:
        return _refused_unless_complete(m, report, force)
    if report.over_ceiling or (report.sample is not None and not report.sample["passed"]):
        return _refused_unless_complete(m, report, force)
    return report


def _complete_or_refused(
    m: Migration, ledger: Ledger, force: bool, sample: int, *, held: bool = False
) -> Coverage:
    """Verify; `held`: writers wait meanwhile, so a provider batch embedder re-embeds nothing (the catch-up
    under the hold refused what it would have needed)."""
    inline = not (held and isinstance(m.embedder, DeferredEmbedder))
    return _refused_unless_complete(m, _verify(m, ledger, sample=sample, inline=inline), force)


def _refused_unless_complete(m: Migration, report: Coverage, force: bool) -> Coverage:
    if not report.target_exists:  # not even --force promotes a target that is not there
        raise VerificationFailed(f"target {report.target!r} does not exist", hint="run `reindex run` first")
    if not report.complete and not force:
        raise VerificationFailed(
            f"cutover refused: target {report.target!r} is not complete ({report.problems()})",
            hint=f"see `reindex verify -c {m.config.path} --json`",
        )
    return report


# compare ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QualityReport:
    """`reindex compare`: the new target against the live index ([compare]), judged by [gate]."""

    report: dict[str, Any]

    @property
    def failures(self) -> list[str]:
        return list(self.report["gate"]["failures"])

    @property
    def passed(self) -> bool:
        return bool(self.report["gate"]["passed"])

    def to_json(self) -> dict[str, Any]:
        return self.report


def compare(config: Config) -> QualityReport:
    """Measure the new target against the live index: neighbourhoods kept, the ANN index's recall, and
    judged queries when [compare] names them; record it and apply the [gate] thresholds."""
    with open_migration(config) as m, ledger_of(config) as ledger:
        return _compare(m, ledger)


def _compare(m: Migration, ledger: Ledger) -> QualityReport:
    if m.sink.describe(m.spec.name) is None:
        raise VerificationFailed(f"target {m.spec.name!r} does not exist", hint="run `reindex run` first")
    alias = m.sink.alias(m.spec.alias)
    live = alias.alias if alias.is_physical else alias.target
    settings = m.config.compare
    old = registry.build("embedder", settings.embedder) if settings.embedder is not None else None
    sides = quality.Sides(m.spec.name, None if live == m.spec.name else live)
    try:
        report = quality.compare(m.source, m.sink, m.embedder, sides, settings, m.config.gate, old)
    finally:
        if isinstance(old, Closes):
            old.close()
    ledger.record_verification(m.plan_id, report["gate"]["passed"], report, kind="quality")
    return QualityReport(report)


def rollback(config: Config) -> alias_moves.AliasMove:
    """Point the alias back at the target the last move replaced. Needs no model."""
    with ledger_of(config) as ledger, ledger.alias_lock(config.alias), open_backends(config) as (_, sink):
        _refuse_rollback_while_carrying(config, ledger, sink)
        return alias_moves.rollback(sink, ledger, config.alias)


def _refuse_rollback_while_carrying(config: Config, ledger: Ledger, sink: Sink) -> None:
    """A `cutover --sync` killed between its flip and its carry-over (Qdrant) left writes of the window in
    the older index that the newer one lacks: a rollback, which carries the newer one's differences back,
    would write over them. The carry-over comes first."""
    alias_moves.settle_pending(sink, ledger, config.alias)
    last = alias_moves.last_move(ledger, config.alias)
    if last is None or sink.alias(config.alias).target != last.new:
        return
    info = sink.describe(last.new)
    marks = ledger.verifications(info.plan_id, kind=AFTER_FLIP) if info and info.plan_id else []
    if marks and not marks[-1].passed and marks[-1].report.get("previous") == last.old:
        raise CutoverRefused(
            f"the catch-up after the flip from {last.old!r} to {last.new!r} did not finish: a rollback now"
            " would write over what the application wrote in between",
            hint=f"run `reindex sync -c {config.path}` (it finishes that catch-up), then rollback",
        )


@dataclass(frozen=True)
class PruneReport:
    alias: str
    kept: list[str]
    dropped: list[str]  # with dry_run: what would be dropped
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def prune(config: Config, *, keep: int = 2, dry_run: bool = False) -> PruneReport:
    """Drop old targets of this alias, keeping the newest `keep` and never the one the alias serves."""
    if keep < 1:
        raise ConfigError("--keep must be at least 1", hint="the live target is always kept")
    with ledger_of(config) as ledger, ledger.alias_lock(config.alias), open_backends(config) as (_, sink):
        alias_moves.settle_pending(sink, ledger, config.alias)
        live = sink.alias(config.alias).target
        newest_first = list(reversed(sink.targets(config.alias)))
        kept = [t for t in newest_first if t == live]
        for candidate in newest_first:
            if candidate not in kept and len(kept) < keep:
                kept.append(candidate)
        dropped = [t for t in newest_first if t not in kept]
        for name in [] if dry_run else dropped:
            if sink.alias(config.alias).target == name:
                raise CutoverRefused(f"{name!r} became live while pruning", hint="rerun prune")
            sink.drop(name)
        return PruneReport(config.alias, kept, dropped, dry_run)


__all__ = [
    "DeadLetterReport",
    "InspectReport",
    "PruneReport",
    "ResolveReport",
    "RunReport",
    "StatusReport",
    "attach",
    "cutover",
    "dlq_list",
    "dlq_retry",
    "inspect",
    "plan",
    "prune",
    "resolve",
    "rollback",
    "run",
    "status",
    "sync",
    "verify",
]


# dead letters -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeadLetterReport:
    plan_id: str
    total: int
    reasons: dict[str, int]
    dead_letters: list[dict[str, Any]]
    retried: int = 0
    written: int = 0
    vanished: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def dlq_list(config: Config) -> DeadLetterReport:
    """The documents that could not be embedded, with their reasons. Needs no model."""
    with open_backends(config) as (source, sink), _read_ledger(config, sink) as ledger:
        run = known_run(config, ledger, source, sink)
        return _dead_letter_report(ledger, run.plan_id if run else "")


def dlq_retry(config: Config) -> DeadLetterReport:
    """Re-read dead-lettered documents from the source and try them again (after a fix or policy change).

    Loads the model only when there is something to retry."""
    with leased(config) as (ledger, lease), open_backends(config) as (source, sink):
        run = known_run(config, ledger, source, sink)
        if run is None or not ledger.dead_letters(run.plan_id):
            return _dead_letter_report(ledger, run.plan_id if run else "")
        with stop_on_lost_lease(lease, threading.Event()):
            return _retry(attach(migration(config, source, sink), ledger), ledger)


def _retry(m: Migration, ledger: Ledger) -> DeadLetterReport:
    with as_served(m, ledger) as served:  # after the flip, dead letters are read from the index the run read
        return _retry_served(served, ledger)


def _retry_served(m: Migration, ledger: Ledger) -> DeadLetterReport:
    ids = [d.doc_id for d in ledger.dead_letters(m.plan_id)]
    pipeline = m.pipeline(ledger)
    written, vanished = 0, 0
    size = m.config.run.shard_size
    for chunk in (ids[start : start + size] for start in range(0, len(ids), size)):
        records = fetch_records(m.source, chunk)
        shard = pipeline.process(records) if records else None
        done = shard.written_ids if shard else []
        gone = sorted(set(chunk) - {r.id for r in records})
        ledger.settle_retry(m.plan_id, written=done, vanished=gone, dead=shard.dead if shard else [])
        written, vanished = written + len(done), vanished + len(gone)
    report = _dead_letter_report(ledger, m.plan_id)
    return DeadLetterReport(
        m.plan_id,
        report.total,
        report.reasons,
        report.dead_letters,
        retried=len(ids),
        written=written,
        vanished=vanished,
    )


def _dead_letter_report(ledger: Ledger, plan_id: str) -> DeadLetterReport:
    letters = ledger.dead_letters(plan_id)
    reasons = dict(Counter(letter.reason for letter in letters))
    return DeadLetterReport(plan_id, len(letters), reasons, [asdict(d) for d in letters])


# inspect, resolve, sync ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class InspectReport:
    alias: str
    alias_target: str | None
    alias_is_physical: bool
    inspected: str
    built_by_reindex: bool  # False: no fingerprint or content hashes were recorded on it
    model: dict[str, Any] | None
    coverage: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def inspect(config: Config, *, target: str | None = None) -> InspectReport:
    """Coverage of any existing target or of what the alias serves now; needs no ledger and no model."""
    with open_backends(config) as (source, sink):
        alias = sink.alias(config.alias)
        name = target or alias.target or (config.alias if alias.is_physical else None)
        if name is None:
            raise ConfigError(
                f"alias {config.alias!r} does not exist", hint="pass --target <name> to inspect one"
            )
        info = sink.describe(name)
        if info is None or info.dim is None:
            raise ConfigError(
                f"{name!r} does not exist or holds no vectors", hint="check [target] and --target"
            )
        report = coverage(source, sink, name, dim=info.dim, fingerprint=info.fingerprint)
        return InspectReport(
            config.alias,
            alias.target,
            alias.is_physical,
            name,
            info.fingerprint is not None,
            dict(info.model) if info.model else None,
            report.to_json(),
        )


@dataclass(frozen=True)
class ResolveReport:
    alias: str
    target: str | None
    fingerprint: str | None
    model: dict[str, Any] | None  # kind, model, dim, options: what queries must be embedded with
    is_physical: bool
    # what the served vectors are stored as (pgvector: float16 in halfvec, bit): what queries are cast to
    precision: str | None = None
    # where `model` comes from: "target" (recorded on it when the tool built it), "config" (a table the tool
    # never built, the application's own: `[compare] embedder` names its model, unchecked), None: unknown
    model_from: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def resolve(config: Config, alias: str | None = None) -> ResolveReport:
    """Which target and which embedding model serve `alias`, so queries are embedded to match."""
    with open_backends(config) as (_, sink):
        info = sink.alias(alias or config.alias)
        if info.target is None and not info.is_physical:
            raise ConfigError(f"alias {info.alias!r} does not exist", hint="run `reindex cutover` first")
        precision = sink.precision(info.target) if isinstance(sink, PlansStorage) and info.target else None
        model, origin = (dict(info.model), "target") if info.model else (None, None)
        if model is None and info.fingerprint is None and config.compare.embedder:
            model, origin = dict(config.compare.embedder), "config"  # the live index's model, as named
        return ResolveReport(
            info.alias, info.target, info.fingerprint, model, info.is_physical, precision, origin
        )


def sync(config: Config) -> SyncReport:
    """Re-embed documents added or changed since the run, delete vectors whose documents vanished."""
    with (
        leased(config) as (ledger, lease),
        open_migration(config) as m,
        stop_on_lost_lease(lease, threading.Event()),
    ):
        m = attach(m, ledger)
        finished = _finish_pending_flip(m, ledger)
        report = catch_up(m, ledger)
        return report if finished is None else replace(report, after_flip=finished.to_json())
