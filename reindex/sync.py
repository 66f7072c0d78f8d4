"""Catch-up sync: re-embed what changed in the source since it was read, delete what vanished.

Lets a live index be migrated while the application keeps writing: run, sync (repeatable),
then `cutover --sync` for a final catch-up immediately before the flip.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any

from reindex.batching import chunks
from reindex.errors import ConfigError
from reindex.ledger import DeadLetter, Ledger
from reindex.pipeline import retrying
from reindex.ports import AdoptingSink, DeferredEmbedder, Record, Source
from reindex.validation import excused
from reindex.verify import Category, Comparison, compare

if TYPE_CHECKING:
    from reindex.commands import Migration

DELETE_CHUNK = 1000


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def catch_up(m: Migration, ledger: Ledger) -> SyncReport:
    """Bring the target level with the source now. Idempotent: a second sync finds nothing to do."""
    started = time.monotonic()
    _refuse_while_jobs_are_open(m, ledger)
    m.sink.prepare(m.spec)
    letters = ledger.dead_letters(m.plan_id)
    previous = {d.doc_id for d in letters}
    # Only dead letters a fresh migration would meet again stay excused; a 429 or an expired line is retried.
    pipeline = m.pipeline(ledger)
    written: list[str] = []
    dead: list[DeadLetter] = []
    with compare(m.source, m.sink, m.spec.name, dim=m.spec.dim, dead_letters=excused(letters)) as comparison:
        kinds: tuple[Category, ...] = ("missing", "stale", "invalid_vectors", "orphaned", "conflicting")
        counts = {c: comparison.count(c) for c in kinds}
        adopted = _adopt(m, comparison)
        stale = chain(*(comparison.ids(c) for c in ("missing", "stale", "invalid_vectors", "conflicting")))
        for chunk in chunks(stale, m.config.run.shard_size):
            shard = pipeline.process(fetch_records(m.source, chunk))
            written += shard.written_ids
            dead += shard.dead
            # A document whose current text is a dead letter must not keep the vector of its old text.
            gone = sorted({d.doc_id for d in shard.dead})
            if gone:
                retrying(m.sink.delete, m.spec.name, gone)
        for chunk in chunks(comparison.ids("orphaned"), DELETE_CHUNK):
            retrying(m.sink.delete, m.spec.name, chunk)
    ledger.settle_retry(m.plan_id, written=[i for i in written if i in previous], vanished=[], dead=[])
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
    )


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
