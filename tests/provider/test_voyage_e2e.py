"""Voyage end to end: `reindex` (a real process) → the Voyage adapters (httpx for batches, the voyageai SDK
online) → the emulator.

A clean batch run ends verified with the model's vectors, one batch per key and the unique texts billed once
(the plan's token estimate on the high side of the bill); a refused input is dead-lettered with Voyage's
reason through 429s, a create that timed out and partial expiry; a SIGKILL after a create or after a write
is recovered without a second batch for any key; `max_cost_usd` stops the run resumably; the online kind
ends verified too. 120 documents in shards of 40 keep each run short.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reindex_adapters.remote.tokens import cl100k
from reindex_adapters.testing.emulators.faults import FaultPlan
from reindex_adapters.testing.emulators.voyage import PROMPTS, REFUSED, VoyageEmulator
from reindex_adapters.testing.memory import HashEmbedder
from tests.durability.support import Tool
from tests.provider import support
from tests.provider.support import (
    POISON,
    assert_the_budget_stops_resumably,
    assert_the_models_vectors,
    assert_verified_once_billed,
    corpus,
    kill_at,
    run_to_end,
    unique_tokens,
)

KEY_ENV = "REINDEX_TEST_VOYAGE_KEY"
KEY = "pa-voyage-test-0123456789abcdef"
ENV = {KEY_ENV: KEY}
DIM, DOCUMENTS, SHARD = 256, 120, 40
HASHER = HashEmbedder(dim=DIM)
BATCH_PRICE = 0.0402  # voyage-3.5, USD per 1M tokens (configs/pricing.toml)


@pytest.fixture
def emulator(monkeypatch: pytest.MonkeyPatch) -> Iterator[VoyageEmulator]:
    monkeypatch.setenv(KEY_ENV, KEY)  # the verbs that only read run in this process
    with VoyageEmulator(HASHER) as emu:
        yield emu


def make_tool(
    tmp_path: Path,
    emulator: VoyageEmulator,
    pg_dsn: str,
    *,
    kind: str = "voyage-batch",
    poison: bool = False,
    **run: Any,
) -> tuple[Tool, list[str]]:
    embedder = {
        "kind": kind,
        "base_url": emulator.base_url,
        "api_key_env": KEY_ENV,
        "output_dimension": DIM,
        "backoff_s": 0.05,
        **({"create_timeout_s": 1.0} if kind == "voyage-batch" else {"concurrency": 2}),
    }
    return support.make_tool(
        tmp_path,
        pg_dsn,
        embedder,
        name="voyage.toml",
        documents=DOCUMENTS,
        shard_size=SHARD,
        poison=poison,
        **run,
    )


def estimated_tokens(texts: list[str]) -> int:
    """What `plan` counts without Voyage's tokenizer: cl100k_base x 1.2, rounded up, per unique text."""
    return sum(math.ceil(len(cl100k().encode_ordinary(text)) * 1.2) for text in set(texts))


def test_a_run_is_verified_with_the_models_vectors_and_billed_once_per_unique_text(
    tmp_path: Path, emulator: VoyageEmulator, pg_dsn: str
) -> None:
    tool, texts = make_tool(tmp_path, emulator, pg_dsn)
    plan = tool.json("plan")
    assert plan["cost_batch_usd"] == round(plan["tokens"] * BATCH_PRICE / 1e6, 6) > 0  # a third off online
    assert plan["batch_window"] == "12h"
    code, out, err = tool.run("run", "--json", env=ENV)
    assert code == 0, err
    stats = assert_verified_once_billed(tool, emulator, texts)
    report = json.loads(out)
    assert report["billed_tokens"] == stats["billed_tokens"] and report["cost_usd"] > 0
    # no Voyage tokenizer offline: the plan estimates on the high side; the run records what was billed
    assert plan["tokens"] == estimated_tokens(texts) > stats["billed_tokens"]
    assert_the_models_vectors(pg_dsn, plan["target"], texts, HASHER, prompt=PROMPTS["document"])
    assert tool.json("status")["reconciled"]


def test_a_refused_input_is_dead_lettered_with_voyages_reason_through_faults(
    tmp_path: Path, emulator: VoyageEmulator, pg_dsn: str
) -> None:
    routes = ["files", "batch_create", "batch_retrieve", "batch_list"]
    faults = {"expire_after": 15, "faulty_batches": 2, "rate_limit": 4, "rate_limit_on": routes}
    faults |= {"retry_after_s": 0.3, "poison_substring": POISON, "slow_creates": 1, "create_delay_s": 2.0}
    emulator.set_faults(FaultPlan.from_mapping(faults))
    tool, texts = make_tool(tmp_path, emulator, pg_dsn, poison=True, provider_attempts=3)
    run_to_end(tool, ENV)
    letters = tool.json("dlq", "list")["dead_letters"]
    assert [d["reason"] for d in letters] == [f"provider_rejected:invalid_request: {REFUSED}"]
    stats = assert_verified_once_billed(tool, emulator, texts, skip=POISON)
    assert stats["refused"] == {"429": 4}
    assert any(
        batch["metadata"]["reindex_key"].endswith("-1") for batch in stats["batches"]
    )  # expired lines, again


def test_sigkill_after_a_create_then_after_a_write_and_the_rerun_creates_no_batch_twice(
    tmp_path: Path, emulator: VoyageEmulator, pg_dsn: str
) -> None:
    """The second batch's id never reaches the ledger (adopted by its key on the rerun), then a finished
    batch's vectors are written but the job is not marked applied (written again, bought once)."""
    tool, texts = make_tool(tmp_path, emulator, pg_dsn)
    for point in ("job_after_create", "job_after_write"):
        kill_at(tool, ENV, point)
    run_to_end(tool, ENV)
    assert_verified_once_billed(tool, emulator, texts)


def test_the_budget_stops_the_run_resumably_and_raising_it_finishes(
    tmp_path: Path, emulator: VoyageEmulator, pg_dsn: str
) -> None:
    texts = corpus(tmp_path / "docs.jsonl", DOCUMENTS)
    first, second = estimated_tokens(texts[:SHARD]), estimated_tokens(texts[SHARD : 2 * SHARD])
    limit = round((first + second / 2) * BATCH_PRICE / 1e6, 9)  # the first shard fits, the second does not
    tool, texts = make_tool(tmp_path, emulator, pg_dsn, max_cost_usd=limit)
    assert_the_budget_stops_resumably(tool, emulator, ENV, limit=limit, price=BATCH_PRICE)
    assert_verified_once_billed(tool, emulator, texts)


def test_the_online_kind_ends_verified_with_a_refused_input_dead_lettered(
    tmp_path: Path, emulator: VoyageEmulator, pg_dsn: str
) -> None:
    emulator.set_faults(FaultPlan(poison_substring=POISON, rate_limit=2, retry_after_s=0.3))
    tool, texts = make_tool(tmp_path, emulator, pg_dsn, kind="voyage", poison=True)
    plan = tool.json("plan")
    run_to_end(tool, ENV)
    assert tool.json("verify")["complete"]
    letters = tool.json("dlq", "list")["dead_letters"]
    assert [d["reason"] for d in letters] == [f"provider_rejected:invalid_request: {REFUSED}"]
    stats = emulator.stats()
    assert stats["billed_tokens"] == stats["billed_tokens_online"] == unique_tokens(texts, skip=POISON)
    assert stats["batches_created"] == 0 and stats["early_requests_total"] == 0
    clean = [text for text in texts if POISON not in text]
    assert_the_models_vectors(pg_dsn, plan["target"], clean, HASHER, prompt=PROMPTS["document"])
