"""Ray itself for the `ray` engine: imported lazily (MissingDependency without the `ray` extra), and the
cluster a run joins, or the local Ray it starts and shuts down."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from reindex.config import Config
from reindex.errors import MissingDependency

LOCAL_ADDRESSES = (None, "local")


@contextmanager
def cluster(ray: Any, config: Config) -> Iterator[None]:
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
        if settings.address in LOCAL_ADDRESSES:  # "local": never join a Ray another process runs here
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
