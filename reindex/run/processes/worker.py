"""A worker process: its lanes (threads, each one shard at a time through `Pipeline.run_shard`) and the pipe
to the coordinator it takes tasks from and answers on.

Messages to the coordinator: ("ready",) once the lanes opened, or ("broken", error); then per task
("took", seq), then ("done", counts), ("refused", seq) when the budget refused it, ("error", seq, error), or
("skipped", seq) for a shard not started when the coordinator said stop.
"""

from __future__ import annotations

import os
import pickle
import queue
import threading
import time
import traceback
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

from reindex.capabilities import ShipsTokenizer, ThreadedTokenizer
from reindex.config import Config
from reindex.errors import BackendError, ReindexError
from reindex.run.cost import Budget, Spending
from reindex.run.lanes import Lane, open_lane
from reindex.run.planning import read_planned
from reindex.run.processes.device import POLL_SECONDS, DeviceClient, DeviceSpec, alive, follow_parent


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    config: Config
    plan_id: str
    nonce: str | None
    lease: tuple[str, int]
    lanes: int
    parent: int
    device: DeviceSpec | None = None  # feed a model process instead of building the embedder here
    budget: Any = None  # a proxy of the coordinator's `BudgetBook`, when a spending limit applies
    env: dict[str, str] | None = None  # the coordinator's environment now (the fork server's is older)
    threads: int = 1  # a tokenizer's threads here: the machine's cores shared between the workers


def main(spec: WorkerSpec, conn: Connection, model: Connection | None) -> None:
    follow_parent(spec.parent, "reindex-worker")
    if spec.env is not None:
        os.environ.clear()
        os.environ.update(spec.env)
    _Worker(spec, conn, model).run()


class _Worker:
    def __init__(self, spec: WorkerSpec, conn: Connection, model: Connection | None) -> None:
        self.spec, self.conn = spec, conn
        self.name = f"worker-{spec.index}:pid-{os.getpid()}"
        self.embedder: Any = DeviceClient(spec.device, model) if spec.device and model else None
        self.budget: Spending | None = _ProxyBudget(spec.budget) if spec.budget is not None else None
        self.tasks: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._send = threading.Lock()

    def tell(self, *message: Any) -> None:
        with self._send:
            self.conn.send(message)

    def run(self) -> None:
        try:
            lanes = [self._open() for _ in range(self.spec.lanes)]
        except ReindexError as exc:
            self.tell("broken", pickle.dumps(exc))
            return
        threads = [threading.Thread(target=self._lane, args=(lane,), daemon=True) for lane in lanes]
        for thread in threads:
            thread.start()
        self.tell("ready")
        self._dispatch(len(lanes))
        for thread in threads:
            thread.join()
        for lane in lanes:
            lane.close()

    def _open(self) -> Lane:
        lane = open_lane(
            self.spec.config,
            plan_id=self.spec.plan_id,
            nonce=self.spec.nonce,
            lease=self.spec.lease,
            worker=f"local/{self.name}",
            embedder=self.embedder,
            budget=self.budget,
        )
        self.embedder = lane.embedder  # built once, shared by the lanes (each call holds its own lock)
        tokenizer = self.embedder.column_tokenizer if isinstance(self.embedder, ShipsTokenizer) else None
        if isinstance(tokenizer, ThreadedTokenizer):  # every core each, they would contend
            tokenizer.threads = self.spec.threads
        return lane

    def _dispatch(self, lanes: int) -> None:
        """Tasks from the pipe to the lanes, until the coordinator's stop (None) or its death."""
        while alive(self.spec.parent):
            if not self.conn.poll(POLL_SECONDS):
                continue
            try:
                task = self.conn.recv()
            except EOFError:
                break
            if task is None:
                break
            self.tasks.put(task)
        while True:  # the run stops: shards handed over but not started go back unread
            try:
                waiting = self.tasks.get_nowait()
            except queue.Empty:
                break
            if waiting is not None:
                self.tell("skipped", int(waiting["seq"]))
        for _ in range(lanes):
            self.tasks.put(None)

    def _lane(self, lane: Lane) -> None:
        while (task := self.tasks.get()) is not None:
            seq = int(task["seq"])
            self.tell("took", seq)
            try:
                self.tell(*self._shard(lane, task))
            except ReindexError as exc:
                self.tell("error", seq, pickle.dumps(exc))
            except BaseException as exc:
                text = "".join(traceback.format_exception(exc))
                self.tell(
                    "error", seq, pickle.dumps(BackendError(f"{self.name} failed on shard {seq}:\n{text}"))
                )

    def _shard(self, lane: Lane, task: dict[str, Any]) -> tuple[Any, ...]:
        pipeline, seq = lane.pipeline, int(task["seq"])
        if self.budget is not None and self.budget.exhausted:
            return ("refused", seq)
        started = time.monotonic()
        before = replace(pipeline.progress)
        docs = read_planned(pipeline.source, task)
        if pipeline.run_shard(seq, task["after"], docs) is None:
            return ("refused", seq)
        after = pipeline.progress
        counts = {"seq": seq, **after.since(before), "seconds": time.monotonic() - started}
        return ("done", counts)


class _ProxyBudget:
    """A worker's view of the coordinator's `BudgetBook` (`reindex.run.cost.Spending`), through a manager."""

    def __init__(self, book: Any) -> None:
        self.book = book
        self.max_usd: float | None = self._snapshot().max_usd

    def _snapshot(self) -> Budget:
        snapshot: Budget = self.book.snapshot()
        return snapshot

    @property
    def exhausted(self) -> bool:
        return self._snapshot().exhausted

    def allows(self, tokens: int) -> bool:
        return bool(self.book.allows(tokens))

    def charge(self, billed_tokens: int, reserved: int | None = None) -> None:
        self.book.charge(billed_tokens, reserved)

    def message(self) -> str:
        return self._snapshot().message()
