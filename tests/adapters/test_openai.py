"""The OpenAI embedders against the local emulator, through the official SDK: pacing, bisecting, batches."""

from __future__ import annotations

import base64
import logging
import tomllib
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from openai import OpenAI

from reindex.batching import batch_budget, batch_texts
from reindex.config import RunConfig
from reindex.errors import BackendError, ConfigError, TransientError
from reindex.ports import DeferredEmbedder, JobItem, JobResult, Vectors
from reindex_adapters.openai.batch import OpenAIBatchEmbedder
from reindex_adapters.openai.client import PRICES, PRICES_TAKEN, price_per_million
from reindex_adapters.openai.online import OpenAIEmbedder
from reindex_adapters.remote.keys import redact
from reindex_adapters.remote.pacing import Pacer
from reindex_adapters.remote.tokens import cl100k
from reindex_adapters.testing.emulators.faults import FaultPlan
from reindex_adapters.testing.emulators.openai import Emulator
from reindex_adapters.testing.memory import HashEmbedder

MODEL = "text-embedding-3-small"
DIM = 16
SECRET = "sk-test-0123456789abcdefSECRET"
TEXTS = ["the quick brown fox", "jumps over", "the lazy dog", "hello world", "naïve café ☕", "one more"]
Serve = Callable[..., tuple[Emulator, OpenAI]]


@pytest.fixture
def hasher() -> HashEmbedder:
    return HashEmbedder(dim=DIM)


@pytest.fixture
def serve(hasher: HashEmbedder) -> Iterator[Serve]:
    running: list[tuple[Emulator, OpenAI]] = []

    def start(**faults: Any) -> tuple[Emulator, OpenAI]:
        emulator = Emulator(hasher, FaultPlan(**faults))
        emulator.start()
        client = OpenAI(base_url=emulator.base_url, api_key=SECRET, max_retries=0, timeout=10)
        running.append((emulator, client))
        return emulator, client

    yield start
    for emulator, client in running:
        client.close()
        emulator.stop()


def online(client: OpenAI, **options: Any) -> OpenAIEmbedder:
    options.setdefault("pacer", Pacer(backoff_s=0.02))
    return OpenAIEmbedder(client, model=MODEL, dim=DIM, **options)


def batcher(client: OpenAI, **options: Any) -> OpenAIBatchEmbedder:
    options.setdefault("pacer", Pacer(backoff_s=0.02))
    return OpenAIBatchEmbedder(client, model=MODEL, dim=DIM, **options)


def expected(hasher: HashEmbedder, texts: list[str]) -> Vectors:
    return hasher.embed(hasher.tokenize(texts))


def jobs(embedder: OpenAIBatchEmbedder, texts: list[str]) -> list[JobItem]:
    return [JobItem(f"doc-{i}", tokens) for i, tokens in enumerate(embedder.tokenize(texts))]


def finish(embedder: OpenAIBatchEmbedder, job_id: str) -> JobResult:
    for _ in range(20):
        result = embedder.poll(job_id)
        if result.is_terminal:
            return result
    raise AssertionError(f"batch {job_id} never finished")


# online ---------------------------------------------------------------------------------------------------


def test_online_vectors_are_the_models_and_billing_matches_tiktoken(
    serve: Serve, hasher: HashEmbedder
) -> None:
    emulator, client = serve()
    embedder = online(client)
    vectors = embedder.embed(embedder.tokenize(TEXTS))
    np.testing.assert_allclose(vectors, expected(hasher, TEXTS), rtol=1e-6)
    counts = [len(cl100k().encode_ordinary(text)) for text in TEXTS]
    assert embedder.billed_tokens == sum(counts) == emulator.stats()["billed_tokens"]
    assert embedder.last_rejections() == {}


def test_long_texts_are_cut_to_max_tokens_at_a_token_boundary(serve: Serve) -> None:
    _, client = serve()
    embedder = online(client, max_tokens=5)
    [short, long] = embedder.tokenize(["hello world", " ".join(["word"] * 40)])
    assert (short.count, short.is_truncated, short.data) == (2, False, "hello world")
    assert long.count <= 5 < long.original_count == 40
    assert embedder.embed([short, long]).shape == (2, DIM)
    assert embedder.billed_tokens == short.count + long.count


def test_the_pipeline_tokenizes_only_texts_that_may_be_too_long_and_counts_what_was_billed(
    serve: Serve, hasher: HashEmbedder
) -> None:
    """Unpaced and uncapped, `tokenize_columns` bounds each count by the text's UTF-8 bytes (a token is at
    least one byte) and tokenizes only texts with more bytes than the limit; the provider's usage is the
    count: the traffic's tokens are what it billed."""
    emulator, client = serve()
    embedder = online(client, max_tokens=20)
    long = " ".join(["word"] * 40)
    texts = ["hello world", "naïve café ✓", long]
    columns = embedder.tokenize_columns(texts)
    assert columns.bounded and columns.texts is not None
    assert columns.counts[:2].tolist() == [len(text.encode()) for text in texts[:2]]
    exact = embedder.tokenize(texts)
    assert all(bound >= item.count for bound, item in zip(columns.counts[:2], exact[:2], strict=True))
    assert (columns.counts[2], columns.original[2], columns.texts[2]) == (20, 40, exact[2].data)  # as before
    vectors = embedder.embed_prepared(embedder.prepare_columns(columns)).result()
    np.testing.assert_allclose(vectors[:2], expected(hasher, texts[:2]), rtol=1e-6)
    billed = sum(item.count for item in exact)
    assert embedder.billed_tokens == billed == emulator.stats()["billed_tokens"]
    assert embedder._endpoint.pacer.traffic.tokens == billed


@pytest.mark.parametrize("why", ["tokens_per_minute", "cost_cap"])
def test_tokens_are_counted_exactly_when_pacing_or_a_cost_cap_needs_them(serve: Serve, why: str) -> None:
    _, client = serve()
    if why == "tokens_per_minute":
        embedder = online(client, pacer=Pacer(tokens_per_minute=1_000_000, concurrency=4))
    else:
        embedder = online(client)
        embedder.count_tokens_exactly()
    columns = embedder.tokenize_columns(["hello world", "naïve café ✓"])
    assert not columns.bounded
    assert columns.counts.tolist() == [
        item.count for item in embedder.tokenize(["hello world", "naïve café ✓"])
    ]


def test_a_429_storm_is_waited_out_without_sending_early(serve: Serve, hasher: HashEmbedder) -> None:
    emulator, client = serve(rate_limit=3, retry_after_s=0.2)
    embedder = online(client, concurrency=4)
    many = [f"text number {i}" for i in range(40)]
    items = embedder.tokenize(many)
    vectors = np.concatenate([embedder.embed(items[:20]), embedder.embed(items[20:])])
    np.testing.assert_allclose(vectors, expected(hasher, many), rtol=1e-6)
    stats = emulator.stats()
    assert stats["refused"] == {"429": 3}
    assert stats["early_requests_total"] == 0


def test_requests_are_split_within_the_api_limits_and_sent_concurrently(serve: Serve) -> None:
    emulator, client = serve()
    embedder = online(client, concurrency=3)
    items = embedder.tokenize([f"document {i}" for i in range(4100)])
    assert np.isfinite(embedder.embed(items)).all()
    stats = emulator.stats()
    assert stats["requests"]["embeddings"] == 12  # four requests of about 342 inputs per slot in flight
    assert 1 < stats["max_in_flight"] <= 3


def test_the_next_call_is_sent_while_the_last_one_finishes(serve: Serve, hasher: HashEmbedder) -> None:
    """The pipeline launches call n+1 before it waits on call n; their requests share the senders, in
    order, and each call's vectors and refusals stay its own."""
    _, client = serve(poison_substring="POISON")
    embedder = online(client, concurrency=2)
    first = [f"first text {i}" for i in range(200)]
    second = [f"second text {i}" for i in range(50)]
    second[7] = "second POISON"
    calls = [
        embedder.embed_prepared(embedder.prepare_columns(embedder.tokenize_columns(texts)))
        for texts in (first, second)
    ]
    np.testing.assert_allclose(calls[0].result(), expected(hasher, first), rtol=1e-6)
    vectors = calls[1].result()
    np.testing.assert_allclose(
        np.delete(vectors, 7, axis=0), expected(hasher, second[:7] + second[8:]), rtol=1e-6
    )
    assert np.isnan(vectors[7]).all()
    assert calls[0].rejections() == {} and calls[1].rejections() == {
        7: "provider_rejected:invalid_request_error"
    }


def test_requests_are_sized_by_the_configured_per_request_limits(serve: Serve, hasher: HashEmbedder) -> None:
    emulator, client = serve()
    embedder = online(client, concurrency=2, max_inputs_per_request=5)
    texts = [f"text number {i}" for i in range(40)]
    vectors = embedder.embed(embedder.tokenize(texts))
    np.testing.assert_allclose(vectors, expected(hasher, texts), rtol=1e-6)
    assert emulator.stats()["requests"]["embeddings"] == 8  # 2 shares of 20 inputs, 5 per request
    by_tokens = online(client, concurrency=1, max_tokens_per_request=12)
    assert np.isfinite(by_tokens.embed(by_tokens.tokenize(texts))).all()
    requests = [entry["tokens"] for entry in emulator.stats()["billed"][8:]]
    assert max(requests) <= 12 and sum(requests) == by_tokens.billed_tokens


def test_the_pipeline_hands_a_remote_embedder_calls_sized_for_all_its_requests(serve: Serve) -> None:
    _, client = serve()
    embedder = online(client, concurrency=3, max_inputs_per_request=100, max_tokens_per_request=5000)
    run = RunConfig()
    assert (batch_budget(run, embedder), batch_texts(run, embedder)) == (15_000, 300)
    assert batch_texts(RunConfig(max_batch=64), embedder) == 64  # an explicit [run] max_batch still wins


def test_several_requests_are_in_flight_and_the_vectors_keep_their_order(
    serve: Serve, hasher: HashEmbedder
) -> None:
    emulator, client = serve()
    embedder = online(client, concurrency=4, max_inputs_per_request=8)
    texts = [f"document {i} {'word ' * (i % 13)}" for i in range(400)]
    vectors = embedder.embed(embedder.tokenize(texts))
    np.testing.assert_allclose(vectors, expected(hasher, texts), rtol=1e-6)
    stats = emulator.stats()
    assert stats["requests"]["embeddings"] >= 50
    assert 2 <= stats["max_in_flight"] <= 4
    assert embedder.traffic.requests == stats["requests"]["embeddings"]


def test_a_429_halves_the_requests_in_flight_and_calm_answers_grow_them_back(
    serve: Serve, hasher: HashEmbedder
) -> None:
    emulator, client = serve(rate_limit=2, retry_after_s=0.1)
    pacer = Pacer(concurrency=4, backoff_s=0.02)
    embedder = online(client, concurrency=4, max_inputs_per_request=4, pacer=pacer)
    embedder.embed(embedder.tokenize(["one request"]))  # refused twice (4 -> 2 -> 1), then one calm answer
    assert pacer.allowed == 2
    assert emulator.stats()["early_requests_total"] == 0
    many = [f"calm text {i}" for i in range(60)]
    vectors = embedder.embed(embedder.tokenize(many))
    np.testing.assert_allclose(vectors, expected(hasher, many), rtol=1e-6)
    assert pacer.allowed == 4  # 2 -> 3 -> 4 after 2 + 3 calm answers
    traffic = embedder.traffic
    assert (traffic.rate_limited, traffic.retries) == (2, 2)


@pytest.mark.serial  # measures an achieved rate
@pytest.mark.parametrize(("limit", "budget"), [("requests_per_minute", 1200), ("tokens_per_minute", 14_400)])
def test_a_rate_limited_endpoint_is_paced_to_its_limit_without_a_429_storm(
    serve: Serve, limit: str, budget: int
) -> None:
    """1,200 requests or 14,400 tokens a minute (about 20 requests of 12 tokens a second), enforced over
    every 3 s: the run stays within 5% of the limit, with at most a stray 429 from arrival jitter."""
    emulator, client = serve(**{limit: budget, "limit_window_s": 3.0})
    pacer = Pacer(**{limit: budget}, concurrency=4, backoff_s=0.05)
    embedder = online(client, concurrency=4, max_inputs_per_request=4, pacer=pacer)
    items = embedder.tokenize([f"text number {i}" for i in range(200)])  # 3 tokens each
    assert np.isfinite(embedder.embed(items)).all()
    stats = emulator.stats()
    arrivals, billed = stats["arrivals"], [entry["tokens"] for entry in stats["billed"]]
    spent = len(arrivals) - 1 if limit == "requests_per_minute" else sum(billed[:-1])
    achieved = spent * 60 / (arrivals[-1] - arrivals[0])  # per minute, between the first and last arrival
    assert stats["refused"].get("429", 0) <= 2, stats["refused"]
    assert 0.85 * budget <= achieved <= 1.05 * budget, achieved
    assert stats["early_requests_total"] == 0


def test_a_burst_of_server_errors_is_survived(serve: Serve, hasher: HashEmbedder) -> None:
    emulator, client = serve(server_errors=3, server_error_status=503)
    embedder = online(client)
    vectors = embedder.embed(embedder.tokenize(TEXTS))
    np.testing.assert_allclose(vectors, expected(hasher, TEXTS), rtol=1e-6)
    assert emulator.stats()["refused"] == {"503": 3}


def test_exhausted_retries_raise_a_resumable_error_without_the_key(serve: Serve) -> None:
    _, client = serve(server_errors=10)
    embedder = online(client, pacer=Pacer(attempts=2, backoff_s=0.01))
    with pytest.raises(TransientError) as caught:
        embedder.embed(embedder.tokenize(TEXTS))
    assert caught.value.exit_code == 75
    assert SECRET not in str(caught.value) and SECRET not in repr(embedder)


def test_a_poison_input_is_isolated_and_the_rest_embedded(serve: Serve, hasher: HashEmbedder) -> None:
    _, client = serve(poison_substring="POISON")
    embedder = online(client)
    texts = [*TEXTS[:3], "a POISON pill", *TEXTS[3:]]
    vectors = embedder.embed(embedder.tokenize(texts))
    assert embedder.last_rejections() == {3: "provider_rejected:invalid_request_error"}
    assert np.isnan(vectors[3]).all()
    keep = [i for i in range(len(texts)) if i != 3]
    np.testing.assert_allclose(vectors[keep], expected(hasher, [texts[i] for i in keep]), rtol=1e-6)


def test_a_poison_input_is_bisected_out_with_several_requests_in_flight(
    serve: Serve, hasher: HashEmbedder
) -> None:
    emulator, client = serve(poison_substring="POISON")
    embedder = online(client, concurrency=4, max_inputs_per_request=16)
    texts = [f"text number {i}" for i in range(200)]
    texts[137] = "a POISON pill"
    vectors = embedder.embed(embedder.tokenize(texts))
    assert embedder.last_rejections() == {137: "provider_rejected:invalid_request_error"}
    keep = [i for i in range(len(texts)) if i != 137]
    np.testing.assert_allclose(vectors[keep], expected(hasher, [texts[i] for i in keep]), rtol=1e-6)
    assert emulator.stats()["max_in_flight"] >= 2
    assert emulator.stats()["billed_tokens"] == embedder.billed_tokens


def test_a_refused_setting_is_a_config_error_not_a_dead_letter(serve: Serve) -> None:
    _, client = serve()
    embedder = OpenAIEmbedder(client, model=MODEL, dimensions=DIM * 4)
    with pytest.raises(ConfigError, match="dimensions") as caught:
        embedder.embed(embedder.tokenize(TEXTS))
    assert SECRET not in str(caught.value)


def test_from_config_reads_the_key_from_the_named_variable(
    serve: Serve, hasher: HashEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    emulator, _ = serve()
    section = {"kind": "openai", "model": MODEL, "dim": DIM, "base_url": emulator.base_url}
    section["api_key_env"] = "EMBED_KEY"
    monkeypatch.delenv("EMBED_KEY", raising=False)
    with pytest.raises(ConfigError, match="EMBED_KEY"):
        OpenAIEmbedder.from_config(OpenAIEmbedder.Config.model_validate(section))
    monkeypatch.setenv("EMBED_KEY", SECRET)
    embedder = OpenAIEmbedder.from_config(OpenAIEmbedder.Config.model_validate(section))
    np.testing.assert_allclose(
        embedder.embed(embedder.tokenize(TEXTS[:2])), expected(hasher, TEXTS[:2]), rtol=1e-6
    )


def test_dimension_comes_from_the_model_or_the_config() -> None:
    client = OpenAI(base_url="http://127.0.0.1:9/v1", api_key=SECRET, max_retries=0)
    assert OpenAIEmbedder(client, model="text-embedding-3-large").info.dim == 3072
    assert OpenAIEmbedder(client, model="text-embedding-3-large", dimensions=256).info.dim == 256
    with pytest.raises(ConfigError, match="dim"):
        OpenAIEmbedder(client, model="BAAI/bge-m3")
    client.close()


def test_fingerprint_follows_the_model_not_the_endpoint_or_the_mode() -> None:
    client = OpenAI(base_url="http://127.0.0.1:9/v1", api_key=SECRET, max_retries=0)
    other = OpenAI(base_url="http://10.0.0.1:9/v1", api_key="sk-other-key-000000", max_retries=0)
    base = OpenAIEmbedder(client, model=MODEL).info.fingerprint
    assert OpenAIEmbedder(other, model=MODEL).info.fingerprint == base
    assert OpenAIBatchEmbedder(client, model=MODEL).info.fingerprint == base
    assert OpenAIEmbedder(client, model=MODEL, dimensions=512).info.fingerprint != base
    assert OpenAIEmbedder(client, model="text-embedding-3-large").info.fingerprint != base
    client.close()
    other.close()


def test_unreachable_endpoint_is_transient_and_keeps_the_key_out() -> None:
    client = OpenAI(base_url="http://127.0.0.1:9/v1", api_key=SECRET, max_retries=0, timeout=2)
    embedder = OpenAIEmbedder(client, model=MODEL, pacer=Pacer(attempts=2, backoff_s=0.01))
    with pytest.raises(TransientError) as caught:
        embedder.embed(embedder.tokenize(["hello"]))
    assert SECRET not in str(caught.value)
    client.close()


def test_provider_messages_are_redacted() -> None:
    message = f"Incorrect API key provided: {SECRET}. Also sk-proj-abcd****wxyz."
    cleaned = redact(message, SECRET)
    assert SECRET not in cleaned and "abcd" not in cleaned


# batch ----------------------------------------------------------------------------------------------------


def test_batch_lifecycle_returns_a_vector_per_custom_id(serve: Serve, hasher: HashEmbedder) -> None:
    emulator, client = serve()
    embedder = batcher(client, inputs_per_request=2)
    assert isinstance(embedder, DeferredEmbedder)
    items = jobs(embedder, TEXTS)
    result = finish(embedder, embedder.submit("plan-1/seq-0/attempt-0", items))
    assert result.status == "completed" and result.failed == {}
    for item, vector in zip(items, expected(hasher, TEXTS), strict=True):
        np.testing.assert_allclose(result.vectors[item.custom_id], vector, rtol=1e-6)
    assert result.billed_tokens == sum(item.tokens.count for item in items)
    assert emulator.stats()["billed_tokens_batch"] == result.billed_tokens


def test_the_same_key_twice_creates_one_batch(serve: Serve) -> None:
    emulator, client = serve()
    embedder = batcher(client)
    items = jobs(embedder, TEXTS)
    first = embedder.submit("key-a", items)
    again = batcher(client).submit("key-a", items)  # another process, after a crash
    assert first == again
    assert emulator.stats()["batches_created"] == 1


def test_a_timed_out_create_adopts_the_batch_it_made(serve: Serve) -> None:
    emulator, client = serve(slow_creates=1, create_delay_s=1.0)
    embedder = batcher(client, create_timeout_s=0.3)
    items = jobs(embedder, TEXTS)
    job_id = embedder.submit("key-slow", items)
    assert embedder.submit("key-slow", items) == job_id
    assert emulator.stats()["batches_created"] == 1
    assert len(finish(embedder, job_id).vectors) == len(TEXTS)


def test_another_process_can_poll_the_job(serve: Serve) -> None:
    """A resume after kill -9 knows the job's items from the ledger alone: each line names the positions of
    its inputs, and nothing is read back but the output (the real API serves no user_data file back)."""
    _, client = serve()
    items = jobs(batcher(client), TEXTS)
    job_id = batcher(client, inputs_per_request=4).submit("key-x", items)
    other = batcher(client)  # a fresh process: no memory of the submit
    other.recall(job_id, [(item.custom_id, item.tokens.count) for item in items])
    assert set(finish(other, job_id).vectors) == {item.custom_id for item in items}
    assert set(client.batches.retrieve(job_id).metadata or {}) == {"reindex_key"}  # no map uploaded


def test_a_fresh_process_reads_an_expired_batch_by_its_line_names(serve: Serve) -> None:
    _, client = serve(expire_after=1, polls_per_step=0)
    submitter = batcher(client, inputs_per_request=2)
    items = jobs(submitter, TEXTS)
    job_id = submitter.submit("key-exp-other", items)
    other = batcher(client)
    other.recall(job_id, [(item.custom_id, item.tokens.count) for item in items])
    result = finish(other, job_id)
    assert set(result.vectors) == {"doc-0", "doc-1"}  # the first line, as the submitter would read it
    assert set(result.failed) == {f"doc-{i}" for i in range(2, len(TEXTS))}


def test_a_batch_whose_items_are_not_recalled_is_a_clear_error(serve: Serve) -> None:
    _, client = serve(polls_per_step=0)
    job_id = batcher(client).submit("key-lost", jobs(batcher(client), TEXTS))
    with pytest.raises(BackendError, match="not in this migration's ledger"):
        finish(batcher(client), job_id)


def test_the_emulator_refuses_a_user_data_download_as_the_real_api_does(serve: Serve) -> None:
    _, client = serve()
    uploaded = client.files.create(file=("map.json", b"{}"), purpose="user_data")
    with pytest.raises(openai.BadRequestError, match="Not allowed to download files of purpose: user_data"):
        client.files.content(uploaded.id)


def test_an_expired_batch_returns_its_done_lines_and_fails_the_rest(serve: Serve) -> None:
    _, client = serve(expire_after=1, polls_per_step=0)
    embedder = batcher(client, inputs_per_request=2)
    items = jobs(embedder, TEXTS)
    result = finish(embedder, embedder.submit("key-exp", items))
    assert result.status == "expired"
    assert set(result.vectors) == {"doc-0", "doc-1"}
    assert result.failed == {f"doc-{i}": "batch_expired" for i in range(2, len(TEXTS))}


def test_shuffled_and_duplicated_output_lines_join_on_custom_id(serve: Serve, hasher: HashEmbedder) -> None:
    _, client = serve(shuffle_output=True, duplicate_output_line=True, polls_per_step=0)
    embedder = batcher(client, inputs_per_request=1)
    items = jobs(embedder, TEXTS)
    result = finish(embedder, embedder.submit("key-shuffle", items))
    assert result.failed == {}
    for item, vector in zip(items, expected(hasher, TEXTS), strict=True):
        np.testing.assert_allclose(result.vectors[item.custom_id], vector, rtol=1e-6)


def test_a_malformed_output_line_fails_only_its_items(serve: Serve) -> None:
    _, client = serve(malformed_output_line=True, polls_per_step=0)
    embedder = batcher(client, inputs_per_request=2)
    result = finish(embedder, embedder.submit("key-bad", jobs(embedder, TEXTS)))
    assert len(result.vectors) == len(TEXTS) - 2
    assert list(result.failed.values()) == ["malformed_output"] * 2


def test_a_deleted_output_file_fails_its_lines_for_resubmission(serve: Serve) -> None:
    _, client = serve(delete_output=True, polls_per_step=0)
    embedder = batcher(client)
    result = finish(embedder, embedder.submit("key-gone", jobs(embedder, TEXTS)))
    assert result.vectors == {}
    assert set(result.failed.values()) == {"output_deleted"}


def test_a_rejected_line_fails_with_its_error_code(serve: Serve) -> None:
    _, client = serve(poison_substring="POISON", polls_per_step=0)
    embedder = batcher(client, inputs_per_request=1)
    texts = [*TEXTS[:2], "a POISON pill"]
    result = finish(embedder, embedder.submit("key-poison", jobs(embedder, texts)))
    assert result.failed == {"doc-2": "invalid_request_error"}
    assert set(result.vectors) == {"doc-0", "doc-1"}


def test_a_batch_that_fails_validation_fails_every_item(serve: Serve) -> None:
    emulator, client = serve(fail_validation=True, polls_per_step=0)
    embedder = batcher(client)
    items = jobs(embedder, TEXTS)
    result = finish(embedder, embedder.submit("key-invalid", items))
    assert result.status == "failed"
    assert result.failed == {item.custom_id: "batch_failed:invalid_request" for item in items}
    emulator.set_faults(FaultPlan(polls_per_step=0))
    assert embedder.submit("key-invalid", items) != ""  # a failed batch is not adopted
    assert emulator.stats()["batches_created"] == 2


def test_release_deletes_every_file_of_the_job(serve: Serve) -> None:
    _, client = serve(polls_per_step=0, expire_after=1)
    embedder = batcher(client, inputs_per_request=2)
    job_id = embedder.submit("key-release", jobs(embedder, TEXTS))
    finish(embedder, job_id)
    batch = client.batches.retrieve(job_id)
    files = [batch.input_file_id, batch.output_file_id, batch.error_file_id]
    assert all(files)
    embedder.release(job_id)
    embedder.release(job_id)  # twice is fine
    for file_id in files:
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(str(file_id))


def test_a_shard_over_the_batch_limit_is_a_config_error(serve: Serve) -> None:
    _, client = serve()
    embedder = batcher(client)
    [tokens] = embedder.tokenize(["x"])
    with pytest.raises(ConfigError, match="shard_size"):
        embedder.submit("key-big", [JobItem(f"d{i}", tokens) for i in range(50_001)])


# pricing --------------------------------------------------------------------------------------------------


def test_the_price_table_matches_configs_pricing_toml() -> None:
    table = tomllib.loads((Path(__file__).parents[2] / "configs" / "pricing.toml").read_text())
    assert table["taken"] == PRICES_TAKEN
    assert table["models"] == PRICES


def test_prices_can_be_overridden_per_model() -> None:
    assert price_per_million(MODEL, batch=True) == 0.01
    assert price_per_million(MODEL, batch=False) == 0.02
    assert price_per_million(MODEL, batch=True, overrides={MODEL: {"batch": 0.005}}) == 0.005
    assert price_per_million("my-local-model", batch=False) is None


@pytest.mark.parametrize(
    ("shape", "code"), [("response", "invalid_request_error"), ("error", "invalid_request")]
)
def test_both_error_file_shapes_of_a_refused_line_name_the_providers_code(
    serve: Serve, shape: str, code: str
) -> None:
    _, client = serve(poison_substring="POISON", poison_shape=shape, polls_per_step=0)
    embedder = batcher(client, inputs_per_request=2)
    texts = [*TEXTS[:3], "a POISON pill"]
    result = finish(embedder, embedder.submit(f"key-{shape}", jobs(embedder, texts)))
    assert result.failed == {"doc-2": code, "doc-3": code}  # the whole request line is refused
    assert set(result.vectors) == {"doc-0", "doc-1"}


@pytest.mark.parametrize(
    ("status", "code"), [(429, "rate_limit_exceeded"), (500, "server_error"), (503, "server_error")]
)
def test_rate_limited_and_server_error_lines_are_named_for_resubmission(
    serve: Serve, status: int, code: str
) -> None:
    _, client = serve(failed_lines=2, failed_line_status=status, polls_per_step=0)
    embedder = batcher(client, inputs_per_request=1)
    result = finish(embedder, embedder.submit(f"key-{status}", jobs(embedder, TEXTS)))
    assert result.failed == {"doc-0": code, "doc-1": code}
    assert len(result.vectors) == len(TEXTS) - 2


KEY = "sk-test-SECRET-123"


def test_the_api_key_is_in_no_error_message_traceback_or_log_line(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    emulator, _ = serve(unauthorized=2)
    client = OpenAI(base_url=emulator.base_url, api_key=KEY, max_retries=0, timeout=5)
    failures: list[BaseException] = []
    for call in (
        lambda: batcher(client).submit("key-401", jobs(batcher(client), TEXTS)),
        lambda: online(client).embed(online(client).tokenize(TEXTS)),
    ):
        with pytest.raises(ConfigError) as caught:
            call()
        failures.append(caught.value)
    emulator.set_faults(FaultPlan(server_errors=5, server_errors_on=("batch_list", "embeddings")))
    with pytest.raises(TransientError) as busy:
        online(client, pacer=Pacer(attempts=2, backoff_s=0.01)).embed(online(client).tokenize(TEXTS))
    failures.append(busy.value)
    dead = OpenAI(base_url="http://127.0.0.1:9/v1", api_key=KEY, max_retries=0, timeout=2)
    with pytest.raises(TransientError) as unreachable:
        batcher(dead, pacer=Pacer(attempts=2, backoff_s=0.01)).poll("batch_x")
    failures.append(unreachable.value)
    for failure in failures:
        rendered = "".join(traceback.format_exception(failure))
        assert KEY not in rendered and "SECRET" not in rendered
    assert emulator.stats()["refused"]["401"] == 2
    assert all("SECRET" not in record.getMessage() for record in caplog.records)
    client.close()
    dead.close()


@pytest.mark.parametrize("dim", [384, 385, 1536])  # 385: each row's base64 ends in padding
def test_base64_rows_decode_to_one_float32_matrix_as_the_rows_say(dim: int) -> None:
    from reindex_adapters.remote.decoding import decode_vectors

    rows = np.random.default_rng(dim).random((7, dim), dtype=np.float32)
    encoded = [base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in rows]
    decoded = decode_vectors(encoded)
    assert decoded is not None and decoded.dtype == np.float32 and np.array_equal(decoded, rows)
    listed = decode_vectors([row.tolist() for row in rows])  # float lists too
    assert listed is not None and np.array_equal(listed, rows)
    shorter = base64.b64encode(rows[0, :-1].astype("<f4").tobytes()).decode("ascii")
    assert decode_vectors([encoded[0], shorter]) is None  # rows of two lengths
    with pytest.raises(ValueError):
        decode_vectors([encoded[0][:-2] + "!!"])  # not base64
    with pytest.raises(ValueError):
        decode_vectors([base64.b64encode(b"abc").decode("ascii")])  # not whole float32s


def test_adoption_reads_the_listing_once_then_only_what_is_new(serve: Serve) -> None:
    """Each submit looked its key up over every page of the organization's batches: about 5 x 10^5 list
    calls for a 10M-document run. Now one process reads the listing whole once, then one page a submit."""
    _, client = serve(polls_per_step=0)
    older = batcher(client)
    for n in range(130):  # another run's batches: two pages of the listing
        older.submit(f"other-{n}", jobs(older, TEXTS[:1]))
    embedder = batcher(client)
    first = embedder.submit("key-a", jobs(embedder, TEXTS))
    pages_then = embedder._index.listed_pages
    assert pages_then == 2
    for key in ("key-b", "key-c", "key-d"):
        embedder.submit(key, jobs(embedder, TEXTS))
    assert embedder._index.listed_pages == pages_then + 3  # one page each: it starts with what it has seen
    assert embedder.submit("key-a", jobs(embedder, TEXTS)) == first  # adopted, not created again
    assert embedder.submit("other-7", jobs(embedder, TEXTS[:1])) == older._index.find("other-7").id  # type: ignore[union-attr]
