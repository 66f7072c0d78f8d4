"""What a run has done so far: counts, tokens and times, read by the progress bar and the run's report."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Progress:
    documents: int = 0
    written: int = 0
    dead_letters: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    reused: int = 0
    model_seconds: float = 0.0
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None  # set when the load ends: later work (the index build) is not counted
    device_started: float | None = None  # a model process's first batch (the `processes` engine)
    processes: int = 1  # worker processes that did the load (the `processes` engine)
    # documents of the windows the model has embedded, a window in flight counted by its share of model
    # calls done: what a progress bar shows between shards (`documents` moves a shard at a time)
    embedding: float = 0.0

    @property
    def seconds(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    def finish(self) -> None:
        self.finished = time.monotonic()

    def since(self, before: Progress) -> dict[str, float]:
        """What this account counted since `before` (a copy taken then): what a worker, a Ray actor or a
        process, sends for each shard it did, and `count` adds up where the run is coordinated."""
        return {
            "documents": self.documents - before.documents,
            "written": self.written - before.written,
            "dead_letters": self.dead_letters - before.dead_letters,
            "tokens": self.tokens - before.tokens,
            "padded_tokens": self.padded_tokens - before.padded_tokens,
            "reused": self.reused - before.reused,
            "model_seconds": self.model_seconds - before.model_seconds,
        }

    def count(self, counts: Mapping[str, Any], *, model_seconds: bool = True) -> None:
        """Add a shard's `since` counts; `model_seconds` False where a model process times the model."""
        self.documents += int(counts["documents"])
        self.written += int(counts["written"])
        self.dead_letters += int(counts["dead_letters"])
        self.tokens += int(counts["tokens"])
        self.padded_tokens += int(counts["padded_tokens"])
        self.reused += int(counts["reused"])
        if model_seconds:
            self.model_seconds += float(counts["model_seconds"])
