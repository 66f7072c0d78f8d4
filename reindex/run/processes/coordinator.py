"""The coordinator: plan the shards, start the model process(es) and the workers, hand out planned shards
over each worker's pipe, count what comes back, and end the run on a stop or a fault with every shard in
flight landed or left unrecorded. Its Python work is per shard and per process, never per document."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.managers import BaseManager
from typing import Any

from reindex.errors import BackendError, Interrupted, ReindexError
from reindex.run.cost import Budget, BudgetBook
from reindex.run.lanes import open_lane
from reindex.run.migration import Migration
from reindex.run.pipeline import Progress
from reindex.run.planning import item, plan, read_planned
from reindex.run.processes import device, worker
from reindex.run.processes.engine import cores
from reindex.state.ledger import Ledger
from reindex.state.records import Lease, PlannedShard

# A worker process costs its start-up (a fork, its connections, its embedder): a run with fewer shards than
# this per worker gets fewer workers, and one of this many shards or fewer runs here.
SHARDS_PER_WORKER = 4
START_SECONDS = 600.0  # how long a process may take to load its model and open its connections
DRAIN_SECONDS = 25.0  # how long the shards in flight get to land once the run stops
# No plain fork: the coordinator holds threads and connections. A fork server is started once per process
# (an interpreter that imported the engine's modules and nothing else: no CUDA, no connections) and forks
# each worker from there, so a worker starts in milliseconds instead of an interpreter's second of imports.
_spawn = multiprocessing.get_context("forkserver")
_spawn.set_forkserver_preload(["reindex.run.processes.worker", "reindex.run.processes.device"])


class _Budgets(BaseManager):
    pass


_Budgets.register("BudgetBook", BudgetBook)


@dataclass
class _Proc:
    name: str
    process: Any  # multiprocessing's SpawnProcess
    conn: Connection
    held: set[int] = field(default_factory=set)  # shards handed over, not yet answered
    ready: bool = False
    gone: bool = False

    def describe(self) -> str:
        return f"{self.name} (pid {self.process.pid})"

    def death(self) -> str:
        code = self.process.exitcode
        if code is not None and code < 0:
            with suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"


def run(
    m: Migration,
    ledger: Ledger,
    lease: Lease,
    *,
    workers: int,
    stop: threading.Event,
    on_progress: Callable[[Progress], None] | None = None,
    budget: Budget | None = None,
    shards: int | None = None,
) -> Progress:
    """Do every planned shard not yet recorded on `workers` processes; raise Interrupted if stopped early, a
    process died, or `budget` refused a shard (what was in flight lands first). `shards`: cut at most this
    many new shards from the source (plan's rehearsal)."""
    pending = plan(m, ledger, shards)
    ledger.release_claims(m.plan_id)  # claims of shards that died in flight
    progress = Progress()
    count = workers_at(workers, len(pending))
    progress.processes = count
    if len(pending) <= SHARDS_PER_WORKER or (count == 1 and m.embedder.traits.device is None):
        progress.processes = 1
        return _here(m, lease, pending, stop, on_progress, budget, progress)
    with ExitStack() as stack:
        coordinator = _Coordinator(m, lease, count, stop, on_progress, progress)
        stack.callback(coordinator.close)
        book = coordinator.start_budget(stack, budget)
        coordinator.start(book)
        coordinator.feed(deque(item(shard) for shard in pending))
        spent: Budget | None = book.snapshot() if book is not None else None
    if coordinator.failure is not None:
        raise coordinator.failure
    if spent is not None and spent.exhausted:
        raise Interrupted(spent.message())
    if stop.is_set() and coordinator.done < len(pending):
        raise Interrupted(f"stopped after {progress.documents} documents; rerun the same command to continue")
    return progress


def workers_at(workers: int, shards: int) -> int:
    """The worker processes a run of `shards` shards starts (1: it runs them in the coordinator)."""
    return max(1, min(workers, -(-shards // SHARDS_PER_WORKER)))


def _here(
    m: Migration,
    lease: Lease,
    pending: list[PlannedShard],
    stop: threading.Event,
    on_progress: Callable[[Progress], None] | None,
    budget: Budget | None,
    progress: Progress,
) -> Progress:
    """A few planned shards, one after the other in this process, through the same lane a worker runs."""
    lane = open_lane(
        m.config,
        plan_id=m.plan_id,
        nonce=m.spec.nonce or None,
        lease=(lease.key, lease.token),
        worker=f"local/pid-{os.getpid()}",
        embedder=m.embedder,
        budget=budget,
    )
    shards = 0
    try:
        for shard in pending:
            if stop.is_set():
                break
            task = item(shard)
            pipeline = lane.pipeline
            if pipeline.run_shard(shard.seq, shard.after_cursor, read_planned(pipeline.source, task)) is None:
                break  # the budget refused it
            now = pipeline.progress
            progress.documents, progress.written = now.documents, now.written
            progress.dead_letters, progress.tokens = now.dead_letters, now.tokens
            progress.padded_tokens, progress.reused = now.padded_tokens, now.reused
            progress.model_seconds = now.model_seconds
            shards += 1
            if on_progress:
                on_progress(progress)
    finally:
        lane.close()
    if budget is not None and budget.exhausted:
        raise Interrupted(budget.message())
    if stop.is_set() and shards < len(pending):
        raise Interrupted(f"stopped after {progress.documents} documents; rerun the same command to continue")
    return progress


class _Coordinator:
    def __init__(
        self,
        m: Migration,
        lease: Lease,
        workers: int,
        stop: threading.Event,
        on_progress: Callable[[Progress], None] | None,
        progress: Progress,
    ) -> None:
        self.m, self.lease, self.count, self.stop = m, lease, workers, stop
        self.on_progress = on_progress or (lambda progress: None)
        self.progress = progress
        self.workers: list[_Proc] = []
        self.models: list[_Proc] = []
        self.failure: ReindexError | None = None
        self.refused = False
        self.done = 0  # shards answered as done
        self.model_stats: list[dict[str, float]] = []
        self.lanes = 1

    # starting ---------------------------------------------------------------------------------------

    def start_budget(self, stack: ExitStack, budget: Budget | None) -> Any:
        """The run's budget in a manager process the workers reserve from (None when nothing limits it)."""
        if budget is None or budget.max_usd is None or not budget.price_per_million:
            return None
        manager = _Budgets(ctx=_spawn)
        manager.start()
        stack.callback(manager.shutdown)
        return manager.BudgetBook(budget)  # type: ignore[attr-defined]

    def start(self, book: Any) -> None:
        m, parent = self.m, os.getpid()  # watched by the model processes and workers (device.alive)
        embedder = m.embedder
        on_device = embedder.traits.device is not None
        spec = device.DeviceSpec.of(embedder) if on_device else None
        feeds: list[list[Connection]] = []
        if on_device:
            for gpu in range(device.device_count(embedder)):
                ends = [_spawn.Pipe() for _ in range(self.count)]
                feeds.append([theirs for theirs, _ in ends])
                mine, control = _spawn.Pipe()
                env = dict(os.environ)  # as it is now: the fork server was started with an older one
                if device.device_count(embedder) > 1:
                    env["CUDA_VISIBLE_DEVICES"] = str(gpu)
                process = _spawn.Process(
                    target=_with_env,
                    args=(
                        env,
                        device.serve,
                        dict(m.config.tables["embedder"]),
                        m.spec.fingerprint,
                        [ours for _, ours in ends],
                        control,
                        parent,
                    ),
                    name=f"reindex-model-{gpu}",
                    daemon=True,
                )
                process.start()
                control.close()
                for _, ours in ends:
                    ours.close()
                self.models.append(_Proc(f"model process {gpu}", process, mine))
        lanes = self.lanes = 2 if on_device else 1  # one lane prepares and writes while the device embeds
        for index in range(self.count):
            mine, theirs = _spawn.Pipe()
            model = feeds[index % len(feeds)][index] if feeds else None
            spec_w = worker.WorkerSpec(
                index,
                m.config,
                m.plan_id,
                m.spec.nonce or None,
                (self.lease.key, self.lease.token),
                lanes,
                parent,
                spec,
                book,
                dict(os.environ),
                max(1, cores() // self.count),
            )
            process = _spawn.Process(
                target=worker.main, args=(spec_w, theirs, model), name=f"reindex-worker-{index}", daemon=True
            )
            process.start()
            theirs.close()
            if model is not None:
                model.close()
            self.workers.append(_Proc(f"worker {index}", process, mine))
        self._await_ready()

    def _await_ready(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        waiting = [proc for proc in self.models + self.workers]
        while waiting and self.failure is None:
            if time.monotonic() > deadline:
                raise BackendError(f"{waiting[0].describe()} did not start within {START_SECONDS:.0f} s")
            for conn in wait([proc.conn for proc in waiting], timeout=1.0):
                proc = next(p for p in waiting if p.conn is conn)
                try:
                    message = proc.conn.recv()
                except (EOFError, OSError):  # its end of the pipe closed, or reset as it died
                    raise BackendError(f"{proc.describe()} died while starting ({proc.death()})") from None
                if message[0] == "broken":
                    raise pickle.loads(message[1])
                proc.ready = True
                waiting.remove(proc)

    # feeding and counting ---------------------------------------------------------------------------

    def feed(self, tasks: deque[dict[str, Any]]) -> None:
        """Keep each worker two shards ahead (one per lane and one queued) until every task is answered,
        the run stops, or a process fails."""
        ahead = self.lanes + 1
        for proc in self.workers:
            self._hand(proc, tasks, ahead)
        while any(proc.held for proc in self.workers) or (tasks and self._feeding()):
            live = [proc for proc in self.workers if not proc.gone] + [m for m in self.models if not m.gone]
            for proc in self._receive(live):
                if self._feeding():
                    self._hand(proc, tasks, ahead)
            if not any(proc.held for proc in self.workers if not proc.gone) and not self._feeding():
                break
            if self.stop.is_set() or self.failure is not None:
                self._drain()
                return
        self._drain()

    def _receive(self, live: list[_Proc]) -> Iterator[_Proc]:
        """Wait up to 0.2 s on `live` processes' pipes; answer each message and yield the worker that sent
        it. A pipe that closes (or a model process's, which only closes) is a process lost."""
        for conn in wait([proc.conn for proc in live], timeout=0.2):
            proc = next(p for p in live if p.conn is conn)
            if proc in self.models:
                self._lost(proc)
                continue
            try:
                message = proc.conn.recv()
            except (EOFError, OSError):  # its end of the pipe closed, or reset as it died
                self._lost(proc)
                continue
            self._answer(proc, message)
            yield proc

    def _feeding(self) -> bool:
        return not self.stop.is_set() and self.failure is None and not self.refused

    def _hand(self, proc: _Proc, tasks: deque[dict[str, Any]], ahead: int) -> None:
        while tasks and len(proc.held) < ahead and not proc.gone:
            task = tasks[0]
            try:
                proc.conn.send(task)
            except OSError:  # it died: the next wait hears it, with what it held
                return
            tasks.popleft()
            proc.held.add(int(task["seq"]))

    def _answer(self, proc: _Proc, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "took":
            return
        if kind == "done":
            counts = message[1]
            proc.held.discard(int(counts["seq"]))
            self.done += 1
            self._count(counts)
        elif kind == "skipped":  # handed over, not started when the run stopped: a rerun does it
            proc.held.discard(int(message[1]))
        elif kind == "refused":
            proc.held.discard(int(message[1]))
            self.refused = True
        elif kind == "error":
            proc.held.discard(int(message[1]))
            error = pickle.loads(message[2])
            # a worker's batch failed because its model process died: say that. The worker may hear the
            # pipe close before the fork server reports the exit, so a model it found gone is waited for.
            wait_s = 5.0 if isinstance(error, device.ModelProcessGone) else 0.0
            for model in self.models:
                model.process.join(timeout=wait_s)
                if not model.gone and not model.process.is_alive():
                    self._lost(model)
            if self.failure is None:
                self.failure = error

    def _count(self, counts: dict[str, Any]) -> None:
        self.progress.count(counts, model_seconds=not self.models)  # a model process times the model itself
        self.on_progress(self.progress)

    def _lost(self, proc: _Proc) -> None:
        """A process that died. A worker that held no shard leaves the others to go on (the run ends
        complete); one that held shards, or the model process, ends the run resumably once the other
        workers' shards landed: its shards' text claims are the ledger's until a rerun releases them, so
        no other worker could take them over here without waiting on claims nobody will fulfil."""
        proc.gone = True
        proc.process.join(timeout=5)
        others = [worker for worker in self.workers if not worker.gone]
        if proc in self.workers and not proc.held and others:
            return
        held = ", ".join(str(seq) for seq in sorted(proc.held)) or "none"
        if self.failure is None:
            what = (
                f"shard(s) {held} in flight"
                if proc in self.workers
                else "the batches of the shards in flight"
            )
            self.failure = Interrupted(
                f"{proc.describe()} died ({proc.death()}) with {what}; nothing it did not write is"
                " marked done: rerun the same command to continue",
                hint="a process killed for memory: lower [run] workers or batch_tokens",
            )
        proc.held.clear()

    def _drain(self) -> None:
        """Stop handing out shards; wait (up to DRAIN_SECONDS) for the shards in flight to land."""
        for proc in self.workers:
            if not proc.gone:
                with suppress(OSError):
                    proc.conn.send(None)
        deadline = time.monotonic() + DRAIN_SECONDS
        while any(proc.held for proc in self.workers if not proc.gone) and time.monotonic() < deadline:
            for _ in self._receive([proc for proc in self.workers if not proc.gone and proc.held]):
                pass

    # ending -----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Every worker told to stop and joined (killed past the drain), then the model processes."""
        for proc in self.workers:
            with suppress(OSError):
                proc.conn.send(None)
        deadline = time.monotonic() + DRAIN_SECONDS
        for proc in self.workers:
            proc.process.join(timeout=max(0.1, deadline - time.monotonic()))
            if proc.process.is_alive():
                proc.process.kill()
                proc.process.join()
        for model in self.models:
            with suppress(OSError):
                model.conn.send("stop")
            if model.conn.poll(DRAIN_SECONDS):
                with suppress(EOFError, OSError):
                    message = model.conn.recv()
                    if message[0] == "stats":
                        self.model_stats.append(message[1])
            model.process.join(timeout=5)
            if model.process.is_alive():
                model.process.kill()
                model.process.join()
        for proc in self.workers + self.models:
            proc.conn.close()
        if self.model_stats:
            self.progress.model_seconds = sum(stats["busy"] for stats in self.model_stats)
            firsts = [stats["first"] for stats in self.model_stats if stats["batches"]]
            self.progress.device_started = min(firsts) if firsts else None


def _with_env(env: dict[str, str], target: Callable[..., None], *args: Any) -> None:
    os.environ.clear()
    os.environ.update(env)
    target(*args)
