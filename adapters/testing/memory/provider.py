"""A batch API provider's side for `memory-batch`: its jobs, the files it released, what it billed and lost."""

from __future__ import annotations

import threading
from dataclasses import dataclass


class BatchProvider:
    """A provider account's side of the batch API: jobs, files released, and what it billed and lost.

    Kept on a named MemoryStore (`store.provider`), so it outlives the embedder each command builds, as a
    real provider outlives the process. `script` sets a transient fault for the jobs created from now on.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.jobs: dict[str, ProviderJob] = {}
        self.created: dict[str, int] = {}  # jobs created per key: more than 1 is a double cost
        self.released: set[str] = set()
        self.billed_tokens = 0
        self.lost_tokens = 0  # billed for lines the provider ran but never delivered
        self.bills: list[Bill] = []  # one per billed line
        self.expire_after: int | None = None
        self.bill_expired = False

    def script(self, *, expire_after: int | None = None, bill_expired: bool = False) -> None:
        """Jobs created from now on expire after `expire_after` lines (None: they complete); with
        `bill_expired` the expired lines ran and are billed, but their output is lost."""
        with self.lock:
            self.expire_after, self.bill_expired = expire_after, bill_expired


@dataclass(frozen=True)
class Bill:
    """One line a provider billed: under which fingerprint, its text and tokens, and whether it was lost."""

    fingerprint: str
    text: str
    tokens: int
    lost: bool


class ProviderJob:
    """One batch on the provider: its key, its lines, how often it was polled, its fault and its result."""

    def __init__(
        self,
        key: str,
        fingerprint: str,
        lines: list[tuple[str, str, int]],
        expire_after: int | None,
        bill_expired: bool,
    ) -> None:
        self.key, self.fingerprint, self.lines = key, fingerprint, lines  # (custom_id, text, tokens)
        self.expire_after, self.bill_expired = expire_after, bill_expired
        self.polls = 0
        self.billed = False
