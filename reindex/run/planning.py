"""Shards fixed in advance, for the engines that run several shards at once (`processes`, `ray`): the plan
is cut once and kept in the ledger (`shard_plan`), so every worker and every rerun cuts the source alike,
and a worker reads exactly its planned shard's documents, over its own connection."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import islice
from typing import Any

from reindex.capabilities import BoundsShards, ScansRanges
from reindex.columns import Documents
from reindex.errors import BackendError
from reindex.ports import Source
from reindex.run.io import scan_documents
from reindex.run.migration import Migration
from reindex.state.ledger import Ledger
from reindex.state.records import PlannedShard


def plan(m: Migration, ledger: Ledger, limit: int | None = None) -> list[PlannedShard]:
    """The shards still to do: those planned before and not recorded, then new ones cut from the source
    after the last planned (or, for a migration the one-process pipeline started, after its resume point);
    at most `limit` new ones."""
    planned = ledger.shard_plan(m.plan_id)
    after, seq = (planned[-1].last_cursor, planned[-1].seq + 1) if planned else ledger.resume_point(m.plan_id)
    new: list[PlannedShard] = []
    for last, documents in islice(shard_bounds(m.source, after, m.config.run.shard_size), limit):
        new.append(PlannedShard(seq, after, last, documents))
        after, seq = last, seq + 1
    if new:
        ledger.plan_shards(m.plan_id, new)
    return [shard for shard in planned if not shard.recorded] + new


def shard_bounds(source: Source, after: str | None, size: int) -> Iterator[tuple[str, int]]:
    """(last position, documents) of each shard of `size` documents after `after`. Sources that can say so
    cheaply do (JSONL: a pass over the bytes; Parquet: arithmetic; Postgres: one query over the ids);
    the others are read through once by the planner."""
    if isinstance(source, BoundsShards):
        yield from source.shard_bounds(after, size)
        return
    for docs in scan_documents(source, after, size):
        yield (docs.last_position if docs.last_position is not None else (after or "")), len(docs)


def item(shard: PlannedShard) -> dict[str, Any]:
    """A planned shard as a worker's task: plain values that travel to another process."""
    return {
        "seq": shard.seq,
        "after": shard.after_cursor,
        "last": shard.last_cursor,
        "documents": shard.documents,
    }


def read_planned(source: Source, task: Mapping[str, Any]) -> Documents:
    """The documents of a planned shard: those after its first cursor up to its last. A source that reads a
    key range (`scan_range`: Postgres) reads it as it is now, so a table written to during the run is read
    as the one-process pipeline would read it. Any other source must still hold the shard as planned: one
    that does not is refused (its shards would no longer cover it)."""
    after = task["after"]
    if isinstance(source, ScansRanges):
        ranged: Documents = source.scan_range(after, task["last"])
        return ranged
    docs = next(scan_documents(source, after, int(task["documents"])), None)
    found = (len(docs), docs.last_position) if docs is not None else (0, None)
    if docs is None or found != (int(task["documents"]), task["last"]):
        raise BackendError(
            f"the source changed under planned shard {task['seq']}: expected {task['documents']} documents"
            f" ending at {task['last']!r}, read {found[0]} ending at {found[1]!r}",
            hint="`reindex run --fresh` plans again; `reindex sync` catches up edits made after a run",
        )
    return docs
