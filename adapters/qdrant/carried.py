"""Carried vectors: a point's named vectors other than the one re-embedded (a sparse BM25 or SPLADE vector, a
second dense one), copied to the target unchanged, digested for verify and sync, and compared by value.

They travel from the source to the sink inside the record's payload object (`PointPayload.vectors`): the
core carries payloads untouched, and every other sink sees a plain mapping of the payload itself.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

# Qdrant renormalises a cosine vector as it stores it (local mode at every write and load, in float64), so a
# carried cosine vector may differ from its original in the last bit: compared within this, per component
COSINE_TOLERANCE = 1e-6


class PointPayload(dict[str, Any]):
    """A point's payload as the source read it, with its carried vectors (name -> vector) beside it."""

    __slots__ = ("vectors",)

    def __init__(self, payload: Mapping[str, Any], vectors: Mapping[str, Any]) -> None:
        super().__init__(payload)
        self.vectors = dict(vectors)

    def __reduce__(self) -> tuple[Any, ...]:  # pickled whole (a worker process, a ray task)
        return PointPayload, (dict(self), self.vectors)


def carried_vectors(point: Any, names: Iterable[str]) -> dict[str, Any]:
    """The carried vectors a point holds, by name; a name the point lacks is left out."""
    held = point.vector if isinstance(point.vector, Mapping) else {}
    return {name: held[name] for name in names if held.get(name) is not None}


def of_payload(payload: Mapping[str, Any]) -> dict[str, Any] | None:
    """The carried vectors a record's payload brings along; None when it brings none (another source)."""
    return payload.vectors if isinstance(payload, PointPayload) else None


def digests(vectors: Mapping[str, Any]) -> dict[str, str]:
    """Each vector's digest, by name: what `Record.carried` and `IndexEntry.carried` hold."""
    return {name: digest(vector) for name, vector in vectors.items()}


def digest(vector: Any) -> str:
    """The exact value as Qdrant stores it: float32 values, a sparse vector's pairs in index order."""
    hashed = hashlib.sha256()
    if hasattr(vector, "indices"):
        indices = np.asarray(vector.indices, dtype=np.uint32)
        order = np.argsort(indices, kind="stable")
        hashed.update(b"sparse")
        hashed.update(indices[order].tobytes())
        hashed.update(np.asarray(vector.values, dtype=np.float32)[order].tobytes())
    else:
        dense = np.asarray(vector, dtype=np.float32)
        hashed.update(f"dense{dense.shape}".encode())
        hashed.update(dense.tobytes())
    return hashed.hexdigest()[:32]


def same(ours: Any, theirs: Any, *, cosine: bool) -> bool:
    """Whether two stored vectors are one value: exactly, or a cosine one within Qdrant's renormalisation."""
    if ours is None or theirs is None:
        return ours is None and theirs is None
    if digest(ours) == digest(theirs):
        return True
    if not cosine or hasattr(ours, "indices") or hasattr(theirs, "indices"):
        return False
    left, right = np.asarray(ours, dtype=np.float32), np.asarray(theirs, dtype=np.float32)
    return left.shape == right.shape and bool(np.all(np.abs(left - right) <= COSINE_TOLERANCE))


def point_version(point: Any, leave: str | None = None) -> str:
    """A digest of a whole point as stored: its payload (less the tool's own `reindex_*` keys) and every
    vector by name (less `leave`, "" for the unnamed). Two reads of a point differ in it whenever anything
    of the application's changed."""
    hashed = hashlib.sha256()
    payload = {k: v for k, v in (point.payload or {}).items() if not k.startswith("reindex_")}
    hashed.update(json.dumps(payload, sort_keys=True, default=str).encode())
    held = point.vector if isinstance(point.vector, Mapping) else {"": point.vector}
    for name in sorted(held):
        if name != leave and held[name] is not None and not (isinstance(held[name], list) and not held[name]):
            hashed.update(f"|{name}:{digest(held[name])}".encode())
    return hashed.hexdigest()[:32]
