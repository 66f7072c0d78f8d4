"""The verdict: whether the target is complete, computed in one place for `verify`, `cutover` and
`cutover --sync`, and the refusal that an incomplete target gets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from reindex.errors import VerificationFailed
from reindex.ports import (
    DeferredEmbedder,
)
from reindex.prove.served import as_served, pending_after_flip
from reindex.prove.verify import Comparison, Coverage, coverage
from reindex.run.migration import (
    Migration,
)
from reindex.run.synchronous import online
from reindex.run.validation import excused
from reindex.state.ledger import Ledger


def verified(
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


def coverage_of(m: Migration, dead_letters: dict[str, str | None] | None) -> Coverage:
    return coverage(
        m.source,
        m.sink,
        m.spec.name,
        dim=m.spec.dim,
        fingerprint=m.spec.fingerprint,
        dead_letters=dead_letters,
    )


def complete_or_refused(
    m: Migration, ledger: Ledger, force: bool, sample: int, *, held: bool = False
) -> Coverage:
    """Verify; `held`: writers wait meanwhile, so a provider batch embedder re-embeds nothing (the catch-up
    under the hold refused what it would have needed)."""
    inline = not (held and isinstance(m.embedder, DeferredEmbedder))
    return refused_unless_complete(m, verified(m, ledger, sample=sample, inline=inline), force)


def refused_unless_complete(m: Migration, report: Coverage, force: bool) -> Coverage:
    if not report.target_exists:  # not even --force promotes a target that is not there
        raise VerificationFailed(f"target {report.target!r} does not exist", hint="run `reindex run` first")
    if not report.complete and not force:
        raise VerificationFailed(
            f"cutover refused: target {report.target!r} is not complete ({report.problems()})",
            hint=f"see `reindex verify -c {m.config.path} --json`",
        )
    return report
