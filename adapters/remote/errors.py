"""What a provider's refusal becomes: ProviderBusy (wait and retry), ProviderRejected (the input itself),
ProviderNotFound; and the Retry-After a busy answer carries."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping

from reindex.errors import BackendError, ConfigError, TransientError


class ProviderBusy(TransientError):
    """429, 5xx, timeouts, dropped connections: wait (Retry-After when given) and try again."""

    def __init__(self, message: str, *, retry_after: float | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.retry_after, self.status = retry_after, status


class ProviderRejected(BackendError):
    """The endpoint refused the inputs themselves (400/413/422); `code` names why."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


class ProviderNotFound(ConfigError):
    """A 404: a wrong model or base_url online; a deleted file for the Batch API."""


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from `retry-after-ms`, or `retry-after` (seconds or an HTTP date)."""
    millis, value = headers.get("retry-after-ms"), headers.get("retry-after")
    try:
        if millis:
            return max(0.0, float(millis) / 1000)
        if value:
            return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None
    return None
