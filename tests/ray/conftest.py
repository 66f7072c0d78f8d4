"""One local Ray per test module (starting one costs seconds on two cores): the engine joins a Ray that is
already running in its process and leaves it running. Modules that build their own cluster do not use it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray = pytest.importorskip("ray", reason="the ray extra is installed by scripts/setup")
    ray.init(
        address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False
    )
    yield
    ray.shutdown()
