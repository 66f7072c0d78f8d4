"""Cohere's Embed Jobs end to end: `reindex` (a real process) → the official cohere SDK → the emulator.

A clean run ends verified with the model's vectors, one dataset and one job per key and the unique texts billed
once; a refused input is dead-lettered with Cohere's reason through 429s, unanswered creates and failed jobs
whose done rows are kept; a SIGKILL after a create or a write is recovered without a second job for any key;
`max_cost_usd` stops the run resumably and raising it finishes. (A lost output and a malformed row: the adapter
tests, tests/adapters/test_cohere.py; the core sends their lines again as it does every provider's.)
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql

from reindex_adapters.testing.emulators.cohere import CohereEmulator
from reindex_adapters.testing.emulators.faults import FaultPlan
from reindex_adapters.testing.memory import HashEmbedder
from tests.durability.support import Tool
from tests.provider.test_openai_e2e import POISON, corpus, unique_tokens

KEY_ENV = "REINDEX_TEST_COHERE_KEY"
KEY = "cohere-test-0123456789abcdef"
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
    texts = corpus(tmp_path / "docs.jsonl", DOCUMENTS, poison=poison)
    options = {"shard_size": SHARD, "poll_seconds": 0.05, "poll_max_seconds": 0.2, **run}
    run_lines = "".join(f"{key} = {json.dumps(value)}\n" for key, value in options.items())
    config = tmp_path / "cohere.toml"
    config.write_text(
        f'[source]\nkind = "jsonl"\npath = "{tmp_path / "docs.jsonl"}"\n\n'
        f'[embedder]\nkind = "cohere-batch"\nbase_url = "{emulator.base_url}"\n'
        f'api_key_env = "{KEY_ENV}"\ncreate_timeout_s = 1.0\nbackoff_s = 0.05\n\n'
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


def one_job_per_key(emulator: CohereEmulator) -> dict[str, Any]:
    """Every job under its own name (the key's digest), and no dataset uploaded twice for one."""
    stats = emulator.stats()
    names = Counter(job["name"] for job in stats["batches"])
    assert names and max(names.values()) == 1, f"one job per key: {names}"
    datasets = Counter(stats["dataset_names"])
    assert max(datasets.values()) == 1 and set(names) <= set(datasets), f"one dataset per key: {datasets}"
    return stats


def assert_verified_once_billed(
    tool: Tool, emulator: CohereEmulator, texts: list[str], *, skip: str | None = None
) -> dict[str, Any]:
    """Verified, one job per key, billed exactly the unique texts' tokens, nothing sent before Retry-After."""
    assert tool.json("verify")["complete"]
    stats = one_job_per_key(emulator)
    assert stats["billed_tokens"] == stats["billed_tokens_batch"] == unique_tokens(texts, skip=skip)
    assert stats["early_requests_total"] == 0
    return stats


def stored_vectors(pg_dsn: str, target: str) -> dict[str, np.ndarray]:
    with psycopg.connect(pg_dsn) as conn:
        query = sql.SQL("SELECT text, embedding::text FROM {}").format(sql.Identifier(target))
        rows = conn.execute(query).fetchall()
    return {text: np.asarray(json.loads(vector), dtype=np.float32) for text, vector in rows}


def test_a_run_is_verified_with_the_models_vectors_and_billed_once_per_unique_text(
    tmp_path: Path, emulator: CohereEmulator, pg_dsn: str
) -> None:
    tool, texts = make_tool(tmp_path, emulator, pg_dsn)
    plan = tool.json("plan")
    assert plan["cost_batch_usd"] == plan["cost_online_usd"] > 0  # Embed Jobs are not discounted
    code, out, err = tool.run("run", "--json", env={KEY_ENV: KEY})
    assert code == 0, err
    stats = assert_verified_once_billed(tool, emulator, texts)
    report = json.loads(out)
    assert report["billed_tokens"] == stats["billed_tokens"] and report["cost_usd"] > 0
    assert plan["tokens"] == stats["billed_tokens"]  # the emulator counts as the tool estimates (docs)
    stored = stored_vectors(pg_dsn, plan["target"])
    assert len(stored) == len(set(texts))
    reference = HASHER.embed(HASHER.tokenize(sorted(stored)))
    np.testing.assert_allclose(np.stack([stored[text] for text in sorted(stored)]), reference, atol=1e-6)
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
    run_to_end(tool)
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
    code, _, err = tool.run("run", env={KEY_ENV: KEY, "REINDEX_CRASH_AT": f"{point}:2"})
    assert code == -signal.SIGKILL, err
    run_to_end(tool)
    assert_verified_once_billed(tool, emulator, texts)


def test_the_budget_stops_the_run_resumably_and_raising_it_finishes(
    tmp_path: Path, emulator: CohereEmulator, pg_dsn: str
) -> None:
    tool, texts = make_tool(
        tmp_path, emulator, pg_dsn, max_cost_usd=0.00005
    )  # one shard of four (432 tokens of 1,350)
    code, _, err = tool.run("run", env={KEY_ENV: KEY})
    assert code == 75 and "budget reached" in err, err
    assert 0 < emulator.stats()["billed_tokens"] * PRICE / 1e6 <= 0.00005
    tool.config.write_text(tool.config.read_text().replace("max_cost_usd = 5e-05", "max_cost_usd = 1.0"))
    run_to_end(tool)
    assert_verified_once_billed(tool, emulator, texts)
