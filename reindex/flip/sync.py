"""Catch-up sync: re-embed what changed in the source since it was read, delete what vanished.

Lets a live index be migrated while the application keeps writing: run, sync (repeatable),
then `cutover --sync` for a final catch-up immediately before the flip.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from itertools import chain
from typing import TYPE_CHECKING, Any, Protocol, cast

from reindex.batching import chunks
from reindex.errors import ConfigError, CutoverRefused
from reindex.ports import (
    AdoptingSink,
    DeferredEmbedder,
    KeepsDocuments,
    Record,
    Sink,
    Source,
    Vectors,
)
from reindex.prove.served import ServedSource, as_served
from reindex.prove.verify import Category, Comparison, compare
from reindex.retry import retrying
from reindex.run.synchronous import online
from reindex.run.validation import excused
from reindex.state.ledger import Ledger
from reindex.state.records import DeadLetter

if TYPE_CHECKING:
    from reindex.run.migration import Migration

DELETE_CHUNK = 1000


class Keeps(Protocol):
    """What keeps the source as a catch-up read it (`reindex.flip.window.Settled`)."""

    def read(self, comparison: Comparison) -> None: ...


@dataclass(frozen=True)
class SyncReport:
    target: str
    added: int  # documents new in the source, embedded and written
    changed: int  # documents whose text changed (stale vectors), re-embedded
    repaired: int  # invalid vectors re-embedded
    deleted: int  # vectors whose document vanished from the source
    dead_letters: int  # documents that could not be embedded this time
    seconds: float
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)
    adopted: int = 0  # application-written vectors given their bookkeeping (Qdrant), nothing re-embedded
    # a catch-up after a flip that a killed cutover left, finished first (reindex.flip.window.AfterFlip)
    after_flip: dict[str, Any] | None = None
    # documents whose text was current but a part carried from the source (a Qdrant point's other named
    # vectors) was missing or changed: written again with the source's parts, their vector kept
    carried: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def catch_up(m: Migration, ledger: Ledger, *, keep: Keeps | None = None, held: bool = False) -> SyncReport:
    """Bring the target level with the source now. Idempotent: a second sync finds nothing to do.

    `keep` receives the source as this catch-up read it (`reindex.flip.window.Settled` tells later writes by
    it). `held`:
    the sink holds the application's writers meanwhile (`cutover --sync`); a provider batch embedder then
    embeds nothing, since its job would hold them for its whole run: what it would embed is refused."""
    _refuse_while_jobs_are_open(m, ledger)
    with as_served(m, ledger) as served:  # after the flip to this target, the truth is what it serves
        return _catch_up(served, ledger, keep, held=held and isinstance(m.embedder, DeferredEmbedder))


def _catch_up(m: Migration, ledger: Ledger, keep: Keeps | None, *, held: bool = False) -> SyncReport:
    started = time.monotonic()
    m.sink.prepare(m.spec)
    letters = ledger.dead_letters(m.plan_id)
    previous = {d.doc_id for d in letters}
    # Only dead letters a fresh migration would meet again stay excused; a 429 or an expired line is retried.
    written: list[str] = []
    dead: list[DeadLetter] = []
    # the application's rows are judged by their vectors too, except where embedding would hold writers
    checking = None if held else online(m.embedder, m.config.run)
    with compare(
        m.source, m.sink, m.spec.name, dim=m.spec.dim, dead_letters=excused(letters), embedder=checking
    ) as comparison:
        kinds: tuple[Category, ...] = (
            "missing",
            "stale",
            "invalid_vectors",
            "orphaned",
            "conflicting",
            "carried",
        )
        counts = {c: comparison.count(c) for c in kinds}
        if held:
            _refuse_embedding_while_held(m, counts, comparison)
        if keep is not None:
            keep.read(comparison)
        adopted = _adopt(m, comparison)
        pipeline = _refuting(m, comparison).pipeline(ledger)
        redo: tuple[Category, ...] = ("missing", "stale", "invalid_vectors", "conflicting", "carried")
        stale = chain(*(comparison.ids(c) for c in redo))
        for chunk in chunks(stale, m.config.run.shard_size):
            shard = pipeline.process(fetch_records(m.source, chunk))
            written += shard.written_ids
            dead += shard.dead
            # A document whose current text is a dead letter must not keep the vector of its old text.
            gone = sorted({d.doc_id for d in shard.dead})
            if gone:
                retrying(_unserving(m), m.spec.name, gone)
        for chunk in chunks(comparison.ids("orphaned"), DELETE_CHUNK):
            retrying(m.sink.delete, m.spec.name, chunk)
        # a dead letter whose document is gone from the source (deleted through the alias) is cleared
        present = {doc_id for doc_id, _ in comparison.source_hashes(sorted(previous))}
        vanished = sorted(previous - present)
    ledger.settle_retry(m.plan_id, written=[i for i in written if i in previous], vanished=vanished, dead=[])
    ledger.record_dead_letters(m.plan_id, dead)
    reasons = dict(Counter(letter.reason for letter in dead))
    return SyncReport(
        m.spec.name,
        added=counts["missing"],
        changed=counts["stale"] + counts["conflicting"],
        repaired=counts["invalid_vectors"],
        deleted=counts["orphaned"],
        dead_letters=len(dead),
        seconds=round(time.monotonic() - started, 3),
        dead_letter_reasons=reasons,
        adopted=adopted,
        carried=counts["carried"],
    )


def _unserving(m: Migration) -> Callable[[str, Sequence[str]], None]:
    """How a document that became a dead letter loses its vector: after the flip, where the target keeps
    every document (`KeepsDocuments`), its point is the application's and stays, less the vector; else
    the target is the tool's own and its point goes (the cutover keeps the dead letters' points)."""
    if isinstance(m.source, ServedSource) and isinstance(m.sink, KeepsDocuments):
        return m.sink.unserve
    return m.sink.delete


def _adopt(m: Migration, comparison: Comparison) -> int:
    """Store the bookkeeping of the application's sound vectors where the sink cannot fill it as they are
    written (Qdrant): a text the application later changes under such a vector then reads as stale, as
    one of the tool's own would. Writing the hash of the text read is safe whatever happens meanwhile: a
    point rewritten since only looks stale, and is re-embedded."""
    if not isinstance(m.sink, AdoptingSink):
        return 0
    adopted = 0
    for chunk in chunks(comparison.adoptable(), DELETE_CHUNK):
        adopted += retrying(m.sink.adopt, m.spec.name, dict(chunk), m.spec.fingerprint)
    return adopted


def _refuting(m: Migration, comparison: Comparison) -> Migration:
    """The migration, its sink never handing out a vector the comparison refuted as the stored vector of its
    text: that row's hash is its text's (pgvector's trigger, an adopted Qdrant point), so a copy of the
    same text, or the very row being re-embedded, would take the stale vector back (`reindex.run.copies`)."""
    refuted = frozenset(comparison.refuted())
    return replace(m, sink=cast(Sink, _Refuted(m.sink, refuted))) if refuted else m


class _Refuted:
    """The sink, less the refuted vectors in `fetch_matching`."""

    def __init__(self, sink: Sink, refuted: frozenset[str]) -> None:
        self._sink, self._refuted = sink, refuted

    def fetch_matching(self, target: str, expected: Mapping[str, str]) -> dict[str, Vectors]:
        kept = {doc_id: digest for doc_id, digest in expected.items() if doc_id not in self._refuted}
        return self._sink.fetch_matching(target, kept) if kept else {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)


def _refuse_embedding_while_held(
    m: Migration, counts: Mapping[Category, int], comparison: Comparison
) -> None:
    """With writers held and a provider batch embedder: refuse what would need its job (documents changed
    since the catch-up before the hold, application rows to check), before any is submitted."""
    waiting = sum(counts[c] for c in ("missing", "stale", "invalid_vectors", "conflicting", "carried"))
    unchecked = sum(1 for _ in comparison.adoptable())
    if waiting or unchecked:
        raise CutoverRefused(
            f"{waiting:,} documents changed and {unchecked:,} application rows wait since the catch-up before"
            " the hold: a provider batch job would hold the application's writers for its whole run",
            hint=f"rerun `reindex cutover --sync -c {m.config.path}` (its first catch-up embeds them with writers"
            " running), or `reindex sync` first",
        )


def _refuse_while_jobs_are_open(m: Migration, ledger: Ledger) -> None:
    """A provider batch the run submitted may have been billed already: sync would pay for its texts again."""
    if not isinstance(m.embedder, DeferredEmbedder):
        return
    open_jobs = [j for j in ledger.jobs(m.plan_id) if j.state in ("intent", "submitted") and j.items]
    if open_jobs:
        raise ConfigError(
            f"{len(open_jobs)} provider batch job(s) of this migration are still open; a sync now would pay"
            " for their texts again",
            hint="run `reindex run` with the same config to collect them, then sync",
        )


def fetch_records(source: Source, ids: list[str]) -> list[Record]:
    """The records with these ids that still exist, read again after a transient fault."""
    return retrying(lambda: list(source.fetch(ids)))
