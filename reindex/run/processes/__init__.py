"""The `processes` engine: the local engine on every core of this machine, the model in its own process.

    coordinator ──task──► worker 1..N (lanes: read → screen → claim → tokenize → [model] → write → record)
         ▲                      │  tokens (arrays), one request per batch
         └──── shard counts ────┤
                                ▼
                         model process per GPU (one on a CPU-only machine): pre-tokenised, length-sorted
                         batches, the next launched while the current computes; vectors back as one array

The coordinator plans the shards in the ledger (`reindex.run.planning`, as the ray engine does), hands each
planned shard to a worker over that worker's pipe and counts what comes back: O(1) Python work per shard.
Workers are the pipeline's own stage functions (`Pipeline.run_shard`), each lane with its own connections,
claims in the ledger (dedupe across processes), the shard recorded only after its rows were written, every
ledger write fenced with the coordinator's lease. A model that runs on a device (its `traits.device`) is loaded
once per GPU in a model process the workers feed; other embedders (the free hash kind) run inside each
worker. Workers are forked from a fork server that imported this package once. An online provider, Qdrant
local mode and vLLM keep the one-process pipeline (`engine.workers_for` says why).

Faults: a worker or model process that dies ends the run resumably (exit 75) naming the process and the
shards it held, after the other workers finished theirs (a worker that held none leaves the others to
finish); nothing is marked done that was not written. A killed coordinator takes its processes along (the
kernel's parent-death signal), and the rerun redoes the shards in flight. SIGTERM stops the feeding, shards
not yet started go back unread, the ones in flight land, and the run exits 75.

    engine.py   which engine a run gets, and how many workers (`workers_for`)
    coordinator.py   the processes, the feeding, the counting, the faults
    worker.py   a worker process: its lanes and the pipe to the coordinator
    device.py   the model process and the workers' client of it (`DeviceClient`)
"""

from __future__ import annotations

from reindex.run.processes.coordinator import run, workers_at
from reindex.run.processes.engine import Choice, cores, default_workers, uses_processes, workers_for

__all__ = ["Choice", "cores", "default_workers", "run", "uses_processes", "workers_at", "workers_for"]
