"""Money: a run's spending limit, charged from the provider's own usage figures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Spending(Protocol):
    """What a pipeline asks of a spending limit: this process's `Budget`, or the ray engine's one budget
    for the whole cluster (an actor every worker reserves from)."""

    @property
    def max_usd(self) -> float | None: ...
    @property
    def exhausted(self) -> bool: ...
    def allows(self, tokens: int) -> bool: ...
    def charge(self, billed_tokens: int, reserved: int | None = None) -> None: ...
    def message(self) -> str: ...


@dataclass
class Budget:
    """Stop claiming work before `max_usd` would be exceeded; rerunning after raising it continues."""

    max_usd: float | None
    price_per_million: float | None  # USD per 1M tokens for this embedder and tier; None = free/unknown
    spent_tokens: int = 0
    reserved_tokens: int = 0
    exhausted: bool = False

    @property
    def spent_usd(self) -> float:
        return self.usd(self.spent_tokens)

    def usd(self, tokens: int) -> float:
        return tokens * (self.price_per_million or 0.0) / 1_000_000

    def allows(self, tokens: int) -> bool:
        """Reserve `tokens` if spent + reserved + these stays within the limit."""
        limited = self.max_usd is not None and self.price_per_million
        if limited and self.usd(self.spent_tokens + self.reserved_tokens + tokens) > (self.max_usd or 0.0):
            self.exhausted = True
            return False
        self.reserved_tokens += tokens
        return True

    def charge(self, billed_tokens: int, reserved: int | None = None) -> None:
        self.spent_tokens += billed_tokens
        self.reserved_tokens = max(
            0, self.reserved_tokens - (billed_tokens if reserved is None else reserved)
        )

    def message(self) -> str:
        return (
            f"budget reached: ${self.spent_usd:.4f} spent of max_cost_usd ${self.max_usd}; "
            "raise [run] max_cost_usd and rerun to continue"
        )


class BudgetBook:
    """One spending limit for every worker of a run (a Ray actor, or the `processes` engine's coordinator
    answering its workers): each worker reserves a shard's tokens before sending them and charges what the
    provider billed once recorded, so the workers stop claiming work where one process would. Once a shard is refused every later one is, whatever its size: the run stops
    (exit 75) rather than picking small shards to fill the rest. A shard retried after its actor died
    reserves again, so the cluster may stop early, never late; a rerun starts from what the ledger holds."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget

    def allows(self, tokens: int) -> bool:
        return not self.budget.exhausted and self.budget.allows(tokens)

    def charge(self, billed_tokens: int, reserved: int | None) -> None:
        self.budget.charge(billed_tokens, reserved)

    def snapshot(self) -> Budget:
        return self.budget
