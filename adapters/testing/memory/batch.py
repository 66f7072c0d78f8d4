"""MemoryBatchEmbedder, the `memory-batch` kind: a provider batch API in memory, vectors from HashEmbedder."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from pydantic import ConfigDict, Field

from reindex.ports import EmbedderTraits, JobItem, JobResult, Section, Tokens, Vectors
from reindex_adapters.testing.memory.hash_embedder import HashEmbedder
from reindex_adapters.testing.memory.provider import BatchProvider, Bill, ProviderJob
from reindex_adapters.testing.memory.stores import store


class MemoryBatchEmbedder:
    """A provider batch API in memory: jobs advance one state per poll, vectors come from HashEmbedder.

    Scriptable like the real service: `expire_after` lines complete before a job expires (decided when
    it is polled), texts containing `reject` fail with `invalid_request`. `created` counts jobs per key
    (no double cost). A job bills its delivered lines once, when it first turns terminal, however often it is polled.
    With `store = "<name>"` the provider's state (jobs, bills) lives on that named store, shared by
    every command, and `store(name).provider.script(...)` injects expiry faults into later jobs.
    """

    class Config(Section):
        model_config = ConfigDict(extra="forbid", frozen=True)
        kind: Literal["memory-batch"]
        dim: int = 32
        max_tokens: int = 512
        seed: str = ""  # vectors and fingerprint are the `hash` embedder's with this seed
        price_per_million: float = 0.01
        polls_to_finish: int = Field(2, ge=1)
        reject: str | None = None  # texts containing this fail with invalid_request
        store: str | None = None  # a named, process-wide store holding the provider's state

    def __init__(
        self,
        dim: int = 32,
        *,
        max_tokens: int = 512,
        seed: str = "",
        expire_after: int | None = None,
        reject: str | None = None,
        polls_to_finish: int = 2,
        price_per_million: float | None = 0.01,
        provider: BatchProvider | None = None,
    ) -> None:
        self.inline = HashEmbedder(dim, max_tokens, seed)
        self.info = replace(self.inline.info, kind="memory-batch")
        self.expire_after, self.reject, self.polls_to_finish = expire_after, reject, polls_to_finish
        self.traits = EmbedderTraits(price_per_million=price_per_million)  # priced, with no list of tiers
        self.provider = provider if provider is not None else BatchProvider()
        self.jobs = self.provider.jobs
        self.created = self.provider.created
        self.released = self.provider.released

    @classmethod
    def from_config(cls, config: Config) -> MemoryBatchEmbedder:
        provider = store(config.store).provider if config.store is not None else None
        return cls(
            config.dim,
            max_tokens=config.max_tokens,
            seed=config.seed,
            reject=config.reject,
            polls_to_finish=config.polls_to_finish,
            price_per_million=config.price_per_million,
            provider=provider,
        )

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        return self.inline.tokenize(texts)

    def submit(self, key: str, items: Sequence[JobItem], *, isolate: bool = False) -> str:
        provider = self.provider
        with provider.lock:
            for job_id, job in provider.jobs.items():
                if job.key == key:
                    return job_id
            job_id = f"batch_{len(provider.jobs)}"
            lines = [(item.custom_id, str(item.tokens.data), item.tokens.count) for item in items]
            fingerprint, expire_after = self.info.fingerprint, provider.expire_after
            provider.jobs[job_id] = ProviderJob(key, fingerprint, lines, expire_after, provider.bill_expired)
            provider.created[key] = provider.created.get(key, 0) + 1
            return job_id

    def poll(self, job_id: str) -> JobResult:
        provider = self.provider
        with provider.lock:
            job = provider.jobs[job_id]
            job.polls += 1
            if job.polls < self.polls_to_finish:
                return JobResult("in_progress", is_terminal=False)
            expire_after = self.expire_after if self.expire_after is not None else job.expire_after
            ran = job.lines if expire_after is None else job.lines[:expire_after]
            vectors: dict[str, Vectors] = {}
            failed: dict[str, str] = {}
            billed, lost, bills = 0, 0, []
            done = [text for _, text, _ in ran if not (self.reject and self.reject in text)]
            computed = iter(self.inline.vectors(done) if done else ())  # in the order of the lines below
            for index, (custom_id, text, tokens) in enumerate(job.lines):
                if self.reject and self.reject in text:
                    failed[custom_id] = "invalid_request"
                elif index < len(ran):
                    vectors[custom_id] = next(computed)
                    billed += tokens
                    bills.append(Bill(job.fingerprint, text, tokens, lost=False))
                else:
                    failed[custom_id] = "batch_expired"
                    if job.bill_expired:
                        lost += tokens
                        bills.append(Bill(job.fingerprint, text, tokens, lost=True))
            if not job.billed:
                job.billed = True
                provider.billed_tokens += billed + lost
                provider.lost_tokens += lost
                provider.bills += bills
            status = "completed" if expire_after is None else "expired"
            return JobResult(status, True, vectors=vectors, failed=failed, billed_tokens=billed + lost)

    def release(self, job_id: str) -> None:
        with self.provider.lock:
            self.provider.released.add(job_id)
