"""A config turned into live adapters, the migration's identity, and the ledger with its lease.

Identity is what changes the vectors and where they go, never how a backend is reached:

    plan id    = hash(source identity, target identity, alias, target name, embedder fingerprint[, storage])
    config key = hash(source identity, target identity, alias, target name, [embedder] section)

A sink that chooses how vectors are stored (pgvector: halfvec, bit) adds the storage to the target's name
and the plan id unless it is the plain one, so the same model stored another way is another target. The
rows keep the model's fingerprint: the vectors are the same model's, only their stored precision differs.

The plan id names the migration in the ledger. The config key finds it again without loading the model
(status, dlq list, dlq retry with nothing to retry), because the fingerprint needs the weights' digest.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from reindex import registry
from reindex.config import Config
from reindex.errors import ConfigError, LeaseLost, ReindexError
from reindex.fingerprint import target_name
from reindex.ports import (
    CarryingSink,
    DeferredEmbedder,
    Distance,
    Embedder,
    PlansStorage,
    Section,
    Sink,
    Source,
    SourceSchema,
    StoragePlan,
    TargetSpec,
)
from reindex.run.identities import build_embedder
from reindex.run.pipeline import Pipeline
from reindex.run.synchronous import SynchronousBatches
from reindex.state.ledger import Ledger
from reindex.state.records import Lease, RunInfo
from reindex.state.sqlite import SqliteLedger


@dataclass
class Migration:
    """A config turned into live adapters and the identity of the target they build."""

    config: Config
    source: Source
    embedder: Embedder
    sink: Sink
    spec: TargetSpec
    plan_id: str
    storage: StoragePlan | None = None  # how the sink stores the target (None: it has one way)

    def pipeline(self, ledger: Ledger) -> Pipeline:
        """A pipeline over this migration's adapters, for work outside the backfill (retries, sync)."""
        embedder: Any = self.embedder
        if isinstance(embedder, DeferredEmbedder):
            run = self.config.run
            embedder = SynchronousBatches(
                embedder, poll_seconds=run.poll_seconds, poll_max_seconds=run.poll_max_seconds
            )
        return Pipeline(
            source=self.source,
            embedder=embedder,
            sink=self.sink,
            ledger=ledger,
            spec=self.spec,
            plan_id=self.plan_id,
            run=self.config.run,
        )


@contextmanager
def open_backends(config: Config) -> Iterator[tuple[Source, Sink]]:
    """Build source and sink only (no model): enough to inspect, resolve, roll back and prune."""
    opened: list[Any] = []
    try:
        yield _open(opened, "source", config.source), _open(opened, "target", config.target)
    finally:
        for adapter in reversed(opened):
            with suppress(ReindexError):
                adapter.close()


@contextmanager
def open_migration(config: Config, *, lazy: bool = False) -> Iterator[Migration]:
    """Build source, embedder and sink (closing whatever was opened, whatever happens). `lazy`: a model whose
    identity is remembered is loaded only when used (`reindex.run.identities`): verify, cutover."""
    with open_backends(config) as (source, sink):
        yield migration(config, source, sink, lazy=lazy)


def migration(
    config: Config, source: Source, sink: Sink, embedder: Embedder | None = None, *, lazy: bool = False
) -> Migration:
    """Load the model (unless given one already loaded, or `lazy`) and name the target and the plan."""
    embedder = embedder or build_embedder(config.embedder, lazy=lazy)
    info = embedder.info
    schema = source.schema()
    refuse_uncarried(schema, sink)
    storage = planned_storage(sink, info.dim, schema.distance)
    identity = info.fingerprint
    if storage is not None and not storage.default:
        identity = _digest(info.fingerprint, storage.type)
    name = config.target.name or target_name(config.alias, identity)
    if name == config.alias:
        raise ConfigError(f"[target] name {name!r} equals the alias", hint="targets are never live names")
    stored = [] if identity == info.fingerprint else [storage.type if storage else None]
    plan_id = _digest(source.identity(), sink.identity(), config.alias, name, info.fingerprint, *stored)
    spec = TargetSpec(
        name=name,
        alias=config.alias,
        dim=info.dim,
        fingerprint=info.fingerprint,
        model=info.describe(),
        source=schema,
        plan_id=plan_id,
    )
    return Migration(config, source, embedder, sink, spec, plan_id, storage)


def planned_storage(sink: Sink, dim: int, distance: Distance) -> StoragePlan | None:
    """How the sink will store a target of `dim` (None: it has one way); ConfigError where it cannot."""
    return sink.plan_storage(dim, distance) if isinstance(sink, PlansStorage) else None


def refuse_uncarried(schema: SourceSchema, sink: Sink) -> None:
    """A source whose documents carry parts beside the vector (a Qdrant point's other named vectors) needs a
    target that holds them: else verify could never find it complete."""
    if schema.carried and not isinstance(sink, CarryingSink):
        raise ConfigError(
            f"the source holds {', '.join(map(repr, schema.carried))} beside the vector re-embedded, which"
            " this [target] cannot carry",
            hint="use a qdrant [target], or set [source] carry_vectors = false to leave them behind",
        )


def config_key(config: Config, source: Source, sink: Sink) -> str:
    """Finds a migration's run in the ledger without loading the model (see the module docstring)."""
    section = json.dumps(config.tables["embedder"], sort_keys=True, default=str)  # as written, as ever
    return _digest(source.identity(), sink.identity(), config.alias, config.target.name, section)


def known_run(config: Config, ledger: Ledger, source: Source, sink: Sink) -> RunInfo | None:
    return ledger.find_run(config_key(config, source, sink))


def with_nonce(m: Migration, nonce: str) -> Migration:
    return replace(m, spec=replace(m.spec, nonce=nonce))


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def _open(opened: list[Any], role: registry.Role, section: Section) -> Any:
    adapter = registry.build(role, section)
    opened.append(adapter)
    return adapter


# the ledger ---------------------------------------------------------------------------------------------


def open_ledger(config: Config, *, create: bool = True) -> Ledger:
    """SQLite by default; a postgresql:// URL (in `state` or the variable `state_env` names) is shared.
    Without `create`, a SQLite ledger that is not there is MissingLedger, never a new empty file."""
    state = config.run.ledger_location()
    if not create and not config.run.ledger_on_postgres() and not Path(state).exists():
        raise MissingLedger(config)
    if config.run.ledger_on_postgres():
        ledger: Ledger = registry.resolve_ledger("postgres")(state)
        return ledger
    return SqliteLedger(state)


class MissingLedger(ConfigError):
    """A verb that reads a run found no SQLite ledger where the config says it is: it never makes up an
    empty one, which would say "no run yet" of an alias the tool has moved, or "nothing to roll back to"."""

    def __init__(self, config: Config) -> None:
        where = Path(config.run.ledger_location()).absolute()
        super().__init__(
            f"no ledger at {where} ([run] state in {config.path.absolute()})",
            hint="run `reindex run` first, or point [run] state at the ledger of the run that moved the alias",
        )


@contextmanager
def ledger_of(config: Config, *, create: bool = False) -> Iterator[Ledger]:
    """The config's ledger. A SQLite ledger that is not there is made only where nothing can have run: by a
    verb that starts a run (`create`), or for an alias that carries no mark of the tool. For an alias the
    tool has moved it is MissingLedger (exit 2, naming where it looked), never a new empty ledger that
    would answer "no run yet" or "nothing to roll back to"."""
    try:
        ledger = open_ledger(config, create=create)
    except MissingLedger:
        if _alias_marked(config):
            raise
        ledger = open_ledger(config)
    try:
        yield ledger
    finally:
        ledger.close()


def _alias_marked(config: Config) -> bool:
    """Whether the config's alias carries the tool's mark (a fingerprint the tool recorded on it)."""
    sink = registry.build("target", config.target)
    try:
        return sink.alias(config.alias).fingerprint is not None
    finally:
        sink.close()


def lease_key(config: Config) -> str:
    """One writer per alias and ledger: run, sync and dlq retry of any migration onto this alias."""
    return f"run:{config.alias}"


@contextmanager
def leased(config: Config, *, create: bool = False) -> Iterator[tuple[Ledger, Lease]]:
    """Open the ledger and hold the lease before any backend is opened (one writer at a time)."""
    with ledger_of(config, create=create) as ledger, ledger.lease(lease_key(config)) as lease:
        yield ledger, lease


@contextmanager
def stop_on_lost_lease(lease: Lease, stop: threading.Event) -> Iterator[None]:
    """Turn a lost lease into a stop request; leave with LeaseLost (exit 75) if it was lost."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            if lease.lost.is_set():
                stop.set()
                return

    watcher = threading.Thread(target=watch, name="lease-watch", daemon=True)
    watcher.start()
    try:
        yield
    except ReindexError:
        if lease.lost.is_set():
            raise LeaseLost(_LOST, hint="rerun the same command to continue") from None
        raise
    finally:
        done.set()
        watcher.join()
    if lease.lost.is_set():
        raise LeaseLost(_LOST, hint="rerun the same command to continue")


_LOST = "the run lost its lease (its ledger connection dropped, or another run took over) and stopped"
