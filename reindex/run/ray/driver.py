"""The `ray` engine's driver: refuse what it cannot do, plan the shards in the ledger, feed them through Ray
Data (read tasks, then the embedding actor pool) and count each shard's row as it comes back."""

from __future__ import annotations

import hashlib
import os
import pickle
import queue
import threading
import time
from collections.abc import Callable, Generator
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

from reindex.capabilities import ShipsTokenizer
from reindex.config import Config
from reindex.errors import ConfigError, Interrupted, ReindexError
from reindex.run.cost import Budget
from reindex.run.migration import Migration
from reindex.run.pipeline import Progress
from reindex.run.planning import plan
from reindex.run.ray.budget import _halt, budget_book
from reindex.run.ray.cluster import LOCAL_ADDRESSES, _ray, cluster
from reindex.run.ray.sizing import pool_size
from reindex.run.ray.worker import ShardWorker, read_shard
from reindex.state.ledger import Ledger
from reindex.state.records import Lease, PlannedShard
from reindex.state.sqlite import SqliteLedger


@dataclass
class WorkerStats:
    """What one node (and actor) wrote in this run."""

    node: str
    actor: str
    shards: int = 0
    documents: int = 0
    seconds: float = 0.0  # summed shard times

    @property
    def docs_per_second(self) -> float:
        return self.documents / self.seconds if self.seconds else 0.0


@dataclass
class RayProgress(Progress):
    workers: dict[str, WorkerStats] = field(default_factory=dict)


def check(m: Migration, ledger: Ledger) -> None:
    """Refuse what the ray engine cannot do (exit 2, naming the fix); `reindex run` calls it before the
    migration's run and target are touched. (A provider batch embedder never gets here: it runs on the
    driver's machine under either engine.)"""
    config = m.config
    for role, adapter, section in (("source", m.source, config.source), ("target", m.sink, config.target)):
        if (
            not adapter.shareable
        ):  # as each adapter declares it: a folder one process opens, a store in memory
            raise ConfigError(
                f"[{role}] ({section.kind}) is opened by one process at a time (Qdrant local mode, a store in"
                " memory), and the ray engine's workers each open it",
                hint=f'give [{role}] a store every worker reaches (a Qdrant server\'s url), or use engine = "local"',
            )
    if isinstance(ledger, SqliteLedger) and config.ray.address not in LOCAL_ADDRESSES:
        raise ConfigError(
            f"[run] state is a SQLite file, which only this machine reaches; a Ray cluster at"
            f" {config.ray.address!r} needs a ledger every node reaches",
            hint="set [run] state (or state_env) to a postgresql:// URL, or omit [ray] address for a local Ray",
        )
    _check_room(config)


def run(
    m: Migration,
    ledger: Ledger,
    lease: Lease,
    *,
    stop: threading.Event,
    on_progress: Callable[[Progress], None] | None = None,
    budget: Budget | None = None,
) -> RayProgress:
    """Do every planned shard not yet recorded on Ray; raise Interrupted if stopped early or once `budget`
    refused a shard (what was in flight lands first)."""
    ray = _ray()
    with cluster(ray, m.config):
        pending = plan(m, ledger)
        ledger.release_claims(m.plan_id)  # claims of shards that died in flight (or refused by a budget)
        book = budget_book(ray, budget) if pending else None
        progress = _stream(ray, m, lease, pending, stop, on_progress, book) if pending else RayProgress()
        spent: Budget | None = ray.get(book.snapshot.remote()) if book is not None else None
    if spent is not None and spent.exhausted:
        raise Interrupted(spent.message())
    if stop.is_set() and sum(stats.shards for stats in progress.workers.values()) < len(pending):
        raise Interrupted(f"stopped after {progress.documents} documents; rerun the same command to continue")
    return progress


def _check_room(config: Config) -> None:
    """On a local Ray, actors that take every CPU leave none for a read task, and the stream would wait
    forever. (A cluster may autoscale, so its CPUs now say nothing: Ray waits for nodes there.)"""
    settings = config.ray
    if settings.address not in LOCAL_ADDRESSES:
        return
    actors = 1 if settings.actors is None else settings.actors  # an unpinned pool has at least one
    cpus = settings.num_cpus or os.cpu_count() or 1
    wanted = actors * settings.cpus_per_actor + settings.cpus_per_task
    if wanted > cpus:
        raise ConfigError(
            f"[ray] {actors} actor(s) x {settings.cpus_per_actor:g} CPU plus a read task's"
            f" {settings.cpus_per_task:g} need {wanted:g} CPUs; the local Ray has {cpus:g}",
            hint="lower [ray] actors, cpus_per_actor or cpus_per_task (fractions are fine), or raise num_cpus",
        )


def _stream(
    ray: Any,
    m: Migration,
    lease: Lease,
    pending: list[PlannedShard],
    stop: threading.Event,
    on_progress: Callable[[Progress], None] | None,
    book: Any = None,
) -> RayProgress:
    """Feed the planned shards through Ray Data and count what comes back, until done or stopped. A shard
    the budget refused comes back as a row of nothing; the stream is drained, not cut: shards already
    in flight land (cutting them would bill them again on the rerun), and the rest are refused unread."""
    progress = RayProgress()
    halt = _halt(ray)
    rows = _Rows(results(_dataset(ray, m, lease, pending, book, halt)), m.config.ray.stall_seconds, ray, halt)
    try:
        while (row := rows.next(progress, len(pending))) is not None:
            if row["error"]:  # a worker's ReindexError, raised as itself: same exit code and hint
                raise pickle.loads(row["error"])
            _count(progress, row)
            if on_progress:
                on_progress(progress)
            if stop.is_set():
                break
    finally:
        rows.close()
    return progress


_DONE = object()
CLOSE_WAIT_S = 10.0  # how long a stopped driver waits for the reader to close the stream itself
HALT_WAIT_S = 60.0  # how long a driver that gave up waits for the halted stream to end


class _Rows:
    """The stream's rows, read by a thread of their own, so the driver can stop waiting: no row for
    `stall` seconds ends the run resumably (exit 75), and a rerun redoes only the shards not recorded.
    Ray Data restarts a dead actor forever (its actors' `max_restarts` is -1, settable only through
    `ray_remote_args`, deprecated in Ray 2.60), so an actor that dies at every shard, like one that hangs,
    would hold the stream forever; a failure Ray does raise ends the run the same way."""

    def __init__(
        self, rows: Generator[dict[str, Any], None, None], stall: float, ray: Any, halt: Any
    ) -> None:
        self._rows, self._stall, self._ray, self._halt = rows, stall, ray, halt
        self._found: queue.Queue[Any] = queue.Queue()
        self._closing, self._stalled = threading.Event(), False
        self._reader = threading.Thread(target=self._read, name="reindex-ray-rows", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for row in self._rows:
                if self._closing.is_set():
                    break
                self._found.put(row)
            else:
                self._found.put(_DONE)
        except BaseException as exc:  # handed to the driver, raised there
            self._found.put(exc)
        finally:
            self._rows.close()  # here, the thread that runs it: Ray Data stops its tasks and actors

    def next(self, progress: RayProgress, shards: int) -> dict[str, Any] | None:
        """The next shard's row; None at the end of the stream."""
        done = sum(stats.shards for stats in progress.workers.values())
        try:
            row = self._found.get(timeout=self._stall)
        except queue.Empty:
            self._give_up()
            raise Interrupted(
                f"no shard came back from the Ray embedding actors for {self._stall:g} s ({done} of"
                f" {shards} done): an actor is stalled or keeps dying; rerun the same command to continue"
                " ([ray] stall_seconds sets the wait)"
            ) from None
        if row is _DONE:
            return None
        if isinstance(row, BaseException):
            if isinstance(row, ReindexError) or not type(row).__module__.startswith("ray"):
                raise row
            last = (str(row).strip().splitlines() or [""])[-1][:300]
            raise Interrupted(
                f"the Ray embedding actors failed ({done} of {shards} shards done): {type(row).__name__}:"
                f" {last}; rerun the same command to continue"
            ) from row
        return dict(row)

    def _give_up(self) -> None:
        """Halt the run and kill every embedding actor (`budget.Halt`): Ray restarts each, retries its
        shard, and the shard is refused at once, so the stream ends and the reader closes it. Waited for
        up to a minute; past that (Ray cannot even restart an actor), the stream is left to the driver's
        exit."""
        try:
            actors = self._ray.get(self._halt.halt.remote(), timeout=HALT_WAIT_S)
            for actor in actors:
                self._ray.kill(actor, no_restart=False)
        except Exception:  # the actors are gone already, or Ray does not answer: nothing more to do here
            pass
        self._stalled = self._drain(HALT_WAIT_S)

    def _drain(self, seconds: float) -> bool:
        """Drop rows until the stream ends; True when it did not within `seconds`."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                row = self._found.get(timeout=left)
            except queue.Empty:
                break
            if row is _DONE or isinstance(row, BaseException):
                return False
        return True

    def close(self) -> None:
        """Stop reading: the reader closes the stream once its current row is in (waited for up to a
        few seconds, or not at all after a stall: shutting the local Ray down, or the driver's exit, ends it)."""
        self._closing.set()
        self._reader.join(timeout=0.1 if self._stalled else min(self._stall, CLOSE_WAIT_S))


def results(dataset: Any) -> Generator[dict[str, Any], None, None]:
    """Each shard's row as soon as its actor returns it. `iter_rows` prefetches a block, so it hands a row
    over only once the next shard is done too: progress, and the check for a stop, would lag a shard."""
    blocks = iter(dataset.iter_batches(batch_size=None, prefetch_batches=0, batch_format="pyarrow"))
    with closing(blocks):
        for block in blocks:
            yield from block.to_pylist()


def _count(progress: RayProgress, row: dict[str, Any]) -> None:
    if row["refused"]:
        return
    progress.count(row)
    key = f"{row['node']}/{row['actor']}"
    stats = progress.workers.setdefault(key, WorkerStats(str(row["node"]), str(row["actor"])))
    stats.shards += 1
    stats.documents += int(row["documents"])
    stats.seconds += float(row["seconds"])


def _dataset(
    ray: Any, m: Migration, lease: Lease, pending: list[PlannedShard], book: Any, halt: Any = None
) -> Any:
    """One row per shard. Ray Data's defaults make it fault tolerant: a task whose worker dies runs
    again, an actor that dies is restarted and its shard retried (a system failure, not an exception)."""
    settings = m.config.ray
    items = [
        {"seq": s.seq, "after": s.after_cursor, "last": s.last_cursor, "documents": s.documents}
        for s in pending
    ]
    dataset = ray.data.from_items(items, override_num_blocks=len(items))
    dataset = dataset.map(
        read_shard,
        fn_kwargs={
            "config": m.config,
            "book": book,
            "tokenizer": _shipped_tokenizer(m.embedder),
            "halt": halt,
        },
        num_cpus=settings.cpus_per_task,
        runtime_env=settings.runtime_env or None,  # also on a Ray this run did not start
    )
    return dataset.map(
        ShardWorker,
        fn_constructor_kwargs={
            "config": m.config,
            "plan_id": m.plan_id,
            "nonce": m.spec.nonce,
            "lease": (lease.key, lease.token),
            "book": book,
            "halt": halt,
        },
        compute=ray.data.ActorPoolStrategy(
            **pool_size(settings, ray.cluster_resources()),
            max_concurrent_calls_per_actor=settings.shards_per_actor,
            enable_true_multi_threading=settings.shards_per_actor > 1,  # lanes, not just batching threads
        ),
        num_cpus=settings.cpus_per_actor,
        num_gpus=settings.gpus_per_actor,
        runtime_env=settings.runtime_env or None,
    )


def _shipped_tokenizer(embedder: Any) -> tuple[str, bytes] | None:
    """The model's tokenizer for the read tasks, pickled once on the driver (key, bytes); None when the
    embedder has none that travels without the model (a provider counts its own tokens; vLLM tokenizes in
    its actor)."""
    tokenizer = embedder.column_tokenizer if isinstance(embedder, ShipsTokenizer) else None
    if tokenizer is None:
        return None
    blob = pickle.dumps(tokenizer, protocol=pickle.HIGHEST_PROTOCOL)
    return hashlib.sha256(blob).hexdigest(), blob
