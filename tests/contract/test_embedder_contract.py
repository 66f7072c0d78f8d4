"""One suite for every registered embedder kind and test double: the traits it declares are the ones the
core reads (`ports.EmbedderTraits`), and each optional behaviour it claims (`capabilities.EmbedsColumns`,
`PipelinesCalls`, `Metered`, ...) is there as its Protocol says, so nothing the core needs is left to a
probe. Built offline: provider kinds get a key and an endpoint nothing listens on (nothing is sent)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reindex import registry
from reindex.capabilities import (
    EmbedsColumns,
    Metered,
    PipelinesCalls,
    RefusesRows,
    ReportsTraffic,
    ShipsTokenizer,
    TokenizesColumns,
    Traffic,
)
from reindex.columns import embed, tokenize
from reindex.ports import DeferredEmbedder, EmbedderTraits, EmbedsStragglers, LimitsRequests

NOWHERE = "http://127.0.0.1:9"  # nothing listens there: a kind that sent a request would fail the test
KEY = "REINDEX_CONTRACT_KEY"

# the smallest section that builds each kind here, beside the key every provider kind reads from KEY
SECTIONS: dict[str, dict[str, Any]] = {
    "openai": {"model": "text-embedding-3-small", "base_url": NOWHERE},
    "openai-batch": {"model": "text-embedding-3-small", "base_url": NOWHERE, "stragglers_online": True},
    "azure-openai": {
        "azure_endpoint": NOWHERE,
        "api_version": "2024-10-21",
        "deployment": "embeddings",
        "model": "text-embedding-3-small",
    },
    "cohere": {"model": "embed-v4.0", "base_url": NOWHERE},
    "cohere-batch": {"model": "embed-english-v3.0", "base_url": NOWHERE},
    "voyage": {"model": "voyage-3.5", "base_url": NOWHERE},
    "voyage-batch": {"model": "voyage-3.5", "base_url": NOWHERE},
    "gemini-batch": {"base_url": NOWHERE},
    "mistral-batch": {"server_url": NOWHERE},
    "bedrock-batch": {
        "region": "us-east-1",
        "role_arn": "arn:aws:iam::123456789012:role/batch",
        "input_s3_uri": "s3://inputs/reindex",
        "output_s3_uri": "s3://outputs/reindex",
        "endpoint_url": NOWHERE,
        "s3_endpoint_url": NOWHERE,
    },
    "hash": {"dim": 8},
    "paced": {"dim": 8, "rate": 1_000_000},
    "memory-batch": {"dim": 8},
}
LOCAL = {"sentence-transformers", "vllm"}  # built from a model folder (vLLM: on CUDA only)
REMOTE = {"openai", "openai-batch", "azure-openai", "cohere", "cohere-batch", "voyage", "voyage-batch"}
REMOTE |= {"gemini-batch", "mistral-batch", "bedrock-batch"}


def test_every_registered_kind_is_in_this_suite() -> None:
    """A kind registered later gets its section here, or this fails: the suite covers every kind."""
    assert set(registry.kinds("embedder")) == set(SECTIONS) | LOCAL


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(KEY, "contract-test-key")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    yield


def built(kind: str, tiny_model: Path | None = None) -> Any:
    if kind == "sentence-transformers":
        assert tiny_model is not None
        return registry.build("embedder", {"kind": kind, "model": str(tiny_model)})
    section = {"kind": kind, **SECTIONS[kind]}
    if kind in REMOTE and kind != "bedrock-batch":
        section["api_key_env"] = KEY
    return registry.build("embedder", section)


@pytest.mark.parametrize("kind", sorted(SECTIONS))
def test_a_kind_declares_its_traits_and_the_behaviours_they_imply(kind: str, keys: None) -> None:
    embedder = built(kind)
    check(embedder, remote=kind in REMOTE)


def test_a_local_model_declares_its_device(tiny_model: Path) -> None:
    embedder = built("sentence-transformers", tiny_model)
    check(embedder, remote=False)
    traits: EmbedderTraits = embedder.traits
    assert traits.device == "cpu" and traits.devices == 1  # one model process on this machine's CPU
    assert isinstance(embedder, ShipsTokenizer) and isinstance(embedder, PipelinesCalls)


def check(embedder: Any, *, remote: bool) -> None:
    traits, dim = embedder.traits, embedder.info.dim
    assert isinstance(traits, EmbedderTraits)
    assert traits.remote is remote
    deferred = isinstance(embedder, DeferredEmbedder)
    if remote:
        # a provider is priced by tier (its list prices, even where a model has none listed: None), runs no
        # model of ours, and the run reports its requests
        assert traits.device is None and traits.devices == 0
        assert set(traits.prices) == {"online", "batch"}
        assert traits.price_per_million == traits.prices["batch" if deferred else "online"]
    if traits.device is not None:
        assert traits.devices >= 1
    if traits.stragglers_online:
        assert deferred and isinstance(embedder, EmbedsStragglers)
    if traits.completion_window_hours is not None:
        assert deferred and traits.completion_window_hours > 0
    if not deferred:
        assert traits.completion_window_hours is None
    if remote and not deferred:
        # an online provider: paced as one budget, metered, refusing rows by content, sized by its limits
        assert isinstance(embedder, Metered) and isinstance(embedder.billed_tokens, int)
        assert isinstance(embedder, RefusesRows) and isinstance(embedder, LimitsRequests)
        assert isinstance(embedder, ReportsTraffic) and isinstance(embedder.traffic, Traffic)
        assert traits.max_batch and traits.batch_tokens  # an `embed` call fills the requests in flight
    if not remote and not deferred:  # a local model embeds here and now, through its columns
        assert isinstance(embedder, EmbedsColumns) and isinstance(embedder, TokenizesColumns)
        tokens = tokenize(embedder, ["a first text", "and a second one"])
        vectors = np.asarray(embed(embedder, tokens))
        assert vectors.shape == (2, dim)
