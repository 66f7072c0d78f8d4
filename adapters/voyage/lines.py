"""The JSONL lines of a Voyage batch: the input file written, the output and error lines read, the usage billed.

    in:     {"custom_id": ..., "body": {"input": [text]}}           (model and options: the batch's request_params)
    out:    {"batch_id", "custom_id", "response": {"status_code": 200, "body": <embeddings answer>}, "error": null}
    error:  {"batch_id", "custom_id", "response": {"status_code": 500, "message": ...}, "error": null}
            {"batch_id", "custom_id", "response": null, "error": {"code": "batch_expired", "message": ...}}

(docs.voyageai.com/docs/batch-inference: "Batch request input object", "Batch Results", "Batch Errors").
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from reindex.ports import JobItem, Vectors
from reindex_adapters.remote.decoding import line_vectors
from reindex_adapters.remote.lines import json_line
from reindex_adapters.voyage.client import refusal_code


def input_file(items: Sequence[JobItem]) -> bytes:
    """One line per input, so a refused input never fails another and the file itself names the lines."""
    lines = (
        json.dumps(
            {"custom_id": item.custom_id, "body": {"input": [str(item.tokens.data)]}}, ensure_ascii=False
        )
        for item in items
    )
    return "".join(f"{line}\n" for line in lines).encode()


def input_lines(content: bytes) -> Iterator[tuple[str, str]]:
    """(custom_id, text) of each line of an input file this module wrote."""
    for raw in content.splitlines():
        line = json_line(raw) or {}
        body = line.get("body")
        texts = body.get("input") if isinstance(body, dict) else None
        text = texts[0] if isinstance(texts, list) and texts else texts
        if line.get("custom_id") is not None:
            yield str(line["custom_id"]), str(text if text is not None else "")


def read_line(line: Mapping[str, Any], size: int, dim: int) -> list[Vectors] | str:
    """A line's vectors, or why it has none (reindex.run.deferred.RETRYABLE says which reasons are retried).

    Voyage's errors carry no code, only a status and a message: a refused input (4xx) becomes
    `invalid_request: <message>`; 429 and 5xx lines are retried; a line the batch never ran names its
    `error.code` (`batch_expired`)."""
    response, error = line.get("response"), line.get("error")
    if isinstance(error, dict):
        return str(error.get("code") or "batch_error")
    if error is not None:
        return "batch_error"
    if not isinstance(response, dict):
        return "malformed_output"
    status = response.get("status_code")
    if status is None or (isinstance(status, int) and status < 400):
        return line_vectors(response.get("body"), size, dim)
    if not isinstance(status, int) or status in (408, 409) or status >= 500:
        return "server_error"
    if status == 429:
        return "rate_limit_exceeded"
    return refusal_code(status, _message(response))


def _message(response: Mapping[str, Any]) -> str:
    """The refusal's words: `response.message`, else the body's `detail` (the API's own error shape)."""
    body = response.get("body")
    detail = body.get("detail") if isinstance(body, dict) else None
    return str(response.get("message") or detail or "")
