"""What the batch embedders' adapter tests share: texts, their job items, and polling a job to its end."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from reindex.ports import JobItem, JobResult, Tokens
from reindex_adapters.remote.tokens import cl100k

TEXTS = ["the quick brown fox", "jumps over", "the lazy dog", "hello world", "naïve café ☕", "one more"]


class Batcher(Protocol):
    def tokenize(self, texts: Sequence[str]) -> list[Tokens]: ...

    def poll(self, job_id: str) -> JobResult: ...


def jobs(embedder: Batcher, texts: list[str]) -> list[JobItem]:
    return [JobItem(f"doc-{i}", tokens) for i, tokens in enumerate(embedder.tokenize(texts))]


def finish(embedder: Batcher, job_id: str, polls: int = 10) -> JobResult:
    for _ in range(polls):
        result = embedder.poll(job_id)
        if result.is_terminal:
            return result
    raise AssertionError(f"job {job_id} never finished")


def tokens(texts: list[str]) -> int:
    """The exact cl100k_base count, as the emulators bill."""
    return sum(len(cl100k().encode_ordinary(text)) for text in texts)
