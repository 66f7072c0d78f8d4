"""Embedding-space identity: two vectors are comparable only if their fingerprints are equal.
Text identity: the content hash of the exact text embedded, per text, per batch and per record."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from reindex.ports import Record

FINGERPRINT_LENGTH = 16  # hex chars; targets use the first 8 (`docs__3f9a1c2e`)


def fingerprint(kind: str, model: str, dim: int, options: Mapping[str, Any]) -> str:
    """Hash everything that changes the vectors: model and weights, dim, pooling, prompt, precision..."""
    identity = {"kind": kind, "model": model, "dim": dim, "options": dict(options)}
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:FINGERPRINT_LENGTH]


def content_hash(text: str) -> str:
    """Hash of the exact text embedded; stored on every vector, it drives staleness and sync."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def target_name(alias: str, fingerprint: str) -> str:
    return f"{alias}__{fingerprint[:8]}"


def content_hashes(texts: list[str]) -> list[str | None]:
    """Content hashes of all texts in one comprehension; None for a text that is not valid Unicode (a lone
    surrogate: no tokenizer accepts it). One encode of the joined texts proves the common case."""
    try:
        "".join(texts).encode("utf-8")
    except UnicodeEncodeError:
        return [_hash_or_none(text) for text in texts]
    return [content_hash(text) for text in texts]


def _hash_or_none(text: str) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return content_hash(text)


def text_hash(record: Record) -> str | None:
    """The content hash of a readable record; None when the source could not read its text."""
    if record.defect:
        return None
    return _hash_or_none(record.text)


def fields_version(payload: Mapping[str, Any]) -> str:
    """A digest of a document's payload less the tool's `reindex_*` keys: what a target that copies the
    payload whole holds of it (`Record.fields`, `IndexEntry.fields`)."""
    fields = {k: v for k, v in payload.items() if not k.startswith("reindex_")}
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def document_version(payload: Mapping[str, Any], carried: Mapping[str, str] | None) -> str:
    """A digest of what the application can change of a document other than the vector re-embedded: its
    payload (less the tool's `reindex_*` keys) and the digests of its carried parts (a Qdrant point's other
    named vectors). A source's record and the target's copy of it have the same version; a write of any
    field or carried part changes it (the carry-over after a flip compares them)."""
    fields = {k: v for k, v in payload.items() if not k.startswith("reindex_")}
    canonical = json.dumps([fields, dict(carried or {})], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]
