"""Bedrock's connection: boto3 clients (their retries off), S3 URIs, and botocore's errors made ours once."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from reindex.errors import BackendError, ConfigError, MissingDependency, ReindexError
from reindex_adapters.remote.errors import ProviderBusy, ProviderNotFound, ProviderRejected

if TYPE_CHECKING:
    from botocore.exceptions import ClientError

T = TypeVar("T")
S3_URI = re.compile(r"s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(.*))?")
BUSY_CODES = frozenset(
    {"ThrottlingException", "ServiceUnavailableException", "ModelNotReadyException", "ModelTimeoutException"}
)


def split_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, prefix without slashes at either end)."""
    match = S3_URI.fullmatch(uri)
    if match is None:
        raise ConfigError(f"{uri!r} is not an S3 URI", hint="write s3://<bucket>/<prefix>")
    return match.group(1), (match.group(2) or "").strip("/")


class ClientSettings(Protocol):
    """What `make_clients` reads of a `BedrockBatchEmbedder.Config`."""

    @property
    def region(self) -> str: ...
    @property
    def endpoint_url(self) -> str | None: ...
    @property
    def s3_endpoint_url(self) -> str | None: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def create_timeout_s(self) -> float: ...


def make_clients(config: ClientSettings) -> dict[str, Any]:
    """boto3 clients with their own retries off (pacing is ours); credentials from boto3's usual chain."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:
        raise MissingDependency("boto3", extra="bedrock") from exc

    def client(service: str, endpoint: str | None, timeout: float) -> Any:
        options = Config(retries={"total_max_attempts": 1}, connect_timeout=timeout, read_timeout=timeout)
        return boto3.client(service, region_name=config.region, endpoint_url=endpoint, config=options)

    return {
        "bedrock": client("bedrock", config.endpoint_url, config.timeout_s),
        "bedrock-create": client("bedrock", config.endpoint_url, config.create_timeout_s),
        "bedrock-runtime": client("bedrock-runtime", config.endpoint_url, config.timeout_s),
        "s3": client("s3", config.s3_endpoint_url, config.timeout_s),
    }


def once(request: Callable[[], T]) -> T:
    with translated_errors():
        return request()


# errors -------------------------------------------------------------------------------------------------


@contextmanager
def translated_errors() -> Iterator[None]:
    """botocore's exceptions, made ours once: 429/5xx/timeouts retried, refusals of an input kept by code."""
    from botocore import exceptions

    try:
        yield
    except exceptions.ClientError as exc:
        raise _client_error(exc) from None
    except (exceptions.NoCredentialsError, exceptions.PartialCredentialsError) as exc:
        raise ConfigError(f"AWS credentials: {exc}", hint="set AWS_PROFILE or the AWS_* variables") from None
    except (exceptions.ConnectionError, exceptions.HTTPClientError) as exc:  # timeouts included
        raise ProviderBusy(f"{type(exc).__name__}: {exc}") from None


def _client_error(exc: ClientError) -> ReindexError:
    error = exc.response.get("Error", {})
    meta = exc.response.get("ResponseMetadata", {})
    code, status = str(error.get("Code") or "unknown"), int(meta.get("HTTPStatusCode") or 0)
    message = f"HTTP {status} {code}: {error.get('Message', '')}"
    if status == 429 or status >= 500 or code in BUSY_CODES:
        hint = _retry_after(meta.get("HTTPHeaders", {}))
        return ProviderBusy(
            message, retry_after=hint, status=429 if code == "ThrottlingException" else status
        )
    if status in (401, 403) or code in ("AccessDeniedException", "UnrecognizedClientException"):
        return ConfigError(f"AWS refused the request: {message}", hint="check the credentials and role_arn")
    if code == "ResourceNotFoundException" or status == 404:  # S3: NoSuchKey, NoSuchBucket
        return ProviderNotFound(message, hint="check model, region and endpoint_url")
    if code == "ConflictException":
        return JobNameTaken(message)
    return ProviderRejected(message, code=code)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


class JobNameTaken(BackendError):
    """CreateModelInvocationJob's ConflictException: a job with this name exists; adopt it."""
