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
