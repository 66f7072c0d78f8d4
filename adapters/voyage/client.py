"""The Voyage API: the official SDK for /v1/embeddings, httpx for the Files and Batch APIs, one pacer, and
the one error translation.

The `voyageai` SDK (0.5.0, the newest release) covers embed, rerank, contextualized and multimodal embeddings
and tokenizers, but no Files or Batch API (`voyageai/client.py`), so those calls are plain HTTP with httpx,
as Voyage's reference gives them (docs.voyageai.com/reference: upload-file, retrieve-file-content,
delete-file, create-batch, retrieve-batch, list-batches). Every error body is `{"detail": <message>}`; the
status says the rest (docs.voyageai.com/docs/error-codes): 400 invalid request, 401/403 the key or the
address, 429 rate limit, 500/502/503/504 the servers.
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from reindex.errors import BackendError, ConfigError, MissingDependency, ReindexError
from reindex_adapters.remote.endpoint import ProviderEndpoint
from reindex_adapters.remote.errors import ProviderBusy, ProviderNotFound, ProviderRejected, retry_after
from reindex_adapters.remote.keys import api_key, redact
from reindex_adapters.remote.lines import json_line
from reindex_adapters.remote.pacing import Pacer

if TYPE_CHECKING:
    import httpx
    from voyageai.client import Client

DEFAULT_BASE_URL = "https://api.voyageai.com/v1"
ATLAS_BASE_URL = (
    "https://ai.mongodb.com/v1"  # the SDK's default for MongoDB Atlas keys ("al-", voyageai/util.py)
)
# Words of a 400's message that name a request parameter, not an input: the section is wrong, not the text
# the opening of every real Voyage 400 message; what follows it is the reason
_MODEL_FAILED = re.compile(r"^\s*Request to model '[^']*' failed\.\s*")
TOO_LARGE_CODES = frozenset({"TOO_MANY_TOKENS_IN_BATCH"})  # Voyage's error_code for the per-request token cap
PARAMETER_WORDS = ("model", "input_type", "output_dimension", "output_dtype", "encoding_format", "truncation")


def base_url_for(base_url: str | None, key: str) -> str:
    if base_url:
        return base_url.rstrip("/")
    return ATLAS_BASE_URL if key.startswith("al-") else DEFAULT_BASE_URL


class VoyageApi(ProviderEndpoint):
    """One Voyage endpoint: its base URL, the key (from `key_env` only), the pacer every call waits on.

    `http` is an httpx client for the Files and Batch APIs; `sdk()` builds the SDK client for embeddings
    on first use (its import costs a second)."""

    def __init__(
        self, http: httpx.Client, base_url: str, secret: str, key_env: str, pacer: Pacer, timeout_s: float
    ) -> None:
        super().__init__(pacer, key_env, secret, translated_errors)
        self.http, self.base_url, self._timeout_s = http, base_url, timeout_s
        self._sdk: Client | None = None
        weakref.finalize(self, http.close)  # its pooled connections, when the embedder goes

    @classmethod
    def connect(cls, base_url: str | None, key_env: str, timeout_s: float, pacer: Pacer) -> VoyageApi:
        import httpx

        key = api_key(key_env)
        url = base_url_for(base_url, key)
        http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=timeout_s)
        return cls(http, url, key, key_env, pacer, timeout_s)

    def sdk(self) -> Client:
        """The SDK client, its retries off (pacing and retries are the pacer's)."""
        if self._sdk is None:
            try:
                from voyageai.client import Client
            except ImportError as exc:
                raise MissingDependency("voyageai", extra="voyage") from exc
            self._sdk = Client(
                api_key=self._secret, max_retries=0, timeout=self._timeout_s, base_url=self.base_url
            )
        return self._sdk

    # the Files and Batch APIs ---------------------------------------------------------------------------

    def send(self, method: str, path: str, *, timeout: float | None = None, **options: Any) -> httpx.Response:
        """One HTTP request; a 4xx/5xx answer raised as ours. Call inside `once`/`call`."""
        if timeout is not None:
            options["timeout"] = timeout
        response = self.http.request(method, path, **options)
        if response.status_code >= 400:
            detail, code = _detail(response.content), _error_code(response.content)
            raise status_error(
                response.status_code, detail, response.headers, self._secret, self.key_env, error_code=code
            )
        return response

    def json(self, method: str, path: str, **options: Any) -> dict[str, Any]:
        body = json_line(self.send(method, path, **options).content)
        if body is None:
            raise BackendError(f"the Voyage API answered {method} {path} with something that is not JSON")
        return body

    def upload(self, name: str, content: bytes) -> str:
        """Upload a batch input file; its id. Retried like a read: an upload whose answer was lost leaves an
        unused file, which costs storage only and is deleted by Voyage after 30 days."""
        upload = functools.partial(
            self.json,
            "POST",
            "/files",
            files={"file": (name, content, "application/jsonl")},
            data={"purpose": "batch"},
        )
        return str(self.call(upload)["id"])

    def download(self, file_id: str) -> bytes:
        return self.call(functools.partial(self.send, "GET", f"/files/{file_id}/content")).content

    def delete(self, file_id: str) -> None:
        self.call(functools.partial(self.send, "DELETE", f"/files/{file_id}"))

    def batch(self, batch_id: str) -> dict[str, Any]:
        return self.call(functools.partial(self.json, "GET", f"/batches/{batch_id}"))

    def batches(self, after: str | None, limit: int) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit, **({"after": after} if after else {})}
        return self.call(functools.partial(self.json, "GET", "/batches", params=params))


@contextmanager
def translated_errors(secret: str, key_env: str) -> Iterator[None]:
    """Make the SDK's and httpx's exceptions ours; no message carries the key (none is chained)."""
    import httpx

    sdk_error = _sdk_error_type()
    try:
        yield
    except httpx.TransportError as exc:  # timeouts included
        raise ProviderBusy(f"{type(exc).__name__}: {redact(str(exc), secret)}") from None
    except sdk_error as exc:
        status = getattr(exc, "http_status", None)
        if not isinstance(status, int):  # the SDK's Timeout and APIConnectionError
            raise ProviderBusy(f"{type(exc).__name__}: {redact(str(exc), secret)}") from None
        detail = str(getattr(exc, "user_message", None) or exc)
        headers = getattr(exc, "headers", None) or {}
        body = getattr(exc, "json_body", None)
        code = body.get("error_code") if isinstance(body, Mapping) else None
        raise status_error(
            status,
            detail,
            headers,
            secret,
            key_env,
            is_input=True,
            error_code=code if isinstance(code, str) else None,
        ) from None


def status_error(
    status: int,
    detail: str,
    headers: Mapping[str, str],
    secret: str,
    key_env: str,
    *,
    is_input: bool = False,
    error_code: str | None = None,
) -> ReindexError:
    """The error a status means. A 400 to an embeddings request names its inputs (ProviderRejected: split,
    isolated, then dead-lettered) unless its message names a request parameter, which no input can fix; to
    the Files and Batch APIs it is the request's fault (ConfigError).

    Every real Voyage 400 starts "Request to model '<model>' failed." (public captures:
    github.com/ramakay/claude-self-reflect/issues/38, 2025-08), so the parameter is looked for in what
    follows; the per-request token cap ("The max allowed tokens per submitted batch is N. Your batch has M
    tokens after truncation.", `error_code` TOO_MANY_TOKENS_IN_BATCH) is the request's size: split it."""
    detail = redact(detail, secret)
    message = f"HTTP {status}: {detail}"
    if status in (408, 409, 429) or status >= 500:
        return ProviderBusy(message, retry_after=retry_after(headers), status=status)
    if status in (401, 403):
        return ConfigError(f"the Voyage API refused the API key (HTTP {status})", hint=f"check ${key_env}")
    if status == 404:
        return ProviderNotFound(
            message, hint="check base_url (a deleted file or unknown batch: see the message)"
        )
    reason = _MODEL_FAILED.sub("", detail, count=1)
    too_large = error_code in TOO_LARGE_CODES or "max allowed tokens" in reason.lower()
    words = reason.lower().replace("after truncation", "")
    names_parameter = not too_large and any(word in words for word in PARAMETER_WORDS)
    if is_input and status in (400, 413, 422) and not names_parameter:
        return ProviderRejected(message, code=refusal_code(status, detail))
    return ConfigError(f"the Voyage API refused the request: {message}", hint="check [embedder]")


def refusal_code(status: int, detail: str) -> str:
    """Voyage's reason for refusing an input: its error type (docs.voyageai.com/docs/error-codes) and its
    message, which is all the reason it gives (no code field): `invalid_request: <message>`."""
    kind = {400: "invalid_request", 413: "too_large", 422: "malformed_request"}.get(status, f"http_{status}")
    text = " ".join(_MODEL_FAILED.sub("", detail, count=1).split())[:160]
    return f"{kind}: {text}" if text else kind


def _detail(content: bytes) -> str:
    body = json_line(content)
    if body is not None and body.get("detail") is not None:
        return str(body["detail"])
    return content.decode("utf-8", errors="replace")[:500]


def _error_code(content: bytes) -> str | None:
    body = json_line(content)
    code = body.get("error_code") if body is not None else None
    return code if isinstance(code, str) else None


def _sdk_error_type() -> type[Exception]:
    try:
        from voyageai.error import VoyageError
    except ImportError:  # the Files and Batch APIs work without the SDK
        return _NoSdkError
    return VoyageError


class _NoSdkError(Exception):
    """Never raised: stands for the SDK's errors when it is not installed."""
