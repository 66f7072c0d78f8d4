"""How many embedding actors a ray run gets: `[ray] actors` when pinned, else what the cluster holds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reindex.config import RayConfig
from reindex.run.ray.cluster import _LOCAL_ADDRESSES


def slots(settings: RayConfig, resources: Mapping[str, float]) -> int:
    """Actors the cluster's resources hold now: one per `gpus_per_actor` GPUs, else per `cpus_per_actor` CPUs
    once a read task's CPUs are set aside (at least one)."""
    if settings.gpus_per_actor > 0:
        return max(1, int(resources.get("GPU", 0) // settings.gpus_per_actor))
    if settings.cpus_per_actor <= 0:
        return 1
    return max(1, int((resources.get("CPU", 1) - settings.cpus_per_task) // settings.cpus_per_actor))


def pool_size(settings: RayConfig, resources: Mapping[str, float]) -> dict[str, Any]:
    """The actor pool's size: pinned by `[ray] actors`, else what the cluster holds now, and on a cluster
    given by address, growing as nodes join (Ray Data adds actors while shards wait and resources are free;
    an actor on a node that leaves is restarted elsewhere). A local Ray's machine does not grow."""
    if settings.actors is not None:
        return {"size": settings.actors}
    now = slots(settings, resources)
    if settings.address in _LOCAL_ADDRESSES:
        return {"size": now}
    return {"min_size": 1, "max_size": None, "initial_size": now}
