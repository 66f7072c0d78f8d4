"""Which engine a local run gets: the `processes` engine on every core, or the one-process pipeline where
several processes cannot share what the run opens."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from reindex.capabilities import ShipsTokenizer
from reindex.config import Config


@dataclass(frozen=True)
class Choice:
    workers: int  # worker processes (1 and no model on a device: the one-process pipeline)
    note: str | None = None  # why fewer than asked for, in one line


def cores() -> int:
    """The cores this process may run on (its affinity mask, which a container's CPU set narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def workers_for(config: Config, source: Any, sink: Any, embedder: Any) -> Choice:
    """`[run] workers`, by default one per core but one (`default_workers`); 1 runs the one-process
    pipeline unless the model runs on a device (it then has a model process of its own, fed by the
    worker). One process too where the run cannot be shared between processes: a source or target one
    process opens at a time (Qdrant local mode, the in-memory test stores), an online provider (its pacing
    and concurrency are one budget, which processes would each spend in full), or a model on a device
    whose tokenizer does not travel to the workers (vLLM tokenizes inside its engine)."""
    asked = config.run.workers
    have = cores()
    for role, adapter in (("source", source), ("target", sink)):
        if not adapter.shareable:
            kind = (config.source if role == "source" else config.target).kind
            return Choice(1, f"one process: the [{role}] ({kind}) is opened by one process at a time")
    if embedder.traits.remote:
        return Choice(1, f"one process: {embedder.info.kind}'s rate limits and concurrency are one budget")
    if embedder.traits.device is not None and not isinstance(embedder, ShipsTokenizer):
        return Choice(1, f"one process: {embedder.info.kind} tokenizes inside its own engine")
    if asked is None:
        return Choice(default_workers(have))
    if asked > have:
        return Choice(
            have, f"{have} worker processes: [run] workers = {asked}, but this machine has {have} cores"
        )
    return Choice(asked)


def default_workers(cores: int) -> int:
    """One worker per core but one: that core is left to the coordinator, the model processes' host work
    and what the run talks to on this machine (a database, a model server). Measured on 2 cores with the
    database on them, one process beat two workers on every free-model case (docs/performance.md)."""
    return max(1, cores - 1)


def uses_processes(choice: Choice, embedder: Any) -> bool:
    """Whether the run goes to the processes engine: several workers, or a model on an accelerator (its own
    process, even beside one worker). A model on the CPU beside a single worker stays in one process: on 2
    cores MiniLM into pgvector ran 1.07 x the raw encode in a model process of its own, against 1.36
    in one process (`scripts/bench --cases raw,reindex_pgvector`), the model's threads and the worker's
    contending for the same cores."""
    if choice.workers > 1:
        return True
    device = embedder.traits.device
    return choice.note is None and device is not None and device != "cpu"
