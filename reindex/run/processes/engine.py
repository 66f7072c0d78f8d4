"""Which engine a local run gets: the `processes` engine on every core, or the one-process pipeline where
several processes cannot share what the run opens."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from reindex.config import Config


@dataclass(frozen=True)
class Choice:
    workers: int  # worker processes; 1 runs the one-process pipeline
    note: str | None = None  # why fewer than asked for, in one line


def cores() -> int:
    """The cores this process may run on (its affinity mask, which a container's CPU set narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def workers_for(config: Config, source: Any, sink: Any, embedder: Any) -> Choice:
    """`[run] workers` (default: every core), or 1 where the run cannot be shared between processes: a
    source or target one process opens at a time (Qdrant local mode, the in-memory test stores), or a model
    on a device whose tokenizer does not travel to the workers (vLLM tokenizes inside its engine)."""
    asked = config.run.workers
    have = cores()
    if asked == 1:
        return Choice(1)
    for role, adapter in (("source", source), ("target", sink)):
        if not getattr(adapter, "shareable", False):
            kind = (config.source if role == "source" else config.target).get("kind")
            return Choice(1, f"one process: the [{role}] ({kind}) is opened by one process at a time")
    if getattr(embedder, "runs_on_device", False) and getattr(embedder, "column_tokenizer", None) is None:
        return Choice(1, f"one process: {embedder.info.kind} tokenizes inside its own engine")
    if asked is None:
        return Choice(have)
    if asked > have:
        return Choice(
            have, f"{have} worker processes: [run] workers = {asked}, but this machine has {have} cores"
        )
    return Choice(asked)
