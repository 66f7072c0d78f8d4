"""Vector sanity: what every sink checks before a write and verify checks after."""

from __future__ import annotations

import numpy as np

from reindex.ports import VectorProblem, Vectors


def vector_problem(vector: Vectors, dim: int) -> VectorProblem | None:
    """Return why `vector` must not be served (wrong dim, NaN/inf, all zero), or None."""
    if vector.ndim != 1 or vector.shape[0] != dim:
        return "dimension"
    if not np.isfinite(vector).all():
        return "non_finite"
    if not vector.any():
        return "zero"
    return None


def batch_problems(vectors: Vectors, dim: int) -> list[VectorProblem | None]:
    """Vectorised `vector_problem` over a (n, d) batch."""
    if vectors.ndim != 2 or vectors.shape[1] != dim:
        return ["dimension"] * len(vectors)
    finite = np.isfinite(vectors).all(axis=1).astype(bool).tolist()
    nonzero = (np.abs(vectors).sum(axis=1) > 0).astype(bool).tolist()
    return [
        None if f and z else ("non_finite" if not f else "zero") for f, z in zip(finite, nonzero, strict=True)
    ]
