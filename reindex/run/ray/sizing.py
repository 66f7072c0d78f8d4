"""How many embedding actors a ray run gets: `[ray] actors` when pinned, else what the cluster holds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reindex.config import RayConfig


def slots(settings: RayConfig, resources: Mapping[str, float]) -> int:
    """Actors the cluster's resources hold now: one per `gpus_per_actor` GPUs, else per `cpus_per_actor` CPUs
    once a read task's CPUs are set aside (at least one)."""
    if settings.gpus_per_actor > 0:
        return max(1, int(resources.get("GPU", 0) // settings.gpus_per_actor))
    if settings.cpus_per_actor <= 0:
        return 1
    return max(1, int((resources.get("CPU", 1) - settings.cpus_per_task) // settings.cpus_per_actor))


def pool_size(settings: RayConfig, resources: Mapping[str, float]) -> dict[str, Any]:
    """The actor pool's size: pinned by `[ray] actors`, else what the cluster holds when the run starts. The
    pool is fixed for the run: an autoscaling one (min_size < max_size) hung now and then when a node died
    mid-run, the pool's own scale-down killing (`ray.kill`) an actor whose shard was being retried, and the
    retry waiting on it for ever (tests/ray/test_ray_cluster.py, under load; Ray Data keeps dead actors in a
    pool, ray-project/ray#62746). An actor on a node that leaves is restarted elsewhere either way."""
    if settings.actors is not None:
        return {"size": settings.actors}
    return {"size": slots(settings, resources)}
