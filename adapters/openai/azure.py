"""Azure OpenAI's online embeddings: the OpenAI embedder through the official SDK's `AzureOpenAI` client.

Requests go to `{azure_endpoint}/openai/deployments/{deployment}/embeddings?api-version={api_version}` with
an `api-key` header. Everything else (pacing, Retry-After, bisecting a refused request, billing) is the
OpenAI embedder's. Azure's Batch API does not take embeddings, so there is no batch kind for Azure (README,
"Azure OpenAI: no batch tier for embeddings").
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import field_validator

from reindex.errors import MissingDependency
from reindex.offers import EmbedderOffer, Entry, key_entry
from reindex_adapters.openai.online import OpenAIEmbedder
from reindex_adapters.remote.keys import api_key

if TYPE_CHECKING:
    from openai import AzureOpenAI

API_VERSION = re.compile(r"\d{4}-\d{2}-\d{2}(-preview)?")
# USD per 1M input tokens, Azure's Standard and Global Standard deployments, pay as you go. Read on
# 2026-12-01 from a third-party tracker (embeddingcost.com, "verified May 2026"), which matches OpenAI's list
# prices; Azure's own price page was not read. No batch price: Azure has no batch tier for embeddings.
PRICES_TAKEN = "2026-12-01"
PRICES: dict[str, dict[str, float]] = {
    "text-embedding-3-small": {"online": 0.02},
    "text-embedding-3-large": {"online": 0.13},
    "text-embedding-ada-002": {"online": 0.10},
}


def _azure_entries(model: str, variable: str) -> list[Entry]:
    return [
        Entry("kind", "azure-openai", "online only: Azure's Batch API takes no embeddings"),
        Entry("model", model, "the model the deployment serves (its price and tokenizer)"),
        Entry(
            "azure_endpoint", "https://RESOURCE.openai.azure.com", "your resource's endpoint", fill_in=True
        ),
        Entry("api_version", "2024-10-21", "an API version your resource serves"),
        Entry("deployment", model, "your deployment's name, if not the model's", fill_in=True),
        key_entry(variable),
        Entry("dimensions", 512, "text-embedding-3 shortening (part of the fingerprint)", is_example=True),
    ]


class AzureOpenAIEmbedder(OpenAIEmbedder):
    """The `openai` embedder against an Azure OpenAI deployment.

    The identity (fingerprint) is the model's, not the deployment's: an Azure deployment of
    text-embedding-3-small computes OpenAI's text-embedding-3-small, so both kinds hash as "openai" with the
    same model, dim, `dimensions` and truncation, and moving between OpenAI and Azure keeps the target.
    `model` must therefore name what the deployment serves; the deployment's name says only where.
    """

    offer: ClassVar[EmbedderOffer] = EmbedderOffer(
        _azure_entries, key_env="AZURE_OPENAI_API_KEY"
    )  # what `reindex init` writes for it

    class Config(OpenAIEmbedder.Config):
        kind: Literal["azure-openai"]  # type: ignore[assignment]
        azure_endpoint: str  # https://<resource>.openai.azure.com
        api_version: str  # e.g. 2024-10-21
        deployment: str  # the deployment's name; `model` is the model it serves (tokenizer, dim, price)
        api_key_env: str = "AZURE_OPENAI_API_KEY"

        @field_validator("azure_endpoint")
        @classmethod
        def _is_url(cls, value: str) -> str:
            if not value.startswith(("https://", "http://")) or "/openai" in value:
                raise ValueError(f"{value!r}: give the resource URL, https://<resource>.openai.azure.com")
            return value

        @field_validator("api_version")
        @classmethod
        def _is_dated(cls, value: str) -> str:
            if not API_VERSION.fullmatch(value):
                raise ValueError(
                    f"{value!r} is not an Azure OpenAI API version; use a dated one, e.g. 2024-10-21"
                )
            return value

        @field_validator("base_url")
        @classmethod
        def _no_base_url(cls, value: str | None) -> None:
            if value is not None:
                raise ValueError("Azure takes azure_endpoint, api_version and deployment, not base_url")
            return None

        @field_validator("prices")
        @classmethod
        def _online_only(cls, value: dict[str, float] | None) -> dict[str, float] | None:
            if value is not None and set(value) != {"online"}:
                raise ValueError("Azure has no batch tier for embeddings: give only {online = <USD per 1M>}")
            return value

    def __init__(self, client: AzureOpenAI, **options: Any) -> None:
        """`OpenAIEmbedder`'s options; pass `deployment` (requests carry it) and `model` (what it serves)."""
        options.setdefault("api_key_env", "AZURE_OPENAI_API_KEY")
        super().__init__(client, **options)
        self.info = dataclasses.replace(self.info, kind="azure-openai")
        overrides = options.get("prices")
        listed = azure_prices(self.info.model, overrides if isinstance(overrides, Mapping) else None)
        self.traits = dataclasses.replace(self.traits, price_per_million=listed["online"], prices=listed)

    @classmethod
    def from_config(cls, config: OpenAIEmbedder.Config) -> AzureOpenAIEmbedder:
        assert isinstance(config, AzureOpenAIEmbedder.Config)
        client = make_azure_client(
            config.azure_endpoint, config.api_version, config.api_key_env, config.timeout_s
        )
        return cls.through(client, config, deployment=config.deployment)


def make_azure_client(azure_endpoint: str, api_version: str, key_env: str, timeout_s: float) -> AzureOpenAI:
    """The SDK's Azure client, its retries off (pacing is ours); the key comes only from `key_env`."""
    try:
        from openai import AzureOpenAI
    except ImportError as exc:
        raise MissingDependency("openai", extra="openai") from exc
    key = api_key(key_env)
    return AzureOpenAI(
        azure_endpoint=azure_endpoint, api_version=api_version, api_key=key, max_retries=0, timeout=timeout_s
    )


def azure_prices(model: str, overrides: Mapping[str, float] | None) -> dict[str, float | None]:
    """Online USD per 1M tokens for `model` on Azure (the config's override, else the table); batch: none."""
    online = overrides.get("online") if overrides else PRICES.get(model, {}).get("online")
    return {"online": None if online is None else float(online), "batch": None}
