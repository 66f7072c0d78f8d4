"""The `ray` engine's spending limit: `BudgetBook`, one budget for the whole cluster held by an actor on the
driver's node, and `RemoteBudget`, a worker's view of it."""

from __future__ import annotations

from typing import Any

from reindex.run.cost import Budget, BudgetBook
from reindex.run.ray.cluster import _ray


def _budget_book(ray: Any, budget: Budget | None) -> Any:
    """The run's budget as an actor on the driver's node (None when nothing limits spending), so that the
    budget lives exactly as long as the driver: a lost worker node takes none of it along."""
    if budget is None or budget.max_usd is None or not budget.price_per_million:
        return None
    here = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
        ray.get_runtime_context().get_node_id(), soft=False
    )
    return ray.remote(BudgetBook).options(num_cpus=0, scheduling_strategy=here).remote(budget)


class RemoteBudget:
    """A worker's view of the `BudgetBook` (`reindex.run.cost.Spending`): each call a round trip to the actor."""

    def __init__(self, book: Any, max_usd: float | None) -> None:
        self.book, self.max_usd = book, max_usd

    @property
    def exhausted(self) -> bool:
        return bool(_ray().get(self.book.snapshot.remote()).exhausted)

    def allows(self, tokens: int) -> bool:
        return bool(_ray().get(self.book.allows.remote(tokens)))

    def charge(self, billed_tokens: int, reserved: int | None = None) -> None:
        _ray().get(self.book.charge.remote(billed_tokens, reserved))

    def message(self) -> str:
        return str(_ray().get(self.book.snapshot.remote()).message())
