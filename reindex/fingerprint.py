"""Embedding-space identity: two vectors are comparable only if their fingerprints are equal."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

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
