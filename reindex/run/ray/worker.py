"""The `ray` engine on the workers: the read task (one planned shard's documents, tokenized when the model's
tokenizer travels) and `ShardWorker`, the embedding actor whose lanes run the local engine's shard."""

from __future__ import annotations

import os
import pickle
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from reindex import registry
from reindex.capabilities import ThreadedTokenizer
from reindex.columns import Documents
from reindex.config import Config
from reindex.errors import ReindexError
from reindex.ports import Source
from reindex.run.lanes import Lane, open_lane
from reindex.run.pipeline import Pipeline
from reindex.run.planning import read_planned
from reindex.run.progress import Progress
from reindex.run.ray.budget import RemoteBudget
from reindex.run.ray.cluster import _ray
from reindex.run.shards import Pretokenized, pretokenize

_sources: dict[str, Source] = {}  # per worker process: one source connection per [source] section
_tokenizers: dict[str, Callable[[list[str]], Any]] = {}  # per worker process, by the pickle's sha256


def read_shard(
    item: dict[str, Any],
    config: Config,
    book: Any = None,
    tokenizer: tuple[str, bytes] | None = None,
    halt: Any = None,
) -> dict[str, Any]:
    """Read one planned shard: exactly the documents after its first cursor up to its last, and tokenize
    its distinct texts with `tokenizer` (`driver._shipped_tokenizer`); nothing once the budget (`book`) has
    refused a shard. A ReindexError travels on in the row (Ray would wrap it beyond recognition); the
    driver raises it.

    Ray Data fuses this function into the actor's process when their resources are equal (CPU-only
    settings): there the actor tokenizes after its claims, as the local engine does, since tokenizing
    here first would only tokenize, in the same process, texts the claims then set aside. Apart (an actor
    with a GPU, a read task without), the read tasks hash and tokenize on the CPUs while the actors embed."""
    row = {
        "seq": item["seq"],
        "after": item["after"],
        "docs": b"",
        "tokens": b"",
        "error": b"",
        "refused": False,
    }
    if (book is not None and _ray().get(book.snapshot.remote()).exhausted) or _halted(halt):
        return row | {"refused": True}
    try:
        docs = _read(item, config)
    except ReindexError as exc:
        return row | {"error": pickle.dumps(exc)}
    tokens = b""
    if tokenizer is not None and _ray().get_runtime_context().get_actor_id() is None:
        ready = pretokenize(_tokenizer(tokenizer, config.ray.cpus_per_task), docs)
        tokens = pickle.dumps(ready, protocol=pickle.HIGHEST_PROTOCOL)
    return row | {"docs": pickle.dumps(docs, protocol=pickle.HIGHEST_PROTOCOL), "tokens": tokens}


def _halted(halt: Any) -> bool:
    """Whether the driver gave up on this run (`budget.Halt`): a round trip to its actor per shard."""
    return halt is not None and bool(_ray().get(halt.is_halted.remote()))


def _tokenizer(shipped: tuple[str, bytes], cpus: float) -> Callable[[list[str]], Any]:
    """The shipped tokenizer, unpickled once per worker process, with threads for the task's CPUs (it
    left the driver with the driver's)."""
    key, blob = shipped
    tokenizer = _tokenizers.get(key)
    if tokenizer is None:
        tokenizer = _tokenizers[key] = pickle.loads(blob)
        if isinstance(tokenizer, ThreadedTokenizer):
            tokenizer.threads = max(1, int(cpus))
    return tokenizer


def _read(item: dict[str, Any], config: Config) -> Documents:
    key = config.source.model_dump_json()
    source = _sources.get(key)
    if source is None:
        source = _sources[key] = registry.build("source", config.source)
    return read_planned(source, item)


class ShardWorker:
    """One embedding actor: the model, loaded once, and up to `[ray] shards_per_actor` lanes, each a shard
    in flight with connections of its own, so one shard embeds while another writes and records (the model
    takes one call at a time, as in the local engine). What fails to open with a ReindexError (an
    unreachable backend, another model) answers every shard with that error, which the driver raises as
    itself; raised here, Ray would report a dead actor and a traceback."""

    def __init__(
        self,
        config: Config,
        plan_id: str,
        nonce: str | None,
        lease: tuple[str, int],
        book: Any = None,
        halt: Any = None,
    ) -> None:
        context = _ray().get_runtime_context()
        self.halt = halt
        if halt is not None:  # so that a driver that gives up can stop this actor (budget.Halt)
            halt.register.remote(context.current_actor)
        self.node = f"{socket.gethostname()}:{context.get_node_id()[:8]}"
        self.actor = f"{(context.get_actor_id() or 'task')[:8]}:pid-{os.getpid()}"
        self.config, self.plan_id, self.nonce, self.lease = config, plan_id, nonce, lease
        self.embedder: Any = None
        self.budget = RemoteBudget(book, config.run.max_cost_usd) if book is not None else None
        self._model = threading.Lock()
        self._free: list[Lane] = []
        self._lanes: list[Lane] = []
        self._opening = threading.Lock()
        self._broken = b""
        try:
            self._free.append(self._open())  # the model and a first lane now: a bad config fails at once
        except ReindexError as exc:
            self._broken = pickle.dumps(exc)

    def _open(self) -> Lane:
        lane = open_lane(
            self.config,
            plan_id=self.plan_id,
            nonce=self.nonce,
            lease=self.lease,
            worker=f"{self.node}/{self.actor}",
            embedder=self.embedder,
            budget=self.budget,
            model_lock=self._model,
        )
        self.embedder = lane.embedder
        self._lanes.append(lane)
        return lane

    def _take(self) -> Lane:
        with self._opening:  # Ray calls this from as many threads as the actor has lanes
            return self._free.pop() if self._free else self._open()

    def __call__(self, item: dict[str, Any]) -> dict[str, Any]:
        nothing = {**_NOTHING, "seq": int(item["seq"]), "node": self.node, "actor": self.actor}
        if self._broken:
            return nothing | {"error": self._broken}
        if item["refused"] or (not item["error"] and self.budget is not None and self.budget.exhausted):
            return nothing | {"refused": True}  # the budget refused a shard: claim nothing more
        if _halted(self.halt):
            return nothing | {"refused": True}  # the driver gave up: a retried shard ends at once
        error = item["error"]
        if not error:
            try:
                lane = self._take()
            except ReindexError as exc:
                return nothing | {"error": pickle.dumps(exc)}
            try:
                return self._process(lane.pipeline, item) or nothing | {"refused": True}
            except ReindexError as exc:  # LeaseLost, BackendError, ...: the driver raises it
                error = pickle.dumps(exc)
            finally:
                with self._opening:
                    self._free.append(lane)
        return nothing | {"error": error}

    def _process(self, pipeline: Pipeline, item: dict[str, Any]) -> dict[str, Any] | None:
        started = time.monotonic()
        before = replace(pipeline.progress)
        pretokenized: Pretokenized | None = pickle.loads(item["tokens"]) if item["tokens"] else None
        shard = pipeline.run_shard(int(item["seq"]), item["after"], pickle.loads(item["docs"]), pretokenized)
        if shard is None:
            return None
        after = pipeline.progress
        return {
            "seq": shard.seq,
            **after.since(before),
            "seconds": time.monotonic() - started,
            "node": self.node,
            "actor": self.actor,
            "error": b"",
            "refused": False,
        }

    def __del__(self) -> None:
        """An actor going away closes what it opened; nobody is left to hear of a failure to close."""
        for lane in getattr(self, "_lanes", ()):
            lane.close()


_NOTHING: dict[str, Any] = {
    **Progress().since(Progress()),
    "seconds": 0.0,
    "error": b"",
    "refused": False,
}
