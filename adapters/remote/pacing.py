"""Pacing requests to a provider: the Pacer (Retry-After, backoff, per-minute budgets, adaptive concurrency),
the Traffic it counts, and Paced, the pacing and retry settings every provider kind's config shares."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from pydantic import ConfigDict, Field

from reindex.capabilities import Traffic as Figures
from reindex.errors import ReindexError, TransientError
from reindex.ports import Section
from reindex_adapters.remote.errors import ProviderBusy

T = TypeVar("T")
PACING_SHARE = 0.98  # of the per-minute budgets a pacer aims at


class Pacer:
    """The one place requests to an endpoint wait: Retry-After, jittered backoff, per-minute budgets and
    how many requests are in flight.

    Workers share one "not before" time and never send earlier. After a refusal one request probes
    alone until it succeeds (so does the very first), so a 429 storm meets one request per
    Retry-After, never a burst. The per-minute budgets are spread evenly (one request every
    60/requests_per_minute s, a request of n tokens holds the next one back n*60/tokens_per_minute s),
    as providers enforce them over parts of a minute. In flight: up to `concurrency`, halved on each 429
    and grown back by one after as many calm answers as are allowed in flight (additive increase,
    multiplicative decrease, as TCP does). Attempts are bounded; a wait longer than `max_wait_s` gives up.
    """

    def __init__(
        self,
        *,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        concurrency: int | None = None,
        attempts: int = 8,
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        max_wait_s: float = 300.0,
    ) -> None:
        self.requests_per_minute, self.tokens_per_minute = requests_per_minute, tokens_per_minute
        self.concurrency = concurrency
        self.attempts, self.backoff_s, self.max_backoff_s = attempts, backoff_s, max_backoff_s
        self.max_wait_s = max_wait_s
        self.traffic = Traffic()
        self._ready = threading.Condition()
        self._not_before = 0.0
        self._next_slot = 0.0  # when the per-minute budgets allow the next request
        self._in_flight = 0
        self._allowed = concurrency  # in flight now: adapted between 1 and `concurrency`
        self._calm = 0  # answers since the last 429 or growth
        self._is_probing = True

    @classmethod
    def of(cls, config: Paced) -> Pacer:
        """The pacer an embedder config asks for: its per-minute limits, concurrency (the online kinds) and
        retry settings (`max_attempts`, `backoff_s`, `max_backoff_s`), by those field names."""
        return cls(
            requests_per_minute=config.requests_per_minute,
            tokens_per_minute=getattr(config, "tokens_per_minute", None),
            concurrency=getattr(config, "concurrency", None),
            attempts=config.max_attempts,
            backoff_s=config.backoff_s,
            max_backoff_s=config.max_backoff_s,
        )

    def call(
        self, request: Callable[[], T], *, tokens: int = 0, usage: Callable[[T], int] | None = None
    ) -> T:
        """Run `request` when allowed; retry ProviderBusy; raise TransientError once attempts run out.
        `tokens` paces it; `usage` reads the tokens the provider counted from its answer (the traffic's
        tokens per minute), else `tokens` are counted."""
        for attempt in range(1, self.attempts + 1):
            self._acquire(tokens, is_retry=attempt > 1)
            try:
                result = request()
            except ProviderBusy as exc:
                delay = self._release(exc, attempt)
                if attempt == self.attempts or delay > self.max_wait_s:
                    raise TransientError(f"gave up after {attempt} attempts: {exc}") from exc
                continue
            except ReindexError:
                self._release(None, attempt)  # the endpoint answered: a refusal of the input, not of us
                raise
            except BaseException:
                self._release(None, attempt, is_answer=False)
                raise
            self._release(None, attempt, tokens=tokens if usage is None else usage(result))
            return result
        raise AssertionError("unreachable: the last attempt returns or raises")

    @property
    def allowed(self) -> int | None:
        """Requests that may be in flight now (None: no limit)."""
        return self._allowed

    def _acquire(self, tokens: int, *, is_retry: bool) -> None:
        with self._ready:
            while True:
                now = time.monotonic()
                wait = max(self._not_before, self._next_slot) - now
                is_full = self._allowed is not None and self._in_flight >= self._allowed
                if wait <= 0 and not is_full and not (self._is_probing and self._in_flight):
                    self._in_flight += 1
                    self._next_slot = max(self._next_slot, now) + self._spacing(tokens)
                    self.traffic.sent(now, is_retry=is_retry)
                    return
                self._ready.wait(timeout=wait if wait > 0 else None)

    def _spacing(self, tokens: int) -> float:
        """Seconds this request holds the next one back under the per-minute budgets (aimed at 98% of
        them: requests reach the provider with some jitter, and a limit enforced over short windows would
        refuse the one that arrived early)."""
        by_requests = 60 / self.requests_per_minute if self.requests_per_minute else 0.0
        by_tokens = 60 * tokens / self.tokens_per_minute if self.tokens_per_minute else 0.0
        return max(by_requests, by_tokens) / PACING_SHARE

    def _release(
        self, busy: ProviderBusy | None, attempt: int, *, is_answer: bool = True, tokens: int = 0
    ) -> float:
        """End an attempt; a refusal pushes the shared "not before" time and starts a probe; returns it."""
        delay = 0.0
        if busy is not None:
            cap = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
            delay = busy.retry_after if busy.retry_after is not None else random.uniform(cap / 2, cap)
        with self._ready:
            self._in_flight -= 1
            if busy is not None:
                self._not_before = max(self._not_before, time.monotonic() + delay)
                self._throttle(is_rate_limit=busy.status == 429)
            elif is_answer:
                self._grow()
            if busy is not None or is_answer:
                self._is_probing = busy is not None
            self.traffic.answered(time.monotonic(), tokens, refused=busy)
            self._ready.notify_all()
        return delay

    def _throttle(self, *, is_rate_limit: bool) -> None:
        self._calm = 0
        if is_rate_limit and self._allowed is not None:
            self._allowed = max(1, self._allowed // 2)

    def _grow(self) -> None:
        if self._allowed is None or self.concurrency is None:
            return
        self._calm += 1
        if self._calm >= self._allowed and self._allowed < self.concurrency:
            self._allowed, self._calm = self._allowed + 1, 0


@dataclass
class Traffic:
    """What an endpoint was sent and answered: the run reports it (a remote model has no padding)."""

    requests: int = 0
    retries: int = 0
    rate_limited: int = 0  # 429 answers
    refused: int = 0  # 429, 5xx, timeouts: every attempt that was retried or gave up
    tokens: int = 0  # of requests that succeeded
    first: float | None = None
    last: float | None = None

    def sent(self, now: float, *, is_retry: bool) -> None:
        self.requests += 1
        self.retries += is_retry
        self.first = now if self.first is None else self.first

    def answered(self, now: float, tokens: int, *, refused: ProviderBusy | None) -> None:
        self.last = now
        self.tokens += tokens
        if refused is not None:
            self.refused += 1
            self.rate_limited += refused.status == 429

    def describe(self) -> Figures:
        """Counts, and the achieved requests/s and tokens/min between the first send and the last answer."""
        seconds = (self.last - self.first) if self.first is not None and self.last is not None else 0.0
        return Figures(
            requests=self.requests,
            retries=self.retries,
            rate_limited=self.rate_limited,
            refused=self.refused,
            requests_per_second=round(self.requests / seconds, 2) if seconds > 0 else None,
            tokens_per_minute=round(self.tokens * 60 / seconds) if seconds > 0 else None,
        )


class Paced(Section):
    """What every provider kind's config says of pacing and retries (`Pacer.of` reads it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    requests_per_minute: int | None = Field(default=None, gt=0)
    max_attempts: int = Field(default=8, gt=0)
    backoff_s: float = Field(default=1.0, gt=0)  # first wait after a refusal without Retry-After; doubles
    max_backoff_s: float = Field(default=60.0, gt=0)  # per attempt up to this (jittered)
