"""plan's rehearsal: the run's own pipeline on the corpus's first shards, into a scratch target and ledger.

Timing the read and the model alone leaves out what a run spends writing: the target's ingest (a COPY into a
table, an upsert into a collection), the ledger's bookkeeping, and how the stages share the cores with
each other and with a database on the same machine. For the free model into pgvector that was most of the
run: plan said 1.3 s for a load of 7.1 s. So `plan` runs the pipeline itself, threads, queues and shard size
as `run` has them, on the first shards of the corpus, into a target made for it
(`ports.MakesScratchTargets`) and a SQLite ledger in a temporary folder, and drops both after.

It rehearses only where that is free and small: a model that bills is never called (a dry run spends
nothing), a sink whose targets are columns of the application's table writes nothing, and a slow model
rehearses on smaller shards so that its steady part stays near REHEARSAL_SECONDS (each shard's own costs,
a commit and a COPY's start, weigh little beside such a model).

The engine is the one the run would get: the one-process pipeline, or the processes engine with its workers
and model processes (their start is part of the rehearsal's fill, as it is of the run). A Ray run is
rehearsed by one process and scaled to its actors by `reindex.plan.estimate.spread`. The ledger is SQLite
whatever the run's is.
"""

from __future__ import annotations

import secrets
import tempfile
import threading
import time
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path

from reindex.errors import Interrupted, ReindexError
from reindex.ports import MakesScratchTargets, Sink
from reindex.run import processes
from reindex.run.migration import Migration, lease_key, migration, with_nonce
from reindex.run.pipeline import Pipeline
from reindex.run.processes.coordinator import SHARDS_PER_WORKER
from reindex.run.progress import Progress
from reindex.state.sqlite import SqliteLedger

REHEARSAL_SECONDS = 3.0  # the steady part a rehearsal aims at: it stops once its first shard is this old
GIVE_UP_SECONDS = 120.0  # a rehearsal that wrote nothing by then is stopped (a model process that hangs)
SHARDS = 8  # shards timed: the steady pace is read over the second half of them, the queues filled
MIN_SHARD = 50
STALE_SECONDS = 3600.0  # a scratch target this old is left from a plan that was killed


@dataclass(frozen=True)
class Rehearsal:
    documents: int
    shard_size: int
    workers: int
    devices: int  # model processes (the processes engine, a model on a device); 0: the model in each worker
    processes: bool  # the processes engine; else the one-process pipeline
    seconds_per_document: float  # the steady pace, all workers together
    timed: tuple[int, int]  # the documents that pace was read over, by their place in the source
    fill_seconds: float  # the time before that pace: start, first reads, the queues filling; once a run


def rehearse(m: Migration, *, documents: int, seconds_per_document: float | None) -> Rehearsal | str:
    """Run the engine on the first shards of `m`'s source into a scratch target; the rehearsal's figures, or
    why there was none (one line). `seconds_per_document`: what the stages and the model were timed at,
    which sizes the shards of a slow model."""
    if not documents:
        return "no documents"
    if not isinstance(m.sink, MakesScratchTargets):
        return "the target kind cannot make a scratch target"
    scratch = m.sink.scratch(m.spec, f"{int(time.time())}_{secrets.token_hex(4)}")
    if scratch is None:
        return "the target is a column of the application's table, which a dry run never writes"
    _drop_stale(m.sink)
    shard = m.config.run.shard_size
    if seconds_per_document:
        shard = max(MIN_SHARD, min(shard, int(2 * REHEARSAL_SECONDS / (SHARDS * seconds_per_document))))
    with tempfile.TemporaryDirectory(prefix="reindex-rehearsal-") as folder:
        run = m.config.run.model_copy(update={"shard_size": shard, "state": str(Path(folder) / "ledger.db")})
        config = replace(m.config, run=run, target=m.config.target.model_copy(update={"name": scratch.name}))
        rehearsal = migration(config, m.source, m.sink, m.embedder)
        try:
            return _rehearse(rehearsal, shard) or "no shard was written within the rehearsal's time"
        except ReindexError as exc:
            return f"the scratch target was refused: {exc.message}"
        finally:
            with suppress(ReindexError):
                m.sink.drop(rehearsal.spec.name)


def _drop_stale(sink: Sink) -> None:
    """Drop scratch targets older than STALE_SECONDS (a plan killed in its rehearsal leaves its own; a
    rehearsal takes seconds, so one that old is no running plan's). Their names carry their creation time.
    A listing or a drop refused only leaves them: the rehearsal does not depend on it."""
    with suppress(ReindexError):
        for name in sink.scratches() if isinstance(sink, MakesScratchTargets) else []:
            made = name.rsplit(".", 1)[-1].removeprefix("reindex_rehearsal_").split("_")[0]
            if made.isdigit() and time.time() - int(made) > STALE_SECONDS:
                with suppress(ReindexError):
                    sink.drop(name)


def _rehearse(m: Migration, shard: int) -> Rehearsal | None:
    choice = processes.workers_for(m.config, m.source, m.sink, m.embedder)
    many = processes.uses_processes(choice, m.embedder) and m.config.run.engine != "ray"
    workers = choice.workers if many else 1
    traits = m.embedder.traits
    devices = max(1, traits.devices) if many and traits.device is not None else 0
    count = max(SHARDS, SHARDS_PER_WORKER * (workers + 1)) if many else SHARDS
    marks: list[tuple[float, int]] = []
    stop = threading.Event()

    def mark(progress: Progress) -> None:
        """Time each shard written until enough were; the shards in flight at the stop land unmeasured (the
        reader has stopped, so the stages after it would go faster than in a run)."""
        if stop.is_set():
            return
        marks.append((time.monotonic(), progress.documents))
        if len(marks) >= count or marks[-1][0] - marks[0][0] > REHEARSAL_SECONDS:
            stop.set()

    ledger = SqliteLedger(m.config.run.state)
    timer = threading.Timer(GIVE_UP_SECONDS, stop.set)
    try:
        spec = m.spec
        m = with_nonce(
            m,
            ledger.begin(
                m.plan_id,
                alias=spec.alias,
                target=spec.name,
                fingerprint=spec.fingerprint,
                model=dict(spec.model),
            ),
        )
        m.sink.prepare(m.spec)
        timer.start()
        started = time.monotonic()
        with suppress(Interrupted):  # stopped once it had enough: what it wrote is the measure
            if many:
                with ledger.lease(lease_key(m.config)) as lease:
                    processes.run(
                        m, ledger, lease, workers=workers, stop=stop, on_progress=mark, shards=2 * count
                    )
            else:
                Pipeline(
                    source=m.source,
                    embedder=m.embedder,
                    sink=m.sink,
                    ledger=ledger,
                    spec=m.spec,
                    plan_id=m.plan_id,
                    run=m.config.run,
                    stop=stop,
                    on_progress=mark,
                    limit=shard * 2 * count,  # the reader reads on while the shards measured land
                ).run()
    finally:
        timer.cancel()
        ledger.close()
    return _paced(marks, started, shard, workers, devices, many)


def _paced(
    marks: list[tuple[float, int]], started: float, shard: int, workers: int, devices: int, many: bool
) -> Rehearsal | None:
    """The pace over the second half of the shards written (the queues full by then), and the time before
    it beyond that pace."""
    if not marks or not marks[-1][1]:
        return None
    (first, before), (last, total) = marks[len(marks) // 2 - 1] if len(marks) > 1 else marks[0], marks[-1]
    if total > before:
        pace = (last - first) / (total - before)
        fill = max(0.0, first - started - before * pace)
    else:  # one shard: its whole time, filling included
        pace, fill, before = (last - started) / total, 0.0, 0
    return Rehearsal(
        documents=total,
        shard_size=shard,
        workers=workers,
        devices=devices,
        processes=many,
        seconds_per_document=pace,
        timed=(before, total),
        fill_seconds=fill,
    )
