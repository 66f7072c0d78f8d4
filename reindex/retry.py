"""The one retry policy for backend calls: `retrying`, jittered exponential backoff on TransientError."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import stamina

from reindex.errors import TransientError

T = TypeVar("T")


def retrying(function: Callable[..., T], *args: Any) -> T:
    """The one retry policy: jittered exponential backoff on TransientError, bounded in attempts and time."""
    for attempt in stamina.retry_context(on=TransientError, attempts=6, timeout=120.0):
        with attempt:
            return function(*args)
    raise AssertionError("unreachable: stamina re-raises the last error")
