"""After the flip, the truth is what the alias serves.

A source that reads the index the alias served (a Qdrant collection, through the alias or by its own
name; a Postgres view named like the alias) stops being the truth at the flip: from then on the
application writes through the alias into this migration's target, and the old index is frozen. Judged against the frozen collection, every
document the application adds through the alias reads as orphaned (and `sync` deletes it), every edit as
reverted; judged against the target alone (the alias), the dead letters vanish, since only the old
collection holds the documents that could not be embedded.

So `verify`, `sync` and `dlq retry` read, once the alias serves this migration's target, a source made
of both: every document the target serves, as it serves it now, and each dead letter of the run that the
target does not hold, as the index the run read holds it. A sink whose target keeps the dead letters'
points itself (`KeepsDocuments`: Qdrant, where the cutover copies them in without a vector) needs no old
index: a dead letter the application deleted through the alias is gone, one it fixed is embedded. A source
that reads anything else (a file, a table not named like the alias) still holds every write, and is read
as it is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from reindex.errors import ConfigError
from reindex.ports import IndexSource, KeepsDocuments, Record, Sink, Source, SourceSchema
from reindex.state.ledger import Ledger

if TYPE_CHECKING:
    from reindex.run.migration import Migration


AFTER_FLIP = "after_flip"  # the ledger's verification kind for the catch-up after a flip (pending, then done)


@contextmanager
def as_served(m: Migration, ledger: Ledger) -> Iterator[Migration]:
    """`m` with the source that is the truth now: `ServedSource` once the alias serves this migration's
    target and the source reads the index it replaced; else `m` as it is."""
    source = _served(m, ledger)
    if source is None:
        yield m
        return
    try:
        yield replace(m, source=source)
    finally:
        source.close()


def replaced(m: Migration, ledger: Ledger) -> bool:
    """Whether the alias serves this migration's target in place of the index its source reads. Then the
    target is the truth and the backfill is over: the old index may hold what the application deleted
    through the alias since, and what changed is `sync`'s to carry, judged against what the alias serves."""
    source = _served(m, ledger)
    if source is None:
        return False
    source.close()
    return True


def _served(m: Migration, ledger: Ledger) -> ServedSource | None:
    if not isinstance(m.source, IndexSource) or isinstance(m.source, ServedSource):
        return None
    if m.sink.alias(m.spec.alias).target != m.spec.name:  # not flipped yet, rolled back, or moved on
        return None
    # the move that put it there: done, or pending where a kill came between the flip and its record
    moves = [c for c in ledger.cutovers(m.spec.alias) if c.state != "aborted" and c.new == m.spec.name]
    moved = moves[-1] if moves else None
    if moved is None or moved.old is None:
        return None
    try:
        previous = m.source.reading(m.sink, m.spec.alias, moved.old)
        if previous is None:  # the source reads something else, which still holds every write
            return None
    except ConfigError:  # the old index was pruned, and the dead letters' documents with it
        previous = None
    if previous is not None and m.sink.describe(moved.old) is None:  # pruned (a lazy source)
        previous.close()
        previous = None
    if previous is not None and isinstance(m.sink, KeepsDocuments):
        previous.close()  # the target holds the dead letters' points: the old index is no truth any more
        previous = None
    dead = [letter.doc_id for letter in ledger.dead_letters(m.plan_id)]
    return ServedSource(m.source, m.source.over(m.spec.name), previous, dead)


class ServedSource:
    """The target as it serves now, plus the run's dead letters it does not hold, read from `previous`
    (None: that collection was pruned, and its documents with it). Names, schema and identity stay the
    configured source's, so the plan id and the target's layout are the ones the run used."""

    shareable = False  # verify reads it in one process

    def __init__(
        self, configured: Source, served: Source, previous: Source | None, dead: Sequence[str]
    ) -> None:
        self.configured, self.served, self.previous = configured, served, previous
        self._dead = list(dict.fromkeys(dead))
        self._extra: list[Record] | None = None

    def schema(self) -> SourceSchema:
        return self.configured.schema()

    def identity(self) -> str:
        return self.configured.identity()

    def count(self) -> int | None:
        served = self.served.count()
        return None if served is None else served + len(self._unserved())

    def scan(self, after: str | None = None) -> Iterator[Record]:
        """The served documents in the target's order; a whole scan ends with the unserved dead letters."""
        yield from self.served.scan(after)
        if after is None:
            yield from self._unserved()

    def fetch(self, ids: Sequence[str]) -> Iterator[Record]:
        found = list(self.served.fetch(ids))
        yield from found
        held = {record.id for record in found}
        dead = set(self._dead)
        rest = [i for i in ids if i not in held and i in dead]
        if rest and self.previous is not None:
            yield from self.previous.fetch(rest)

    def reading(self, sink: Sink, alias: str, previous: str) -> Source | None:
        assert isinstance(self.configured, IndexSource)
        return self.configured.reading(sink, alias, previous)

    def over(self, index: str) -> Source:
        assert isinstance(self.configured, IndexSource)
        return self.configured.over(index)

    def close(self) -> None:
        """Close what this opened over the target and the old index; the migration closes the configured
        source (a Qdrant client is shared among the three: closing these releases nothing)."""
        self.served.close()
        if self.previous is not None:
            self.previous.close()

    def _unserved(self) -> list[Record]:
        """The dead letters the target does not hold, as the collection the run read holds them."""
        if self._extra is None:
            self._extra = []
            if self._dead and self.previous is not None:
                held = {record.id for record in self.served.fetch(self._dead)}
                self._extra = [r for r in self.previous.fetch(self._dead) if r.id not in held]
        return self._extra


def pending_after_flip(m: Migration, ledger: Ledger) -> str | None:
    """The index the alias served before the flip to this target, while the catch-up after it is pending."""
    marks = ledger.verifications(m.plan_id, kind=AFTER_FLIP)
    if not marks or marks[-1].passed or marks[-1].report.get("previous") is None:
        return None
    if m.sink.alias(m.spec.alias).target != m.spec.name:  # the flip never landed, or was rolled back
        return None
    return str(marks[-1].report["previous"])
