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
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql

from reindex_adapters.remote.tokens import cl100k
from reindex_adapters.testing.emulators.faults import FaultPlan
from reindex_adapters.testing.emulators.voyage import PROMPTS, REFUSED, VoyageEmulator
from reindex_adapters.testing.memory import HashEmbedder
from tests.durability.support import Tool
from tests.provider.test_openai_e2e import POISON, corpus, unique_tokens

KEY_ENV = "REINDEX_TEST_VOYAGE_KEY"
KEY = "pa-voyage-test-0123456789abcdef"
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
    texts = corpus(tmp_path / "docs.jsonl", DOCUMENTS, poison=poison)
    options = {"shard_size": SHARD, "poll_seconds": 0.05, "poll_max_seconds": 0.2, **run}
    run_lines = "".join(f"{key} = {json.dumps(value)}\n" for key, value in options.items())
    extra = "create_timeout_s = 1.0\n" if kind == "voyage-batch" else "concurrency = 2\n"
    config = tmp_path / "voyage.toml"
    config.write_text(
        f'[source]\nkind = "jsonl"\npath = "{tmp_path / "docs.jsonl"}"\n\n'
        f'[embedder]\nkind = "{kind}"\nbase_url = "{emulator.base_url}"\napi_key_env = "{KEY_ENV}"\n'
        f"output_dimension = {DIM}\nbackoff_s = 0.05\n{extra}\n"
        f'[target]\nkind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "docs"\n\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\n{run_lines}'
    )
    return Tool(config, tmp_path / "state.db"), texts


def run_to_end(tool: Tool, attempts: int = 6) -> None:
    for _ in range(attempts):
        code, _, err = tool.run("run", env={KEY_ENV: KEY}, timeout=240)
        if code == 0:
            return
        assert code == 75, err
    pytest.fail("the run did not finish")


def estimated_tokens(texts: list[str]) -> int:
    """What `plan` counts without Voyage's tokenizer: cl100k_base x 1.2, rounded up, per unique text."""
    return sum(math.ceil(len(cl100k().encode_ordinary(text)) * 1.2) for text in set(texts))


def assert_verified_once_billed(
    tool: Tool, emulator: VoyageEmulator, texts: list[str], *, skip: str | None = None
) -> dict[str, Any]:
    """Verified, one batch per key, billed exactly the unique texts' tokens, nothing sent before Retry-After."""
    assert tool.json("verify")["complete"]
    stats = emulator.stats()
    keys = Counter(batch["metadata"].get("reindex_key") for batch in stats["batches"])
    assert keys and max(keys.values()) == 1, f"one batch per key: {keys}"
    assert stats["billed_tokens"] == stats["billed_tokens_batch"] == unique_tokens(texts, skip=skip)
    assert stats["early_requests_total"] == 0
    return stats


def stored_vectors(pg_dsn: str, target: str) -> dict[str, np.ndarray]:
    with psycopg.connect(pg_dsn) as conn:
        query = sql.SQL("SELECT text, embedding::text FROM {}").format(sql.Identifier(target))
        rows = conn.execute(query).fetchall()
    return {text: np.asarray(json.loads(vector), dtype=np.float32) for text, vector in rows}


def assert_the_models_vectors(pg_dsn: str, target: str, texts: list[str]) -> None:
    stored = stored_vectors(pg_dsn, target)
    assert set(stored) == set(texts)
    ordered = sorted(stored)
    reference = HASHER.embed(HASHER.tokenize([PROMPTS["document"] + text for text in ordered]))
    np.testing.assert_allclose(np.stack([stored[text] for text in ordered]), reference, atol=1e-6)


def test_a_run_is_verified_with_the_models_vectors_and_billed_once_per_unique_text(
    tmp_path: Path, emulator: VoyageEmulator, pg_dsn: str
) -> None:
    tool, texts = make_tool(tmp_path, emulator, pg_dsn)
    plan = tool.json("plan")
    assert plan["cost_batch_usd"] == round(plan["tokens"] * BATCH_PRICE / 1e6, 6) > 0  # a third off online
    assert plan["batch_window"] == "12h"
    code, out, err = tool.run("run", "--json", env={KEY_ENV: KEY})
    assert code == 0, err
    stats = assert_verified_once_billed(tool, emulator, texts)
    report = json.loads(out)
    assert report["billed_tokens"] == stats["billed_tokens"] and report["cost_usd"] > 0
    # no Voyage tokenizer offline: the plan estimates on the high side; the run records what was billed
    assert plan["tokens"] == estimated_tokens(texts) > stats["billed_tokens"]
    assert_the_models_vectors(pg_dsn, plan["target"], texts)
    assert tool.json("status")["reconciled"]


def test_a_refused_input_is_dead_lettered_with_voyages_reason_through_faults(
    tmp_path: Path, emulator: VoyageEmulator, pg_dsn: str
) -> None:
    routes = ["files", "batch_create", "batch_retrieve", "batch_list"]
    faults = {"expire_after": 15, "faulty_batches": 2, "rate_limit": 4, "rate_limit_on": routes}
    faults |= {"retry_after_s": 0.3, "poison_substring": POISON, "slow_creates": 1, "create_delay_s": 2.0}
    emulator.set_faults(FaultPlan.from_mapping(faults))
    tool, texts = make_tool(tmp_path, emulator, pg_dsn, poison=True, provider_attempts=3)
    run_to_end(tool)
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
        code, _, err = tool.run("run", env={KEY_ENV: KEY, "REINDEX_CRASH_AT": f"{point}:2"})
        assert code == -signal.SIGKILL, f"{point}: {err}"
    run_to_end(tool)
    assert_verified_once_billed(tool, emulator, texts)


def test_the_budget_stops_the_run_resumably_and_raising_it_finishes(
    tmp_path: Path, emulator: VoyageEmulator, pg_dsn: str
) -> None:
    texts = corpus(tmp_path / "docs.jsonl", DOCUMENTS)
    first, second = estimated_tokens(texts[:SHARD]), estimated_tokens(texts[SHARD : 2 * SHARD])
    limit = round((first + second / 2) * BATCH_PRICE / 1e6, 9)  # the first shard fits, the second does not
    tool, texts = make_tool(tmp_path, emulator, pg_dsn, max_cost_usd=limit)
    code, _, err = tool.run("run", env={KEY_ENV: KEY})
    assert code == 75 and "budget reached" in err, err
    assert 0 < emulator.stats()["billed_tokens"] * BATCH_PRICE / 1e6 <= limit
    tool.config.write_text(
        tool.config.read_text().replace(f"max_cost_usd = {json.dumps(limit)}", "max_cost_usd = 1.0")
    )
    run_to_end(tool)
    assert_verified_once_billed(tool, emulator, texts)


def test_the_online_kind_ends_verified_with_a_refused_input_dead_lettered(
    tmp_path: Path, emulator: VoyageEmulator, pg_dsn: str
) -> None:
    emulator.set_faults(FaultPlan(poison_substring=POISON, rate_limit=2, retry_after_s=0.3))
    tool, texts = make_tool(tmp_path, emulator, pg_dsn, kind="voyage", poison=True)
    plan = tool.json("plan")
    run_to_end(tool)
    assert tool.json("verify")["complete"]
    letters = tool.json("dlq", "list")["dead_letters"]
    assert [d["reason"] for d in letters] == [f"provider_rejected:invalid_request: {REFUSED}"]
    stats = emulator.stats()
    assert stats["billed_tokens"] == stats["billed_tokens_online"] == unique_tokens(texts, skip=POISON)
    assert stats["batches_created"] == 0 and stats["early_requests_total"] == 0
    assert_the_models_vectors(pg_dsn, plan["target"], [text for text in texts if POISON not in text])
