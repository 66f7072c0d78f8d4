"""How many embedding actors a ray run gets (`reindex.run.ray.sizing`): the cluster's GPUs (CPUs on a CPU
cluster) when the run starts, unless `[ray] actors` pins it. Pure arithmetic over what
`ray.cluster_resources()` reports; the multi-node run in test_ray_cluster.py uses it for real."""

from __future__ import annotations

from reindex.config import RayConfig
from reindex.run.ray.sizing import pool_size, slots


def test_a_gpu_cluster_gets_an_actor_per_gpu_fixed_for_the_run() -> None:
    settings = RayConfig(address="ray://head:10001", gpus_per_actor=1)
    three_nodes = {"CPU": 48.0, "GPU": 3.0}
    assert slots(settings, three_nodes) == 3
    assert pool_size(settings, three_nodes) == {"size": 3}  # no autoscaling pool: see pool_size


def test_a_cpu_cluster_gets_an_actor_per_cpu_left_after_a_read_task() -> None:
    settings = RayConfig(address="auto", cpus_per_actor=2, cpus_per_task=1)
    assert slots(settings, {"CPU": 9.0}) == 4
    assert slots(settings, {"CPU": 1.0}) == 1  # never none


def test_a_local_ray_is_sized_once_and_a_pinned_pool_is_left_alone() -> None:
    assert pool_size(RayConfig(), {"CPU": 16.0}) == {"size": 15}
    assert pool_size(RayConfig(num_cpus=2), {"CPU": 2.0}) == {"size": 1}
    assert pool_size(RayConfig(actors=2, address="auto"), {"CPU": 64.0, "GPU": 8.0}) == {"size": 2}
