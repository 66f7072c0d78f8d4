"""Vector sanity: what every sink checks before a write and verify checks after.
Exact nearest neighbours by brute force: the quality check's ground truth and the memory sink's search."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from reindex.ports import Distance, Precision, VectorProblem, Vectors

Neighbours = list[tuple[list[str], list[float]]]  # per query: ids and scores, best first


def vector_problem(vector: Vectors, dim: int) -> VectorProblem | None:
    """Return why `vector` must not be served (wrong dim, NaN/inf, all zero), or None."""
    if vector.ndim != 1 or vector.shape[0] != dim:
        return "dimension"
    if not np.isfinite(vector).all():
        return "non_finite"
    if not vector.any():
        return "zero"
    return None


# Re-embedded vectors agree with stored ones when their cosine is at least this: float32 and float16 differ
# by rounding only (cosine 1 - 1e-7 measured at 3,072-d); 1-bit signs may flip where a component is near zero
# (a GPU's batch-dependent last bits), so up to 1 % of the bits may differ (cosine 1 - 2 x 0.01), while
# another model's vector agrees on about half of them (cosine near 0).
AGREEMENT: dict[Precision, float] = {"float32": 0.999, "float16": 0.999, "bit": 0.98}


def as_stored(vectors: Vectors, precision: Precision) -> Vectors:
    """Fresh vectors as a target storing `precision` would read them back (what verify compares)."""
    if precision == "float16":
        return vectors.astype(np.float16).astype(np.float32)
    if precision == "bit":
        return signs(vectors > 0)
    return vectors


def signs(bits: NDArray[np.bool_]) -> Vectors:
    """Stored bits as vectors: +1/√dim for a set bit, -1/√dim for a clear one (unit length)."""
    scale = np.float32(1.0 / np.sqrt(max(bits.shape[-1], 1)))
    return np.where(bits, scale, -scale).astype(np.float32)


# exact neighbours ---------------------------------------------------------------------------------------


def exact_neighbours(
    batches: Iterable[tuple[list[str], Vectors]],
    queries: Vectors,
    query_ids: Sequence[str | None],
    k: int,
    distance: Distance,
) -> Neighbours:
    """Each query's k nearest stored vectors by `distance`, itself (its own id) excluded, best first."""
    count = len(queries)
    best_scores = np.full((count, 0), -np.inf, dtype=np.float64)
    best_ids = np.empty((count, 0), dtype=object)
    prepared = _prepared(np.asarray(queries, dtype=np.float32), distance)
    rows = {doc_id: row for row, doc_id in enumerate(query_ids) if doc_id is not None}
    for ids, vectors in batches:
        if not len(ids):
            continue
        scores = _scores(prepared, np.asarray(vectors, dtype=np.float32), distance)
        for column, doc_id in enumerate(ids):
            row = rows.get(doc_id)
            if row is not None:
                scores[row, column] = -np.inf  # a document is not its own neighbour
        take = min(k, len(ids))
        top = np.argpartition(-scores, take - 1, axis=1)[:, :take]
        names = np.asarray(ids, dtype=object)
        best_scores = np.hstack([best_scores, np.take_along_axis(scores, top, axis=1)])
        best_ids = np.hstack([best_ids, names[top]])
        order = np.argsort(-best_scores, axis=1, kind="stable")[:, :k]
        best_scores = np.take_along_axis(best_scores, order, axis=1)
        best_ids = np.take_along_axis(best_ids, order, axis=1)
    return [
        (
            [str(i) for i, s in zip(ids, scores, strict=True) if np.isfinite(s)],
            [float(s) for s in scores if np.isfinite(s)],
        )
        for ids, scores in zip(best_ids.tolist(), best_scores.tolist(), strict=True)
    ]


def _prepared(queries: NDArray[np.float32], distance: Distance) -> NDArray[np.float32]:
    return _normalised(queries) if distance == "cosine" else queries


def _scores(queries: NDArray[np.float32], vectors: NDArray[np.float32], distance: Distance) -> NDArray[Any]:
    """Higher is nearer: cosine similarity, inner product, or minus the squared Euclidean distance."""
    if distance == "cosine":
        return (queries @ _normalised(vectors).T).astype(np.float64)
    products = (queries @ vectors.T).astype(np.float64)
    if distance == "dot":
        return products
    squares = (queries.astype(np.float64) ** 2).sum(axis=1)[:, None]
    distances: NDArray[np.float64] = (
        squares - 2 * products + (vectors.astype(np.float64) ** 2).sum(axis=1)[None, :]
    )
    return -distances


def _normalised(vectors: NDArray[np.float32]) -> NDArray[np.float32]:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit: NDArray[np.float32] = (vectors / np.where(norms > 0, norms, 1.0)).astype(np.float32)
    return unit
