"""Cohere's API: the SDK client (its retries off), its errors made ours, the models, list prices and a model's
identity, shared by the `cohere` (online /v2/embed) and `cohere-batch` (Embed Jobs) embedders.

Names are those of the `cohere` SDK 7.3: `cohere.ClientV2(api_key=, base_url=, max_retries=, timeout=)`,
`client.embed(...)` (POST /v2/embed), `client.datasets.*` (/v1/datasets) and `client.embed_jobs.*`
(/v1/embed-jobs). Every SDK error is a `cohere.core.api_error.ApiError` with `status_code`, `headers`, `body`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from reindex.errors import ConfigError, MissingDependency, ReindexError
from reindex.fingerprint import fingerprint
from reindex.offers import Entry
from reindex.ports import EmbedderInfo, TokenCounts, Tokens
from reindex_adapters.remote.endpoint import ProviderEndpoint
from reindex_adapters.remote.errors import ProviderBusy, ProviderNotFound, ProviderRejected, retry_after
from reindex_adapters.remote.keys import api_key, redact
from reindex_adapters.remote.pacing import Paced, Pacer
from reindex_adapters.remote.tokens import encoding, tokenize_texts

if TYPE_CHECKING:
    from cohere import ClientV2
    from cohere.core.api_error import ApiError

# model -> (dim, max tokens per input): Cohere's model pages; embed-v4.0 also takes output_dimension
MODELS: dict[str, tuple[int, int]] = {
    "embed-english-v3.0": (1024, 512),
    "embed-multilingual-v3.0": (1024, 512),
    "embed-english-light-v3.0": (384, 512),
    "embed-multilingual-light-v3.0": (384, 512),
    "embed-v4.0": (1536, 128_000),
}
BATCH_MODELS = frozenset(model for model in MODELS if model.endswith("-v3.0"))  # "only ... embed v3.0 models"
OUTPUT_DIMENSIONS = (256, 512, 1024, 1536)  # embed-v4.0's sizes
# USD per 1M input tokens on PRICES_TAKEN, from third-party listings of Cohere's prices (configs/pricing.toml says
# which): Embed Jobs are not documented as discounted, so their batch price is the online one. embed-v4.0 has no
# batch row: Embed Jobs take only the v3.0 models. The light models have no listed price: set `prices`.
COHERE_OPTIONS = (  # the options `reindex init` shows as examples
    Entry(
        "input_type",
        "search_document",
        "how Cohere embeds stored texts (part of the fingerprint)",
        is_example=True,
    ),
)
PRICES_TAKEN = "2026-12-06"
PRICES: dict[str, dict[str, float]] = {
    "embed-english-v3.0": {"online": 0.10, "batch": 0.10},
    "embed-multilingual-v3.0": {"online": 0.10, "batch": 0.10},
    "embed-v4.0": {"online": 0.12},
}
MAX_TEXTS = 96  # per /v2/embed request ("Maximum number of texts per call is 96")
DEFAULT_BASE_URL = "https://api.cohere.com"
InputType = Literal["search_document", "search_query", "classification", "clustering"]


class Settings(Paced):
    """What both Cohere kinds take: the model and what changes its vectors, the endpoint, the key."""

    model: str = "embed-english-v3.0"
    input_type: InputType = "search_document"  # v3+ models need it; it changes the vectors
    truncate: Literal["END", "START"] = "END"  # what Cohere cuts from an input over the model's limit
    output_dimension: int | None = None  # embed-v4.0 only: 256, 512, 1024 or 1536 (default 1536)
    max_tokens: int | None = Field(default=None, gt=0)  # cut point counted with cl100k_base; default: model's
    base_url: str | None = None  # the SDK's own option; None is https://api.cohere.com
    api_key_env: str = "CO_API_KEY"
    timeout_s: float = Field(default=60.0, gt=0)
    prices: dict[str, float] | None = None  # {"online": x, "batch": y} USD per 1M tokens

    @model_validator(mode="after")
    def _known_model(self) -> Settings:
        if self.model not in MODELS:
            raise ValueError(
                f"model {self.model!r} is not a Cohere embed model; use one of: {', '.join(MODELS)}"
            )
        if self.output_dimension is not None and (
            self.model != "embed-v4.0" or self.output_dimension not in OUTPUT_DIMENSIONS
        ):
            raise ValueError("output_dimension is embed-v4.0's only, one of 256, 512, 1024, 1536")
        return self


def model_info(kind: str, config: Settings) -> EmbedderInfo:
    """Identity is the model, its size and what the request asks of it, hashed as "cohere" for both kinds:
    the online endpoint and Embed Jobs serve the same model, so switching between them keeps the target."""
    dim, limit = MODELS[config.model]
    dim = config.output_dimension or dim
    max_tokens = min(config.max_tokens or limit, limit)
    options = {
        "input_type": config.input_type,
        "truncate": config.truncate,
        "embedding_type": "float",
        "output_dimension": config.output_dimension,
        "max_tokens": max_tokens,
        "tokenizer": "cl100k_base",
    }
    return EmbedderInfo(
        kind, config.model, dim, max_tokens, fingerprint("cohere", config.model, dim, options), options
    )


def prices_for(model: str, overrides: Mapping[str, float] | None) -> dict[str, float | None]:
    """Online and batch USD per 1M tokens: the config's override, else the list price, else None."""
    listed = PRICES.get(model, {})
    return {tier: (overrides or listed).get(tier) for tier in ("online", "batch")}


COUNTS = TokenCounts(False, "estimate: cl100k_base (Cohere's tokenizer is fetched from the network)")


def tokenizer() -> Any:
    """cl100k_base: Cohere's own tokenizer is fetched from the network (`client.fetch_tokenizer`), so counts
    offline are estimates; what was billed comes from Cohere's `meta.billed_units`."""
    try:
        import tiktoken  # noqa: F401  (the cohere extra's; reindex_adapters.remote.tokens names the openai extra)
    except ImportError as exc:
        raise MissingDependency("tiktoken", extra="cohere") from exc
    return encoding("cl100k_base")


def tokenize(texts: Sequence[str], codec: Any, max_tokens: int) -> list[Tokens]:
    return tokenize_texts(texts, codec, max_tokens)


class Api(ProviderEndpoint):
    """The SDK client, through the pacer and the one error translation. `call` and `once` take
    `rejects_input=True` where a 400/422 refuses the inputs sent (ProviderRejected), not the configuration."""

    def __init__(self, client: ClientV2, pacer: Pacer, key_env: str) -> None:
        token = getattr(getattr(client, "_client_wrapper", None), "_token", "")  # the SDK keeps it private
        super().__init__(pacer, key_env, token, translated_errors)
        self.client = client


@contextmanager
def translated_errors(secret: str, key_env: str, *, rejects_input: bool = False) -> Iterator[None]:
    """Make the SDK's exceptions ours; no message carries the key."""
    import httpx
    from cohere.core.api_error import ApiError

    try:
        yield
    except ApiError as exc:  # not chained: its body may echo the key
        raise status_error(exc, secret, key_env, rejects_input=rejects_input) from None
    except httpx.TransportError as exc:  # timeouts included
        raise ProviderBusy(f"{type(exc).__name__}: {redact(str(exc), secret)}") from None


def status_error(exc: ApiError, secret: str, key_env: str, *, rejects_input: bool = False) -> ReindexError:
    status = exc.status_code or 0
    text = redact(message_of(exc.body), secret)
    message = f"HTTP {status}: {text}"
    if status in (408, 409, 429, 499) or status >= 500 or status == 0:
        headers = {str(k).lower(): str(v) for k, v in (exc.headers or {}).items()}
        return ProviderBusy(message, retry_after=retry_after(headers), status=status or None)
    if status in (401, 403, 498):  # 498: Cohere's "invalid token"
        return ConfigError(f"the Cohere API refused the API key (HTTP {status})", hint=f"check ${key_env}")
    if status == 402:
        return ConfigError(f"the Cohere API asks for payment: {message}", hint="add billing to the account")
    if status == 404:
        return ProviderNotFound(message, hint="check base_url and model")
    if rejects_input and status in (400, 413, 422):
        return ProviderRejected(message, code=refusal_code(text, status))
    return ConfigError(f"the Cohere API refused the request: {message}", hint="check [embedder]")


def message_of(body: Any) -> str:
    """Cohere's error body is `{"message": "..."}` (sometimes with an `id`); else the body as text."""
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(body)[:500]


def refusal_code(message: str, status: int) -> str:
    """A short code from Cohere's message, whose first words name the kind of refusal ("invalid request: ...",
    "too many tokens: ..."): `invalid_request`, `too_many_tokens`; else `http_<status>`."""
    head = message.split(":", 1)[0].strip().lower()
    if ":" in message and re.fullmatch(r"[a-z][a-z ]{2,40}", head):
        return head.replace(" ", "_")
    return f"http_{status}"


def make_client(base_url: str | None, key_env: str, timeout_s: float) -> ClientV2:
    """An SDK client with its retries off (pacing is ours); the key comes only from `key_env`."""
    try:
        import cohere
    except ImportError as exc:
        raise MissingDependency("cohere", extra="cohere") from exc
    return cohere.ClientV2(
        api_key=api_key(key_env),
        base_url=base_url or DEFAULT_BASE_URL,
        max_retries=0,
        timeout=timeout_s,
        log_warning_experimental_features=False,
    )
