"""The Gemini batch embedder against the local emulator, through the official google-genai SDK: adoption by
display name, results joined by key, and each fault the service shows."""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from reindex.errors import ConfigError, MissingDependency
from reindex.ports import DeferredEmbedder, JobItem, JobResult
from reindex.registry import build
from reindex_adapters.gemini import (
    PRICES,
    PRICES_TAKEN,
    GeminiBatchEmbedder,
    line_code,
    make_client,
    read_responses,
    retry_delay,
)
from reindex_adapters.remote.pacing import Pacer
from reindex_adapters.remote.tokens import cl100k
from reindex_adapters.testing.emulators.faults import FaultPlan
from reindex_adapters.testing.emulators.gemini.app import GeminiEmulator
from reindex_adapters.testing.memory import HashEmbedder

KEY_ENV = "REINDEX_TEST_GEMINI_KEY"
SECRET = "AIzaSyTEST0123456789abcdefSECRET"
DIM = 64
TEXTS = ["the quick brown fox", "jumps over", "the lazy dog", "hello world", "naïve café ☕", "one more"]
Serve = Callable[..., tuple[GeminiEmulator, GeminiBatchEmbedder]]
ROUTES = ["batch_create", "batch_retrieve", "batch_list", "files"]


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Serve]:
    monkeypatch.setenv(KEY_ENV, SECRET)
    running: list[GeminiEmulator] = []

    def start(
        embedder: dict[str, Any] | None = None, **faults: Any
    ) -> tuple[GeminiEmulator, GeminiBatchEmbedder]:
        emulator = GeminiEmulator(HashEmbedder(dim=3072), FaultPlan(**{"polls_per_step": 0, **faults}))
        emulator.__enter__()
        running.append(emulator)
        options = {"pacer": Pacer(backoff_s=0.02), "output_dimensionality": DIM, "api_key_env": KEY_ENV}
        client = make_client(emulator.base_url, KEY_ENV, 10)
        return emulator, GeminiBatchEmbedder(client, **{**options, **(embedder or {})})

    yield start
    for emulator in running:
        emulator.__exit__(None, None, None)


def items(embedder: GeminiBatchEmbedder, texts: list[str] = TEXTS) -> list[JobItem]:
    return [JobItem(f"0-{i}", tokens) for i, tokens in enumerate(embedder.tokenize(texts))]


def reference(texts: list[str]) -> np.ndarray:
    """What the emulator's model gives, cut to DIM and made unit length (as the embedder does)."""
    hasher = HashEmbedder(dim=3072)
    cut = hasher.embed(hasher.tokenize(texts))[:, :DIM]
    return cut / np.linalg.norm(cut, axis=1, keepdims=True)


def finish(embedder: GeminiBatchEmbedder, job_id: str) -> JobResult:
    for _ in range(20):
        result = embedder.poll(job_id)
        if result.is_terminal:
            return result
    pytest.fail("the batch never finished")


def test_a_batch_is_embedded_billed_and_released(serve: Serve) -> None:
    emulator, embedder = serve(polls_per_step=1)
    assert isinstance(embedder, DeferredEmbedder)
    job_id = embedder.submit("plan-1-0", items(embedder))
    assert embedder.poll(job_id).status == "JOB_STATE_RUNNING"
    result = finish(embedder, job_id)
    assert result.status == "JOB_STATE_SUCCEEDED" and not result.failed
    vectors = np.stack([result.vectors[f"0-{i}"] for i in range(len(TEXTS))])
    np.testing.assert_allclose(vectors, reference(TEXTS), atol=1e-6)
    codec = cl100k()
    assert result.billed_tokens == sum(len(codec.encode(text)) for text in TEXTS)
    assert emulator.stats()["billed_tokens"] == result.billed_tokens
    files = emulator.stats()["files"]
    embedder.release(job_id)
    embedder.release(job_id)  # already gone is fine
    assert emulator.stats()["files"] == files - 1


def test_the_same_key_adopts_the_batch_instead_of_creating_another(serve: Serve) -> None:
    emulator, embedder = serve()
    first = embedder.submit("plan-1-0", items(embedder))
    assert embedder.submit("plan-1-0", items(embedder)) == first
    assert emulator.stats()["batches_created"] == 1


def test_a_create_that_times_out_is_adopted_by_its_display_name(serve: Serve) -> None:
    emulator, embedder = serve({"create_timeout_s": 0.3}, slow_creates=1, create_delay_s=1.5)
    job_id = embedder.submit("plan-1-0", items(embedder))
    assert [b["name"] for b in emulator.stats()["batches"]] == [job_id]
    assert len(finish(embedder, job_id).vectors) == len(TEXTS)


def test_a_failed_batch_is_not_adopted(serve: Serve) -> None:
    _, embedder = serve(fail_validation=True, faulty_batches=1)
    failed = embedder.submit("plan-1-0", items(embedder))
    result = finish(embedder, failed)
    assert result.status == "JOB_STATE_FAILED" and not result.vectors  # every line is sent again
    again = embedder.submit("plan-1-0", items(embedder))
    assert again != failed and len(finish(embedder, again).vectors) == len(TEXTS)


def test_an_expired_batch_keeps_the_lines_it_finished(serve: Serve) -> None:
    _, embedder = serve(expire_after=2)
    result = finish(embedder, embedder.submit("plan-1-0", items(embedder)))
    assert result.status == "JOB_STATE_EXPIRED"
    assert set(result.vectors) == {"0-0", "0-1"} and not result.failed  # the rest: missing, sent again
    codec = cl100k()
    assert result.billed_tokens == sum(len(codec.encode(text)) for text in TEXTS[:2])


def test_shuffled_and_duplicated_lines_are_joined_by_key(serve: Serve) -> None:
    _, embedder = serve(shuffle_output=True, duplicate_output_line=True)
    result = finish(embedder, embedder.submit("plan-1-0", items(embedder)))
    vectors = np.stack([result.vectors[f"0-{i}"] for i in range(len(TEXTS))])
    np.testing.assert_allclose(vectors, reference(TEXTS), atol=1e-6)


def test_a_malformed_line_leaves_only_its_key_missing(serve: Serve) -> None:
    _, embedder = serve(malformed_output_line=True)
    result = finish(embedder, embedder.submit("plan-1-0", items(embedder)))
    assert len(result.vectors) == len(TEXTS) - 1 and not result.failed


def test_a_lost_responses_file_leaves_every_line_to_send_again(serve: Serve) -> None:
    _, embedder = serve(delete_output=True)
    result = finish(embedder, embedder.submit("plan-1-0", items(embedder)))
    assert result.is_terminal and not result.vectors and not result.failed


def test_a_refused_input_fails_its_own_line_with_the_providers_status(serve: Serve) -> None:
    _, embedder = serve(poison_substring="POISON")
    result = finish(embedder, embedder.submit("plan-1-0", items(embedder, [*TEXTS[:2], "a POISON pill"])))
    assert result.failed == {"0-2": "invalid_argument"} and set(result.vectors) == {"0-0", "0-1"}


@pytest.mark.parametrize(
    ("status", "code"), [(429, "rate_limit_exceeded"), (500, "server_error"), (503, "server_error")]
)
def test_rate_limited_and_server_error_lines_are_named_for_resubmission(
    serve: Serve, status: int, code: str
) -> None:
    _, embedder = serve(failed_lines=2, failed_line_status=status)
    result = finish(embedder, embedder.submit("plan-1-0", items(embedder)))
    assert result.failed == {"0-0": code, "0-1": code} and len(result.vectors) == len(TEXTS) - 2


def test_throttling_is_waited_out_after_the_retry_info_delay(serve: Serve) -> None:
    emulator, embedder = serve(
        rate_limit=4, rate_limit_on=ROUTES, retry_after_s=0.2, server_errors=2, server_errors_on=ROUTES
    )
    result = finish(embedder, embedder.submit("plan-1-0", items(embedder)))
    assert len(result.vectors) == len(TEXTS)
    stats = emulator.stats()
    assert stats["refused"] == {"429": 4, "500": 2} and stats["early_requests_total"] == 0
    assert stats["batches_created"] == 1


def test_a_refused_key_is_a_config_error_that_never_shows_the_key(serve: Serve) -> None:
    _, embedder = serve(unauthorized=1)
    with pytest.raises(ConfigError) as caught:
        embedder.submit("plan-1-0", items(embedder))
    assert caught.value.exit_code == 2 and SECRET not in str(caught.value)


# pure functions ---------------------------------------------------------------------------------------------


def test_retry_delay_reads_google_rpc_retry_info() -> None:
    info = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "12.5s"}
    assert retry_delay({"error": {"code": 429, "details": [{"@type": "x.Help"}, info]}}) == 12.5
    assert retry_delay({"error": {"code": 429}}) is None and retry_delay("not json") is None


@pytest.mark.parametrize(
    ("error", "code"),
    [
        ({"code": 400, "status": "INVALID_ARGUMENT"}, "invalid_argument"),
        ({"code": 429, "status": "RESOURCE_EXHAUSTED"}, "rate_limit_exceeded"),
        ({"code": 503, "status": "UNAVAILABLE"}, "server_error"),
        ({"code": 504, "status": "DEADLINE_EXCEEDED"}, "request_timeout"),
        ({"code": 500}, "server_error"),
        ({"code": 403}, "http_403"),
        ({}, "batch_error"),
    ],
)
def test_line_errors_map_onto_the_runs_codes(error: dict[str, Any], code: str) -> None:
    assert line_code(error) == code


def test_responses_are_read_by_key_and_a_success_wins_over_a_duplicate_failure() -> None:
    lines = [
        b'{"key": "a", "error": {"code": 503, "status": "UNAVAILABLE"}}',
        b'{"key": "a", "response": {"embedding": {"values": [1.0, 0.0]}, "tokenCount": "3"}}',
        b'{"key": "b", "response": {"embedding": {"values": [1.0]}}}',
        b'{"key": "c", "response": {"embedding": {"values": [0.0, 2.0]}, "usageMetadata": {"promptTokenCount": 4}}}',
        b'{"key": "d", "respo',
    ]
    vectors, failed, billed = read_responses(b"\n".join(lines), 2)
    assert set(vectors) == {"a", "c"} and failed == {"b": "wrong_dimension"} and billed == 7


# configuration ----------------------------------------------------------------------------------------------


def test_the_kind_is_built_from_a_config_section(serve: Serve) -> None:
    emulator, _ = serve()
    section = {"kind": "gemini-batch", "base_url": emulator.base_url, "api_key_env": KEY_ENV}
    embedder = build("embedder", {**section, "output_dimensionality": 768, "task_type": "RETRIEVAL_DOCUMENT"})
    assert isinstance(embedder, GeminiBatchEmbedder)
    assert embedder.info.dim == 768 and embedder.traits.price_per_million == 0.075
    assert build("embedder", section).info.dim == 3072
    assert embedder.info.fingerprint != build("embedder", section).info.fingerprint


def test_without_the_sdk_the_config_error_names_the_extra(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    emulator, _ = serve()
    monkeypatch.setitem(sys.modules, "google.genai", None)
    with pytest.raises(MissingDependency) as caught:
        build("embedder", {"kind": "gemini-batch", "base_url": emulator.base_url, "api_key_env": KEY_ENV})
    assert caught.value.exit_code == 2 and "reindex-embeddings[gemini]" in str(caught.value.hint)


def test_an_unknown_model_needs_its_dim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    with pytest.raises(ConfigError, match="unknown"):
        build("embedder", {"kind": "gemini-batch", "model": "text-embedding-004", "api_key_env": KEY_ENV})


def test_the_price_table_matches_configs_pricing_toml() -> None:
    table = tomllib.loads((Path(__file__).parents[2] / "configs" / "pricing.toml").read_text())
    assert table["gemini"]["taken"] == PRICES_TAKEN
    assert table["gemini"]["models"] == PRICES


def test_a_responses_file_the_key_may_not_delete_is_left_and_the_run_goes_on(serve: Serve) -> None:
    """Deleting a GENERATED responses file is not documented as allowed (the wire review): a 403 there
    leaves the file (the Files API removes it after 48 hours) and must not end a run whose vectors are
    already stored."""
    emulator, embedder = serve()
    job_id = embedder.submit("plan-1-403", items(embedder))
    assert finish(embedder, job_id).status == "JOB_STATE_SUCCEEDED"
    files = emulator.stats()["files"]
    emulator.set_faults(
        FaultPlan(polls_per_step=0, server_errors=1, server_error_status=403, server_errors_on=("files",))
    )
    embedder.release(job_id)
    assert emulator.stats()["files"] == files


def test_a_fresh_process_polls_the_batch_reading_only_the_generated_responses_file(serve: Serve) -> None:
    """What a resume has: the batch's name from the ledger. The emulator refuses to download an uploaded
    file, as the Files API does, so a poll that needed the input back would fail here."""
    emulator, first = serve()
    job_id = first.submit("plan-1-fresh", items(first))
    fresh = GeminiBatchEmbedder(
        make_client(emulator.base_url, KEY_ENV, 10),
        pacer=Pacer(backoff_s=0.02),
        output_dimensionality=DIM,
        api_key_env=KEY_ENV,
    )
    result = finish(fresh, job_id)
    assert result.status == "JOB_STATE_SUCCEEDED" and set(result.vectors) == {
        f"0-{i}" for i in range(len(TEXTS))
    }
    uploaded = next(name for name, f in emulator.state.files.items() if f.source == "UPLOADED")
    refused = httpx.get(
        f"{emulator.base_url}/v1beta/{uploaded}:download",
        params={"alt": "media"},
        headers={"x-goog-api-key": SECRET},
    )
    assert refused.status_code == 403 and "only generated files" in refused.text
