"""The only code that moves aliases: intent in the ledger, one atomic move in the sink, then settle."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from reindex import crashpoints
from reindex.errors import CutoverRefused
from reindex.ports import NamesUnserved, Sink
from reindex.state.ledger import Ledger
from reindex.state.records import Cutover

ADOPTED_SUFFIX = "__adopted"  # what a sink renames a physical index to when it adopts it behind an alias


@dataclass(frozen=True)
class AliasMove:
    alias: str
    target: str
    previous: str | None
    changed: bool
    forced: bool = False
    action: str = "cutover"
    # cutover --sync on a sink that cannot hold writers: the window carried over after the flip (AfterFlip)
    after_flip: dict[str, Any] | None = None
    # rollback: documents the target rolled away from holds a vector for and the one served now does not
    # (what the application wrote while the newer target was live); kept there for the next cutover
    unserved: int = 0
    unserved_ids: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def settle_pending(sink: Sink, ledger: Ledger, alias: str) -> None:
    """Resolve a move interrupted between intent and record by looking at where the alias points."""
    for move in ledger.cutovers(alias):
        if move.state == "pending":
            landed = sink.alias(alias).target == move.new
            ledger.settle_cutover(move.id, "done" if landed else "aborted")


def move(
    sink: Sink,
    ledger: Ledger,
    *,
    alias: str,
    target: str,
    fingerprint: str | None,
    model: Any,
    action: str = "cutover",
    forced: bool = False,
    report: dict[str, Any] | None = None,
    expected: str | None = None,
    check_expected: bool = False,
    settle: Callable[[], None] | None = None,
) -> AliasMove:
    """Point `alias` at `target`, recording intent first so a crash at any instant is resolvable.
    `settle`: the final catch-up, run while the sink holds writers back (`Sink.move_alias`)."""
    settle_pending(sink, ledger, alias)
    served = sink.alias(alias)
    current = served.target
    if check_expected and current != expected:
        raise CutoverRefused(
            f"alias {alias!r} serves {current!r}, not {expected!r} as the history says",
            hint="inspect it with `reindex status`; the history and the index disagree",
        )
    if current == target:
        return AliasMove(alias, target, current, changed=False, forced=forced, action=action)
    # Adopting a plain table renames it `<alias>__adopted`: record that name before the move, so a crash
    # after the intent still leaves the way back in the history.
    previous = f"{alias}{ADOPTED_SUFFIX}" if served.is_physical and current is None else current
    intent = ledger.cutover_intent(
        alias, previous, target, fingerprint=fingerprint, action=action, forced=forced, report=report
    )
    crashpoints.crash_if_armed("cutover_after_intent")
    meta = {
        "target": target,
        "fingerprint": fingerprint,
        "model": model,
        "moved_at": time.time(),
        "action": action,  # a sink keeps on a rollback what the application wrote meanwhile (pgvector)
    }
    try:
        previous = sink.move_alias(alias, target, expected=current, meta=meta, settle=settle)
    except BaseException:
        settle_pending(sink, ledger, alias)
        raise
    crashpoints.crash_if_armed("cutover_after_move")
    ledger.settle_cutover(intent, "done", old=previous)
    return AliasMove(alias, target, previous, changed=True, forced=forced, action=action)


def last_move(ledger: Ledger, alias: str) -> Cutover | None:
    done = [m for m in ledger.cutovers(alias) if m.state == "done"]
    return done[-1] if done else None


def rollback(sink: Sink, ledger: Ledger, alias: str) -> AliasMove:
    """Undo the last alias move: back to the target it replaced, if that still exists."""
    settle_pending(sink, ledger, alias)
    last = last_move(ledger, alias)
    if last is None or last.old is None:
        raise CutoverRefused(
            f"nothing to roll back to for alias {alias!r}", hint="the history has no earlier target"
        )
    info = sink.describe(last.old)
    if info is None:
        raise CutoverRefused(
            f"the previous target {last.old!r} no longer exists (pruned)",
            hint="rebuild it with `reindex run` on its config",
        )
    moved = move(
        sink,
        ledger,
        alias=alias,
        target=last.old,
        fingerprint=info.fingerprint,
        model=info.model,
        action="rollback",
        expected=last.new,
        check_expected=True,
    )
    if not moved.changed or not isinstance(sink, NamesUnserved) or sink.describe(last.new) is None:
        return moved
    ids = sink.unserved(alias, last.old, last.new)
    return replace(moved, unserved=len(ids), unserved_ids=ids)
