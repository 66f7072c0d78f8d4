"""Catch-up sync: re-embed what changed in the source since it was read, delete what vanished.

Lets a live index be migrated while the application keeps writing: run, sync (repeatable),
then `cutover --sync` for a final catch-up immediately before the flip.
"""

from __future__ import annotations

import sqlite3
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from reindex.batching import chunks
from reindex.errors import ConfigError
from reindex.ledger import DeadLetter, Ledger
from reindex.pipeline import retrying
from reindex.ports import AdoptingSink, DeferredEmbedder, GuardedSink, IndexSource, Record, Rows, Sink, Source
from reindex.validation import excused, text_hash
from reindex.verify import Category, Comparison, compare, load_rows

if TYPE_CHECKING:
    from reindex.commands import Migration

DELETE_CHUNK = 1000
AFTER_FLIP = "after_flip"  # the ledger's verification kind for the catch-up after a flip (pending, then done)


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
    # a catch-up after a flip that a killed cutover left, finished first
    after_flip: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def catch_up(m: Migration, ledger: Ledger, *, keep: Settled | None = None) -> SyncReport:
    """Bring the target level with the source now. Idempotent: a second sync finds nothing to do.

    `keep` receives the source as this catch-up read it (`Settled.gaps` tells later writes by it)."""
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
        if keep is not None:
            keep.read(comparison)
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


# after a flip the sink could not hold writers for ------------------------------------------------------


@dataclass(frozen=True)
class AfterFlip:
    """`cutover --sync` on a sink that cannot hold writers (Qdrant): what reached the old index between the
    final catch-up and the flip, carried over once the alias serves the new target."""

    read: str  # "previous": the index the alias served (the source is that live index); "source": the source
    carried: int  # documents written or changed in that window, embedded and written (unless written since)
    deleted: int  # documents deleted in that window, deleted here too
    kept: int  # documents the application also wrote through the alias after the flip: its later write stands
    dead_letters: int
    seconds: float
    # finishing a pass that a killed cutover left (`Settled.rebuild`): documents only the old index holds,
    # which may be inserts of the window or deletes through the alias since; left alone, listed
    uncertain: int = 0
    examples: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Settled:
    """The target as the final catch-up left it, just verified: each vector's id, content hash and origin,
    in a scratch database (bounded memory, as verify). After the flip, anything in the target that differs
    from this was written by the application through the alias. The scratch database is made on first use:
    a cutover that needs none (pgvector, or no --sync) pays nothing."""

    def __init__(self) -> None:
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        self._db: sqlite3.Connection | None = None
        self.taken = self.rebuilt = False

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        self._scratch = tempfile.TemporaryDirectory(prefix="reindex-settled-")
        self._db = sqlite3.connect(Path(self._scratch.name) / "settled.db", isolation_level=None)
        self._db.executescript("""
            PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA temp_store=FILE;
            CREATE TABLE settled (id TEXT PRIMARY KEY, hash TEXT, state TEXT NOT NULL) WITHOUT ROWID;
            CREATE TABLE now (id TEXT PRIMARY KEY, hash TEXT, state TEXT NOT NULL) WITHOUT ROWID;
            CREATE TABLE old (id TEXT PRIMARY KEY, hash TEXT) WITHOUT ROWID;
            CREATE TABLE dead (id TEXT PRIMARY KEY, hash TEXT) WITHOUT ROWID;
            CREATE TABLE read (id TEXT PRIMARY KEY, hash TEXT) WITHOUT ROWID;
        """)
        return self._db

    def read(self, comparison: Comparison) -> None:
        """Keep the source as the final catch-up read it."""
        self.db.execute("DELETE FROM read")
        load_rows(self.db, "INSERT OR REPLACE INTO read VALUES (?,?)", comparison.source_hashes())

    def unexplained(self, comparison: Comparison, fingerprint: str) -> int:
        """The documents verify holds against the target (`Comparison.faults`: a vector of another
        fingerprint or without a content hash too) while the source still holds what the final catch-up
        read: real gaps. One whose source changed since is a write the catch-up could not see, which
        `after_flip` carries over."""
        gaps = 0
        for chunk in chunks(comparison.faults(fingerprint), 500):
            now = dict(comparison.source_hashes(chunk))
            seen = dict(_hashes(self.db, "read", chunk))
            gaps += sum((i in now, now.get(i)) == (i in seen, seen.get(i)) for i in chunk)
        return gaps

    def take(self, m: Migration) -> None:
        self.db.execute("DELETE FROM settled")
        load_rows(self.db, "INSERT OR REPLACE INTO settled VALUES (?,?,?)", _states(m))
        self.taken = True

    def rebuild(self, m: Migration) -> None:
        """After a kill between the flip and the end of `after_flip`: the settled target as far as the
        target itself still tells it. A vector that keeps the bookkeeping the tool stored is as it was (an
        upsert through the alias drops it), and one without was written through the alias since; what the
        application deleted since cannot be told from what the window inserted (`AfterFlip.uncertain`)."""
        self.db.execute("DELETE FROM settled")
        load_rows(self.db, "INSERT OR REPLACE INTO settled VALUES (?,?,?)", _states(m, derived=False))
        self.taken = self.rebuilt = True

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
        if self._scratch is not None:
            self._scratch.cleanup()

    def __enter__(self) -> Settled:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def after_flip(m: Migration, ledger: Ledger, previous: str | None, settled: Settled) -> AfterFlip:
    """Carry over what reached the old index between the final catch-up and the flip.

    A source that is not the old index holds every write: catching up with it again is enough. A source
    that IS the old index (a Qdrant collection read through the alias) stops seeing writes at the flip, so
    the old index is read by name and compared with `settled`: a document it changed since is carried over
    (re-embedded, or deleted), unless the application has since written that document through the alias
    into the new target, whose later write stands."""
    started = time.monotonic()
    old = None
    if isinstance(m.source, IndexSource) and previous is not None and settled.taken:
        old = m.source.reading(m.sink, m.spec.alias, previous)
    if old is None:
        again = catch_up(m, ledger)
        done = AfterFlip(
            "source",
            carried=again.added + again.changed + again.repaired,
            deleted=again.deleted,
            kept=0,
            dead_letters=again.dead_letters,
            seconds=round(time.monotonic() - started, 3),
        )
        ledger.record_verification(m.plan_id, True, done.to_json(), kind=AFTER_FLIP)
        return done
    db = settled.db
    load_rows(db, "INSERT OR REPLACE INTO old VALUES (?,?)", ((r.id, text_hash(r)) for r in old.scan()))
    load_rows(db, "INSERT OR IGNORE INTO dead VALUES (?,?)", excused(ledger.dead_letters(m.plan_id)).items())
    load_rows(db, "INSERT OR REPLACE INTO now VALUES (?,?,?)", _states(m))  # last: the newest view of it
    carry, gone, uncertain, kept = [], [], [], 0
    for doc_id, in_old, touched, unseen in db.execute(_WINDOW):
        if settled.rebuilt and unseen:
            uncertain.append(doc_id)
        elif touched:
            kept += 1
        elif in_old:
            carry.append(doc_id)
        else:
            gone.append(doc_id)
    sink = m.sink
    if not isinstance(sink, GuardedSink):
        raise TypeError(f"{type(sink).__name__} cannot write only where nothing changed meanwhile")
    found = dict(_hashes(db, "settled", [*carry, *gone]))
    guarded = _Guarded(sink, expected := {i: found.get(i) for i in [*carry, *gone]})
    pipeline = replace(m, source=old, sink=cast(Sink, guarded)).pipeline(ledger)
    written: list[str] = []
    dead: list[DeadLetter] = []
    for chunk in chunks(carry, m.config.run.shard_size):
        shard = pipeline.process(fetch_records(old, chunk))
        written += shard.written_ids
        dead += shard.dead
    # a text that failed must not keep the vector of the one before; a point never stored has none to delete
    failed = {d.doc_id for d in dead}
    doomed = {i: expected[i] for i in sorted({*gone, *failed}) if expected.get(i) is not None}
    for chunk in chunks(list(doomed.items()), DELETE_CHUNK):
        retrying(sink.delete_guarded, m.spec.name, dict(chunk))
    ledger.record_dead_letters(m.plan_id, dead)
    report = AfterFlip(
        "previous",
        carried=len(written),
        deleted=len(gone),
        kept=kept,
        dead_letters=len(dead),
        seconds=round(time.monotonic() - started, 3),
        uncertain=len(uncertain),
        examples=uncertain[:5],
    )
    ledger.record_verification(m.plan_id, True, report.to_json(), kind=AFTER_FLIP)
    return report


def mark_after_flip(m: Migration, ledger: Ledger, *, previous: str | None) -> None:
    """Before a flip the sink cannot hold writers for: its catch-up is pending until `after_flip` ends, so
    a kill in between is seen (verify is incomplete) and finished by the next `cutover --sync`."""
    ledger.record_verification(m.plan_id, False, {"previous": previous}, kind=AFTER_FLIP)


def pending_after_flip(m: Migration, ledger: Ledger) -> str | None:
    """The index the alias served before the flip to this target, while the catch-up after it is pending."""
    marks = ledger.verifications(m.plan_id, kind=AFTER_FLIP)
    if not marks or marks[-1].passed or marks[-1].report.get("previous") is None:
        return None
    if m.sink.alias(m.spec.alias).target != m.spec.name:  # the flip never landed, or was rolled back
        return None
    return str(marks[-1].report["previous"])


# Every id the settled target, the target now or the old index holds, where the old index changed since the
# final catch-up (present or gone, or another text), less a dead letter excused then and unchanged since.
# `touched`: the target changed too (written, rewritten or deleted through the alias after the flip).
_WINDOW = """
    SELECT ids.id, old.id IS NOT NULL,
           (now.id IS NULL) != (settled.id IS NULL) OR now.state IS NOT settled.state,
           settled.id IS NULL AND now.id IS NULL
    FROM (SELECT id FROM settled UNION SELECT id FROM now UNION SELECT id FROM old) AS ids
    LEFT JOIN settled ON settled.id = ids.id
    LEFT JOIN now ON now.id = ids.id
    LEFT JOIN old ON old.id = ids.id
    LEFT JOIN dead ON dead.id = ids.id
    WHERE ((old.id IS NULL) != (settled.id IS NULL) OR old.hash IS NOT settled.hash)
      AND NOT (settled.id IS NULL AND old.id IS NOT NULL AND dead.id IS NOT NULL AND dead.hash IS old.hash)
    ORDER BY ids.id
"""


class _Guarded:
    """The sink, every write guarded by what the settled target held (GuardedSink.write_guarded)."""

    def __init__(self, sink: GuardedSink, expected: Mapping[str, str | None]) -> None:
        self._sink, self._expected = sink, expected

    def write(self, target: str, rows: Rows) -> None:
        self._sink.write_guarded(target, rows, self._expected)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)


def _hashes(db: sqlite3.Connection, table: str, ids: Sequence[str]) -> Iterator[tuple[str, str | None]]:
    """(id, hash) of the rows of `table` (one of Settled's) with these ids."""
    for chunk in chunks(ids, 500):
        yield from db.execute(
            f"SELECT id, hash FROM {table} WHERE id IN ({','.join('?' * len(chunk))})", chunk
        )


def _states(m: Migration, *, derived: bool = True) -> Iterator[tuple[str, str | None, str]]:
    """(id, content hash, state) of every vector in the target (less those whose bookkeeping was derived as
    read, unless `derived`): state also tells the application's from the tool's, so the application
    rewriting a point with the same text still reads as a change."""
    for entry in m.sink.scan_index(m.spec.name, m.spec.dim):
        if entry.derived and not derived:
            continue
        yield entry.id, entry.content_hash, f"{entry.content_hash}|{entry.fingerprint}|{entry.application}"
