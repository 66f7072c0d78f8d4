"""The `ray` engine (`[run] engine = "ray"`): one migration's shards spread over a Ray cluster with Ray Data.

    driver:  plan shards in the ledger → Ray Data: read tasks → embedding actor pool → results → progress
    read task (CPU):   one planned shard's documents, read from the source over the worker's own connection,
                       and (for a model with a tokenizer that travels) its distinct texts tokenized
    actor (GPU/CPU):   screen, claim texts in the ledger, tokenise what the read task did not, embed, write
                       to the target over its own connection, record the shard: the local engine's functions

The ledger is the one source of truth, as for the local engine: the plan (`shard_plan`, fixed once, so every
rerun and every worker cuts the source alike) and what is done (`shards`). Ray's own checkpointing is not
used: a shard is done exactly when the ledger records it, in the same transaction as its texts and dead
letters, and a replayed record is recognised and changes nothing. A task or actor that dies (its node lost)
is retried by Ray; a driver that dies leaves unrecorded shards in the plan, and rerunning `reindex run` does
them. Workers' ledger writes are fenced with the driver's lease token: a driver that lost its lease cannot
have its workers record anything. Text claims go to the ledger (as for provider batches), so dedupe holds
across the whole cluster: a shard whose texts another has claimed waits for that shard to store them and
copies them (`Pipeline._copies`), rather than paying for them twice. A spending limit (`[run] max_cost_usd`)
is one budget for the whole cluster, held by an actor on the driver's node: every worker reserves a shard's
tokens there before sending them.

registry.ENGINES["ray"] names this package; `reindex run` calls its `require`, `check` and `run`.
    driver.py    refuse what the engine cannot do, plan the shards, feed Ray Data, count the rows back
    worker.py    the read task and the embedding actor (`ShardWorker`) with its lanes
    budget.py    the cluster's one spending limit (`BudgetBook`) and a worker's view of it (`RemoteBudget`)
    cluster.py   Ray imported lazily; the cluster a run joins or the local Ray it starts
"""

from __future__ import annotations

from reindex.run.cost import BudgetBook
from reindex.run.planning import plan, shard_bounds
from reindex.run.ray.budget import RemoteBudget
from reindex.run.ray.cluster import require
from reindex.run.ray.driver import RayProgress, WorkerStats, check, run
from reindex.run.ray.worker import ShardWorker

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
