"""The cutover's order of operations: a 0.2 view moved back first, the gate, the catch-ups with the
application's writers running and then held, the verdict, the move, and the carry-over after a flip
that nothing could hold (Qdrant); and what refuses a rollback while that carry-over is pending."""

from __future__ import annotations

from dataclasses import replace

from reindex.config import Config
from reindex.errors import CutoverRefused, VerificationFailed
from reindex.flip import cutover as alias_moves
from reindex.flip.sync import catch_up
from reindex.flip.window import (
    AfterFlip,
    Settled,
    after_flip,
    keep_dead_letters,
    mark_after_flip,
    settled_path,
)
from reindex.ports import (
    RestoresTable,
    Sink,
)
from reindex.prove.judged import judged
from reindex.prove.served import AFTER_FLIP, pending_after_flip
from reindex.prove.verdict import complete_or_refused, refused_unless_complete, verified
from reindex.prove.verify import Coverage
from reindex.run.migration import (
    Migration,
    MissingLedger,
    open_backends,
    open_ledger,
)
from reindex.state.ledger import Ledger


def refuse_before_any_run(config: Config) -> None:
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


def restore_table(config: Config, ledger: Ledger) -> alias_moves.AliasMove | None:
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


def flip(
    m: Migration, ledger: Ledger, force: bool, sample: int, *, sync: bool = False
) -> alias_moves.AliasMove:
    """Gate, verify, move. With `sync`, catch up first with the application's writers running, then catch
    up again and verify while the sink holds them back (`Sink.move_alias` settle): the flip then serves
    every write, and a write that waited lands in the new target. A sink that cannot hold them (Qdrant)
    lets through only differences written after the final catch-up read, and carries those over right
    after the flip (`reindex.flip.window.after_flip`); a carry-over a killed cutover left is finished first."""
    finished = finish_pending_flip(m, ledger) if sync else None
    if sync:
        catch_up(m, ledger)  # the bulk of the changes, writers running
    failures: list[str] = []
    if m.config.gate.thresholds:  # measured now, against what the alias serves now: never a stale verdict
        failures = judged(m, ledger).failures
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
            checked.append(complete_or_refused(m, ledger, force, sample, held=sync))

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


def finish_pending_flip(m: Migration, ledger: Ledger) -> AfterFlip | None:
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
    report = verified(
        m,
        ledger,
        sample=sample,
        also=lambda comparison: gaps.append(settled.unexplained(comparison, fingerprint)),
    )
    if report.complete or force or not report.target_exists or gaps[0]:
        return refused_unless_complete(m, report, force)
    if report.over_ceiling or (report.sample is not None and not report.sample["passed"]):
        return refused_unless_complete(m, report, force)
    return report


def refuse_rollback_while_carrying(config: Config, ledger: Ledger, sink: Sink) -> None:
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
