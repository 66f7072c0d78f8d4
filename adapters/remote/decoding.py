"""Embedding vectors from a provider's answer: base64 or float rows, and an OpenAI-shaped embeddings body."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import numpy as np

from reindex.ports import Vectors


def line_vectors(body: Any, size: int, dim: int) -> list[Vectors] | str:
    try:
        data = sorted(body["data"], key=lambda embedding: int(embedding["index"]))
        vectors = [decode(embedding["embedding"]) for embedding in data]
    except (KeyError, TypeError, ValueError):  # binascii.Error is a ValueError
        return "malformed_output"
    if len(vectors) != size:
        return "malformed_output"
    return vectors if all(vector.shape == (dim,) for vector in vectors) else "wrong_dimension"


def decode_vectors(values: Sequence[Any]) -> Vectors | None:
    """The rows of a response as one float32 matrix, or None when they differ in length. Base64 rows are
    decoded one by one with pybase64 (SIMD) and joined as bytes: a tenth of the time of joining the strings
    and decoding them with binascii, which held the GIL for a tenth of a second per 5,000 rows of 1,536."""
    if not values:
        return np.empty((0, 0), dtype=np.float32)
    if all(isinstance(value, str) for value in values):
        import pybase64

        raw = [pybase64.b64decode(value, validate=True) for value in values]  # binascii.Error: a ValueError
        if len({len(row) for row in raw}) != 1:
            return None
        flat = np.frombuffer(b"".join(raw), dtype="<f4")  # a length not a multiple of 4: ValueError
        return flat.reshape(len(raw), -1).astype(np.float32)
    rows = [decode(value) for value in values]
    if len({row.shape for row in rows}) != 1:
        return None
    return np.vstack(rows)


def decode(value: Any) -> Vectors:
    if isinstance(value, str):
        return np.frombuffer(base64.b64decode(value, validate=True), dtype="<f4").astype(np.float32)
    return np.asarray(value, dtype=np.float32)
