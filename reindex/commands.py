"""The verbs. Each is a plain function from a Config to a result object; cli.py only parses and renders."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from reindex import registry
from reindex.config import Config
from reindex.errors import ConfigError, CutoverRefused
from reindex.flip import cutover as alias_moves
from reindex.flip.choreography import (
    finish_pending_flip,
    flip,
    refuse_before_any_run,
    refuse_rollback_while_carrying,
    restore_table,
)
from reindex.flip.sync import SyncReport, catch_up, fetch_records
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
    DeferredEmbedder,
    DescribingSink,
    NamesLosses,
    PlansStorage,
    Sink,
)
from reindex.prove.judged import QualityReport, judged
from reindex.prove.served import as_served, replaced
from reindex.prove.verdict import coverage_of, verified
from reindex.prove.verify import Coverage, coverage
from reindex.run.arenas import limit_malloc_arenas
from reindex.run.backfill import (
    RunReport,
    after_the_flip,
    attach,
    backfill,
    planned_devices,
    planned_workers,
)
from reindex.run.claims import run_wide
from reindex.run.migration import (
    Migration,
    MissingLedger,
    known_run,
    lease_key,
    leased,
    ledger_of,
    migration,
    open_backends,
    open_ledger,
    open_migration,
    stop_on_lost_lease,
)
from reindex.run.pipeline import Progress
from reindex.state.ledger import Ledger
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
        default = planned_workers(config, m, report.documents)
        spread(report, config.run, workers or default, worker_docs_per_second, planned_devices(config, m))
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
            report.coverage = coverage_of(m, dead_letters=None).to_json()
        headline_eta(report)
        remember(report, config.run)
        return report


# run ----------------------------------------------------------------------------------------------------


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
            engine.check(m, ledger)  # before the run and its target are touched
        m = attach(m, ledger, fresh=fresh, create=True)
        if replaced(m, ledger):
            return after_the_flip(m, ledger)
        return backfill(m, ledger, stop, on_start, on_progress, lease=lease)


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
        target = run.target if run else config.target.name or ""
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
        return verified(m, ledger, sample=sample)


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
    refuse_before_any_run(config)
    with ledger_of(config) as ledger, ledger.alias_lock(config.alias):
        restored = restore_table(config, ledger)
        if restored is not None:
            return restored
        if sync:
            with ledger.lease(lease_key(config)), open_migration(config) as m:
                return flip(attach(m, ledger), ledger, force, sample, sync=True)
        with open_migration(config, lazy=True) as m:
            return flip(m, ledger, force, sample)


# compare ------------------------------------------------------------------------------------------------


def compare(config: Config) -> QualityReport:
    """Measure the new target against the live index: neighbourhoods kept, the ANN index's recall, and
    judged queries when [compare] names them; record it and apply the [gate] thresholds."""
    with open_migration(config) as m, ledger_of(config) as ledger:
        return judged(m, ledger)


def rollback(config: Config) -> alias_moves.AliasMove:
    """Point the alias back at the target the last move replaced. Needs no model."""
    with ledger_of(config) as ledger, ledger.alias_lock(config.alias), open_backends(config) as (_, sink):
        refuse_rollback_while_carrying(config, ledger, sink)
        return alias_moves.rollback(sink, ledger, config.alias)


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
    coverage: Coverage

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
            report,
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
        finished = finish_pending_flip(m, ledger)
        report = catch_up(m, ledger)
        return report if finished is None else replace(report, after_flip=finished.to_json())
