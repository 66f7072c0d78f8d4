"""Coverage: compare a source with a target directly, by exact id sets and content hashes, never by ANN.

Both sides stream into a temporary on-disk SQLite database and are joined there, so memory stays
bounded whatever the corpus size and neither side has to share the other's sort order (a Qdrant
scroll is in point-id order, a Postgres scan in key order).
"""

from __future__ import annotations

import sqlite3
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from reindex.ports import IndexEntry, Record, Sink, Source
from reindex.validation import text_hash

CHUNK = 20_000
EXAMPLES = 5


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
    fingerprints: dict[str, int]  # fingerprint ("none" when absent) -> vectors
    expected_fingerprint: str
    examples: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0
    ids_per_second: float = 0.0

    def problems(self) -> str:
        """One line naming every non-zero count, for refusals."""
        counts = {
            "missing": self.missing,
            "stale": self.stale,
            "orphaned": self.orphaned,
            "invalid": self.invalid_vectors,
        }
        parts = [f"{v} {k}" for k, v in counts.items() if v]
        others = {fp: n for fp, n in self.fingerprints.items() if fp != self.expected_fingerprint}
        if others:
            parts.append(f"{sum(others.values())} vectors of other fingerprints {sorted(others)}")
        return ", ".join(parts) or "none"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def coverage(
    source: Source,
    sink: Sink,
    target: str,
    *,
    dim: int,
    fingerprint: str,
    dead_letters: Mapping[str, str | None] | None = None,
) -> Coverage:
    """Compare `source` with `target`; `dead_letters` maps excused ids to the content hash they failed on."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="reindex-verify-") as scratch:
        db = _scratch_db(Path(scratch) / "coverage.db")
        _load(db, "INSERT OR IGNORE INTO src VALUES (?,?)", _source_rows(source.scan()))
        _load(db, "INSERT OR IGNORE INTO dead VALUES (?,?)", (dead_letters or {}).items())
        _load(db, "INSERT OR REPLACE INTO tgt VALUES (?,?,?,?)", _target_rows(sink.scan_index(target, dim)))
        report = _report(db, target, fingerprint)
        db.close()
    seconds = time.monotonic() - started
    compared = report["source_documents"] + report["target_vectors"]
    return Coverage(**report, seconds=round(seconds, 3), ids_per_second=round(compared / max(seconds, 1e-9)))


def _scratch_db(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript("""
        PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA temp_store=FILE;
        CREATE TABLE src (id TEXT PRIMARY KEY, hash TEXT) WITHOUT ROWID;
        CREATE TABLE dead (id TEXT PRIMARY KEY, hash TEXT) WITHOUT ROWID;
        CREATE TABLE tgt (id TEXT PRIMARY KEY, hash TEXT, fp TEXT, problem TEXT) WITHOUT ROWID;
    """)
    return db


def _source_rows(records: Iterable[Record]) -> Iterator[tuple[str, str | None]]:
    for record in records:
        yield record.id, text_hash(record)


def _target_rows(entries: Iterable[IndexEntry]) -> Iterator[tuple[str, str | None, str | None, str | None]]:
    for entry in entries:
        yield entry.id, entry.content_hash, entry.fingerprint, entry.problem


def _load(db: sqlite3.Connection, sql: str, rows: Iterable[tuple[Any, ...]]) -> None:
    iterator = iter(rows)
    while chunk := list(islice(iterator, CHUNK)):
        db.execute("BEGIN")
        db.executemany(sql, chunk)
        db.execute("COMMIT")


_EXCUSED = "EXISTS (SELECT 1 FROM dead d WHERE d.id = s.id AND (d.hash IS s.hash OR d.hash IS NULL))"
_QUERIES = {
    "missing": f"FROM src s LEFT JOIN tgt t ON t.id = s.id WHERE t.id IS NULL AND NOT {_EXCUSED}",
    "dead_letters": f"FROM src s LEFT JOIN tgt t ON t.id = s.id WHERE t.id IS NULL AND {_EXCUSED}",
    "stale": "FROM src s JOIN tgt t ON t.id = s.id WHERE t.hash IS NOT s.hash",
    "orphaned": "FROM tgt t LEFT JOIN src s ON s.id = t.id WHERE s.id IS NULL",
    "invalid_vectors": "FROM tgt t WHERE t.problem IS NOT NULL",
}


def _report(db: sqlite3.Connection, target: str, fingerprint: str) -> dict[str, Any]:
    counts = {name: db.execute(f"SELECT count(*) {where}").fetchone()[0] for name, where in _QUERIES.items()}
    alias = {"missing": "s", "dead_letters": "s", "stale": "t", "orphaned": "t", "invalid_vectors": "t"}
    examples = {
        name: [row[0] for row in db.execute(f"SELECT {alias[name]}.id {where} LIMIT {EXAMPLES}")]
        for name, where in _QUERIES.items()
        if counts[name] and name != "dead_letters"
    }
    fingerprints = dict(
        db.execute("SELECT coalesce(fp, 'none'), count(*) FROM tgt GROUP BY 1 ORDER BY 2 DESC")
    )
    complete = not any(counts[k] for k in ("missing", "stale", "orphaned", "invalid_vectors")) and set(
        fingerprints
    ) <= {fingerprint}
    return {
        "target": target,
        "complete": complete,
        "source_documents": db.execute("SELECT count(*) FROM src").fetchone()[0],
        "target_vectors": db.execute("SELECT count(*) FROM tgt").fetchone()[0],
        **counts,
        "fingerprints": fingerprints,
        "expected_fingerprint": fingerprint,
        "examples": examples,
    }
