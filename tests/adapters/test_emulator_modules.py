"""Each provider emulator runs as a module for a dry run, and its official SDK talks to it."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator

import pytest


def serve(*args: str) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "reindex_adapters.testing.emulators", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    found = re.search(r"at (http://\S+)", line)
    assert found, f"no address in {line!r}"
    return process, found.group(1)


@pytest.fixture
def stop() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        process.terminate()
        process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()


def test_the_mistral_emulator_runs_as_a_module(stop: list[subprocess.Popen[str]]) -> None:
    from mistralai.client import Mistral

    process, url = serve("mistral", "--dim", "8")
    stop.append(process)
    client = Mistral(api_key="test", server_url=url)
    assert client.batch.jobs.list().total == 0


def test_the_gemini_emulator_runs_as_a_module(stop: list[subprocess.Popen[str]]) -> None:
    from google import genai

    process, url = serve("gemini", "--dim", "8")
    stop.append(process)
    client = genai.Client(api_key="test", http_options={"base_url": url, "api_version": "v1beta"})
    assert list(client.batches.list()) == []


def test_the_bedrock_emulator_runs_as_a_module_with_its_s3(stop: list[subprocess.Popen[str]]) -> None:
    import boto3

    process, url = serve("bedrock", "--dim", "8", "--bucket", "reindex-input")
    stop.append(process)
    bedrock = boto3.client(
        "bedrock", endpoint_url=url, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    assert bedrock.list_model_invocation_jobs()["invocationJobSummaries"] == []


def test_the_cohere_emulator_runs_as_a_module(stop: list[subprocess.Popen[str]]) -> None:
    import cohere

    process, url = serve("cohere", "--dim", "8")
    stop.append(process)
    client = cohere.ClientV2(api_key="test", base_url=url, max_retries=0)
    assert client.embed_jobs.list().embed_jobs == []
    assert (
        client.embed(texts=["a"], model="embed-v4.0", input_type="search_document").embeddings.float_
        is not None
    )
    client._client_wrapper.httpx_client.httpx_client.close()
