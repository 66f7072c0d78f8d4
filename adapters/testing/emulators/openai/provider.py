"""What every provider emulator keeps behind one lock (ProviderState), what it would bill (Ledger), and a
JSONL batch job as the Mistral and Voyage emulators keep it (LineJob); the other emulators build on them too."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from reindex.ports import Embedder
from reindex_adapters.testing.emulators.faults import FaultGate, FaultPlan


@dataclass(slots=True)
class Ledger:
    """What a provider would bill and count: tokens of successful embeddings, requests served (not
    refused by a fault), batches created with their metadata."""

    billed: list[tuple[int, str | None]] = field(default_factory=list)  # (tokens, batch id or None)
    requests: Counter[str] = field(default_factory=Counter)
    batches: list[dict[str, Any]] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        batch_tokens = sum(tokens for tokens, batch in self.billed if batch)
        total = sum(tokens for tokens, _ in self.billed)
        billed = [{"tokens": t, "batch_id": b, "is_batch": b is not None} for t, b in self.billed]
        return dict(
            billed_tokens=total,
            billed_tokens_online=total - batch_tokens,
            billed_tokens_batch=batch_tokens,
            billed=billed,
            requests=dict(self.requests),
            requests_served=sum(self.requests.values()),
            batches_created=len(self.batches),
            batches=[dict(b) for b in self.batches],
        )


@dataclass(slots=True)
class LineJob:
    """A batch job over a JSONL input file: its wire object, the faults it runs under, and its lines."""

    data: dict[str, Any]  # the wire object, updated in place
    plan: FaultPlan  # the faults in force when it was created
    polls: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


class ProviderState:
    """What every provider emulator keeps behind one lock: the model, the scripted faults' gate and what the
    provider would bill and count. The web layers only parse and render."""

    def __init__(self, embedder: Embedder, faults: FaultPlan) -> None:
        self.embedder, self.gate, self.ledger = embedder, FaultGate(faults), Ledger()
        self.lock = threading.RLock()

    def admit(self, route: str, client: str) -> None:
        """A request through the fault gate (its scripted refusal raised as ApiError), counted as served."""
        with self.lock:
            self.gate.admit(route, client, time.monotonic())
            self.ledger.requests[route] += 1

    def set_faults(self, plan: FaultPlan) -> None:
        with self.lock:
            self.gate.plan = plan

    def tick(self, job: Any, running: Collection[str], advance: Callable[[Any], None]) -> dict[str, Any]:
        """One poll of a job is one tick of the emulated clock: it steps every `polls_per_step` ticks (0:
        straight to the end); returns the job's wire object as it stands. Call under the lock."""
        job.polls += 1
        if job.plan.polls_per_step <= 0:
            while job.data["status"] in running:
                advance(job)
        elif job.polls % job.plan.polls_per_step == 0:
            advance(job)
        return dict(job.data)

    def stats(self) -> dict[str, Any]:
        with self.lock:
            early = dict(self.gate.early_requests)
            refused = {str(status): count for status, count in self.gate.refused.items()}
            return {
                **self.ledger.describe(),
                "early_requests": early,
                "early_requests_total": sum(early.values()),
                "refused": refused,
            }
