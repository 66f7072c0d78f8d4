"""Bedrock's output records: `.jsonl.out` lines joined on recordId, their vectors, codes and billed tokens."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from reindex.ports import Vectors


def collect_records(
    mapping: Mapping[str, str], outputs: Sequence[bytes] | None, dim: int, *, missing: str | None
) -> tuple[dict[str, Vectors], dict[str, str], int]:
    """Join output records on recordId, in any order, duplicates tolerated: (vectors, failed, billed tokens).

    A record with `error` fails with its code (429 → rate_limit_exceeded, 408/5xx → server_error, another
    4xx → `http_<code>`, a refusal of the input). Records that never appear fail with `missing` (a job that
    ran out of time), else "output_deleted" (no output file at all), "malformed_output" (an unreadable line
    was seen) or "missing_output". Billed tokens are the successes' `inputTextTokenCount`.
    """
    vectors: dict[str, Vectors] = {}
    failed: dict[str, str] = {}
    billed, is_malformed = 0, False
    for raw in (raw for content in outputs or [] for raw in content.splitlines() if raw.strip()):
        record = _json_record(raw)
        custom_id = mapping.get(str(record.get("recordId"))) if record is not None else None
        is_malformed = is_malformed or record is None
        if record is None or custom_id is None or custom_id in vectors:
            continue
        result = _record_result(record, dim)
        if isinstance(result, str):
            failed.setdefault(custom_id, result)
        else:
            vectors[custom_id] = result
            failed.pop(custom_id, None)
            billed += int(record["modelOutput"].get("inputTextTokenCount", 0))
    leftover = missing or ("output_deleted" if outputs is None else None)
    leftover = leftover or ("malformed_output" if is_malformed else "missing_output")
    for custom_id in mapping.values():
        if custom_id not in vectors:
            failed.setdefault(custom_id, leftover)
    return vectors, failed, billed


def _json_record(raw: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) else None


def _record_result(record: Mapping[str, Any], dim: int) -> Vectors | str:
    output, error = record.get("modelOutput"), record.get("error")
    if isinstance(output, dict):
        return embedding(output, dim)
    if isinstance(error, dict):
        return _error_code(error.get("errorCode"))
    return "malformed_output"


def _error_code(code: Any) -> str:
    status = int(code) if isinstance(code, int) or str(code).isdigit() else None
    if status == 429:
        return "rate_limit_exceeded"
    if status is None or status in (408, 409) or status >= 500:
        return "server_error"
    return f"http_{status}"


def embedding(body: Mapping[str, Any], dim: int) -> Vectors | str:
    try:
        vector = np.asarray(body["embedding"], dtype=np.float32)
    except (KeyError, TypeError, ValueError):
        return "malformed_output"
    return vector if vector.shape == (dim,) else "wrong_dimension"
