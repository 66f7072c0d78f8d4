"""Batch output files as JSONL lines: `json_line` reads one, `collect_lines` joins output and error lines on
custom_id into vectors and per-item error codes (OpenAI's line shapes unless a reader is given)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from reindex.ports import Vectors
from reindex_adapters.remote.decoding import line_vectors

LineReader = Callable[[Mapping[str, Any], int, int], list[Vectors] | str]  # (line, size, dim) -> result


def collect_lines(
    lines: Mapping[str, Sequence[str]],
    files: Sequence[bytes | None],
    dim: int,
    *,
    missing: str | None,
    read: LineReader | None = None,
) -> tuple[dict[str, Vectors], dict[str, str]]:
    """Join output and error lines on custom_id, in any order, duplicates tolerated; a success wins.

    Items of lines that never appear fail with `missing` (a deleted output file), else "malformed_output"
    when an unreadable line was seen, else "missing_output". `read` turns one line into its vectors or its
    error code (the OpenAI shapes unless given: another provider's envelope).
    """
    read = read or _line_result
    vectors: dict[str, Vectors] = {}
    failed: dict[str, str] = {}
    is_malformed = False
    for raw in (raw for content in files for raw in (content or b"").splitlines() if raw.strip()):
        line = json_line(raw)
        group = lines.get(str(line.get("custom_id"))) if line is not None else None
        is_malformed = is_malformed or line is None
        if line is None or group is None:
            continue
        result = read(line, len(group), dim)
        for position, item in enumerate(group):
            if isinstance(result, str) and item not in vectors:
                failed.setdefault(item, result)
            elif not isinstance(result, str):
                vectors[item] = result[position]
                failed.pop(item, None)
    leftover = missing or ("malformed_output" if is_malformed else "missing_output")
    for item in (item for group in lines.values() for item in group):
        if item not in vectors:
            failed.setdefault(item, leftover)
    return vectors, failed


def json_line(raw: bytes) -> dict[str, Any] | None:
    try:
        line = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return line if isinstance(line, dict) else None


def _line_result(line: Mapping[str, Any], size: int, dim: int) -> list[Vectors] | str:
    """The line's vectors, in input order, or the error code of the whole line.

    Both error-file shapes are read: an HTTP answer (`response.status_code` 4xx/5xx with the API's error
    body) and a line the batch never ran (`response: null`, `error: {code, message}`). 429 and 408/409/5xx
    answers become `rate_limit_exceeded` / `server_error` (retried); other 4xx answers keep the provider's
    code (a refusal of the input: dead-lettered once isolated). See reindex.run.deferred.RETRYABLE.
    """
    response, error = line.get("response"), line.get("error")
    if isinstance(response, dict) and response.get("status_code") == 200:
        return line_vectors(response.get("body"), size, dim)
    if isinstance(response, dict):
        return _refusal_code(response)
    if isinstance(error, dict):
        return str(error.get("code") or "batch_error")
    return "malformed_output"


def _refusal_code(response: Mapping[str, Any]) -> str:
    status = response.get("status_code")
    if status == 429:
        return "rate_limit_exceeded"
    if not isinstance(status, int) or status in (408, 409) or status >= 500:
        return "server_error"
    body = response.get("body")
    detail = body.get("error") if isinstance(body, dict) else None
    detail = detail if isinstance(detail, dict) else {}
    return str(detail.get("code") or detail.get("type") or f"http_{status}")


def billed_tokens(output: bytes | None, field: str) -> int:
    """The usage `field` (`prompt_tokens`, `total_tokens`) of each answered line of an output file, once per
    custom_id (a duplicated line bills once)."""
    billed: dict[str, int] = {}
    for raw in (output or b"").splitlines():
        line = json_line(raw) or {}
        response = line.get("response")
        body = response.get("body") if isinstance(response, dict) else None
        usage = body.get("usage") if isinstance(body, dict) else None
        if isinstance(usage, dict) and isinstance(usage.get(field), int):
            billed[str(line.get("custom_id"))] = usage[field]
    return sum(billed.values())
