"""Cohere's Embed Jobs end to end: `reindex` (a real process) → the official cohere SDK → the emulator.

A clean run ends verified with the model's vectors, one dataset and one job per key and the unique texts billed
once; a refused input is dead-lettered with Cohere's reason through 429s, unanswered creates and failed jobs
whose done rows are kept; a SIGKILL after a create or a write is recovered without a second job for any key;
`max_cost_usd` stops the run resumably and raising it finishes. (A lost output and a malformed row: the adapter
tests, tests/adapters/test_cohere.py; the core sends their lines again as it does every provider's.)
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reindex_adapters.testing.emulators.cohere import CohereEmulator
from reindex_adapters.testing.emulators.faults import FaultPlan
from reindex_adapters.testing.memory import HashEmbedder
from tests.durability.support import Tool
from tests.provider import support
from tests.provider.support import (
    POISON,
    assert_the_budget_stops_resumably,
    assert_the_models_vectors,
    kill_at,
    run_to_end,
)

KEY_ENV = "REINDEX_TEST_COHERE_KEY"
KEY = "cohere-test-0123456789abcdef"
ENV = {KEY_ENV: KEY}
HASHER = HashEmbedder(dim=1024)
PRICE = 0.10  # embed-english-v3.0, USD per 1M tokens, online and batch alike
DOCUMENTS, SHARD = 90, 30  # with the corpus's 12 duplicates: 4 shards


@pytest.fixture
def emulator(monkeypatch: pytest.MonkeyPatch) -> Iterator[CohereEmulator]:
    monkeypatch.setenv(KEY_ENV, KEY)  # the verbs that only read run in this process
    with CohereEmulator(HASHER) as emu:
        yield emu


def make_tool(
    tmp_path: Path, emulator: CohereEmulator, pg_dsn: str, *, poison: bool = False, **run: Any
) -> tuple[Tool, list[str]]:
    embedder = {
        "kind": "cohere-batch",
        "base_url": emulator.base_url,
        "api_key_env": KEY_ENV,
        "create_timeout_s": 1.0,
        "backoff_s": 0.05,
    }
    return support.make_tool(
        tmp_path,
        pg_dsn,
        embedder,
        name="cohere.toml",
        documents=DOCUMENTS,
        shard_size=SHARD,
        poison=poison,
        **run,
    )


def assert_verified_once_billed(
    tool: Tool, emulator: CohereEmulator, texts: list[str], *, skip: str | None = None
) -> dict[str, Any]:
    """Every job under its own name (the key's digest), no dataset uploaded twice for one, and billed once."""
    stats = support.assert_verified_once_billed(tool, emulator, texts, skip=skip, key=lambda job: job["name"])
    datasets = Counter(stats["dataset_names"])
    names = {job["name"] for job in stats["batches"]}
    assert max(datasets.values()) == 1 and names <= set(datasets), f"one dataset per key: {datasets}"
    return stats


def test_a_run_is_verified_with_the_models_vectors_and_billed_once_per_unique_text(
    tmp_path: Path, emulator: CohereEmulator, pg_dsn: str
) -> None:
    tool, texts = make_tool(tmp_path, emulator, pg_dsn)
    plan = tool.json("plan")
    assert plan["cost_batch_usd"] == plan["cost_online_usd"] > 0  # Embed Jobs are not discounted
    code, out, err = tool.run("run", "--json", env=ENV)
    assert code == 0, err
    stats = assert_verified_once_billed(tool, emulator, texts)
    report = json.loads(out)
    assert report["billed_tokens"] == stats["billed_tokens"] and report["cost_usd"] > 0
    assert plan["tokens"] == stats["billed_tokens"]  # the emulator counts as the tool estimates (docs)
    assert_the_models_vectors(pg_dsn, plan["target"], texts, HASHER)
    assert tool.json("status")["reconciled"]


def test_a_refused_input_is_dead_lettered_with_cohere_s_reason_through_faults(
    tmp_path: Path, emulator: CohereEmulator, pg_dsn: str
) -> None:
    routes = ["files", "batch_create", "batch_retrieve", "batch_list"]
    faults = {"expire_after": 10, "faulty_batches": 2, "rate_limit": 4, "rate_limit_on": routes}
    slow = {"slow_creates": 2, "create_delay_s": 1.5}  # the first dataset's and job's creates go unanswered
    emulator.set_faults(
        FaultPlan.from_mapping({**faults, **slow, "retry_after_s": 0.3, "poison_substring": POISON})
    )
    tool, texts = make_tool(tmp_path, emulator, pg_dsn, poison=True, provider_attempts=3)
    run_to_end(tool, ENV)
    letters = tool.json("dlq", "list")["dead_letters"]
    assert [d["reason"] for d in letters] == ["provider_rejected:row_dropped:the text could not be embedded"]
    stats = assert_verified_once_billed(tool, emulator, texts, skip=POISON)
    assert stats["refused"] == {"429": 4}
    statuses = [emulator.job(job["id"])["status"] for job in stats["batches"]]
    assert statuses[:2] == ["failed", "failed"] and "complete" in statuses  # partial: the rest sent again


@pytest.mark.parametrize("point", ["job_after_create", "job_after_write"])
def test_sigkill_mid_run_then_rerun_creates_no_job_twice(
    tmp_path: Path, emulator: CohereEmulator, pg_dsn: str, point: str
) -> None:
    tool, texts = make_tool(tmp_path, emulator, pg_dsn)
    kill_at(tool, ENV, point)
    run_to_end(tool, ENV)
    assert_verified_once_billed(tool, emulator, texts)


def test_the_budget_stops_the_run_resumably_and_raising_it_finishes(
    tmp_path: Path, emulator: CohereEmulator, pg_dsn: str
) -> None:
    tool, texts = make_tool(
        tmp_path, emulator, pg_dsn, max_cost_usd=0.00005
    )  # one shard of four (432 tokens of 1,350)
    assert_the_budget_stops_resumably(tool, emulator, ENV, limit=0.00005, price=PRICE)
    assert_verified_once_billed(tool, emulator, texts)
