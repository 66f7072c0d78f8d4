"""After a flip the sink could not hold writers for (Qdrant): what reached the old index between the final
catch-up and the flip, carried over once the alias serves the new target, and the dead letters' points the
target keeps so that it serves every document.

`cutover --sync` takes the target's state (`Settled`) right before the flip; `after_flip` then compares the
old index and the target now with it, carries what changed in the old index, and leaves what the
application wrote through the alias since. A kill in between is finished by the next `cutover --sync` or
`sync` (`pending_after_flip`).
"""

from __future__ import annotations

import sqlite3
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from reindex.batching import chunks
from reindex.fingerprint import document_version, text_hash
from reindex.flip.sync import DELETE_CHUNK, catch_up, fetch_records
from reindex.ports import (
    GuardedSink,
    IndexEntry,
    IndexSource,
    KeepsDocuments,
    Rows,
    Sink,
    Source,
)
from reindex.prove.scratch import load_rows
from reindex.prove.served import AFTER_FLIP
from reindex.prove.verify import Comparison
from reindex.retry import retrying
from reindex.run.validation import excused
from reindex.state.ledger import Ledger
from reindex.state.records import DeadLetter
from reindex.state.sqlite import SqliteLedger

if TYPE_CHECKING:
    from reindex.run.migration import Migration


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
    # documents whose text the application changed in place through the alias since the flip (the vector
    # left as it was): kept, and re-embedded from the text it gave them
    edited: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Settled:
    """The target as the final catch-up left it, just verified: each vector's id, content hash and origin,
    in a scratch database (bounded memory, as verify). After the flip, anything in the target that differs
    from this was written by the application through the alias. The scratch database is made on first use:
    a cutover that needs none (pgvector, or no --sync) pays nothing.

    With `path` (beside a SQLite ledger) it is durable: a `cutover --sync` killed between the flip and the
    end of its carry-over leaves it, and the next `cutover --sync` or `sync` finishes the carry-over from
    it (`recall`), telling a document the window inserted into the old index from one the application
    deleted through the alias since. Without it (a Postgres ledger: the next command may run elsewhere),
    that carry-over rebuilds the view from the target (`rebuild`)."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        self._db: sqlite3.Connection | None = None
        self.taken = self.rebuilt = self.finished = False

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        if self._path is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="reindex-settled-")
            self._db = sqlite3.connect(Path(self._scratch.name) / "settled.db", isolation_level=None)
            self._db.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA temp_store=FILE;")
        else:
            self._db = sqlite3.connect(self._path, isolation_level=None)
            self._db.executescript(
                "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA temp_store=FILE;"
            )
        self._db.executescript("""
            CREATE TABLE IF NOT EXISTS settled (
                id TEXT PRIMARY KEY, hash TEXT, state TEXT NOT NULL, version TEXT
            ) WITHOUT ROWID;
            CREATE TABLE IF NOT EXISTS now (
                id TEXT PRIMARY KEY, hash TEXT, state TEXT NOT NULL, version TEXT
            ) WITHOUT ROWID;
            CREATE TABLE IF NOT EXISTS old (id TEXT PRIMARY KEY, hash TEXT, version TEXT) WITHOUT ROWID;
            CREATE TABLE IF NOT EXISTS dead (id TEXT PRIMARY KEY, hash TEXT) WITHOUT ROWID;
            CREATE TABLE IF NOT EXISTS read (id TEXT PRIMARY KEY, hash TEXT) WITHOUT ROWID;
            CREATE TABLE IF NOT EXISTS taken (target TEXT NOT NULL, previous TEXT);
        """)
        for table in ("settled", "now", "old"):  # kept by an earlier version, killed mid-cutover: no versions
            columns = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            if "version" not in columns:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN version TEXT")
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

    def take(self, m: Migration, previous: str | None = None) -> None:
        """Keep the target as it is now, before the flip from `previous`; durable once this returns."""
        self.db.execute("DELETE FROM taken")
        self.db.execute("DELETE FROM settled")
        load_rows(self.db, "INSERT OR REPLACE INTO settled VALUES (?,?,?,?)", _states(m))
        self.db.execute("INSERT INTO taken VALUES (?, ?)", (m.spec.name, previous))  # last: it is whole
        self.taken = True

    def recall(self, m: Migration, previous: str) -> bool:
        """Take up the view a killed `cutover --sync` kept of this target before its flip from `previous`."""
        if self._path is None or not self._path.exists():
            return False
        taken = self.db.execute("SELECT target, previous FROM taken").fetchall()
        self.taken = taken == [(m.spec.name, previous)]
        return self.taken

    def rebuild(self, m: Migration) -> None:
        """After a kill between the flip and the end of `after_flip`: the settled target as far as the
        target itself still tells it. A vector that keeps the bookkeeping the tool stored is as it was (an
        upsert through the alias drops it), and one without was written through the alias since; what the
        application deleted since cannot be told from what the window inserted (`AfterFlip.uncertain`)."""
        self.db.execute("DELETE FROM settled")
        load_rows(self.db, "INSERT OR REPLACE INTO settled VALUES (?,?,?,?)", _states(m, derived=False))
        self.taken = self.rebuilt = True

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
        if self._scratch is not None:
            self._scratch.cleanup()
        if self._path is not None and self.finished:  # carried over: nothing left to finish
            for leftover in (self._path, *(Path(f"{self._path}{end}") for end in ("-wal", "-shm"))):
                leftover.unlink(missing_ok=True)

    def __enter__(self) -> Settled:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def settled_path(ledger: Ledger, m: Migration) -> Path | None:
    """Where a durable `Settled` lives: beside a SQLite ledger, one per migration; None for Postgres."""
    if not isinstance(ledger, SqliteLedger):
        return None
    path = ledger.path
    return path.with_name(f"{path.name}.settled-{m.plan_id[:16]}")


def after_flip(m: Migration, ledger: Ledger, previous: str | None, settled: Settled) -> AfterFlip:
    """Carry over what reached the old index between the final catch-up and the flip.

    A source that is not the old index holds every write: catching up with it again is enough. A source
    that IS the old index (a Qdrant collection read through the alias) stops seeing writes at the flip, so
    the old index is read by name and compared with `settled`: a document it changed since is carried over
    (re-embedded, or deleted), unless the application has since written that document through the alias
    into the new target, whose later write stands."""
    started = time.monotonic()
    old = served = None
    if isinstance(m.source, IndexSource) and previous is not None and settled.taken:
        old, served = m.source.reading(m.sink, m.spec.alias, previous), m.source.over(m.spec.name)
    if old is None or served is None:
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
    sink = m.sink
    if not isinstance(sink, GuardedSink):
        raise TypeError(f"{type(sink).__name__} cannot write only where nothing changed meanwhile")
    db = settled.db
    for scratch in ("old", "now", "dead"):  # what a killed pass read is out of date
        db.execute(f"DELETE FROM {scratch}")
    versions = ((r.id, text_hash(r), document_version(r.payload, r.carried)) for r in old.scan())
    load_rows(db, "INSERT OR REPLACE INTO old VALUES (?,?,?)", versions)
    load_rows(db, "INSERT OR IGNORE INTO dead VALUES (?,?)", excused(ledger.dead_letters(m.plan_id)).items())
    load_rows(db, "INSERT OR REPLACE INTO now VALUES (?,?,?,?)", _states(m))  # last: the newest view of it
    carry, gone, uncertain, kept = [], [], [], 0
    window = list(db.execute(_WINDOW))
    edited = _edited_in_place(served, db, [row[0] for row in window])
    for doc_id, in_old, touched, unseen in window:
        if settled.rebuilt and unseen:
            uncertain.append(doc_id)
        elif touched or doc_id in edited:
            kept += 1
        elif in_old:
            carry.append(doc_id)
        else:
            gone.append(doc_id)
    found = dict(_hashes(db, "settled", [*carry, *gone]))
    expected = {i: found.get(i) for i in [*carry, *gone]}
    written, dead = _rewrite(m, ledger, old, sink, carry, expected)
    # the application's text edited in place since the flip, under the vector of the text before: its
    # text stands, embedded now (guarded by the hash still stored, so a newer write stands in turn)
    stored = dict(_hashes(db, "now", sorted(edited)))
    fixed, dead_edits = _rewrite(m, ledger, served, sink, sorted(edited), stored)
    lettered = {letter.doc_id for letter in ledger.dead_letters(m.plan_id)}
    embedded = [i for i in [*written, *fixed] if i in lettered]  # a dead letter fixed in the window
    ledger.settle_retry(m.plan_id, written=embedded, vanished=[], dead=[])
    # a text that failed must not keep the vector of the one before; a point never stored has none to delete
    failed = {d.doc_id for d in dead}
    edits = {d.doc_id: h for d in dead_edits if (h := stored.get(d.doc_id)) is not None}
    if isinstance(
        sink, KeepsDocuments
    ):  # the points stay (the old index's, the application's edit), unserved
        _keep(m, sink, old, sorted(failed), expected)
        for chunk in chunks(list(edits.items()), DELETE_CHUNK):
            retrying(sink.unserve, m.spec.name, [i for i, _ in chunk], dict(chunk))
        failed, edits = set(), {}
    doomed = {i: h for i in sorted({*gone, *failed}) if (h := expected.get(i)) is not None} | edits
    for chunk in chunks(list(doomed.items()), DELETE_CHUNK):
        retrying(sink.delete_guarded, m.spec.name, dict(chunk))
    ledger.record_dead_letters(m.plan_id, [*dead, *dead_edits])
    report = AfterFlip(
        "previous",
        carried=len(written),
        deleted=len(gone),
        kept=kept,
        dead_letters=len(dead) + len(dead_edits),
        seconds=round(time.monotonic() - started, 3),
        uncertain=len(uncertain),
        examples=uncertain[:5],
        edited=len(edited),
    )
    ledger.record_verification(m.plan_id, True, report.to_json(), kind=AFTER_FLIP)
    settled.finished = True
    return report


def _rewrite(
    m: Migration,
    ledger: Ledger,
    source: Source,
    sink: GuardedSink,
    ids: Sequence[str],
    expected: Mapping[str, str | None],
) -> tuple[list[str], list[DeadLetter]]:
    """Embed these documents as `source` holds them now and write each only where the target still
    holds what `expected` says: (written ids, dead letters)."""
    pipeline = replace(m, source=source, sink=cast(Sink, _Guarded(sink, expected))).pipeline(ledger)
    written: list[str] = []
    dead: list[DeadLetter] = []
    for chunk in chunks(ids, m.config.run.shard_size):
        shard = pipeline.process(fetch_records(source, list(chunk)))
        written += shard.written_ids
        dead += shard.dead
    return written, dead


def keep_dead_letters(m: Migration, ledger: Ledger) -> int:
    """Before a flip from the index the source reads, onto a target that keeps every document
    (`KeepsDocuments`, Qdrant): the dead letters' points go into the target as that index holds them,
    without the migration's vector, so the alias goes on serving each of the application's points and
    after the flip a dead letter is judged by the point it serves. Returns how many were kept."""
    if not isinstance(m.sink, KeepsDocuments) or not isinstance(m.source, IndexSource):
        return 0
    previous = m.sink.alias(m.spec.alias).target
    if previous is None or previous == m.spec.name:
        return 0
    old = m.source.reading(m.sink, m.spec.alias, previous)
    if old is None:  # the source is not the index the alias serves: the application's points are not here
        return 0
    try:
        ids = sorted({letter.doc_id for letter in ledger.dead_letters(m.plan_id)})
        # a point kept for a document that is no dead letter now (deleted or fixed since a rollback) goes:
        # the target is not served yet, and the alias must not bring it back
        stale = sorted(set(m.sink.kept(m.spec.name)) - set(ids))
        for chunk in chunks(stale, DELETE_CHUNK):
            retrying(m.sink.delete, m.spec.name, chunk)
        return _keep(m, m.sink, old, ids, {})
    finally:
        old.close()


def _keep(
    m: Migration, sink: KeepsDocuments, source: Source, ids: Sequence[str], expected: Mapping[str, str | None]
) -> int:
    """Keep these documents, as `source` holds them now, in the target without a vector; guarded by the
    content hash `expected` names, where it names one."""
    kept = 0
    for chunk in chunks(ids, DELETE_CHUNK):
        records = fetch_records(source, list(chunk))
        guards = {r.id: h for r in records if (h := expected.get(r.id)) is not None}
        retrying(sink.keep, m.spec.name, records, guards)
        kept += len(records)
    return kept


def mark_after_flip(m: Migration, ledger: Ledger, *, previous: str | None) -> None:
    """Before a flip the sink cannot hold writers for: its catch-up is pending until `after_flip` ends, so
    a kill in between is seen (verify is incomplete) and finished by the next `cutover --sync`."""
    ledger.record_verification(m.plan_id, False, {"previous": previous}, kind=AFTER_FLIP)


# Every id the settled target, the target now or the old index holds, where the old index changed since the
# final catch-up (present or gone, another text, another field or carried part: `document_version`), less a
# dead letter excused then and unchanged since.
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
    WHERE ((old.id IS NULL) != (settled.id IS NULL) OR old.hash IS NOT settled.hash
           OR (settled.version IS NOT NULL AND old.version IS NOT settled.version))
      AND NOT (settled.id IS NULL AND old.id IS NOT NULL AND dead.id IS NOT NULL AND dead.hash IS old.hash)
    ORDER BY ids.id
"""


def _edited_in_place(served: Source, db: sqlite3.Connection, ids: Sequence[str]) -> set[str]:
    """The documents whose text the target serves now differs from the one the settled target held: an
    edit through the alias since the flip that leaves the bookkeeping as it was (`set_payload` of the text
    under the old vector), which the stored hashes cannot show. Its later write stands; the vector it left
    is stale, and the next catch-up re-embeds it."""
    edited: set[str] = set()
    for chunk in chunks(ids, DELETE_CHUNK):
        settled = dict(_hashes(db, "settled", chunk))
        for record in fetch_records(served, chunk):
            if record.id in settled and text_hash(record) != settled[record.id]:
                edited.add(record.id)
    return edited


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


def _states(m: Migration, *, derived: bool = True) -> Iterator[tuple[str, str | None, str, str | None]]:
    """(id, content hash, state) of every vector in the target (less those whose bookkeeping was derived as
    read, unless `derived`): state also tells the application's from the tool's, so the application
    rewriting a point with the same text still reads as a change, and, where the sink digests whole points
    (`GuardedSink.scan_states`), so does a write of another field or of a carried vector."""
    states: Iterator[tuple[IndexEntry, str, str | None]]
    if isinstance(m.sink, GuardedSink):
        states = m.sink.scan_states(m.spec.name, m.spec.dim)
    else:
        states = ((entry, "", None) for entry in m.sink.scan_index(m.spec.name, m.spec.dim))
    for entry, whole, version in states:
        if entry.derived and not derived:
            continue
        state = f"{entry.content_hash}|{entry.fingerprint}|{entry.application}|{whole}"
        yield entry.id, entry.content_hash, state, version
