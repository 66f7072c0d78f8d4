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

from reindex.fingerprint import content_hash
from reindex.ledger import DeadLetter
from reindex.ports import Record, Vectors
from reindex.vectors import batch_problems

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
    records: list[Record] = field(default_factory=list)  # unique ids, embeddable text
    hashes: list[str] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    duplicates: int = 0


def screen(records: Sequence[Record]) -> Screened:
    """Drop unreadable and empty documents and fold duplicate ids (a conflict dead-letters all copies)."""
    result = Screened()
    first: dict[str, int] = {}
    conflicted: set[str] = set()
    for record in records:
        reason = _defect(record)
        digest = text_hash(record)
        if reason:
            result.dead.append(DeadLetter(record.id, reason, _detail(record), digest))
        elif record.id in first:
            _fold(result, record, digest or "", first, conflicted)
        else:
            first[record.id] = len(result.records)
            result.records.append(record)
            result.hashes.append(digest or "")
    if conflicted:
        _drop_conflicts(result, conflicted)
    return result


def text_hash(record: Record) -> str | None:
    """The content hash of a readable record; None when the source could not read its text."""
    if record.defect:
        return None
    try:
        return content_hash(record.text)
    except UnicodeEncodeError:
        return None


def _defect(record: Record) -> str | None:
    if record.defect:
        return record.defect
    try:
        record.text.encode("utf-8")
    except UnicodeEncodeError:
        return "invalid_encoding"
    return "empty_text" if not record.text.strip() else None


def _detail(record: Record) -> str:
    return f"source position {record.position}" if record.defect else ""


def _fold(result: Screened, record: Record, digest: str, first: dict[str, int], conflicted: set[str]) -> None:
    if result.hashes[first[record.id]] == digest:
        result.duplicates += 1
    else:
        conflicted.add(record.id)
        result.dead.append(DeadLetter(record.id, "duplicate_id_conflict", "same id, different text", digest))


def _drop_conflicts(result: Screened, conflicted: set[str]) -> None:
    kept = [(r, h) for r, h in zip(result.records, result.hashes, strict=True) if r.id not in conflicted]
    for record, digest in zip(result.records, result.hashes, strict=True):
        if record.id in conflicted:
            result.dead.append(
                DeadLetter(record.id, "duplicate_id_conflict", "same id, different text", digest)
            )
    result.records = [r for r, _ in kept]
    result.hashes = [h for _, h in kept]


def is_excusable(reason: str) -> bool:
    """True when a fresh migration would dead-letter the same text for the same reason."""
    return reason not in NOT_INTRINSIC and not reason.startswith(NOT_INTRINSIC_PREFIXES)


def excused(letters: Iterable[DeadLetter]) -> dict[str, str | None]:
    """Dead letters that excuse a missing vector (id -> the text's hash): those a fresh migration would meet."""
    return {d.doc_id: d.content_hash for d in letters if is_excusable(d.reason)}


def vector_dead_letters(vectors: Vectors, dim: int) -> list[str | None]:
    """The dead-letter reason for each vector of a batch, or None when it may be written."""
    return [VECTOR_REASONS[p] if p else None for p in batch_problems(vectors, dim)]
