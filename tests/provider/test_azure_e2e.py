"""Azure OpenAI end to end: `reindex` (a real process) → the SDK's AzureOpenAI client → the emulator's Azure
route. A clean run, a 429 storm with a refused input, a SIGKILL and a rerun, and misconfigurations: each
ends verified and billed for the unique texts (plus at most the calls a kill lost), or exits 2."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reindex_adapters.remote.tokens import cl100k
from reindex_adapters.testing.emulators.faults import FaultPlan
from reindex_adapters.testing.emulators.openai import Emulator
from reindex_adapters.testing.memory import HashEmbedder
from tests.durability.support import Tool, assert_crashed
from tests.provider.support import POISON, corpus, run_to_end, unique_tokens, write_config

KEY_ENV = "REINDEX_TEST_AZURE_KEY"
KEY = "0123456789abcdef0123456789abcdef"
ENV = {KEY_ENV: KEY}
DEPLOYMENT = "emb-small-prod"
SHARD = 100


@pytest.fixture
def emulator(monkeypatch: pytest.MonkeyPatch) -> Iterator[Emulator]:
    monkeypatch.setenv(KEY_ENV, KEY)  # the verbs that only read run in this process
    with Emulator(HashEmbedder(dim=1536), deployments={DEPLOYMENT: "text-embedding-3-small"}) as emu:
        yield emu


def make_tool(
    tmp_path: Path, emulator: Emulator, pg_dsn: str, *, poison: bool = False, **embedder: Any
) -> tuple[Tool, list[str]]:
    texts = corpus(tmp_path / "docs.jsonl", poison=poison)
    keys = {
        "kind": "azure-openai",
        "azure_endpoint": emulator.azure_endpoint,
        "api_version": "2024-10-21",
        "deployment": DEPLOYMENT,
        "model": "text-embedding-3-small",
        "dimensions": 64,
        "api_key_env": KEY_ENV,
        "backoff_s": 0.05,
        "max_backoff_s": 0.5,
        **embedder,
    }
    section = {key: value for key, value in keys.items() if value is not None}
    return write_config(tmp_path, pg_dsn, section, {"shard_size": SHARD}, name="azure.toml"), texts


def costliest_shards(texts: list[str], count: int) -> int:
    """The tokens of the unique texts of the `count` costliest shards."""
    codec = cl100k()
    shards = [texts[start : start + SHARD] for start in range(0, len(texts), SHARD)]
    return sum(sorted(sum(len(codec.encode(text)) for text in set(shard)) for shard in shards)[-count:])


def test_a_run_through_the_azure_route_is_verified_and_billed_once_per_unique_text(
    tmp_path: Path, emulator: Emulator, pg_dsn: str
) -> None:
    tool, texts = make_tool(tmp_path, emulator, pg_dsn)
    plan = tool.json("plan")
    assert plan["cost_online_usd"] > 0 and plan["cost_batch_usd"] is None and plan["batch_window"] is None
    run_to_end(tool, ENV, attempts=4)
    assert tool.json("verify")["complete"]
    stats = emulator.stats()
    assert stats["billed_tokens"] == stats["billed_tokens_online"] == unique_tokens(texts)
    assert stats["requests"]["embeddings"] > 0 and stats["early_requests_total"] == 0
    assert abs(plan["tokens"] - stats["billed_tokens"]) <= 0.01 * stats["billed_tokens"]


def test_a_429_storm_is_waited_out_and_a_refused_input_is_dead_lettered_with_its_reason(
    tmp_path: Path, emulator: Emulator, pg_dsn: str
) -> None:
    emulator.set_faults(FaultPlan(rate_limit=5, retry_after_s=0.3, server_errors=2, poison_substring=POISON))
    tool, texts = make_tool(tmp_path, emulator, pg_dsn, poison=True)
    run_to_end(tool, ENV, attempts=4)
    letters = tool.json("dlq", "list")["dead_letters"]
    assert [d["reason"] for d in letters] == ["provider_rejected:invalid_request_error"]
    assert tool.json("verify")["complete"]
    stats = emulator.stats()
    assert stats["refused"] == {"429": 5, "500": 2} and stats["early_requests_total"] == 0
    assert stats["billed_tokens"] == unique_tokens(texts, skip=POISON)


@pytest.mark.parametrize("point", ["after_embed", "after_write"])
def test_sigkill_mid_run_then_rerun_is_verified_and_rebuys_at_most_three_calls(
    tmp_path: Path, emulator: Emulator, pg_dsn: str, point: str
) -> None:
    tool, texts = make_tool(tmp_path, emulator, pg_dsn)
    code, _, err = tool.run("run", env={KEY_ENV: KEY, "REINDEX_CRASH_AT": f"{point}:2"})
    assert_crashed(code, err)
    run_to_end(tool, ENV, attempts=4)
    assert tool.json("verify")["complete"]
    billed, unique = emulator.stats()["billed_tokens"], unique_tokens(texts)
    # One call per shard here. A kill loses at most the calls in flight: a shard written but not yet
    # recorded, the one embedded but not written, and the next window's first call, launched before the
    # embedded one was collected (reindex.run.feeding).
    assert unique <= billed <= unique + costliest_shards(texts, 3)


@pytest.mark.parametrize(
    ("keys", "verb", "message"),
    [
        ({"api_version": None}, "plan", "[embedder] missing required key 'api_version'"),
        ({"deployment": None}, "plan", "[embedder] missing required key 'deployment'"),
        ({"api_version": "2024-10"}, "plan", "use a dated one, e.g. 2024-10-21"),
        ({"deployment": "no-such-deployment"}, "run", "Azure: deployment and azure_endpoint"),
        ({"api_key_env": "REINDEX_TEST_UNSET_KEY"}, "run", "export REINDEX_TEST_UNSET_KEY="),
    ],
    ids=["no-api-version", "no-deployment", "undated-api-version", "unknown-deployment", "unset-key"],
)
def test_a_misconfiguration_exits_2_with_one_line_naming_the_fix(
    tmp_path: Path, emulator: Emulator, pg_dsn: str, keys: dict[str, Any], verb: str, message: str
) -> None:
    tool, _ = make_tool(tmp_path, emulator, pg_dsn, **keys)
    os.environ.pop("REINDEX_TEST_UNSET_KEY", None)
    code, out, err = tool.run(verb, env={KEY_ENV: KEY}, timeout=240)
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], err
    assert KEY not in out + err
    assert emulator.stats()["billed_tokens"] == 0
