"""Screen documents before embedding and vectors before writing; what fails becomes a dead letter.

Reasons (fixed, documented in the README):
    empty_text, too_long, invalid_encoding, invalid_json, missing_id, missing_text, invalid_text_type,
    duplicate_id_conflict, non_finite_vector, zero_vector, dimension_mismatch, provider_rejected:<code>,
    duplicate_source_lost (another document carried this text, and its vector is gone),
    sink_rejected:<code> (the target refused the row, e.g. a NUL byte for Postgres)

verify excuses a missing document only by a dead letter for its current text whose reason a fresh
migration would meet again (`is_excusable`); a lost duplicate or an expired provider line is not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from reindex.columns import Documents, documents
from reindex.fingerprint import content_hashes
from reindex.ports import Record, Vectors
from reindex.state.records import DeadLetter

REASONS = frozenset(
    {
        "empty_text",
        "too_long",
        "invalid_encoding",
        "invalid_json",
        "missing_id",
        "missing_text",
        "invalid_text_type",
        "duplicate_id_conflict",
        "non_finite_vector",
        "zero_vector",
        "dimension_mismatch",
        "duplicate_source_lost",
    }
)
# Reasons that say nothing about the text: a rerun or `dlq retry` may well succeed.
NOT_INTRINSIC = ("duplicate_source_lost", "provider_rejected:batch_expired", "provider_rejected:429")
NOT_INTRINSIC_PREFIXES = ("provider_rejected:5", "provider_rejected:rate_limit", "provider_rejected:server")
VECTOR_REASONS = {"non_finite": "non_finite_vector", "zero": "zero_vector", "dimension": "dimension_mismatch"}


@dataclass
class Screened:
    records: Documents = field(default_factory=lambda: Documents([], []))  # unique ids, embeddable text
    hashes: list[str] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    duplicates: int = 0


def screen(records: Sequence[Record], hashes: Sequence[str | None] | None = None) -> Screened:
    """Drop unreadable and empty documents and fold duplicate ids (a conflict dead-letters all copies).
    `hashes`: the texts' `content_hashes`, when computed before (the ray engine's read tasks).

    Columnar: one hash comprehension over the texts, one set for the ids; per-document Python only for the
    documents that are dropped or duplicated."""
    docs = documents(records)
    hashes = content_hashes(docs.texts) if hashes is None else list(hashes)
    empty = [row for row, text in enumerate(docs.texts) if not text or text.isspace()]
    unreadable = [row for row, digest in enumerate(hashes) if digest is None] if None in hashes else []
    defects = {row: reason for row, (reason, _) in docs.defects.items()}
    bad = dict.fromkeys(empty, "empty_text") | dict.fromkeys(unreadable, "invalid_encoding") | defects
    result = Screened()
    for row in sorted(bad):
        detail = docs.defects[row][1] if row in docs.defects else ""
        digest = None if row in docs.defects else hashes[row]
        result.dead.append(DeadLetter(docs.ids[row], bad[row], detail, digest))
    rows = [row for row in range(len(docs)) if row not in bad] if bad else range(len(docs))
    ids = docs.ids if not bad else [docs.ids[row] for row in rows]
    if len(set(ids)) < len(ids):
        rows = _fold(result, docs, hashes, list(rows))
    if bad or len(rows) < len(docs):
        docs = docs.take(rows)
        hashes = [hashes[row] for row in rows]
    result.records = docs
    result.hashes = [digest or "" for digest in hashes]
    return result


def _fold(result: Screened, docs: Documents, hashes: list[str | None], rows: list[int]) -> list[int]:
    """Keep the first of each id; every later row of an id is folded (counted in `duplicates`), and an id
    whose rows hold different texts is one dead letter, `duplicate_id_conflict`: the unit is the document
    id, so `plan`, `run`, `dlq list` and `verify` count it once however many rows repeat it."""
    first: dict[str, int] = {}
    copies: dict[str, int] = {}
    conflicted: set[str] = set()
    for row in rows:
        doc_id = docs.ids[row]
        if doc_id not in first:
            first[doc_id] = row
            continue
        result.duplicates += 1
        copies[doc_id] = copies.get(doc_id, 1) + 1
        if hashes[first[doc_id]] != hashes[row]:
            conflicted.add(doc_id)
    for doc_id in sorted(conflicted):
        detail = f"{copies[doc_id]} rows with this id hold different texts"
        result.dead.append(DeadLetter(doc_id, "duplicate_id_conflict", detail, hashes[first[doc_id]]))
    return sorted(row for row in first.values() if docs.ids[row] not in conflicted)


def is_excusable(reason: str) -> bool:
    """True when a fresh migration would dead-letter the same text for the same reason."""
    return reason not in NOT_INTRINSIC and not reason.startswith(NOT_INTRINSIC_PREFIXES)


def excused(letters: Iterable[DeadLetter]) -> dict[str, str | None]:
    """Dead letters that excuse a missing vector (id -> the text's hash): those a fresh migration would meet."""
    return {d.doc_id: d.content_hash for d in letters if is_excusable(d.reason)}


def vector_dead_letters(vectors: Vectors, dim: int) -> list[str | None]:
    """The dead-letter reason for each vector of a batch, or None when it may be written."""
    problems = vector_problems(vectors, dim)
    return [problems.get(row) for row in range(len(vectors))]


def vector_problems(vectors: Vectors, dim: int) -> dict[int, str]:
    """{row: dead-letter reason} for the unusable vectors of a batch (usually empty): two numpy reductions."""
    if vectors.ndim != 2 or vectors.shape[1] != dim:
        return dict.fromkeys(range(len(vectors)), VECTOR_REASONS["dimension"])
    finite = np.asarray(np.isfinite(vectors).all(axis=1), dtype=bool)
    nonzero = np.asarray(np.abs(vectors).sum(axis=1) > 0, dtype=bool)
    if finite.all() and nonzero.all():
        return {}
    return {
        int(row): VECTOR_REASONS["non_finite" if not finite[row] else "zero"]
        for row in np.flatnonzero(~(finite & nonzero))
    }
