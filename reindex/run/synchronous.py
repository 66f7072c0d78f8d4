"""A provider batch embedder used inline, for the few documents `sync` and `dlq retry` embed.

Each call submits one job, polls it to the end, and returns the vectors in input order; refused lines come
back as `provider_rejected:<code>` through `last_rejections`, like an online embedder's. The key is new for
every call: a job is released once read, so adopting it again later would find its files gone. A crash in
the middle of a sync can therefore bill its few texts twice; the backfill's own jobs keep the adopt-by-key
guarantee.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from reindex.config import RunConfig
from reindex.errors import TransientError
from reindex.ports import DeferredEmbedder, Embedder, JobItem, Tokens, Vectors


class SynchronousBatches:
    def __init__(self, embedder: DeferredEmbedder, *, poll_seconds: float, poll_max_seconds: float) -> None:
        self.info = embedder.info
        # one small job per call, waited for: the traits of an online embedder at the batch's price
        self.traits = replace(embedder.traits, completion_window_hours=None, stragglers_online=False)
        self._embedder = embedder
        self._poll = (poll_seconds, poll_max_seconds)
        self._rejected: dict[int, str] = {}
        self.billed_tokens = 0

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        return self._embedder.tokenize(texts)

    def embed(self, items: Sequence[Tokens]) -> Vectors:
        jobs = [JobItem(f"s{i}", tokens) for i, tokens in enumerate(items)]
        job_id = self._embedder.submit(
            f"sync-{self.info.fingerprint[:8]}-{uuid.uuid4().hex}", jobs, isolate=True
        )
        result = self._embedder.poll(job_id)
        wait, longest = self._poll
        deadline = time.monotonic() + 24 * 3600
        while not result.is_terminal:
            if time.monotonic() > deadline:
                raise TransientError(f"provider job {job_id} did not finish", hint="rerun to adopt it")
            time.sleep(wait)
            wait = min(wait * 2, longest)
            result = self._embedder.poll(job_id)
        self.billed_tokens += result.billed_tokens
        vectors = np.full((len(items), self.info.dim), np.nan, dtype=np.float32)
        self._rejected = {}
        for i, job in enumerate(jobs):
            if job.custom_id in result.vectors:
                vectors[i] = result.vectors[job.custom_id]
            else:
                self._rejected[i] = f"provider_rejected:{result.failed.get(job.custom_id, 'missing')}"
        self._embedder.release(job_id)
        return vectors

    def last_rejections(self) -> dict[int, str]:
        return dict(self._rejected)


def online(embedder: Embedder | DeferredEmbedder, run: RunConfig) -> Embedder:
    """`embedder` as one that embeds inline (verify's fresh embeddings): a provider batch embedder through
    one small job per call, waited for."""
    if isinstance(embedder, DeferredEmbedder):
        return SynchronousBatches(
            embedder, poll_seconds=run.poll_seconds, poll_max_seconds=run.poll_max_seconds
        )
    return embedder
