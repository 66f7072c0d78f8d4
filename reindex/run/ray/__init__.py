"""The `ray` engine (`[run] engine = "ray"`): one migration's shards spread over a Ray cluster with Ray Data.

registry.ENGINES["ray"] names this package; `reindex run` calls its `require`, `check` and `run`.
    driver.py   plans shards in the ledger, feeds them through Ray Data, counts what comes back
"""

from __future__ import annotations

from reindex.run.ray.driver import (
    BudgetBook,
    RayProgress,
    RemoteBudget,
    ShardWorker,
    WorkerStats,
    check,
    plan,
    require,
    run,
    shard_bounds,
)

__all__ = [
    "BudgetBook",
    "RayProgress",
    "RemoteBudget",
    "ShardWorker",
    "WorkerStats",
    "check",
    "plan",
    "require",
    "run",
    "shard_bounds",
]
