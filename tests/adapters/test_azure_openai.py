"""The emulator's Azure OpenAI route, driven through the official SDK's `AzureOpenAI` client."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
from openai import AzureOpenAI, OpenAI

from adapters.memory import HashEmbedder
from adapters.openai_emulator import Emulator

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
