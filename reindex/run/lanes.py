"""A lane: one shard at a time inside a worker process, with its own ledger, source and target connections
and its own pipeline; the lanes of a worker share its model (and the lock each model call holds). The
`processes` engine's workers and the `ray` engine's actors both run their shards in lanes, through the same
`Pipeline.run_shard` the stages are written once for."""

from __future__ import annotations

import threading
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from typing import Any

from reindex.config import Config
from reindex.errors import ConfigError
from reindex.run.claims import LedgerClaims, run_wide
from reindex.run.cost import Spending
from reindex.run.migration import migration, open_backends, open_ledger, with_nonce
from reindex.run.pipeline import Pipeline
from reindex.state.records import Lease


@dataclass
class Lane:
    pipeline: Pipeline
    resources: ExitStack  # the lane's connections, closed with it

    @property
    def embedder(self) -> Any:
        return self.pipeline.embedder

    def close(self) -> None:
        with suppress(Exception):
            self.resources.close()


def open_lane(
    config: Config,
    *,
    plan_id: str,
    nonce: str | None,
    lease: tuple[str, int],
    worker: str,
    embedder: Any = None,
    budget: Spending | None = None,
    model_lock: threading.Lock | None = None,
) -> Lane:
    """Open a lane's connections, fenced with the coordinator's lease, and its pipeline over `embedder` (or
        the config's, built here). With run-wide dedupe, claims go to the ledger, so it holds across every worker
    of the run (`reindex.run.claims`)."""
    with ExitStack() as resources:
        ledger = open_ledger(config)
        resources.callback(ledger.close)
        ledger.fence(Lease(*lease))
        source, sink = resources.enter_context(open_backends(config))
        m = migration(config, source, sink, embedder)
        if m.plan_id != plan_id:
            raise ConfigError(
                f"this worker computes plan {m.plan_id}, the coordinator {plan_id}: its model or backends differ",
                hint="give every worker the same model weights and the same config",
            )
        m = with_nonce(m, nonce) if nonce else m
        pipeline = Pipeline(
            source=m.source,
            embedder=m.embedder,
            sink=m.sink,
            ledger=ledger,
            spec=m.spec,
            plan_id=plan_id,
            run=config.run,
            # run-wide dedupe: claims in the ledger, seen by every worker; windowed: each lane's own
            claims=LedgerClaims(ledger, plan_id) if run_wide(config.run, m.embedder) else None,
            worker=worker,
            budget=budget,
            model_lock=model_lock,
        )
        return Lane(pipeline, resources.pop_all())
