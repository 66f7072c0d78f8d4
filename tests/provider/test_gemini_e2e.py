"""Gemini end to end: `reindex run` (a real process) → the official google-genai SDK → the Gemini emulator.

A clean run, runs through throttling, a slow create, partial expiry, a malformed line, a lost responses file
and a refused input, a SIGKILL right after a create and after a write, and a budget: each ends verified with
one batch per key, vectors equal to the reference model's, and billed exactly the unique texts (plus what
the provider billed and then lost, which must be bought again)."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from reindex.registry import build
from reindex.ui.cli import app
from reindex_adapters.testing.emulators.faults import FaultPlan
from reindex_adapters.testing.emulators.gemini.app import GeminiEmulator
from reindex_adapters.testing.memory import HashEmbedder
from tests.durability.support import Tool
from tests.provider import support
from tests.provider.support import POISON, one_job_per_key, unique_tokens

KEY_ENV = "REINDEX_TEST_GEMINI_KEY"
KEY = "AIzaSyE2E0123456789abcdefSECRET"
ENV = {KEY_ENV: KEY}
ROUTES = ["batch_create", "batch_retrieve", "batch_list", "files"]
DIM = 64


@pytest.fixture
def emulator(monkeypatch: pytest.MonkeyPatch) -> Iterator[GeminiEmulator]:
    monkeypatch.setenv(KEY_ENV, KEY)  # the verbs that only read run in this process
    with GeminiEmulator(HashEmbedder(dim=3072)) as emu:
        yield emu


def make_tool(
    tmp_path: Path,
    emulator: GeminiEmulator,
    pg_dsn: str,
    *,
    poison: bool = False,
    embedder: dict[str, Any] | None = None,
    **run: Any,
) -> tuple[Tool, list[str]]:
    keys = {
        "kind": "gemini-batch",
        "base_url": emulator.base_url,
        "api_key_env": KEY_ENV,
        "output_dimensionality": DIM,
        "backoff_s": 0.05,
        "max_backoff_s": 0.5,
        **(embedder or {}),
    }
    return support.make_tool(tmp_path, pg_dsn, keys, name="gemini.toml", poison=poison, **run)


def run_to_end(tool: Tool, attempts: int = 6) -> dict[str, Any]:
    """The report of the run that finished."""
    report: dict[str, Any] = json.loads(support.run_to_end(tool, ENV, "--json", attempts=attempts))
    return report


def assert_verified_once_billed(
    tool: Tool, emulator: GeminiEmulator, texts: list[str], *, skip: str | None = None, lost_batches: int = 0
) -> dict[str, Any]:
    assert tool.json("verify")["complete"]
    stats = emulator.stats()
    one_job_per_key(stats, key=lambda batch: batch["display_name"])
    first = {batch["name"] for batch in stats["batches"][:lost_batches]}
    lost = sum(entry["tokens"] for entry in stats["billed"] if entry["batch"] in first)
    unique = unique_tokens(texts, skip=skip)
    assert unique <= stats["billed_tokens"] <= unique + lost
    assert stats["early_requests_total"] == 0
    return stats


def assert_reference_vectors(tool: Tool, pg_dsn: str, texts: list[str], *, skip: str | None = None) -> None:
    """Every stored vector is the emulator model's for its text, cut to DIM and made unit length."""
    target = tool.json("status")["target"]
    sink = build("target", {"kind": "pgvector", "dsn": pg_dsn, "alias": "docs"})
    try:
        ids = [f"d{i:04d}" for i, text in enumerate(texts) if not (skip and skip in text)]
        stored = sink.fetch(target, ids)
    finally:
        sink.close()
    hasher = HashEmbedder(dim=3072)
    wanted = hasher.embed(hasher.tokenize([texts[int(doc_id[1:])] for doc_id in ids]))[:, :DIM]
    wanted /= np.linalg.norm(wanted, axis=1, keepdims=True)
    np.testing.assert_allclose(np.stack([stored[doc_id] for doc_id in ids]), wanted, atol=1e-6)


def test_a_run_is_verified_equal_to_the_reference_and_billed_once_per_unique_text(
    tmp_path: Path, emulator: GeminiEmulator, pg_dsn: str
) -> None:
    tool, texts = make_tool(tmp_path, emulator, pg_dsn)
    plan = tool.json("plan")
    assert plan["cost_batch_usd"] == pytest.approx(plan["cost_online_usd"] / 2) and plan["cost_batch_usd"] > 0
    run = run_to_end(tool)
    stats = assert_verified_once_billed(tool, emulator, texts)
    assert plan["tokens"] == stats["billed_tokens"]  # the same counting on both sides here (see the README)
    assert_reference_vectors(tool, pg_dsn, texts)
    assert run["billed_tokens"] == stats["billed_tokens"] and run["cost_usd"] > 0


def test_throttling_a_slow_create_partial_expiry_and_a_refused_input_end_verified(
    tmp_path: Path, emulator: GeminiEmulator, pg_dsn: str
) -> None:
    """The lost responses file and the other faults are the adapter tests' (tests/adapters/test_gemini.py);
    each run here costs a process start with the SDK's imports."""
    storm = {"rate_limit": 4, "rate_limit_on": ROUTES, "retry_after_s": 0.3, "server_errors": 2}
    storm |= {"server_errors_on": ROUTES, "slow_creates": 1, "create_delay_s": 1.5}
    lost = {"expire_after": 30, "malformed_output_line": True, "faulty_batches": 1}
    emulator.set_faults(FaultPlan.from_mapping({**storm, **lost, "poison_substring": POISON}))
    tool, texts = make_tool(tmp_path, emulator, pg_dsn, poison=True, embedder={"create_timeout_s": 0.5})
    run_to_end(tool)
    letters = tool.json("dlq", "list")["dead_letters"]
    assert [d["reason"] for d in letters] == ["provider_rejected:invalid_argument"]
    stats = assert_verified_once_billed(tool, emulator, texts, skip=POISON, lost_batches=1)
    assert stats["refused"] == {"429": 4, "500": 2}
    assert_reference_vectors(tool, pg_dsn, texts, skip=POISON)


def test_sigkill_right_after_a_create_then_rerun_adopts_the_batch_and_never_creates_a_key_twice(
    tmp_path: Path, emulator: GeminiEmulator, pg_dsn: str
) -> None:
    tool, texts = make_tool(tmp_path, emulator, pg_dsn)
    code, _, err = tool.run("run", env={KEY_ENV: KEY, "REINDEX_CRASH_AT": "job_after_create:2"})
    assert code == -signal.SIGKILL, err
    run_to_end(tool)
    stats = assert_verified_once_billed(tool, emulator, texts)
    assert stats["billed_tokens"] == unique_tokens(texts)


def test_the_budget_stops_resumably_and_raising_it_finishes(
    tmp_path: Path, emulator: GeminiEmulator, pg_dsn: str
) -> None:
    tool, texts = make_tool(tmp_path, emulator, pg_dsn, max_cost_usd=0.0001)
    code, _, err = tool.run("run", env={KEY_ENV: KEY})
    assert code == 75 and "budget reached" in err
    assert emulator.stats()["billed_tokens"] * 0.075 / 1e6 <= 0.0001
    tool.config.write_text(tool.config.read_text().replace("max_cost_usd = 0.0001", "max_cost_usd = 1.0"))
    run_to_end(tool)
    assert_verified_once_billed(tool, emulator, texts)


def test_without_the_sdk_the_run_exits_2_naming_the_extra(
    tmp_path: Path, emulator: GeminiEmulator, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool, _ = make_tool(tmp_path, emulator, pg_dsn)
    monkeypatch.setitem(sys.modules, "google.genai", None)
    result = CliRunner().invoke(app, ["plan", "-c", str(tool.config)])
    assert result.exit_code == 2
    assert "pip install 'reindex-embeddings[gemini]'" in result.stderr and KEY not in result.stderr
