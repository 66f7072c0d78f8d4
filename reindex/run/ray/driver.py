"""The `ray` engine: one migration's shards spread over a Ray cluster with Ray Data.

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
copies them (`Pipeline._copies`), rather than paying for them twice. A spending limit (`[run] max_cost_usd`) is one budget for the whole cluster, held
by an actor on the driver's node: every worker reserves a shard's tokens there before sending them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import signal
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import ExitStack, closing, contextmanager, suppress
from dataclasses import dataclass, field, replace
from typing import Any

from reindex import registry
from reindex.columns import Documents
from reindex.config import Config
from reindex.errors import BackendError, ConfigError, Interrupted, MissingDependency, ReindexError
from reindex.ports import Source
from reindex.run.claims import LedgerClaims
from reindex.run.cost import Budget
from reindex.run.migration import Migration, migration, open_backends, open_ledger, with_nonce
from reindex.run.pipeline import Pipeline, Progress, scan_documents
from reindex.run.shards import Pretokenized, pretokenize
from reindex.state.ledger import Lease, Ledger, PlannedShard, SqliteLedger

_LOCAL_ADDRESSES = (None, "local")


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


def check(config: Config, embedder: Any, ledger: Ledger) -> None:
    """Refuse what the ray engine cannot do (exit 2, naming the fix); `reindex run` calls it before the
    migration's run and target are touched. (A provider batch embedder never gets here: it runs on the
    driver's machine under either engine.)"""
    for role, section in (("source", config.source), ("target", config.target)):
        if section.get("kind") == "qdrant" and section.get("path") is not None:
            raise ConfigError(
                f"[{role}] is Qdrant local mode (path = {section['path']!r}), which one process opens at a"
                " time; the ray engine's workers each open it",
                hint=f'give [{role}] the url of a Qdrant server, or use engine = "local"',
            )
    if isinstance(ledger, SqliteLedger) and config.ray.address not in _LOCAL_ADDRESSES:
        raise ConfigError(
            f"[run] state is a SQLite file, which only this machine reaches; a Ray cluster at"
            f" {config.ray.address!r} needs a ledger every node reaches",
            hint="set [run] state (or state_env) to a postgresql:// URL, or omit [ray] address for a local Ray",
        )
    _check_room(config)


def plan(m: Migration, ledger: Ledger) -> list[PlannedShard]:
    """The shards still to do: those planned before and not recorded, then new ones cut from the source
    after the last planned (or, for a migration the local engine started, after its resume point)."""
    planned = ledger.shard_plan(m.plan_id)
    after, seq = (planned[-1].last_cursor, planned[-1].seq + 1) if planned else ledger.resume_point(m.plan_id)
    new: list[PlannedShard] = []
    for last, documents in shard_bounds(m.source, after, m.config.run.shard_size):
        new.append(PlannedShard(seq, after, last, documents))
        after, seq = last, seq + 1
    if new:
        ledger.plan_shards(m.plan_id, new)
    return [shard for shard in planned if not shard.recorded] + new


def shard_bounds(source: Source, after: str | None, size: int) -> Iterator[tuple[str, int]]:
    """(last position, documents) of each shard of `size` documents after `after`. Sources that can say so
    cheaply do (JSONL: a pass over the bytes; Parquet: arithmetic; Postgres: one query over the ids);
    the others are read through once on the driver."""
    bounds = getattr(source, "shard_bounds", None)
    if bounds is not None:
        yield from bounds(after, size)
        return
    for docs in scan_documents(source, after, size):
        yield (docs.last_position if docs.last_position is not None else (after or "")), len(docs)


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
    with _cluster(ray, m.config):
        pending = plan(m, ledger)
        ledger.release_claims(m.plan_id)  # claims of shards that died in flight (or refused by a budget)
        book = _budget_book(ray, budget) if pending else None
        progress = _stream(ray, m, lease, pending, stop, on_progress, book) if pending else RayProgress()
        spent: Budget | None = ray.get(book.snapshot.remote()) if book is not None else None
    if spent is not None and spent.exhausted:
        raise Interrupted(spent.message())
    if stop.is_set() and progress.documents < sum(shard.documents for shard in pending):
        raise Interrupted(f"stopped after {progress.documents} documents; rerun the same command to continue")
    return progress


def _check_room(config: Config) -> None:
    """On a local Ray, actors that take every CPU leave none for a read task, and the stream would wait
    forever. (A cluster may autoscale, so its CPUs now say nothing: Ray waits for nodes there.)"""
    settings = config.ray
    if settings.address not in _LOCAL_ADDRESSES:
        return
    cpus = settings.num_cpus or os.cpu_count() or 1
    wanted = settings.actors * settings.cpus_per_actor + settings.cpus_per_task
    if wanted > cpus:
        raise ConfigError(
            f"[ray] {settings.actors} actor(s) x {settings.cpus_per_actor:g} CPU plus a read task's"
            f" {settings.cpus_per_task:g} need {wanted:g} CPUs; the local Ray has {cpus:g}",
            hint="lower [ray] actors, cpus_per_actor or cpus_per_task (fractions are fine), or raise num_cpus",
        )


def _budget_book(ray: Any, budget: Budget | None) -> Any:
    """The run's budget as an actor on the driver's node (None when nothing limits spending), so that the
    budget lives exactly as long as the driver: a lost worker node takes none of it along."""
    if budget is None or budget.max_usd is None or not budget.price_per_million:
        return None
    here = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
        ray.get_runtime_context().get_node_id(), soft=False
    )
    return ray.remote(BudgetBook).options(num_cpus=0, scheduling_strategy=here).remote(budget)


class BudgetBook:
    """One spending limit for the whole cluster (a Ray actor): each worker reserves a shard's tokens before
    sending them and charges what the provider billed once recorded, so the cluster stops claiming work
    where one process would. Once a shard is refused every later one is, whatever its size: the run stops
    (exit 75) rather than picking small shards to fill the rest. A shard retried after its actor died
    reserves again, so the cluster may stop early, never late; a rerun starts from what the ledger holds."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget

    def allows(self, tokens: int) -> bool:
        return not self.budget.exhausted and self.budget.allows(tokens)

    def charge(self, billed_tokens: int, reserved: int | None) -> None:
        self.budget.charge(billed_tokens, reserved)

    def snapshot(self) -> Budget:
        return self.budget


class RemoteBudget:
    """A worker's view of the `BudgetBook` (`reindex.run.cost.Spending`): each call a round trip to the actor."""

    def __init__(self, book: Any, max_usd: float | None) -> None:
        self.book, self.max_usd = book, max_usd

    @property
    def exhausted(self) -> bool:
        return bool(_ray().get(self.book.snapshot.remote()).exhausted)

    def allows(self, tokens: int) -> bool:
        return bool(_ray().get(self.book.allows.remote(tokens)))

    def charge(self, billed_tokens: int, reserved: int | None = None) -> None:
        _ray().get(self.book.charge.remote(billed_tokens, reserved))

    def message(self) -> str:
        return str(_ray().get(self.book.snapshot.remote()).message())


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
    with closing(_results(_dataset(ray, m, lease, pending, book))) as rows:
        for row in rows:  # leaving closes the stream: Ray Data stops its tasks and actors
            if row["error"]:  # a worker's ReindexError, raised as itself: same exit code and hint
                raise pickle.loads(row["error"])
            _count(progress, row)
            if on_progress:
                on_progress(progress)
            if stop.is_set():
                break
    return progress


def _results(dataset: Any) -> Generator[dict[str, Any], None, None]:
    """Each shard's row as soon as its actor returns it. `iter_rows` prefetches a block, so it hands a row
    over only once the next shard is done too: progress, and the check for a stop, would lag a shard."""
    blocks = iter(dataset.iter_batches(batch_size=None, prefetch_batches=0, batch_format="pyarrow"))
    with closing(blocks):
        for block in blocks:
            yield from block.to_pylist()


def _count(progress: RayProgress, row: dict[str, Any]) -> None:
    if row["refused"]:
        return
    progress.documents += int(row["documents"])
    progress.written += int(row["written"])
    progress.dead_letters += int(row["dead_letters"])
    progress.tokens += int(row["tokens"])
    progress.model_seconds += float(row["model_seconds"])
    key = f"{row['node']}/{row['actor']}"
    stats = progress.workers.setdefault(key, WorkerStats(str(row["node"]), str(row["actor"])))
    stats.shards += 1
    stats.documents += int(row["documents"])
    stats.seconds += float(row["seconds"])


def _dataset(ray: Any, m: Migration, lease: Lease, pending: list[PlannedShard], book: Any) -> Any:
    """One row per shard. Ray Data's defaults make it fault tolerant: a task whose worker dies runs
    again, an actor that dies is restarted and its shard retried (a system failure, not an exception)."""
    settings = m.config.ray
    items = [
        {"seq": s.seq, "after": s.after_cursor, "last": s.last_cursor, "documents": s.documents}
        for s in pending
    ]
    dataset = ray.data.from_items(items, override_num_blocks=len(items))
    dataset = dataset.map(
        _read_shard,
        fn_kwargs={"config": m.config, "book": book, "tokenizer": _shipped_tokenizer(m.embedder)},
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
        },
        compute=ray.data.ActorPoolStrategy(
            size=settings.actors,
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
    tokenizer = getattr(embedder, "column_tokenizer", None)
    if tokenizer is None:
        return None
    blob = pickle.dumps(tokenizer, protocol=pickle.HIGHEST_PROTOCOL)
    return hashlib.sha256(blob).hexdigest(), blob


@contextmanager
def _cluster(ray: Any, config: Config) -> Iterator[None]:
    """Join the configured cluster, or start a local Ray for this run; leave a Ray someone else started.
    Ray's own notices on the driver's stderr (each dataset's start and plan, token authentication, progress
    bars off) are held back to errors: the run's progress and report are what a user reads there; Ray's
    session logs keep everything."""
    with _quiet("ray", "ray.data"):
        if ray.is_initialized():
            yield
            return
        settings = config.ray
        options: dict[str, Any] = {
            "namespace": settings.namespace,
            "runtime_env": settings.runtime_env or None,
            "log_to_driver": False,
            "configure_logging": False,
        }
        if settings.address in _LOCAL_ADDRESSES:  # "local": never join a Ray another process runs here
            options |= {"address": "local", "num_cpus": settings.num_cpus, "include_dashboard": False}
        else:
            options["address"] = settings.address
        on_sigterm = signal.getsignal(signal.SIGTERM)
        ray.init(**options)
        if threading.current_thread() is threading.main_thread() and on_sigterm is not None:
            # ray.init puts its own SIGTERM handler (exit 15, and its core's stack dump) in place of the
            # run's: a reclaimed driver must finish its in-flight shards and exit 75, as the local engine does.
            signal.signal(signal.SIGTERM, on_sigterm)
        try:
            ray.data.DataContext.get_current().enable_progress_bars = False
            yield
        finally:
            ray.shutdown()


@contextmanager
def _quiet(*names: str) -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


# on the workers ------------------------------------------------------------------------------------------

_sources: dict[str, Source] = {}  # per worker process: one source connection per [source] section
_tokenizers: dict[str, Callable[[list[str]], Any]] = {}  # per worker process, by the pickle's sha256


def _read_shard(
    item: dict[str, Any], config: Config, book: Any = None, tokenizer: tuple[str, bytes] | None = None
) -> dict[str, Any]:
    """Read one planned shard: exactly the documents after its first cursor up to its last, and tokenize
    its distinct texts with `tokenizer` (`_shipped_tokenizer`); nothing once the budget (`book`) has
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
    if book is not None and _ray().get(book.snapshot.remote()).exhausted:
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


def _tokenizer(shipped: tuple[str, bytes], cpus: float) -> Callable[[list[str]], Any]:
    """The shipped tokenizer, unpickled once per worker process, with threads for the task's CPUs (it
    left the driver with the driver's)."""
    key, blob = shipped
    tokenizer = _tokenizers.get(key)
    if tokenizer is None:
        tokenizer = _tokenizers[key] = pickle.loads(blob)
        if hasattr(tokenizer, "threads"):
            tokenizer.threads = max(1, int(cpus))
    return tokenizer


def _read(item: dict[str, Any], config: Config) -> Documents:
    key = json.dumps(config.source, sort_keys=True, default=str)
    source = _sources.get(key)
    if source is None:
        source = _sources[key] = registry.build("source", config.source)
    after = item["after"]
    docs = next(scan_documents(source, after, int(item["documents"])), None)
    found = (len(docs), docs.last_position) if docs is not None else (0, None)
    if docs is None or found != (int(item["documents"]), item["last"]):
        raise BackendError(
            f"the source changed under planned shard {item['seq']}: expected {item['documents']} documents"
            f" ending at {item['last']!r}, read {found[0]} ending at {found[1]!r}",
            hint="`reindex run --fresh` plans again; `reindex sync` catches up edits made after a run",
        )
    return docs


@dataclass
class _Lane:
    """One shard at a time inside an actor: its own ledger, source and target connections and pipeline
    (its progress counts only its shards); the actor's lanes share the model and its lock."""

    pipeline: Pipeline
    resources: ExitStack  # the lane's connections, closed with it

    def close(self) -> None:
        with suppress(Exception):
            self.resources.close()


class ShardWorker:
    """One embedding actor: the model, loaded once, and up to `[ray] shards_per_actor` lanes, each a shard
    in flight with connections of its own, so one shard embeds while another writes and records (the model
    takes one call at a time, as in the local engine). What fails to open with a ReindexError (an
    unreachable backend, another model) answers every shard with that error, which the driver raises as
    itself; raised here, Ray would report a dead actor and a traceback."""

    def __init__(
        self, config: Config, plan_id: str, nonce: str | None, lease: tuple[str, int], book: Any = None
    ) -> None:
        context = _ray().get_runtime_context()
        self.node = f"{socket.gethostname()}:{context.get_node_id()[:8]}"
        self.actor = f"{(context.get_actor_id() or 'task')[:8]}:pid-{os.getpid()}"
        self.config, self.plan_id, self.nonce, self.lease = config, plan_id, nonce, lease
        self.embedder: Any = None
        self.budget = RemoteBudget(book, config.run.max_cost_usd) if book is not None else None
        self._model = threading.Lock()
        self._free: list[_Lane] = []
        self._lanes: list[_Lane] = []
        self._opening = threading.Lock()
        self._broken = b""
        try:
            self._free.append(self._open())  # the model and a first lane now: a bad config fails at once
        except ReindexError as exc:
            self._broken = pickle.dumps(exc)

    def _open(self) -> _Lane:
        config = self.config
        with ExitStack() as resources:
            ledger = open_ledger(config)
            resources.callback(ledger.close)
            ledger.fence(Lease(*self.lease))
            source, sink = resources.enter_context(open_backends(config))
            m = migration(config, source, sink, self.embedder)
            if m.plan_id != self.plan_id:
                raise ConfigError(
                    f"this worker computes plan {m.plan_id}, the driver {self.plan_id}: its model or"
                    " backends differ",
                    hint="give every node the same model weights and the same config",
                )
            self.embedder = m.embedder
            m = with_nonce(m, self.nonce) if self.nonce else m
            pipeline = Pipeline(
                source=m.source,
                embedder=m.embedder,
                sink=m.sink,
                ledger=ledger,
                spec=m.spec,
                plan_id=self.plan_id,
                run=config.run,
                claims=LedgerClaims(ledger, self.plan_id),
                worker=f"{self.node}/{self.actor}",
                budget=self.budget,
                model_lock=self._model,
            )
            lane = _Lane(pipeline, resources.pop_all())
        self._lanes.append(lane)
        return lane

    def _take(self) -> _Lane:
        with self._opening:  # Ray calls this from as many threads as the actor has lanes
            return self._free.pop() if self._free else self._open()

    def __call__(self, item: dict[str, Any]) -> dict[str, Any]:
        nothing = {**_NOTHING, "seq": int(item["seq"]), "node": self.node, "actor": self.actor}
        if self._broken:
            return nothing | {"error": self._broken}
        if item["refused"] or (not item["error"] and self.budget is not None and self.budget.exhausted):
            return nothing | {"refused": True}  # the budget refused a shard: claim nothing more
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
            "documents": after.documents - before.documents,
            "written": after.written - before.written,
            "dead_letters": after.dead_letters - before.dead_letters,
            "tokens": after.tokens - before.tokens,
            "model_seconds": after.model_seconds - before.model_seconds,
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
    "documents": 0,
    "written": 0,
    "dead_letters": 0,
    "tokens": 0,
    "model_seconds": 0.0,
    "seconds": 0.0,
    "error": b"",
    "refused": False,
}


def require() -> None:
    """MissingDependency (exit 2, naming the `ray` extra) unless Ray Data imports."""
    _ray()


def _ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError:
        raise MissingDependency("ray", extra="ray") from None
    return ray
