"""Mistral's batch API end to end: `reindex` (a real process) → the official mistralai SDK → the emulator.

A clean run ends verified with the model's vectors, one job per key and the unique texts billed once; a
refused input is dead-lettered with Mistral's reason; faults and a SIGKILL are recovered without a second
job for any key; `max_cost_usd` stops the run resumably.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reindex_adapters.testing.emulators.faults import FaultPlan
from reindex_adapters.testing.emulators.mistral import MistralEmulator
from reindex_adapters.testing.memory import HashEmbedder
from tests.durability.support import Tool
from tests.provider import support
from tests.provider.support import (
    POISON,
    assert_the_budget_stops_resumably,
    assert_the_models_vectors,
    assert_verified_once_billed,
    kill_at,
    mistral_count,
    one_job_per_key,
    run_to_end,
    unique_tokens,
)

KEY_ENV = "REINDEX_TEST_MISTRAL_KEY"
KEY = "mistral-test-0123456789abcdef"
ENV = {KEY_ENV: KEY}
HASHER = HashEmbedder(dim=1024)


@pytest.fixture
def emulator(monkeypatch: pytest.MonkeyPatch) -> Iterator[MistralEmulator]:
    monkeypatch.setenv(KEY_ENV, KEY)  # the verbs that only read run in this process
    with MistralEmulator(HASHER) as emu:
        yield emu


def make_tool(
    tmp_path: Path, emulator: MistralEmulator, pg_dsn: str, *, poison: bool = False, **run: Any
) -> tuple[Tool, list[str]]:
    embedder = {
        "kind": "mistral-batch",
        "server_url": emulator.server_url,
        "api_key_env": KEY_ENV,
        "create_timeout_s": 1.0,
        "backoff_s": 0.05,
    }
    return support.make_tool(tmp_path, pg_dsn, embedder, name="mistral.toml", poison=poison, **run)


def test_a_run_is_verified_with_the_models_vectors_and_billed_once_per_unique_text(
    tmp_path: Path, emulator: MistralEmulator, pg_dsn: str
) -> None:
    tool, texts = make_tool(tmp_path, emulator, pg_dsn)
    plan = tool.json("plan")
    assert plan["cost_batch_usd"] == pytest.approx(plan["cost_online_usd"] / 2, abs=1e-6)  # costs: 6 decimals
    assert plan["cost_batch_usd"] > 0
    code, out, err = tool.run("run", "--json", env=ENV)
    assert code == 0, err
    stats = assert_verified_once_billed(tool, emulator, texts, count=mistral_count)
    report = json.loads(out)
    assert report["billed_tokens"] == stats["billed_tokens"] and report["cost_usd"] > 0
    assert plan["tokens"] == stats["billed_tokens"]  # both count in mistral-embed's own tokenizer
    assert plan["token_counts"]["exact"]
    assert_the_models_vectors(pg_dsn, plan["target"], texts, HASHER)
    assert tool.json("status")["reconciled"]


def test_a_refused_input_is_dead_lettered_with_mistrals_reason_through_faults(
    tmp_path: Path, emulator: MistralEmulator, pg_dsn: str
) -> None:
    routes = ["files", "batch_create", "batch_retrieve", "batch_list"]
    faults = {"expire_after": 40, "faulty_batches": 2, "rate_limit": 4, "rate_limit_on": routes}
    emulator.set_faults(FaultPlan.from_mapping({**faults, "retry_after_s": 0.3, "poison_substring": POISON}))
    tool, texts = make_tool(tmp_path, emulator, pg_dsn, poison=True, provider_attempts=3)
    run_to_end(tool, ENV)
    letters = tool.json("dlq", "list")["dead_letters"]
    assert [d["reason"] for d in letters] == ["provider_rejected:invalid_request_error"]
    stats = assert_verified_once_billed(tool, emulator, texts, skip=POISON, count=mistral_count)
    assert stats["refused"] == {"429": 4}


@pytest.mark.parametrize(
    "fault",
    [
        {"slow_creates": 2, "create_delay_s": 2.0},
        {"delete_output": True, "malformed_output_line": True, "faulty_batches": 2},
    ],
    ids=["timeout-after-create", "lost-output-file-and-malformed-line"],
)
def test_batch_faults_end_verified_with_one_job_per_key(
    tmp_path: Path, emulator: MistralEmulator, pg_dsn: str, fault: dict[str, Any]
) -> None:
    emulator.set_faults(FaultPlan.from_mapping(fault))
    tool, texts = make_tool(tmp_path, emulator, pg_dsn)
    run_to_end(tool, ENV)
    assert tool.json("verify")["complete"]
    stats = emulator.stats()
    one_job_per_key(stats)
    if "slow_creates" in fault:
        assert stats["billed_tokens"] == unique_tokens(texts, count=mistral_count)
    else:  # what the provider billed and then lost (the files of the first two jobs) is bought again
        first = {job["id"] for job in stats["batches"][:2]}
        lost = sum(entry["tokens"] for entry in stats["billed"] if entry["batch_id"] in first)
        assert (
            unique_tokens(texts, count=mistral_count)
            < stats["billed_tokens"]
            <= unique_tokens(texts, count=mistral_count) + lost
        )


@pytest.mark.parametrize("point", ["job_after_create", "job_after_write"])
def test_sigkill_mid_run_then_rerun_creates_no_job_twice(
    tmp_path: Path, emulator: MistralEmulator, pg_dsn: str, point: str
) -> None:
    tool, texts = make_tool(tmp_path, emulator, pg_dsn)
    kill_at(tool, ENV, point)
    run_to_end(tool, ENV)
    assert_verified_once_billed(tool, emulator, texts, count=mistral_count)


def test_the_budget_stops_the_run_resumably_and_raising_it_finishes(
    tmp_path: Path, emulator: MistralEmulator, pg_dsn: str
) -> None:
    tool, texts = make_tool(tmp_path, emulator, pg_dsn, max_cost_usd=0.0001)  # about one shard of four
    assert_the_budget_stops_resumably(tool, emulator, ENV, limit=0.0001, price=0.05)
    assert_verified_once_billed(tool, emulator, texts, count=mistral_count)
