"""Token-budget batches over length-sorted texts: short and long never share a padded batch."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import TypeVar

T = TypeVar("T")


def token_batches(lengths: Sequence[int], budget: int, max_batch: int) -> list[list[int]]:
    """Group indexes so that each batch's padded size (count x longest) stays within `budget`.

    A single text longer than the budget still gets a batch of its own.
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        longest = max(lengths[index], 1)
        if current and ((len(current) + 1) * longest > budget or len(current) >= max_batch):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def padded_tokens(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> int:
    """Tokens the model computes including padding, for the padding-fraction figure."""
    return sum(len(batch) * max(lengths[i] for i in batch) for batch in batches)


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of `size` items (the last may be shorter), pulled lazily: memory stays flat."""
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk
