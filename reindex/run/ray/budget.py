"""Actors on the driver's node that the whole cluster asks: the `ray` engine's spending limit (`BudgetBook`,
one budget for the whole cluster, and `RemoteBudget`, a worker's view of it), and `Halt`, which a driver
that gave up waiting uses to stop every shard and free what a stuck actor holds."""

from __future__ import annotations

from typing import Any

from reindex.run.cost import Budget, BudgetBook
from reindex.run.ray.cluster import _ray


def budget_book(ray: Any, budget: Budget | None) -> Any:
    """The run's budget as an actor on the driver's node (None when nothing limits spending), so that the
    budget lives exactly as long as the driver: a lost worker node takes none of it along."""
    if budget is None or budget.max_usd is None or not budget.price_per_million:
        return None
    return ray.remote(BudgetBook).options(num_cpus=0, scheduling_strategy=_here(ray)).remote(budget)


def _halt(ray: Any) -> Any:
    """The run's `Halt`, on the driver's node: it lives exactly as long as the driver."""
    return ray.remote(Halt).options(num_cpus=0, scheduling_strategy=_here(ray)).remote()


def _here(ray: Any) -> Any:
    return ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
        ray.get_runtime_context().get_node_id(), soft=False
    )


class Halt:
    """Whether the driver has given up on this run, and the embedding actors to stop. Each read task and
    each actor asks before a shard and does nothing once halted; an actor registers itself as it starts
    (again after each restart). A driver that waited `[ray] stall_seconds` for a shard halts the run and
    kills every actor: Ray restarts each and retries its shard, which is then refused at once, so the
    stream ends and closes cleanly (a stuck actor, or one that dies at every shard, would hold it
    forever: Ray Data restarts actors without end)."""

    def __init__(self) -> None:
        self.halted = False
        self.actors: list[Any] = []

    def register(self, actor: Any) -> None:
        self.actors.append(actor)

    def halt(self) -> list[Any]:
        self.halted = True
        return list(self.actors)

    def is_halted(self) -> bool:
        return self.halted


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
