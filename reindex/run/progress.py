"""What a run has done so far: counts, tokens and times, read by the progress bar and the run's report."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


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
