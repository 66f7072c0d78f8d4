"""Coverage: compare a source with a target directly, by exact id sets and content hashes, never by ANN.

Both sides stream into a temporary on-disk SQLite database and are joined there, so memory stays
bounded whatever the corpus size and neither side has to share the other's sort order (a Qdrant
scroll is in point-id order, a Postgres scan in key order).
"""

from __future__ import annotations

import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from reindex.batching import chunks
from reindex.fingerprint import text_hash
from reindex.ports import (
    Embedder,
    IndexEntry,
    PlansStorage,
    Precision,
    Record,
    Sink,
    Source,
)
from reindex.prove.carried import FIELDS, find_carried, parts_json
from reindex.prove.scratch import load_rows
from reindex.run.validation import screen
from reindex.vectors import AGREEMENT, as_stored

EXAMPLES = 5
APPLICATION_CHUNK = 256  # application rows re-embedded per model call
Category = Literal[
    "missing", "stale", "orphaned", "invalid_vectors", "dead_letters", "unhashed", "conflicting", "carried"
]


@dataclass(frozen=True)
class Coverage:
    target: str
    complete: bool
    source_documents: int
    target_vectors: int
    missing: int  # source documents without a vector (dead-lettered ones excluded)
    stale: int  # vectors whose content hash differs from the source text now
    orphaned: int  # vectors whose document is no longer in the source
    dead_letters: int  # source documents excused by a dead letter for the same text
    invalid_vectors: int  # non-finite, zero or wrong dimension
    unhashed: int  # vectors without a content hash (an index this tool did not build): staleness unknown
    conflicting: int  # vectors of ids the source holds twice with different texts (dead letters, not vectors)
    fingerprints: dict[str, int]  # fingerprint ("none" when absent) -> vectors
    expected_fingerprint: str | None
    examples: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0
    ids_per_second: float = 0.0
    sample: dict[str, Any] | None = None  # re-embedding check, when asked for
    dead_letter_ceiling: int | None = None  # [run] max_dead_letters for this source; None: not checked
    target_exists: bool = True  # False: nothing is built yet (every source document is missing)
    # vectors the application wrote through the alias, without the tool's bookkeeping (Qdrant: no reindex_*
    # payload; pgvector: reindex_origin set by the trigger); None where the target cannot tell for some
    application_rows: int | None = None
    # the index the alias served before its last flip, while the catch-up after that flip has not finished
    # (a `cutover --sync` on Qdrant killed in between): what reached it in the window may be missing
    after_flip_pending: str | None = None
    # the run that builds the target has not finished (its finalize: the ANN index, the triggers that take
    # the application's writes, grants), though every row may be there: never complete until it has
    run_unfinished: bool = False
    is_live: bool = False  # the alias serves this target already: nothing to cut over to
    # the application's rows re-embedded and compared with what they store (`refute_application_rows`):
    # checked, stale (counted in `stale` too), min_cosine, threshold; None when no embedder was at hand
    application_check: dict[str, Any] | None = None
    # documents whose text is current but a part carried from the source (a Qdrant point's other named
    # vectors) is missing, extra or changed; and how many documents each part is wrong in
    carried: int = 0
    carried_vectors: dict[str, int] = field(default_factory=dict)

    @property
    def over_ceiling(self) -> bool:
        return self.dead_letter_ceiling is not None and self.dead_letters > self.dead_letter_ceiling

    def problems(self) -> str:
        """One line naming every non-zero count, for refusals."""
        counts = {
            "missing": self.missing,
            "stale": self.stale,
            "orphaned": self.orphaned,
            "invalid": self.invalid_vectors,
            "without content hash": self.unhashed,
            "of ids the source holds with two texts": self.conflicting,
        }
        parts = [f"{v:,} {k}" for k, v in counts.items() if v]
        parts += [
            f"{n:,} documents whose payload differs from the source's"
            if name == FIELDS
            else f"{n:,} documents whose carried vector {name!r} is missing or differs from the source"
            for name, n in sorted(self.carried_vectors.items())
        ]
        if not self.target_exists:
            parts.insert(0, f"target {self.target!r} does not exist")
        if self.over_ceiling:
            parts.append(
                f"{self.dead_letters:,} dead letters exceed the ceiling [run] max_dead_letters"
                f" ({self.dead_letter_ceiling:,} for {self.source_documents:,} documents)"
            )
        if self.after_flip_pending:
            parts.append(f"the catch-up after the flip from {self.after_flip_pending!r} did not finish")
        if self.run_unfinished:
            parts.append("the run building it has not finished (rerun `reindex run` to finalize it)")
        others = {fp: n for fp, n in self.fingerprints.items() if fp != self.expected_fingerprint}
        if others:
            parts.append(f"{sum(others.values()):,} vectors of other fingerprints {sorted(others)}")
        if self.sample and not self.sample["passed"]:
            parts.append(f"{self.sample['failures']} sampled vectors differ from a fresh embedding")
        if self.application_check and self.application_check["stale"]:
            parts.append(
                f"{self.application_check['stale']:,} of the stale are vectors the application wrote that"
                " differ from a fresh embedding of their text"
            )
        return ", ".join(parts) or "none"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_EXCUSED = (
    "EXISTS (SELECT 1 FROM dead d WHERE d.id = s.id AND (d.hash IS s.hash OR d.hash IS NULL OR s.conflict))"
)
_WHERE: dict[Category, tuple[str, str]] = {  # category -> (id column, FROM ... WHERE ...)
    "missing": ("s.id", f"FROM src s LEFT JOIN tgt t ON t.id = s.id WHERE t.id IS NULL AND NOT {_EXCUSED}"),
    "dead_letters": ("s.id", f"FROM src s LEFT JOIN tgt t ON t.id = s.id WHERE t.id IS NULL AND {_EXCUSED}"),
    "stale": (
        "t.id",
        "FROM src s JOIN tgt t ON t.id = s.id WHERE (t.hash IS NOT NULL AND t.hash IS NOT s.hash"
        " OR t.id IN (SELECT id FROM refuted) OR s.blank) AND NOT s.conflict",
    ),
    "orphaned": ("t.id", "FROM tgt t LEFT JOIN src s ON s.id = t.id WHERE s.id IS NULL"),
    "invalid_vectors": ("t.id", "FROM tgt t WHERE t.problem IS NOT NULL"),
    "unhashed": (
        "t.id",
        "FROM tgt t JOIN src s ON s.id = t.id WHERE t.hash IS NULL AND NOT s.conflict AND NOT s.blank",
    ),
    "conflicting": ("t.id", "FROM tgt t JOIN src s ON s.id = t.id WHERE s.conflict"),
    "carried": ("c.id", "FROM (SELECT DISTINCT id FROM carried) c"),
}

# What verify holds against a complete target, besides dead letters past the ceiling: the ids of these
# categories, and vectors of a fingerprint other than the expected one (`Comparison.faults`, `report`).
PROBLEMS: tuple[Category, ...] = (
    "missing",
    "stale",
    "orphaned",
    "invalid_vectors",
    "unhashed",
    "conflicting",
    "carried",
)
_FOREIGN = "SELECT t.id FROM tgt t WHERE coalesce(t.fp, 'none') IS NOT ?"

# A source may hold one id twice (a JSONL file): with two texts, a fresh migration dead-letters the id.
_INSERT_SOURCE = (
    "INSERT INTO src (id, hash, carried, blank, fields) VALUES (?,?,?,?,?) ON CONFLICT (id) DO UPDATE"
    " SET conflict = conflict OR (hash IS NOT excluded.hash), blank = blank OR excluded.blank"
)


class Comparison:
    """Source and target loaded side by side in a scratch database; ask for counts or id streams."""

    def __init__(self, db: sqlite3.Connection, target: str, seconds: float, *, exists: bool = True) -> None:
        self.db, self.target, self.seconds, self.exists = db, target, seconds, exists
        self.application_check: dict[str, Any] | None = None  # set by `refute_application_rows`

    def count(self, category: Category) -> int:
        return int(self.db.execute(f"SELECT count(*) {_WHERE[category][1]}").fetchone()[0])

    def ids(self, category: Category, limit: int | None = None) -> Iterator[str]:
        column, where = _WHERE[category]
        suffix = f" LIMIT {int(limit)}" if limit is not None else ""
        for (doc_id,) in self.db.execute(f"SELECT {column} {where} ORDER BY 1{suffix}"):
            yield doc_id

    def faults(self, expected_fingerprint: str | None) -> Iterator[str]:
        """Every id that keeps the target from being complete, as `report` judges it: those of the
        PROBLEMS categories and those of vectors of another fingerprint, each once, in order."""
        selects = [f"SELECT {_WHERE[c][0]} {_WHERE[c][1]}" for c in PROBLEMS]
        query = " UNION ".join([*selects, _FOREIGN]) + " ORDER BY 1"
        for (doc_id,) in self.db.execute(query, (expected_fingerprint or "none",)):
            yield doc_id

    def source_hashes(self, ids: Sequence[str] | None = None) -> Iterator[tuple[str, str | None]]:
        """(id, content hash) of the source's documents as read: all, or those of `ids` it holds."""
        if ids is None:
            yield from self.db.execute("SELECT id, hash FROM src")
            return
        for chunk in chunks(ids, 500):
            marks = ",".join("?" * len(chunk))
            yield from self.db.execute(f"SELECT id, hash FROM src WHERE id IN ({marks})", chunk)

    def sample_ids(self, n: int) -> list[str]:
        """Up to `n` random ids present on both sides with sane vectors, for the re-embedding check."""
        rows = self.db.execute(
            "SELECT t.id FROM tgt t JOIN src s ON s.id = t.id WHERE t.problem IS NULL"
            " AND t.hash IS s.hash ORDER BY random() LIMIT ?",
            (n,),
        )
        return [row[0] for row in rows]

    def adoptable(self) -> Iterator[tuple[str, str]]:
        """(id, content hash) of the application's vectors that are sound as they are (the hash derived from
        their text is the source's, the vector is sane): a sink that can store that bookkeeping should."""
        rows = self.db.execute(
            "SELECT t.id, t.hash FROM tgt t JOIN src s ON s.id = t.id WHERE t.app = 1 AND t.problem IS NULL"
            " AND t.hash IS NOT NULL AND t.hash IS s.hash AND NOT s.conflict AND NOT s.blank"
            " AND t.id NOT IN (SELECT id FROM refuted) ORDER BY 1"
        )
        yield from rows

    def refute(self, ids: Iterable[str]) -> None:
        """These vectors differ from a fresh embedding of their text: stale, whatever their hash says."""
        load_rows(self.db, "INSERT OR IGNORE INTO refuted VALUES (?)", ((i,) for i in ids))

    def refuted(self) -> Iterator[str]:
        for (doc_id,) in self.db.execute("SELECT id FROM refuted ORDER BY 1"):
            yield doc_id

    def application_rows(self) -> int | None:
        """How many vectors the application wrote; None when the target could not tell for some."""
        told, written = self.db.execute(
            "SELECT count(app) = count(*), coalesce(sum(app), 0) FROM tgt"
        ).fetchone()
        return int(written) if told else None

    def report(
        self, expected_fingerprint: str | None, ceiling: Callable[[int], int] | None = None
    ) -> Coverage:
        counts: dict[str, Any] = {name: self.count(name) for name in _WHERE}
        examples: dict[str, list[str]] = {
            name: list(self.ids(name, EXAMPLES)) for name in _WHERE if counts[name] and name != "dead_letters"
        }
        fingerprints = dict(
            self.db.execute("SELECT coalesce(fp, 'none'), count(*) FROM tgt GROUP BY 1 ORDER BY 2 DESC")
        )
        complete = not any(counts[k] for k in PROBLEMS) and set(fingerprints) <= {
            expected_fingerprint or "none"
        }
        source_documents = self.db.execute("SELECT count(*) FROM src").fetchone()[0]
        target_vectors = self.db.execute("SELECT count(*) FROM tgt").fetchone()[0]
        rate = (source_documents + target_vectors) / max(self.seconds, 1e-9)
        limit = ceiling(source_documents) if ceiling is not None else None
        complete = complete and (limit is None or counts["dead_letters"] <= limit)
        return Coverage(
            self.target,
            complete and self.exists,
            source_documents,
            target_vectors,
            fingerprints=fingerprints,
            expected_fingerprint=expected_fingerprint,
            examples=examples,
            seconds=round(self.seconds, 3),
            ids_per_second=round(rate),
            dead_letter_ceiling=limit,
            target_exists=self.exists,
            application_rows=self.application_rows(),
            application_check=self.application_check,
            carried_vectors=dict(self.db.execute("SELECT part, count(*) FROM carried GROUP BY 1 ORDER BY 1")),
            **counts,
        )


@contextmanager
def compare(
    source: Source,
    sink: Sink,
    target: str,
    *,
    dim: int,
    dead_letters: Mapping[str, str | None] | None = None,
    embedder: Embedder | None = None,
) -> Iterator[Comparison]:
    """Stream both sides into a scratch database; `dead_letters` maps excused ids to their failed hash.

    With `embedder` (inline: a provider batch embedder wrapped by `reindex.run.synchronous.online`), the rows
    the application wrote are re-embedded and judged by their vectors too (`refute_application_rows`)."""
    started = time.monotonic()
    exists = sink.describe(target) is not None
    with tempfile.TemporaryDirectory(prefix="reindex-verify-") as scratch:
        db = _scratch_db(Path(scratch) / "coverage.db")
        try:
            load_rows(db, _INSERT_SOURCE, _source_rows(source.scan()))
            load_rows(db, "INSERT OR IGNORE INTO dead VALUES (?,?)", (dead_letters or {}).items())
            if exists:  # a target not built yet is an empty one: every source document is missing
                entries = _target_rows(sink.scan_index(target, dim))
                load_rows(db, "INSERT OR REPLACE INTO tgt VALUES (?,?,?,?,?,?,?)", entries)
            comparison = Comparison(db, target, time.monotonic() - started, exists=exists)
            if exists and embedder is not None:
                refute_application_rows(comparison, source, sink, embedder)
            if exists:
                find_carried(db, target, source, sink)
            yield comparison
        finally:
            db.close()


def coverage(
    source: Source,
    sink: Sink,
    target: str,
    *,
    dim: int,
    fingerprint: str | None,
    dead_letters: Mapping[str, str | None] | None = None,
    embedder: Embedder | None = None,
    sample: int = 0,
    ceiling: Callable[[int], int] | None = None,
    also: Callable[[Comparison], None] | None = None,
) -> Coverage:
    """Compare `source` with `target` and count every way they differ; optionally re-embed a sample.

    `ceiling` maps the source's document count to the most dead letters a complete target may have;
    `also` reads the same comparison for more (cutover's gate on Qdrant), without a second scan."""
    with compare(source, sink, target, dim=dim, dead_letters=dead_letters, embedder=embedder) as comparison:
        report = comparison.report(fingerprint, ceiling)
        if also is not None:
            also(comparison)
        if sample and embedder is not None:
            checked = sample_check(source, sink, embedder, target, comparison.sample_ids(sample))
            report = replace(report, sample=checked, complete=report.complete and checked["passed"])
        return report


def sample_check(
    source: Source,
    sink: Sink,
    embedder: Embedder,
    target: str,
    ids: Sequence[str],
    threshold: float | None = None,
) -> dict[str, Any]:
    """Re-embed documents and require cosine >= `threshold` (default: the agreement the target's stored
    precision allows, `reindex.vectors.AGREEMENT`) with what the target stores."""
    threshold = AGREEMENT[stored_precision(sink, target)] if threshold is None else threshold
    records, cosines = fresh_cosines(source, sink, embedder, target, ids)
    if not records:
        return {"checked": 0, "min_cosine": None, "failures": 0, "threshold": threshold, "passed": True}
    failures = int((cosines < threshold).sum())
    return {
        "checked": len(records),
        "min_cosine": round(float(cosines.min()), 6),
        "failures": failures,
        "threshold": threshold,
        "passed": failures == 0,
    }


def stored_precision(sink: Sink, target: str) -> Precision:
    """What the target's vectors read back as (float32 where the sink has one way to store them)."""
    return sink.precision(target) if isinstance(sink, PlansStorage) else "float32"


def fresh_cosines(
    source: Source, sink: Sink, embedder: Embedder, target: str, ids: Sequence[str]
) -> tuple[list[Record], NDArray[np.float64]]:
    """The documents of `ids` both sides still hold, and the cosine of each one's stored vector with a
    fresh embedding of its text now (NaN where either is not a usable vector). A document a migration
    would not embed (empty, unreadable: `screen`) is left out, as a provider would refuse the whole call."""
    records = list(source.fetch(ids))
    stored = sink.fetch(target, [r.id for r in records])
    embeddable = set(screen([r for r in records if r.id in stored]).records.ids)
    records = [r for r in records if r.id in embeddable]
    if not records:
        return [], np.empty(0)
    fresh = as_stored(
        embedder.embed(embedder.tokenize([r.text for r in records])), stored_precision(sink, target)
    )
    kept = np.stack([stored[r.id] for r in records])
    with np.errstate(divide="ignore", invalid="ignore"):
        norms = np.linalg.norm(fresh, axis=1) * np.linalg.norm(kept, axis=1)
        cosines = (fresh * kept).sum(axis=1, dtype=np.float64) / norms
    return records, cosines


def refute_application_rows(
    comparison: Comparison,
    source: Source,
    sink: Sink,
    embedder: Embedder,
    threshold: float | None = None,
) -> dict[str, Any]:
    """Re-embed the texts of the rows the application wrote that look sound by their bookkeeping (the hash
    of their text is the source's: `Comparison.adoptable`), and refute those whose stored vector has a
    cosine below `threshold` with the fresh embedding: a write embedded with the old model (same dimension,
    so nothing refused it), or a Qdrant text overwritten in place under its old vector (`overwrite_payload`
    takes the tool's keys with it). They then count as stale, are re-embedded by sync and never adopted.

    The cost is one embedding per application row at each verify and sync (`verify --sample` does the same
    for its sample): tokens billed by a provider, for those rows only."""
    ids = [doc_id for doc_id, _ in comparison.adoptable()]
    threshold = AGREEMENT[stored_precision(sink, comparison.target)] if threshold is None else threshold
    refuted: list[str] = []
    lowest: float | None = None
    checked = 0
    for chunk in chunks(ids, APPLICATION_CHUNK):
        records, cosines = fresh_cosines(source, sink, embedder, comparison.target, chunk)
        checked += len(records)
        refuted += [r.id for r, cosine in zip(records, cosines, strict=True) if not cosine >= threshold]
        finite = cosines[np.isfinite(cosines)]
        if finite.size:
            least = float(finite.min())
            lowest = least if lowest is None else min(lowest, least)
    comparison.refute(refuted)
    found = {
        "checked": checked,
        "stale": len(set(refuted)),
        "min_cosine": None if lowest is None else round(lowest, 6),
        "threshold": threshold,
    }
    comparison.application_check = found
    return found


def _scratch_db(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript("""
        PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA temp_store=FILE;
        CREATE TABLE src (
            id TEXT PRIMARY KEY, hash TEXT, conflict INTEGER NOT NULL DEFAULT 0, carried TEXT,
            blank INTEGER NOT NULL DEFAULT 0, fields TEXT
        ) WITHOUT ROWID;
        CREATE TABLE dead (id TEXT PRIMARY KEY, hash TEXT) WITHOUT ROWID;
        CREATE TABLE tgt (
            id TEXT PRIMARY KEY, hash TEXT, fp TEXT, problem TEXT, app INTEGER, carried TEXT, fields TEXT
        ) WITHOUT ROWID;
        CREATE TABLE refuted (id TEXT PRIMARY KEY) WITHOUT ROWID;
        CREATE TABLE carried (id TEXT NOT NULL, part TEXT NOT NULL, PRIMARY KEY (id, part)) WITHOUT ROWID;
    """)
    return db


def _source_rows(
    records: Iterable[Record],
) -> Iterator[tuple[str, str | None, str | None, bool, str | None]]:
    """(id, content hash, carried digests, blank): blank where a migration embeds nothing (no text, an
    empty one, one of another type, undecodable: what `screen` drops), so a vector held for it is stale."""
    for record in records:
        digest = text_hash(record)
        blank = digest is None or record.defect is not None or not record.text or record.text.isspace()
        yield record.id, digest, parts_json(record.carried), blank, record.fields


def _target_rows(
    entries: Iterable[IndexEntry],
) -> Iterator[tuple[str, str | None, str | None, str | None, bool | None, str | None, str | None]]:
    for entry in entries:
        yield (
            entry.id,
            entry.content_hash,
            entry.fingerprint,
            entry.problem,
            entry.application,
            parts_json(entry.carried),
            entry.fields,
        )
