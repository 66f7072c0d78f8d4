"""Reading a Gemini batch responses file: vectors by line key, failed lines in the run's codes, billed tokens."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from reindex.ports import Vectors

# google.rpc.Code names of a line that may succeed when sent again -> reindex.run.deferred.RETRYABLE codes
RETRY_CODES = {
    "RESOURCE_EXHAUSTED": "rate_limit_exceeded",
    "UNAVAILABLE": "server_error",
    "INTERNAL": "server_error",
    "ABORTED": "server_error",
    "UNKNOWN": "server_error",
    "DEADLINE_EXCEEDED": "request_timeout",
}


def read_responses(content: bytes, dim: int) -> tuple[dict[str, Vectors], dict[str, str], int]:
    """(vectors, failed codes, billed tokens) by line key; a success wins over a duplicate's failure.

    Unreadable lines are skipped (their keys are missing, so the run sends them again). A line's billed
    tokens are its `tokenCount`, else its `usageMetadata.promptTokenCount`, else none.
    """
    vectors: dict[str, Vectors] = {}
    failed: dict[str, str] = {}
    billed = 0
    for raw in (raw for raw in content.splitlines() if raw.strip()):
        line = _json_line(raw)
        key = line.get("key") if line else None
        if line is None or not isinstance(key, str) or key in vectors:
            continue
        result = _line_result(line, dim)
        if isinstance(result, str):
            failed.setdefault(key, result)
            continue
        vectors[key], tokens = result
        failed.pop(key, None)
        billed += tokens
    return vectors, failed, billed


def _json_line(raw: bytes) -> dict[str, Any] | None:
    try:
        line = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return line if isinstance(line, dict) else None


def _line_result(line: Mapping[str, Any], dim: int) -> tuple[Vectors, int] | str:
    response, error = line.get("response"), line.get("error")
    if isinstance(error, dict):
        return line_code(error)
    if not isinstance(response, dict):
        return "malformed_output"
    try:
        vector = np.asarray(response["embedding"]["values"], dtype=np.float32)
    except (KeyError, TypeError, ValueError):
        return "malformed_output"
    if vector.shape != (dim,):
        return "wrong_dimension"
    return vector, _tokens(response)


def _tokens(response: Mapping[str, Any]) -> int:
    usage = response.get("usageMetadata")
    count = response.get("tokenCount", usage.get("promptTokenCount") if isinstance(usage, dict) else None)
    try:
        return int(count) if count is not None else 0
    except (TypeError, ValueError):
        return 0


def line_code(error: Mapping[str, Any]) -> str:
    """A failed line's code: retryable ones in reindex.run.deferred's words, else the provider's status name."""
    status = str(error.get("status") or "")
    code = error.get("code")
    if status in RETRY_CODES:
        return RETRY_CODES[status]
    if code == 429:
        return "rate_limit_exceeded"
    if isinstance(code, int) and (code >= 500 or code == 408):
        return "server_error"
    return status.lower() or (f"http_{code}" if code else "batch_error")
