"""The OpenAI emulator, driven only through the official SDK (and its admin endpoints over HTTP)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from openai import OpenAI

from reindex.ports import Vectors
from reindex_adapters.remote.tokens import cl100k
from reindex_adapters.testing.emulators.faults import INVALID_INPUT, FaultPlan
from reindex_adapters.testing.emulators.openai import Emulator
from reindex_adapters.testing.memory import HashEmbedder

MODEL = "text-embedding-3-small"
TERMINAL = {"completed", "failed", "expired", "cancelled"}
Serve = Callable[..., Emulator]
Connect = Callable[..., OpenAI]
TEXTS = ["the quick brown fox", "jumps over", "the lazy dog", "hello world", "naïve café ☕"]


@pytest.fixture
def embedder() -> HashEmbedder:
    return HashEmbedder(dim=16)


@pytest.fixture
def serve(embedder: HashEmbedder) -> Iterator[Serve]:
    started: list[Emulator] = []

    def start(**faults: Any) -> Emulator:
        emulator = Emulator(embedder, FaultPlan(**faults))
        emulator.start()
        started.append(emulator)
        return emulator

    yield start
    for emulator in started:
        emulator.stop()


@pytest.fixture
def connect() -> Iterator[Connect]:
    clients: list[OpenAI] = []

    def make(emulator: Emulator, api_key: str = "test", **options: Any) -> OpenAI:
        options.setdefault("max_retries", 0)
        client = OpenAI(base_url=emulator.base_url, api_key=api_key, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def expected(embedder: HashEmbedder, texts: list[str]) -> Vectors:
    return embedder.embed(embedder.tokenize(texts))


def tokens(text: str) -> int:
    return len(cl100k().encode_ordinary(text))


def line(custom_id: str, text: Any) -> dict[str, Any]:
    body = {"model": MODEL, "input": text, "encoding_format": "float"}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}


def submit(client: OpenAI, lines: list[dict[str, Any]] | bytes, **metadata: str) -> str:
    content = lines if isinstance(lines, bytes) else "".join(json.dumps(x) + "\n" for x in lines).encode()
    upload = client.files.create(file=("requests.jsonl", content), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h", metadata=metadata or None
    )
    assert batch.status == "validating"
    return batch.id


def wait(client: OpenAI, batch_id: str) -> list[str]:
    """Poll to a terminal status; return the statuses seen."""
    seen: list[str] = [client.batches.retrieve(batch_id).status]
    while seen[-1] not in TERMINAL:
        assert len(seen) < 10
        seen.append(client.batches.retrieve(batch_id).status)
    return seen


def read_jsonl(client: OpenAI, file_id: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def test_embeddings_match_the_embedder_and_bill_exact_cl100k_tokens(
    serve: Serve, connect: Connect, embedder: HashEmbedder
) -> None:
    emulator = serve()
    client = connect(emulator)
    as_base64 = client.embeddings.create(input=TEXTS, model=MODEL)  # the SDK asks for base64 by default
    as_float = client.embeddings.create(input="hello world", model=MODEL, encoding_format="float")
    vectors = np.array([d.embedding for d in as_base64.data], dtype=np.float32)
    np.testing.assert_array_equal(vectors, expected(embedder, TEXTS))
    np.testing.assert_allclose(as_float.data[0].embedding, expected(embedder, ["hello world"])[0], rtol=1e-6)
    assert [d.index for d in as_base64.data] == list(range(len(TEXTS)))
    assert as_base64.usage.prompt_tokens == as_base64.usage.total_tokens == sum(map(tokens, TEXTS))
    assert as_float.usage.prompt_tokens == 2
    assert as_base64.model == MODEL
    stats = emulator.stats()
    assert stats["billed_tokens_online"] == stats["billed_tokens"] == sum(map(tokens, TEXTS)) + 2
    assert stats["requests"]["embeddings"] == 2


def test_token_arrays_are_embedded_as_their_text_and_dimensions_shorten(
    serve: Serve, connect: Connect, embedder: HashEmbedder
) -> None:
    client = connect(serve())
    hello = cl100k().encode_ordinary("hello world")
    response = client.embeddings.create(input=[hello], model=MODEL, dimensions=4)
    full = expected(embedder, ["hello world"])[0]
    np.testing.assert_allclose(response.data[0].embedding, full[:4] / np.linalg.norm(full[:4]), rtol=1e-5)
    assert response.usage.prompt_tokens == len(hello)


@pytest.mark.parametrize("bad_input", ["", "   ", ["fine", " \n"], [], [[]]])
def test_empty_input_is_a_400_in_the_real_error_shape(serve: Serve, connect: Connect, bad_input: Any) -> None:
    emulator = serve()
    with pytest.raises(openai.BadRequestError) as caught:
        connect(emulator).embeddings.create(input=bad_input, model=MODEL)
    assert caught.value.status_code == 400
    error = {"message": INVALID_INPUT, "type": "invalid_request_error", "param": None, "code": None}
    assert caught.value.response.json() == {"error": error}
    assert emulator.stats()["billed_tokens"] == 0


def test_too_many_inputs_or_tokens_are_rejected(serve: Serve, connect: Connect) -> None:
    client = connect(serve())
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(input=["x"] * 2049, model=MODEL)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 8192"):
        client.embeddings.create(input=["ok", "word " * 8200], model=MODEL)


def test_batch_lifecycle_from_upload_to_deleted_files(
    serve: Serve, connect: Connect, embedder: HashEmbedder
) -> None:
    emulator = serve()
    client = connect(emulator)
    batch_id = submit(client, [line("a", TEXTS[0]), line("b", "  "), line("c", TEXTS[1])], run="r1")
    assert wait(client, batch_id) == ["in_progress", "finalizing", "completed"]
    batch = client.batches.retrieve(batch_id)
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (
        3,
        2,
        1,
    )
    assert batch.metadata == {"run": "r1"}
    assert batch.output_file_id and batch.error_file_id
    outputs = {x["custom_id"]: x for x in read_jsonl(client, batch.output_file_id)}
    assert outputs["a"]["response"]["status_code"] == 200 and outputs["a"]["error"] is None
    vectors = [outputs[key]["response"]["body"]["data"][0]["embedding"] for key in ("a", "c")]
    np.testing.assert_allclose(vectors, expected(embedder, [TEXTS[0], TEXTS[1]]), rtol=1e-6)
    [failure] = read_jsonl(client, batch.error_file_id)
    assert failure["custom_id"] == "b" and failure["response"]["status_code"] == 400
    assert failure["response"]["body"]["error"]["message"] == INVALID_INPUT
    stats = emulator.stats()
    assert stats["billed_tokens_batch"] == tokens(TEXTS[0]) + tokens(TEXTS[1])
    assert all(entry["is_batch"] and entry["batch_id"] == batch_id for entry in stats["billed"])
    for file_id in (batch.input_file_id, batch.output_file_id, batch.error_file_id):
        assert client.files.delete(file_id).deleted
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(file_id)


def test_list_pages_newest_first_and_clients_filter_on_metadata(serve: Serve, connect: Connect) -> None:
    emulator = serve()
    client = connect(emulator)
    ids = [submit(client, [line("a", "x")], intent=f"k{i}") for i in range(3)]
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[:0:-1] and page.has_more
    assert [b.id for b in client.batches.list(limit=2)] == ids[::-1]  # auto-pagination with `after`
    assert [b.id for b in client.batches.list() if (b.metadata or {}).get("intent") == "k1"] == [ids[1]]
    assert [b["metadata"] for b in emulator.stats()["batches"]] == [{"intent": f"k{i}"} for i in range(3)]


def test_invalid_lines_fail_validation_with_line_numbers(serve: Serve, connect: Connect) -> None:
    client = connect(serve())
    content = b"\n".join(
        [json.dumps(line("a", "x")).encode(), b"{not json", json.dumps(line("a", "y")).encode()]
    )
    batch_id = submit(client, content)
    assert wait(client, batch_id) == ["failed"]
    errors = client.batches.retrieve(batch_id).errors
    assert errors is not None and errors.data is not None
    assert [(e.code, e.line) for e in errors.data] == [("invalid_json_line", 2), ("duplicate_custom_id", 3)]


def test_scripted_validation_failure(serve: Serve, connect: Connect) -> None:
    client = connect(serve(fail_validation=True))
    assert wait(client, submit(client, [line("a", "x")])) == ["failed"]


def test_rate_limit_storm_sends_retry_after_and_counts_early_requests(serve: Serve, connect: Connect) -> None:
    emulator = serve(rate_limit=2, retry_after_s=5)
    impatient = connect(emulator, api_key="impatient")
    for _ in range(2):
        with pytest.raises(openai.RateLimitError) as caught:
            impatient.embeddings.create(input="x", model=MODEL)
    headers = caught.value.response.headers
    assert (headers["retry-after"], headers["retry-after-ms"]) == ("5", "5000")
    assert caught.value.code == "rate_limit_exceeded"
    impatient.embeddings.create(input="x", model=MODEL)
    assert emulator.stats()["early_requests"] == {"impatient": 2}
    assert emulator.stats()["refused"] == {"429": 2}


def test_sdk_retries_that_honour_retry_after_are_not_early(serve: Serve, connect: Connect) -> None:
    emulator = serve(rate_limit=2, retry_after_s=0.05, rate_limit_on=("batch_create", "batch_retrieve"))
    client = connect(emulator, api_key="patient", max_retries=3)
    batch_id = submit(client, [line("a", "x")])
    wait(client, batch_id)
    stats = emulator.stats()
    assert stats["refused"] == {"429": 2} and stats["early_requests_total"] == 0
    assert stats["batches_created"] == 1


def test_server_error_burst_then_recovery(serve: Serve, connect: Connect) -> None:
    emulator = serve(server_errors=2, server_error_status=503)
    client = connect(emulator)
    for _ in range(2):
        with pytest.raises(openai.InternalServerError) as caught:
            client.embeddings.create(input="x", model=MODEL)
        assert caught.value.status_code == 503
    assert client.embeddings.create(input="x", model=MODEL).usage.prompt_tokens == 1


def test_create_that_times_out_still_makes_a_batch_the_list_shows(serve: Serve, connect: Connect) -> None:
    emulator = serve(slow_creates=1, create_delay_s=1.0)
    client = connect(emulator, timeout=0.2)
    with pytest.raises(openai.APITimeoutError):
        submit(client, [line("a", "x")], intent="once")
    [batch] = client.batches.list().data
    assert batch.metadata == {"intent": "once"}
    assert emulator.stats()["batches_created"] == 1


def test_expired_batch_delivers_first_lines_and_marks_the_rest_expired(
    serve: Serve, connect: Connect
) -> None:
    emulator = serve(expire_after=2)
    client = connect(emulator)
    batch_id = submit(client, [line(f"id{i}", text) for i, text in enumerate(TEXTS)])
    assert wait(client, batch_id) == ["in_progress", "expired"]
    batch = client.batches.retrieve(batch_id)
    assert batch.request_counts is not None and batch.request_counts.completed == 2
    assert batch.output_file_id and batch.error_file_id
    assert [x["custom_id"] for x in read_jsonl(client, batch.output_file_id)] == ["id0", "id1"]
    expired = read_jsonl(client, batch.error_file_id)
    assert [(x["custom_id"], x["error"]["code"]) for x in expired] == [
        (f"id{i}", "batch_expired") for i in (2, 3, 4)
    ]
    assert emulator.stats()["billed_tokens_batch"] == tokens(TEXTS[0]) + tokens(TEXTS[1])


def test_client_cancel_keeps_finished_lines(serve: Serve, connect: Connect) -> None:
    emulator = serve(cancel_after=1)
    client = connect(emulator)
    batch_id = submit(client, [line("a", "x"), line("b", "y")])
    assert client.batches.cancel(batch_id).status == "cancelling"
    assert wait(client, batch_id) == ["cancelled"]
    batch = client.batches.retrieve(batch_id)
    assert batch.output_file_id and batch.error_file_id
    assert [x["custom_id"] for x in read_jsonl(client, batch.output_file_id)] == ["a"]
    assert read_jsonl(client, batch.error_file_id)[0]["error"]["code"] == "batch_cancelled"
    emulator.set_faults(FaultPlan())
    completed = submit(client, [line("a", "x")])
    wait(client, completed)
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a batch with status 'completed'"):
        client.batches.cancel(completed)


def test_server_side_cancel_after_some_lines(serve: Serve, connect: Connect) -> None:
    client = connect(serve(cancel_after=1))
    batch_id = submit(client, [line("a", "x"), line("b", "y")])
    assert wait(client, batch_id) == ["in_progress", "cancelling", "cancelled"]
    counts = client.batches.retrieve(batch_id).request_counts
    assert counts is not None and (counts.completed, counts.failed) == (1, 1)


def test_shuffled_output_is_joinable_on_custom_id(
    serve: Serve, connect: Connect, embedder: HashEmbedder
) -> None:
    client = connect(serve(shuffle_output=True))
    batch_id = submit(client, [line(f"id{i}", text) for i, text in enumerate(TEXTS)])
    wait(client, batch_id)
    output_file_id = client.batches.retrieve(batch_id).output_file_id
    assert output_file_id
    lines = read_jsonl(client, output_file_id)
    order = [x["custom_id"] for x in lines]
    assert order != [f"id{i}" for i in range(len(TEXTS))] and sorted(order) == sorted(set(order))
    joined = {x["custom_id"]: x["response"]["body"]["data"][0]["embedding"] for x in lines}
    vectors = [joined[f"id{i}"] for i in range(len(TEXTS))]
    np.testing.assert_allclose(vectors, expected(embedder, TEXTS), rtol=1e-6)


def test_duplicated_malformed_and_deleted_output(serve: Serve, connect: Connect) -> None:
    emulator = serve(duplicate_output_line=True)
    client = connect(emulator)
    batch_id = submit(client, [line(f"id{i}", text) for i, text in enumerate(TEXTS)])
    wait(client, batch_id)
    output_file_id = client.batches.retrieve(batch_id).output_file_id
    assert output_file_id
    custom_ids = [x["custom_id"] for x in read_jsonl(client, output_file_id)]
    assert len(custom_ids) == len(TEXTS) + 1 and len(set(custom_ids)) == len(TEXTS)
    emulator.set_faults(FaultPlan(malformed_output_line=True))
    batch_id = submit(client, [line("a", "x"), line("b", "y")])
    wait(client, batch_id)
    text = client.files.content(client.batches.retrieve(batch_id).output_file_id or "").text
    with pytest.raises(json.JSONDecodeError):
        [json.loads(x) for x in text.splitlines()]
    emulator.set_faults(FaultPlan(delete_output=True))
    batch_id = submit(client, [line("a", "x")])
    wait(client, batch_id)
    with pytest.raises(openai.NotFoundError):
        client.files.content(client.batches.retrieve(batch_id).output_file_id or "")


def test_a_poison_input_fails_its_whole_request(serve: Serve, connect: Connect) -> None:
    emulator = serve(poison_substring="POISON")
    client = connect(emulator)
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(input=["fine", "a POISON pill", "fine too"], model=MODEL)
    assert emulator.stats()["billed_tokens"] == 0
    batch_id = submit(client, [line("ok", "fine"), line("bad", ["x", "POISON"])])
    wait(client, batch_id)
    error_file_id = client.batches.retrieve(batch_id).error_file_id
    assert error_file_id
    [failure] = read_jsonl(client, error_file_id)
    assert (failure["custom_id"], failure["response"]["status_code"]) == ("bad", 400)


def test_faults_are_set_and_stats_read_over_http(serve: Serve, connect: Connect) -> None:
    emulator = serve()
    root = emulator.base_url.removesuffix("/v1")
    with httpx.Client(base_url=root) as admin:
        assert admin.post(
            "/_emulator/faults", json={"rate_limit": 1, "rate_limit_on": ["embeddings"]}
        ).is_success
        assert admin.post("/_emulator/faults", json={"rate_limt": 1}).status_code == 400
        assert admin.post("/_emulator/faults", json={"rate_limit_on": ["nowhere"]}).status_code == 400
        with pytest.raises(openai.RateLimitError):
            connect(emulator).embeddings.create(input="x", model=MODEL)
        stats = admin.get("/_emulator/stats").json()
    assert stats["refused"] == {"429": 1} and stats["faults"]["rate_limit"] == 0


def test_a_poison_input_can_come_back_as_an_error_object_instead_of_an_http_answer(
    serve: Serve, connect: Connect
) -> None:
    emulator = serve(poison_substring="POISON", poison_shape="error")
    client = connect(emulator)
    batch_id = submit(client, [line("ok", "fine"), line("bad", ["x", "POISON"])])
    wait(client, batch_id)
    [failure] = read_jsonl(client, client.batches.retrieve(batch_id).error_file_id or "")
    assert failure["custom_id"] == "bad" and failure["response"] is None
    assert failure["error"] == {"code": "invalid_request", "message": INVALID_INPUT}


def test_scripted_failed_lines_answer_with_their_status_and_bill_nothing(
    serve: Serve, connect: Connect
) -> None:
    emulator = serve(failed_lines=1, failed_line_status=429)
    client = connect(emulator)
    batch_id = submit(client, [line("a", "first"), line("b", "second")])
    assert wait(client, batch_id)[-1] == "completed"
    batch = client.batches.retrieve(batch_id)
    [failure] = read_jsonl(client, batch.error_file_id or "")
    assert (failure["custom_id"], failure["response"]["status_code"]) == ("a", 429)
    assert failure["response"]["body"]["error"]["code"] == "rate_limit_exceeded"
    assert [x["custom_id"] for x in read_jsonl(client, batch.output_file_id or "")] == ["b"]
    assert emulator.stats()["billed_tokens"] == len(cl100k().encode_ordinary("second"))


def test_an_unauthorized_answer_echoes_the_key_presented_as_the_real_api_does(
    serve: Serve, connect: Connect
) -> None:
    emulator = serve(unauthorized=1)
    with pytest.raises(openai.AuthenticationError) as caught:
        connect(emulator, api_key="sk-test-echo-1234").embeddings.create(input="x", model=MODEL)
    assert "sk-test-echo-1234" in str(caught.value)
    assert connect(emulator).embeddings.create(input="x", model=MODEL).data
    assert emulator.stats()["refused"] == {"401": 1}
