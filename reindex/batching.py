"""Token-budget batches over length-sorted texts: short and long never share a padded batch; and how big one
model call is (`batch_budget` padded tokens, `batch_texts` texts)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from reindex.config import RunConfig

T = TypeVar("T")


def token_batches(
    lengths: Sequence[int] | NDArray[np.integer[Any]], budget: int, max_batch: int
) -> list[NDArray[np.int64]]:
    """Group indexes so that each batch's padded size (count x longest) stays within `budget`.

    Greedy over the length-sorted order, one numpy search per batch (not per text): in ascending order
    `k * lengths[start + k - 1]` grows with k, so a batch is the longest prefix that fits. A single text
    longer than the budget still gets a batch of its own.
    """
    values = np.maximum(np.asarray(lengths, dtype=np.int64), 1)
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    batches: list[NDArray[np.int64]] = []
    start, total = 0, len(order)
    while start < total:
        span = min(max_batch, total - start)
        fits = np.arange(1, span + 1) * ordered[start : start + span] <= budget
        size = max(1, int(np.argmin(fits)) if not fits.all() else span)
        batches.append(order[start : start + size])
        start += size
    return batches


def padded_tokens(
    lengths: Sequence[int] | NDArray[np.integer[Any]], batches: Sequence[Sequence[int] | NDArray[np.int64]]
) -> int:
    """Tokens the model computes including padding, for the padding-fraction figure."""
    values = np.asarray(lengths, dtype=np.int64)
    return int(sum(len(batch) * int(values[batch].max()) for batch in batches if len(batch)))


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of `size` items (the last may be shorter), pulled lazily: memory stays flat."""
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


def batch_budget(run: RunConfig, embedder: Any) -> int:
    """Padded tokens per model call: `[run] batch_tokens`, else what the embedder suits (CPU small, GPU large,
    a remote API enough for all its requests in flight)."""
    return int(run.batch_tokens or embedder.traits.batch_tokens or 4096)


def batch_texts(run: RunConfig, embedder: Any) -> int:
    """Texts per model call: `[run] max_batch` when set, else the embedder's own limit, else the default."""
    own = embedder.traits.max_batch
    return int(own) if own and "max_batch" not in run.model_fields_set else run.max_batch
