"""Voyage's text embedding models: sizes, limits, list prices, the settings both kinds share, and identity.

Sizes, context lengths and per-request token limits are from Voyage's "Text Embeddings" guide and its
embeddings API reference (docs.voyageai.com/docs/embeddings, /reference/embeddings-api, read 2026-12-06);
which models the Batch API serves is from its "Batch Inference" guide (Model Availability).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import Field

from reindex.errors import ConfigError
from reindex.fingerprint import fingerprint
from reindex.offers import Entry
from reindex.ports import EmbedderInfo
from reindex_adapters.remote.pacing import Paced

FLEXIBLE_DIMS = (256, 512, 1024, 2048)  # `output_dimension` values of the models that take one
MAX_INPUTS = 1000  # texts per /v1/embeddings request
DEFAULT_CONTEXT, DEFAULT_REQUEST_TOKENS = 32_000, 120_000  # a model not in the table: the strictest limits
OutputDtype = Literal["float", "int8", "uint8"]  # binary/ubinary pack 8 dimensions a byte: not a float vector
InputType = Literal["document", "query", "none"]  # "none": no input_type sent (TOML has no null)


@dataclass(frozen=True, slots=True)
class Model:
    dim: int  # the default output size
    context: int  # tokens of one input; Voyage truncates past it (`truncation: true`)
    request_tokens: int  # tokens of one request, all its inputs together
    is_flexible: bool = True  # takes `output_dimension` (FLEXIBLE_DIMS) and the integer `output_dtype`s
    in_batch: bool = True  # served by the Batch API


MODELS: dict[str, Model] = {
    "voyage-4-large": Model(1024, 32_000, 120_000),
    "voyage-4": Model(1024, 32_000, 320_000),
    "voyage-4-lite": Model(1024, 32_000, 1_000_000),
    "voyage-3-large": Model(1024, 32_000, 120_000),
    "voyage-3.5": Model(1024, 32_000, 320_000),
    "voyage-3.5-lite": Model(1024, 32_000, 1_000_000),
    "voyage-code-3": Model(1024, 32_000, 120_000),
    "voyage-code-2": Model(1536, 16_000, 120_000, is_flexible=False),
    "voyage-finance-2": Model(1024, 32_000, 120_000, is_flexible=False, in_batch=False),
    "voyage-law-2": Model(1024, 16_000, 120_000, is_flexible=False, in_batch=False),
}

# USD per 1M input tokens on PRICES_TAKEN (configs/pricing.toml, [voyage], says where each figure was read).
# Batch: the online price less Voyage's 33% Batch API discount.
VOYAGE_OPTIONS = (  # the options `reindex init` shows as examples
    Entry(
        "input_type", "document", "how Voyage embeds stored texts (part of the fingerprint)", is_example=True
    ),
    Entry("output_dimension", 1024, "256, 512, 1024 or 2048 where the model takes it", is_example=True),
)
PRICES_TAKEN = "2026-12-06"
PRICES: dict[str, dict[str, float]] = {
    "voyage-4-large": {"online": 0.12, "batch": 0.0804},
    "voyage-4": {"online": 0.06, "batch": 0.0402},
    "voyage-4-lite": {"online": 0.02, "batch": 0.0134},
    "voyage-3-large": {"online": 0.18, "batch": 0.1206},
    "voyage-3.5": {"online": 0.06, "batch": 0.0402},
    "voyage-3.5-lite": {"online": 0.02, "batch": 0.0134},
    "voyage-code-3": {"online": 0.18, "batch": 0.1206},
    "voyage-code-2": {"online": 0.12, "batch": 0.0804},
}


class VoyageSettings(Paced):
    """What `voyage` and `voyage-batch` sections share."""

    PATHS: ClassVar[tuple[str, ...]] = (
        "tokenizer_path",
    )  # relative to the config file (reindex.config.anchor)
    model: str = "voyage-3.5"
    base_url: str | None = (
        None  # default https://api.voyageai.com/v1 (the SDK's: MongoDB Atlas for "al-" keys)
    )
    api_key_env: str = "VOYAGE_API_KEY"
    input_type: InputType = "document"  # Voyage prepends its retrieval prompt; part of the identity
    output_dimension: int | None = Field(default=None, gt=0)  # 256, 512, 1024 or 2048 (flexible models)
    output_dtype: OutputDtype = "float"
    dim: int | None = Field(default=None, gt=0)  # the output size of a model not in the table
    tokenizer_path: str | None = (
        None  # a tokenizer.json of the model: exact counts (else cached or estimated)
    )
    timeout_s: float = Field(default=60.0, gt=0)
    prices: dict[str, float] | None = None  # {"online": x, "batch": y} USD per 1M tokens


def model_limits(name: str) -> Model:
    """The model's row; a model not in the table gets the strictest known limits."""
    return MODELS.get(name) or Model(0, DEFAULT_CONTEXT, DEFAULT_REQUEST_TOKENS)


def resolve_dim(settings: VoyageSettings) -> int:
    """The vectors' size: `output_dimension`, else the model's default, else `dim`; refuse what Voyage would."""
    model = MODELS.get(settings.model)
    flexible = model is None or model.is_flexible
    if settings.output_dimension is not None and not flexible:
        raise ConfigError(f"{settings.model} has one output size", hint="remove output_dimension")
    if settings.output_dimension is not None and model and settings.output_dimension not in FLEXIBLE_DIMS:
        raise ConfigError(
            f"output_dimension {settings.output_dimension} is not one {settings.model} offers",
            hint=f"use one of {', '.join(map(str, FLEXIBLE_DIMS))}",
        )
    if settings.output_dtype != "float" and not flexible:
        raise ConfigError(f"{settings.model} returns only float vectors", hint='set output_dtype = "float"')
    size = settings.output_dimension or (model.dim if model else settings.dim)
    if size is None:
        raise ConfigError(f"the output size of model {settings.model!r} is unknown", hint="set dim")
    if settings.dim is not None and settings.dim != size:
        raise ConfigError(f"dim = {settings.dim} but the model returns {size}", hint="remove dim")
    return size


def identity(kind: str, settings: VoyageSettings) -> EmbedderInfo:
    """The same fingerprint for `voyage` and `voyage-batch`: both serve the same model with the same request
    parameters, so switching between them keeps the target. Texts are never cut here: Voyage truncates an
    input past the model's context itself (`truncation: true`), so the tokenizer is not part of it."""
    size, limits = resolve_dim(settings), model_limits(settings.model)
    options = {
        "input_type": settings.input_type,
        "output_dimension": settings.output_dimension,
        "output_dtype": settings.output_dtype,
        "truncation": "server",
        "context": limits.context,
    }
    return EmbedderInfo(
        kind,
        settings.model,
        size,
        limits.context,
        fingerprint("voyage", settings.model, size, options),
        options,
    )


def prices_for(model: str, overrides: dict[str, float] | None) -> dict[str, float | None]:
    listed = PRICES.get(model, {})
    table = {**listed, **(overrides or {})}
    return {tier: table.get(tier) for tier in ("online", "batch")}


def request_params(settings: VoyageSettings) -> dict[str, object]:
    """The endpoint parameters of every request: the batch's `request_params`, the online request's options.
    `truncation` is left at Voyage's default, true (an input past the context is cut by Voyage)."""
    params: dict[str, object] = {"model": settings.model}
    if settings.input_type != "none":
        params["input_type"] = settings.input_type
    if settings.output_dimension is not None:
        params["output_dimension"] = settings.output_dimension
    if settings.output_dtype != "float":
        params["output_dtype"] = settings.output_dtype
    return params
