"""Azure OpenAI's online embeddings through the official SDK's `AzureOpenAI` client, against the emulator's
Azure route (`/openai/deployments/{deployment}/embeddings?api-version=...`, `api-key` header)."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from openai import AzureOpenAI, OpenAI

from reindex.errors import ConfigError
from reindex.registry import build
from reindex_adapters.openai.azure import PRICES, PRICES_TAKEN, AzureOpenAIEmbedder
from reindex_adapters.openai.online import OpenAIEmbedder
from reindex_adapters.remote.pacing import Pacer
from reindex_adapters.remote.tokens import cl100k
from reindex_adapters.testing.emulators.faults import FaultPlan
from reindex_adapters.testing.emulators.openai import Emulator
from reindex_adapters.testing.memory import HashEmbedder

MODEL = "text-embedding-3-small"
DEPLOYMENT = "emb-small-prod"
API_VERSION = "2024-10-21"
DIM = 16
SECRET = "0123456789abcdef0123456789abcdefSECRET"
TEXTS = ["the quick brown fox", "jumps over", "the lazy dog", "hello world", "naïve café ☕", "one more"]


@pytest.fixture
def hasher() -> HashEmbedder:
    return HashEmbedder(dim=DIM)


@pytest.fixture
def emulator(hasher: HashEmbedder) -> Iterator[Emulator]:
    with Emulator(hasher, deployments={DEPLOYMENT: MODEL}) as emu:
        yield emu


@pytest.fixture
def client(emulator: Emulator) -> Iterator[AzureOpenAI]:
    azure = AzureOpenAI(
        azure_endpoint=emulator.azure_endpoint,
        api_version=API_VERSION,
        api_key=SECRET,
        max_retries=0,
        timeout=10,
    )
    yield azure
    azure.close()


def azure_embedder(client: AzureOpenAI, **options: Any) -> AzureOpenAIEmbedder:
    options.setdefault("pacer", Pacer(backoff_s=0.02))
    options.setdefault("deployment", DEPLOYMENT)
    return AzureOpenAIEmbedder(client, model=MODEL, dim=DIM, **options)


def section(emulator: Emulator, **changes: Any) -> dict[str, Any]:
    values = {
        "kind": "azure-openai",
        "azure_endpoint": emulator.azure_endpoint,
        "api_version": API_VERSION,
        "deployment": DEPLOYMENT,
        "model": MODEL,
        "dim": DIM,
        "api_key_env": "AZURE_TEST_KEY",
    }
    values.update(changes)
    return {key: value for key, value in values.items() if value is not None}


# the emulator's Azure route -------------------------------------------------------------------------------


def test_the_sdk_reaches_the_deployment_route_with_the_api_version_and_key(
    emulator: Emulator, client: AzureOpenAI, hasher: HashEmbedder
) -> None:
    answer = client.embeddings.create(input=TEXTS[:2], model=DEPLOYMENT)
    vectors = np.array([item.embedding for item in answer.data], dtype=np.float32)
    np.testing.assert_allclose(vectors, hasher.embed(hasher.tokenize(TEXTS[:2])), rtol=1e-6)
    assert answer.model == MODEL  # the model the deployment serves
    assert emulator.stats()["requests"] == {"embeddings": 1}


def test_azure_refuses_a_request_without_api_version_or_key_as_the_service_does(emulator: Emulator) -> None:
    url = f"{emulator.azure_endpoint}/openai/deployments/{DEPLOYMENT}/embeddings"
    body = {"input": ["hello"]}
    no_version = httpx.post(url, json=body, headers={"api-key": SECRET})
    assert no_version.status_code == 404
    assert no_version.json()["error"]["message"] == "Resource not found"
    no_key = httpx.post(url, params={"api-version": API_VERSION}, json=body)
    assert no_key.status_code == 401
    assert httpx.post(
        url, params={"api-version": API_VERSION}, json=body, headers={"api-key": "k"}
    ).is_success
    assert emulator.stats()["requests"] == {"embeddings": 1}  # refusals never reach the model


def test_an_unknown_deployment_is_a_404_naming_it(emulator: Emulator, client: AzureOpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="deployment for this resource does not exist"):
        client.embeddings.create(input=["hello"], model="no-such-deployment")


def test_the_openai_routes_are_unchanged_beside_the_azure_one(emulator: Emulator) -> None:
    plain = OpenAI(base_url=emulator.base_url, api_key=SECRET, max_retries=0)
    assert len(plain.embeddings.create(input=["hello"], model=MODEL).data) == 1
    plain.close()


# the embedder ---------------------------------------------------------------------------------------------


def test_vectors_billing_and_price_through_the_azure_client(
    emulator: Emulator, client: AzureOpenAI, hasher: HashEmbedder
) -> None:
    embedder = azure_embedder(client)
    vectors = embedder.embed(embedder.tokenize(TEXTS))
    np.testing.assert_allclose(vectors, hasher.embed(hasher.tokenize(TEXTS)), rtol=1e-6)
    counts = [len(cl100k().encode_ordinary(text)) for text in TEXTS]
    assert embedder.billed_tokens == sum(counts) == emulator.stats()["billed_tokens"]
    assert embedder.traits.prices == {
        "online": 0.02,
        "batch": None,
    }  # no batch tier: plan shows no batch cost
    assert embedder.info.kind == "azure-openai"


def test_the_fingerprint_is_the_models_so_openai_and_azure_share_a_target(client: AzureOpenAI) -> None:
    plain = OpenAI(base_url="http://127.0.0.1:9/v1", api_key=SECRET, max_retries=0)
    for dimensions in (None, 256):
        azure = AzureOpenAIEmbedder(client, model=MODEL, deployment="any-name", dimensions=dimensions)
        assert (
            azure.info.fingerprint
            == OpenAIEmbedder(plain, model=MODEL, dimensions=dimensions).info.fingerprint
        )
    other_model = AzureOpenAIEmbedder(client, model="text-embedding-3-large", deployment=DEPLOYMENT)
    assert other_model.info.fingerprint != AzureOpenAIEmbedder(client, model=MODEL).info.fingerprint
    plain.close()


def test_retry_after_is_obeyed_and_a_refused_input_is_isolated(
    emulator: Emulator, client: AzureOpenAI
) -> None:
    emulator.set_faults(FaultPlan(rate_limit=2, retry_after_s=0.2, poison_substring="poison"))
    embedder = azure_embedder(client)
    texts = [*TEXTS, "a poison text"]
    vectors = embedder.embed(embedder.tokenize(texts))
    assert embedder.last_rejections() == {len(TEXTS): "provider_rejected:invalid_request_error"}
    assert np.isfinite(vectors[: len(TEXTS)]).all() and np.isnan(vectors[len(TEXTS)]).all()
    stats = emulator.stats()
    assert stats["refused"] == {"429": 2} and stats["early_requests_total"] == 0


def test_a_wrong_deployment_is_a_config_error_not_a_retry(client: AzureOpenAI) -> None:
    embedder = azure_embedder(client, deployment="no-such-deployment")
    with pytest.raises(ConfigError, match="azure_endpoint") as caught:
        embedder.embed(embedder.tokenize(["hello"]))
    assert caught.value.exit_code == 2


def test_a_refused_key_is_a_config_error_that_never_shows_the_key(
    emulator: Emulator, client: AzureOpenAI
) -> None:
    emulator.set_faults(FaultPlan(unauthorized=5))  # the answer echoes the key it was sent
    embedder = azure_embedder(client)
    with pytest.raises(ConfigError, match="AZURE_OPENAI_API_KEY") as caught:
        embedder.embed(embedder.tokenize(["hello"]))
    assert SECRET not in str(caught.value)


# configuration --------------------------------------------------------------------------------------------


def test_from_config_builds_the_azure_client_from_the_named_variable(
    emulator: Emulator, hasher: HashEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_TEST_KEY", SECRET)
    embedder = build("embedder", section(emulator))
    assert isinstance(embedder, AzureOpenAIEmbedder)
    np.testing.assert_allclose(
        embedder.embed(embedder.tokenize(TEXTS[:2])), hasher.embed(hasher.tokenize(TEXTS[:2])), rtol=1e-6
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"deployment": None}, "missing required key 'deployment'"),
        ({"api_version": None}, "missing required key 'api_version'"),
        ({"azure_endpoint": None}, "missing required key 'azure_endpoint'"),
        ({"api_version": "latest"}, "use a dated one, e.g. 2024-10-21"),
        ({"azure_endpoint": "my-resource.openai.azure.com"}, "https://<resource>.openai.azure.com"),
        ({"base_url": "https://x.openai.azure.com/openai/v1"}, "not base_url"),
        ({"prices": {"online": 0.02, "batch": 0.01}}, "no batch tier"),
        ({"api_key_env": "AZURE_KEY_NOT_SET"}, "export AZURE_KEY_NOT_SET="),
        ({"model": "my-own-model", "dim": None}, "set dim in"),
    ],
    ids=lambda value: next(iter(value)) if isinstance(value, dict) else None,
)
def test_each_misconfiguration_is_one_line_naming_the_fix(
    emulator: Emulator, monkeypatch: pytest.MonkeyPatch, changes: dict[str, Any], message: str
) -> None:
    monkeypatch.setenv("AZURE_TEST_KEY", SECRET)
    monkeypatch.delenv("AZURE_KEY_NOT_SET", raising=False)
    with pytest.raises(ConfigError) as caught:
        build("embedder", section(emulator, **changes))
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.exit_code == 2


def test_the_azure_price_table_matches_configs_pricing_toml() -> None:
    table = tomllib.loads((Path(__file__).parents[2] / "configs" / "pricing.toml").read_text())
    assert table["azure"]["taken"] == PRICES_TAKEN
    assert table["azure"]["models"] == PRICES
    assert all("batch" not in prices for prices in table["azure"]["models"].values())
