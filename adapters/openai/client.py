"""The OpenAI endpoint: the SDK client and its errors made ours, request limits, list prices, and a model's
identity (dim and fingerprint), shared by the `openai`, `openai-batch` and `azure-openai` embedders."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from pydantic import Field

from reindex.errors import BackendError, ConfigError, MissingDependency, ReindexError
from reindex.fingerprint import fingerprint
from reindex.offers import Entry
from reindex.ports import EmbedderInfo, TokenCounts
from reindex_adapters.remote.endpoint import ProviderEndpoint
from reindex_adapters.remote.errors import ProviderBusy, ProviderNotFound, ProviderRejected, retry_after
from reindex_adapters.remote.keys import api_key, redact
from reindex_adapters.remote.pacing import Paced, Pacer
from reindex_adapters.remote.tokens import request_groups as request_groups  # openai.batch and .online use it

if TYPE_CHECKING:
    from openai import APIStatusError, OpenAI

KNOWN_DIMS = {"text-embedding-3-small": 1536, "text-embedding-3-large": 3072, "text-embedding-ada-002": 1536}
OPENAI_OPTIONS = (
    Entry("base_url", "http://127.0.0.1:8089/v1", "any OpenAI-compatible endpoint", is_example=True),
    Entry("dimensions", 512, "text-embedding-3 shortening (part of the fingerprint)", is_example=True),
)  # the options `reindex init` shows as examples
PRICES_TAKEN = "2026-11-29"
PRICES: dict[str, dict[str, float]] = {  # USD per 1M input tokens, list prices on PRICES_TAKEN
    "text-embedding-3-small": {"online": 0.02, "batch": 0.01},
    "text-embedding-3-large": {"online": 0.13, "batch": 0.065},
    "text-embedding-ada-002": {"online": 0.10, "batch": 0.05},
}
MAX_INPUTS = 2048  # per request
MAX_REQUEST_TOKENS = 300_000


def price_per_million(
    model: str, *, batch: bool, overrides: Mapping[str, Mapping[str, float]] | None = None
) -> float | None:
    """USD per 1M input tokens: `overrides[model]["batch"|"online"]`, else the list price, else None."""
    mode = "batch" if batch else "online"
    for table in (overrides or {}, PRICES):
        price = table.get(model, {}).get(mode)
        if price is not None:
            return float(price)
    return None


def prices_for(model: str, overrides: Mapping[str, float] | None) -> dict[str, float | None]:
    """Online and batch USD per 1M tokens for `model`: the config's override, else the list price."""
    table = {model: dict(overrides)} if overrides else None
    return {
        tier: price_per_million(model, batch=tier == "batch", overrides=table) for tier in ("online", "batch")
    }


def resolve_dim(model: str, dimensions: int | None, dim: int | None) -> int:
    if dimensions is not None and dim is not None and dimensions != dim:
        raise ConfigError(f"dimensions={dimensions} and dim={dim} disagree", hint="set only dimensions")
    resolved = dimensions or dim or KNOWN_DIMS.get(model)
    if resolved is None:
        raise ConfigError(f"the output dimension of model {model!r} is unknown", hint="set dim in [embedder]")
    return resolved


def token_counts(model: str, tokenizer: str) -> TokenCounts:
    """Exact for OpenAI's own embedding models counted in cl100k_base (their tokenizer, tiktoken's model
    table); for another model a server names, an estimate in `tokenizer`."""
    if model in KNOWN_DIMS and tokenizer == "cl100k_base":
        return TokenCounts(True, f"cl100k_base, {model}'s own tokenizer")
    return TokenCounts(False, f"estimate: {tokenizer} (not known to be {model}'s tokenizer)")


def model_info(
    kind: str, model: str, dim: int, max_tokens: int, dimensions: int | None, tokenizer: str
) -> EmbedderInfo:
    """Identity is model, dim, `dimensions` and the truncation rule, hashed as "openai" for both kinds.

    The batch and online endpoints serve the same model, so switching between them keeps the target.
    `base_url` is left out on purpose: it says where the model is served, not what it computes (the
    same model on OpenAI or Azure gives the same vectors; a self-hosted server names its model).
    """
    options = {"dimensions": dimensions, "max_tokens": max_tokens, "tokenizer": tokenizer}
    identity = fingerprint("openai", model, dim, options)
    return EmbedderInfo(kind, model, dim, max_tokens, identity, options)


@contextmanager
def translated_errors(secret: str, key_env: str) -> Iterator[None]:
    """Make the SDK's exceptions ours, once; no message ever carries the key."""
    import openai

    try:
        yield
    except openai.APIStatusError as exc:  # not chained: its message may echo the key
        raise _status_error(exc, secret, key_env) from None
    except openai.APIConnectionError as exc:  # timeouts included
        raise ProviderBusy(f"{type(exc).__name__}: {redact(str(exc), secret)}") from None


def _status_error(exc: APIStatusError, secret: str, key_env: str) -> ReindexError:
    status = exc.status_code
    body = exc.body if isinstance(exc.body, dict) else {}
    message = f"HTTP {status}: {redact(str(body.get('message') or exc.message), secret)}"
    if status in (408, 409, 429) or status >= 500:
        return ProviderBusy(message, retry_after=retry_after(exc.response.headers), status=status)
    if status in (401, 403):
        return ConfigError(f"the endpoint refused the API key (HTTP {status})", hint=f"check ${key_env}")
    if status == 404:
        return ProviderNotFound(
            message, hint="check model and base_url (Azure: deployment and azure_endpoint)"
        )
    if status in (400, 413, 422) and exc.param not in (None, "input"):
        return ConfigError(f"the endpoint refused {exc.param!r}: {message}", hint="check [embedder]")
    if status in (400, 413, 422):
        return ProviderRejected(message, code=str(exc.code or exc.type or f"http_{status}"))
    return BackendError(message)


class Endpoint(ProviderEndpoint):
    """One OpenAI-compatible API: the client, through the pacer and the error translation."""

    def __init__(self, client: OpenAI, pacer: Pacer, key_env: str) -> None:
        super().__init__(pacer, key_env, client.api_key, translated_errors)
        self.client = client


def make_client(base_url: str | None, key_env: str, timeout_s: float) -> OpenAI:
    """An SDK client with its own retries off (pacing is ours); the key comes only from `key_env`."""
    try:
        from openai import OpenAI
    except ImportError as exc:
        raise MissingDependency("openai", extra="openai") from exc
    return OpenAI(api_key=api_key(key_env), base_url=base_url, max_retries=0, timeout=timeout_s)


class Settings(Paced):
    model: str
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    dimensions: int | None = Field(default=None, gt=0)  # sent to the API (text-embedding-3 shortening)
    dim: int | None = Field(default=None, gt=0)  # the output size when neither known nor `dimensions`
    max_tokens: int = Field(default=8191, gt=0)
    timeout_s: float = Field(default=60.0, gt=0)
    tokenizer: str = "cl100k_base"  # exact for OpenAI models; an estimate for other served models
    prices: dict[str, float] | None = (
        None  # {"online": x, "batch": y} USD per 1M tokens; else configs/pricing.toml
    )
