"""A worker node lost mid-run on a real multi-node cluster (`ray.cluster_utils.Cluster` on this machine):
with SIGTERM to its raylet, or gone without warning. Its shards run elsewhere; the run ends complete,
reconciled, no shard recorded twice, and equal to a local-engine run of the same source."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reindex import commands
from reindex.run.pipeline import Progress
from tests.ray.test_ray_engine import config, corpus
from tests.ray.test_ray_faults import complete_and_equal_to_local

ray = pytest.importorskip("ray", reason="the ray extra is installed by scripts/setup")


@pytest.fixture(scope="module")
def nodes() -> Iterator[Any]:
    """A head with no CPU (so every actor runs on a worker node) and two worker nodes of one CPU each."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.mark.parametrize("graceful", [False, True], ids=["gone-without-warning", "sigterm"])
def test_a_worker_node_lost_mid_run_has_its_shards_run_elsewhere(
    tmp_path: Path, pg_dsn: str, nodes: Any, graceful: bool
) -> None:
    while len(nodes.worker_nodes) < 2:  # the other case took one away: one actor, one spare node
        nodes.add_node(num_cpus=1)
    nodes.wait_for_nodes()
    source = corpus(tmp_path / "docs.jsonl", 400)
    cluster = config(
        tmp_path,
        pg_dsn,
        source,
        alias="ray_docs",
        engine="ray",
        state=pg_dsn,  # several nodes: the Postgres ledger
        shard_size=20,
        address=nodes.address,
        cpus_per_actor=1,
        num_cpus=None,
    )
    removed: list[Any] = []

    def lose_a_node(progress: Progress) -> None:
        """Remove the worker node that runs the embedding actor: its shard in flight dies with it."""
        busy = {key.split("/")[0].split(":")[-1] for key in getattr(progress, "workers", {})}
        hosting = [node for node in nodes.worker_nodes if node.node_id[:8] in busy]
        if hosting and not removed:
            nodes.remove_node(hosting[0], allow_graceful=graceful)
            removed.append(hosting[0])

    report = commands.run(cluster, on_progress=lose_a_node)
    assert removed and report.reconciled
    workers = {w["worker"].split("/")[0] for w in commands.status(cluster).workers}
    assert len(workers) == 2, f"the shards did not move to another node: {workers}"
    complete_and_equal_to_local(tmp_path, pg_dsn, source, cluster)


def test_an_unpinned_actor_pool_spreads_over_every_node(tmp_path: Path, pg_dsn: str, nodes: Any) -> None:
    """`[ray] actors` left out: the pool is sized to the cluster (here three half-CPU actors on two
    one-CPU nodes, a read task's half CPU set aside), so both nodes embed; a pinned pool of 1 did all the
    shards on one node."""
    while len(nodes.worker_nodes) < 2:
        nodes.add_node(num_cpus=1)
    nodes.wait_for_nodes()
    source = corpus(tmp_path / "docs.jsonl", 300)
    cluster = config(
        tmp_path,
        pg_dsn,
        source,
        alias="ray_spread",
        engine="ray",
        state=pg_dsn,
        shard_size=10,
        address=nodes.address,
        cpus_per_actor=0.5,
        cpus_per_task=0.5,
        num_cpus=None,
    )
    assert commands.run(cluster).reconciled
    hosts = {w["worker"].split("/")[0] for w in commands.status(cluster).workers}
    assert len(hosts) == 2, f"one node did every shard: {hosts}"
