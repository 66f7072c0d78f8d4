"""The google-genai client for the Gemini Developer API, and its errors as ours (the key never shown)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from reindex.errors import BackendError, ConfigError, MissingDependency, ReindexError
from reindex_adapters.remote.errors import ProviderBusy, ProviderNotFound
from reindex_adapters.remote.keys import redact

if TYPE_CHECKING:
    from google.genai import Client
    from google.genai.errors import APIError

API_VERSION = "v1beta"  # where the Batch API's REST reference places models.asyncBatchEmbedContent
RETRY_DELAY = re.compile(r"^(\d+(?:\.\d+)?)s$")
KEY_PATTERN = re.compile(r"\bAIza[0-9A-Za-z_\-]{8,}")


@contextmanager
def translated_errors(secret: str, key_env: str) -> Iterator[None]:
    """The SDK's errors as ours, once; no message carries the key."""
    from google.genai import errors

    try:
        yield
    except errors.APIError as exc:  # not chained: its message may echo the request
        raise _status_error(exc, secret, key_env) from None
    except _transport_errors() as exc:  # timeouts, refused and dropped connections
        raise ProviderBusy(f"{type(exc).__name__}: {_clean(str(exc), secret)}") from None


def _status_error(exc: APIError, secret: str, key_env: str) -> ReindexError:
    code = int(exc.code or 0)
    message = f"HTTP {code} {exc.status or ''}: {_clean(str(exc.message or ''), secret)}".replace(" :", ":")
    if code in (408, 409, 429) or code >= 500:
        return ProviderBusy(message, retry_after=retry_delay(exc.details), status=code)
    if code in (401, 403) or "API key not valid" in message:
        return ConfigError(f"the Gemini API refused the API key (HTTP {code})", hint=f"check ${key_env}")
    if code == 404:
        return ProviderNotFound(message, hint="check model and base_url")
    if code == 400:
        return ConfigError(f"the Gemini API refused the request: {message}", hint="check [embedder]")
    return BackendError(message)


def retry_delay(body: Any) -> float | None:
    """Seconds from the google.rpc.RetryInfo detail of an error body (`"retryDelay": "12s"`), if any."""
    error = body.get("error", body) if isinstance(body, dict) else {}
    details = error.get("details") if isinstance(error, dict) else None
    for detail in details if isinstance(details, list) else []:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("google.rpc.RetryInfo"):
            match = RETRY_DELAY.match(str(detail.get("retryDelay", "")))
            if match:
                return float(match.group(1))
    return None


def _clean(message: str, secret: str) -> str:
    return KEY_PATTERN.sub("AIza***", redact(message, secret))


@functools.cache
def _transport_errors() -> tuple[type[BaseException], ...]:
    found: list[type[BaseException]] = []
    for module in ("httpx2", "httpx"):
        try:
            found.append(__import__(module).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def make_client(base_url: str | None, key_env: str, timeout_s: float) -> Client:
    """The SDK's client for the Gemini Developer API (its retries are off by default: pacing is ours)."""
    try:
        import google.genai as genai
    except ImportError as exc:
        raise MissingDependency("google-genai", extra="gemini") from exc
    from reindex_adapters.remote.keys import api_key

    options = genai.types.HttpOptions(
        api_version=API_VERSION, timeout=int(timeout_s * 1000), base_url=base_url
    )
    return genai.Client(api_key=api_key(key_env), http_options=options)
