"""Contract tests: the providers' documented wire examples, replayed through the adapters' parsing and error
classification, independent of the emulators (issue 42). Each example is the shape a public source shows,
with the source named beside it; values are shortened (vectors of 3), never reshaped.

Sources:
- [OB] OpenAI Batch API guide, "Retrieving the results" and "Batch expiration": an output line
  `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}`, and for a request
  the window cut off, `"response": null, "error": {"code": "batch_expired", "message": "This request could
  not be executed before the completion window expired."}`.
- [OE] OpenAI API reference, embeddings object: `{"object": "list", "data": [{"object": "embedding",
  "embedding": [...], "index": 0}], "model", "usage": {"prompt_tokens", "total_tokens"}}`.
- [VB] Voyage Batch Inference guide: output lines `{"batch_id", "custom_id", "response": {"status_code": 200,
  "body": {object, data, model, usage: {total_tokens}}}, "error": null}`; error lines with `response:
  {status_code, message}` or `error: {code: "batch_expired", message}`.
- [V400] Voyage 400 bodies quoted in public clients (github.com/ramakay/claude-self-reflect/issues/38):
  `{"detail": "Request to model '<m>' failed. ..."}`.
- [CB] google-gemini/cookbook `quickstarts/Batch_mode.ipynb`, "Batch embeddings", executed output: a
  responses line `{"response": {"tokenCount": "1", "embedding": {"values": [...]}}, "key": "request_1"}`.
- [MS] mistralai's SDK, `extra/batch` `_parse_output_obj`: `{custom_id, response: {status_code, body}, error}`,
  a success when there is no error and the status is below 400.
- [BD] AWS Bedrock user guide, "Format and upload your batch inference data": output records
  `{"recordId", "modelInput", "modelOutput": <InvokeModel answer>}`, or `"error": {"errorCode",
  "errorMessage"}`; Titan V2's answer `{"embedding": [...], "inputTextTokenCount"}` (its model card).
- [CE] Cohere API reference, "Embed (v2)": `{"id", "embeddings": {"float": [[...]]}, "texts": [...], "meta":
  {"api_version": {"version": "2"}, "billed_units": {"input_tokens"}}, "response_type": "embeddings_by_type"}`;
  errors are `{"message": "..."}` (the SDK raises `BadRequestError`, `TooManyRequestsError` from the status).
- [CJ] Cohere "Embed Jobs" guide: the result dataset's rows `{"text", "embeddings": {"float": [...], "int8":
  null, ...}, <kept fields>}`, read by the SDK's own Avro reader (`cohere/utils.py`, fastavro).
- [AZ] Azure OpenAI 429 and 401 bodies as real deployments return them, quoted in public reports:
  `{"error": {"code": "429", "message": "Requests to the Embeddings_Create Operation under Azure OpenAI API
  version 2024-02-15-preview have exceeded call rate limit ... Please retry after 86400 seconds. ..."}}`
  (github.com/assafelovic/gpt-researcher/issues/936, with a `Retry-After` header in the Azure guide "Manage
  quota"); `{"error": {"code": "401", "message": "Access denied due to invalid subscription key or wrong API
  endpoint. ..."}}`; a 404 `{"error": {"code": "DeploymentNotFound", "message": "The API deployment for this
  resource does not exist. ..."}}`; an over-long input's 400 `{"error": {"message": "This model's maximum
  context length is 8192 tokens, however you requested 8245 tokens ...", "type": "invalid_request_error",
  "param": null, "code": null}}`.

The Cohere and Azure cases go through the official SDKs (`cohere.ClientV2`, `openai.AzureOpenAI`) over an
httpx transport that answers the documented bytes, so the SDK's own parsing is part of what is checked.
"""

from __future__ import annotations

import io
import json

import httpx
import numpy as np
import pytest

from reindex.errors import ConfigError, TransientError
from reindex_adapters.bedrock.records import collect_records
from reindex_adapters.cohere.batch import join as cohere_join
from reindex_adapters.cohere.online import CohereEmbedder
from reindex_adapters.gemini.responses import read_responses
from reindex_adapters.mistral import read_line as read_mistral_line
from reindex_adapters.openai.client import translated_errors as azure_errors
from reindex_adapters.remote.errors import ProviderBusy, ProviderNotFound, ProviderRejected
from reindex_adapters.remote.lines import billed_tokens, collect_lines
from reindex_adapters.remote.pacing import Pacer
from reindex_adapters.voyage.client import _detail, _error_code, status_error
from reindex_adapters.voyage.lines import read_line

DIM = 3
VECTOR = [0.0023064255, -0.009327292, 0.015797347]


def lines(*objects: object) -> bytes:
    return "".join(json.dumps(o) + "\n" for o in objects).encode()


def test_openai_batch_output_and_expired_lines_join_back_to_their_items() -> None:
    answered = {  # [OB] an output line, its body the embeddings object [OE]
        "id": "batch_req_wnaDys",
        "custom_id": "a1b2c3d4e5f6a7b8-0-2",
        "response": {
            "status_code": 200,
            "request_id": "req_c187b3",
            "body": {
                "object": "list",
                "data": [
                    {"object": "embedding", "embedding": VECTOR, "index": 0},
                    {"object": "embedding", "embedding": VECTOR[::-1], "index": 1},
                ],
                "model": "text-embedding-3-small",
                "usage": {"prompt_tokens": 8, "total_tokens": 8},
            },
        },
        "error": None,
    }
    expired = {  # [OB] "Batch expiration": a request the window cut off, in the error file
        "id": "batch_req_123",
        "custom_id": "a1b2c3d4e5f6a7b8-2-1",
        "response": None,
        "error": {
            "code": "batch_expired",
            "message": "This request could not be executed before the completion window expired.",
        },
    }
    groups = {"a1b2c3d4e5f6a7b8-0-2": ["doc-0", "doc-1"], "a1b2c3d4e5f6a7b8-2-1": ["doc-2"]}
    vectors, failed = collect_lines(groups, [lines(answered), lines(expired)], DIM, missing=None)
    np.testing.assert_allclose(vectors["doc-0"], VECTOR, rtol=1e-6)
    np.testing.assert_allclose(vectors["doc-1"], VECTOR[::-1], rtol=1e-6)
    assert failed == {"doc-2": "batch_expired"}  # retried: a rerun sends it again
    assert billed_tokens(lines(answered), "prompt_tokens") == 8


def test_openai_batch_error_line_with_an_http_answer_keeps_the_apis_code() -> None:
    refused = {  # [OB] a request that ran and was refused: its response carries the API's error body
        "id": "batch_req_9",
        "custom_id": "k-0-1",
        "response": {
            "status_code": 400,
            "request_id": "req_9",
            "body": {
                "error": {
                    "message": "This model's maximum context length is 8192 tokens.",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,
                }
            },
        },
        "error": None,
    }
    throttled = {**refused, "custom_id": "k-1-1", "response": {"status_code": 429, "body": {}}}
    groups = {"k-0-1": ["doc-0"], "k-1-1": ["doc-1"]}
    _, failed = collect_lines(groups, [lines(refused, throttled)], DIM, missing=None)
    assert failed == {"doc-0": "invalid_request_error", "doc-1": "rate_limit_exceeded"}


def test_voyage_batch_output_and_error_lines_read_as_documented() -> None:
    answered = {  # [VB]
        "batch_id": "batch_01",
        "custom_id": "doc-0",
        "response": {
            "status_code": 200,
            "body": {
                "object": "list",
                "data": [{"object": "embedding", "embedding": VECTOR, "index": 0}],
                "model": "voyage-3.5",
                "usage": {"total_tokens": 5},
            },
        },
        "error": None,
    }
    failed_line = {  # [VB] an error line with a status and a message
        "batch_id": "batch_01",
        "custom_id": "doc-1",
        "response": {"status_code": 500, "message": "Internal server error."},
        "error": None,
    }
    expired = {  # [VB] a line the window closed on
        "batch_id": "batch_01",
        "custom_id": "doc-2",
        "response": None,
        "error": {"code": "batch_expired", "message": "The batch expired."},
    }
    read = read_line(answered, 1, DIM)
    assert not isinstance(read, str)
    np.testing.assert_allclose(read[0], VECTOR, rtol=1e-6)
    assert read_line(failed_line, 1, DIM) == "server_error"
    assert read_line(expired, 1, DIM) == "batch_expired"
    assert billed_tokens(lines(answered), "total_tokens") == 5


def test_voyage_error_bodies_are_read_and_classified_as_documented() -> None:
    body = json.dumps(  # [V400], with the newer bodies' error_code
        {
            "detail": "Request to model 'voyage-4-large' failed. The max allowed tokens per submitted batch is"
            " 120000. Your batch has 126899 tokens after truncation. Please lower the number of tokens in the"
            " batch.",
            "error_code": "TOO_MANY_TOKENS_IN_BATCH",
        }
    ).encode()
    detail, code = _detail(body), _error_code(body)
    assert code == "TOO_MANY_TOKENS_IN_BATCH"
    assert isinstance(
        status_error(400, detail, {}, "", "KEY", is_input=True, error_code=code), ProviderRejected
    )
    busy = status_error(429, "Rate limit exceeded.", {"retry-after": "2"}, "", "KEY", is_input=True)
    assert isinstance(busy, ProviderBusy)


def test_gemini_responses_lines_read_as_the_cookbook_shows_them() -> None:
    answered = {"response": {"tokenCount": "1", "embedding": {"values": VECTOR}}, "key": "request_1"}  # [CB]
    vectors, failed, billed = read_responses(lines(answered), DIM)
    assert failed == {} and billed == 1  # tokenCount is a string on the wire
    np.testing.assert_allclose(vectors["request_1"], VECTOR, rtol=1e-6)  # poll scales it to unit length


def test_mistral_output_lines_read_by_the_sdks_own_rule() -> None:
    answered = {  # [MS]
        "custom_id": "doc-0",
        "response": {
            "status_code": 200,
            "body": {
                "object": "list",
                "data": [{"object": "embedding", "embedding": VECTOR, "index": 0}],
                "model": "mistral-embed",
                "usage": {"prompt_tokens": 4, "total_tokens": 4},
            },
        },
        "error": None,
    }
    read = read_mistral_line(answered, 1, DIM)
    assert not isinstance(read, str)
    np.testing.assert_allclose(read[0], VECTOR, rtol=1e-6)
    refused = {"custom_id": "doc-1", "response": {"status_code": 429, "body": {}}, "error": None}
    assert read_mistral_line(refused, 1, DIM) == "rate_limit_exceeded"


def test_bedrock_output_records_join_on_record_id_as_documented() -> None:
    answered = {  # [BD], Titan V2's answer
        "recordId": "00000000001",
        "modelInput": {"inputText": "a note", "dimensions": DIM, "normalize": True},
        "modelOutput": {"embedding": VECTOR, "inputTextTokenCount": 3},
    }
    refused = {  # [BD] a record the model refused
        "recordId": "00000000002",
        "modelInput": {"inputText": "", "dimensions": DIM, "normalize": True},
        "error": {"errorCode": 400, "errorMessage": "Malformed input request"},
    }
    mapping = {"00000000001": "doc-0", "00000000002": "doc-1"}
    vectors, failed, billed = collect_records(mapping, [lines(answered, refused)], DIM, missing=None)
    np.testing.assert_allclose(vectors["doc-0"], VECTOR, rtol=1e-5)
    assert failed == {"doc-1": "http_400"} and billed == 3


# Cohere and Azure, through their SDKs ----------------------------------------------------------------------


def _transport(status: int, body: object, headers: dict[str, str] | None = None) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=body, headers=headers or {})

    return httpx.MockTransport(answer)


def _cohere(status: int, body: object, headers: dict[str, str] | None = None) -> CohereEmbedder:
    import cohere

    client = cohere.ClientV2(
        api_key="co-test", httpx_client=httpx.Client(transport=_transport(status, body, headers))
    )
    config = CohereEmbedder.Config(kind="cohere", model="embed-english-v3.0", concurrency=1)
    return CohereEmbedder(client, config, pacer=Pacer(attempts=1))


def test_cohere_v2_embed_answer_gives_vectors_and_the_billed_units() -> None:
    answer = {  # [CE]
        "id": "da6e531f-4a4e-4d8f-a0a6-6a4c2f9d2c11",
        "embeddings": {"float": [[0.01] * 1024, [0.02] * 1024]},
        "texts": ["hello", "goodbye"],
        "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": 2}},
        "response_type": "embeddings_by_type",
    }
    embedder = _cohere(200, answer)
    vectors = embedder.embed(embedder.tokenize(["hello", "goodbye"]))
    assert vectors.shape == (2, 1024) and embedder.billed_tokens == 2


def test_cohere_error_bodies_are_classified_as_documented() -> None:
    refused = _cohere(400, {"message": "invalid request: text must not be empty"})  # [CE]
    vectors = refused.embed(refused.tokenize(["x"]))
    assert np.isnan(vectors).all() and refused.last_rejections() == {0: "provider_rejected:invalid_request"}
    with pytest.raises(TransientError):  # throttled: retried by the pacer, then the run stops resumably
        busy = _cohere(
            429, {"message": "You are using a Trial key, which is limited to 100 API calls / minute."}
        )
        busy.embed(busy.tokenize(["x"]))
    with pytest.raises(ConfigError, match="refused the API key"):
        bad = _cohere(401, {"message": "invalid api token"})
        bad.embed(bad.tokenize(["x"]))


def test_cohere_embed_job_result_rows_from_avro_join_on_the_kept_field() -> None:
    import fastavro

    nullable_floats = ["null", {"type": "array", "items": "float"}]
    schema = fastavro.parse_schema(  # [CJ] the row shape, written as Avro as the result parts are
        {
            "type": "record",
            "name": "EmbedResult",
            "fields": [
                {"name": "text", "type": "string"},
                {
                    "name": "embeddings",
                    "type": {
                        "type": "record",
                        "name": "Embeddings",
                        "fields": [
                            {"name": "float", "type": nullable_floats},
                            {"name": "int8", "type": ["null", {"type": "array", "items": "int"}]},
                        ],
                    },
                },
                {"name": "reindex_id", "type": "string"},
            ],
        }
    )
    part = io.BytesIO()
    rows = [
        {"text": "b", "embeddings": {"float": VECTOR[::-1], "int8": None}, "reindex_id": "doc-1"},
        {"text": "a", "embeddings": {"float": VECTOR, "int8": None}, "reindex_id": "doc-0"},
    ]
    fastavro.writer(part, schema, rows)
    found = [row for row in fastavro.reader(io.BytesIO(part.getvalue())) if isinstance(row, dict)]
    vectors, failed = cohere_join([("doc-0", 1), ("doc-1", 1), ("doc-2", 1)], found, DIM)
    assert failed == {} and set(vectors) == {"doc-0", "doc-1"}  # doc-2: missing, sent again
    np.testing.assert_allclose(vectors["doc-0"], VECTOR, rtol=1e-6)


def _azure_error(status: int, body: object, headers: dict[str, str] | None = None) -> Exception:
    import httpx2  # the HTTP client the openai SDK is built on
    from openai import AzureOpenAI

    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, json=body, headers=headers or {})

    client = AzureOpenAI(
        azure_endpoint="https://example-resource.openai.azure.com",
        api_key="azure-test-key",
        api_version="2024-10-21",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(answer)),
    )
    try:
        with azure_errors("azure-test-key", "AZURE_OPENAI_API_KEY"):
            client.embeddings.create(model="my-deployment", input=["hello"])
    except Exception as exc:
        return exc
    raise AssertionError("the SDK raised nothing")


def test_azure_error_bodies_are_classified_as_documented() -> None:
    busy = _azure_error(  # [AZ] a daily quota: the pacer gives up past max_wait_s, so the run stops resumably
        429,
        {
            "error": {
                "code": "429",
                "message": "Requests to the Embeddings_Create Operation under Azure OpenAI API version"
                " 2024-02-15-preview have exceeded call rate limit of your current OpenAI S0 pricing tier."
                " Please retry after 86400 seconds.",
            }
        },
        {"retry-after": "86400"},
    )
    assert isinstance(busy, ProviderBusy) and busy.retry_after == 86400
    key = _azure_error(
        401, {"error": {"code": "401", "message": "Access denied due to invalid subscription key."}}
    )
    assert isinstance(key, ConfigError) and "azure-test-key" not in str(key)
    missing = _azure_error(
        404,
        {
            "error": {
                "code": "DeploymentNotFound",
                "message": "The API deployment for this resource does not exist.",
            }
        },
    )
    assert isinstance(missing, ProviderNotFound) and "deployment" in str(missing)
    too_long = _azure_error(
        400,
        {
            "error": {
                "message": "This model's maximum context length is 8192 tokens, however you requested 8245 tokens"
                " (8245 in your prompt; 0 for the completion). Please reduce your prompt; or completion length.",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        },
    )
    assert isinstance(too_long, ProviderRejected)  # dead-lettered, never a configuration error
