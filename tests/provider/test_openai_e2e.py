"""The provider path end to end: `reindex run` (a real process) → official openai SDK → the emulator.

Every fault the real service shows, and SIGKILL at each step of the batch lifecycle, must end in a
verified target with exactly one batch per key, billed tokens equal to the tokens of the unique texts
embedded, and no request sent before its Retry-After.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from reindex_adapters.testing.emulators.faults import FaultPlan
from reindex_adapters.testing.emulators.openai import Emulator
from reindex_adapters.testing.memory import HashEmbedder
from tests.durability.support import Tool
from tests.provider import support
from tests.provider.support import POISON, one_job_per_key, run_to_end, unique_tokens

KEY_ENV = "REINDEX_TEST_OPENAI_KEY"
KEY = "sk-test-0123456789abcdef"
ENV = {KEY_ENV: KEY}


def make_tool(
    tmp_path: Path,
    emulator: Emulator,
    pg_dsn: str,
    *,
    kind: str = "openai-batch",
    poison: bool = False,
    embedder: Mapping[str, object] | None = None,
    **run: Any,
) -> tuple[Tool, list[str]]:
    section: dict[str, object] = {
        "kind": kind,
        "model": "text-embedding-3-small",
        "dimensions": 64,
        "base_url": emulator.base_url,
        "api_key_env": KEY_ENV,
        **({"inputs_per_request": 16} if kind == "openai-batch" else {}),
        **(embedder or {}),
    }
    return support.make_tool(tmp_path, pg_dsn, section, name="provider.toml", poison=poison, **run)


@pytest.fixture
def emulator():
    os.environ[KEY_ENV] = KEY
    with Emulator(HashEmbedder(dim=1536)) as emu:
        yield emu
    os.environ.pop(KEY_ENV, None)


def assert_verified_once_billed(
    tool: Tool, emulator: Emulator, texts: list[str], *, skip: str | None = None, lost_batches: int = 0
):
    """Verified, one batch per key, and billed exactly the unique texts' tokens, except what the provider
    billed and then lost (a malformed line, a deleted output file): that must be bought again."""
    report = tool.json("verify")
    assert report["complete"], report
    stats = emulator.stats()
    one_job_per_key(stats)
    unique = unique_tokens(texts, skip=skip)
    first_ids = [batch["id"] for batch in stats["batches"][:lost_batches]]
    lost = sum(entry["tokens"] for entry in stats["billed"] if entry["batch_id"] in first_ids)
    assert unique <= stats["billed_tokens"] <= unique + lost
    assert stats["early_requests_total"] == 0
    return stats


def test_batch_run_is_verified_and_billed_once_per_unique_text(tmp_path, emulator, pg_dsn):
    tool, texts = make_tool(tmp_path, emulator, pg_dsn)
    plan = tool.json("plan")
    run_to_end(tool, ENV)
    stats = assert_verified_once_billed(tool, emulator, texts)
    assert abs(plan["tokens"] - stats["billed_tokens"]) <= 0.01 * stats["billed_tokens"]
    assert plan["cost_batch_usd"] == pytest.approx(plan["cost_online_usd"] / 2)
    status = tool.json("status")
    assert status["reconciled"] and status["written"] == len(texts) - 12 + 12
    run = tool.json("run")
    assert run["billed_tokens"] == stats["billed_tokens"] and run["cost_usd"] > 0


@pytest.mark.parametrize(
    "fault",
    [
        {"expire_after": 3, "faulty_batches": 2},
        {"cancel_after": 2, "faulty_batches": 1},
        {"shuffle_output": True, "duplicate_output_line": True},
        {"malformed_output_line": True, "faulty_batches": 2},
        {"delete_output": True, "faulty_batches": 1},
        {"fail_validation": True, "faulty_batches": 1},
        {"slow_creates": 2, "create_delay_s": 3.0},
        {
            "rate_limit": 6,
            "rate_limit_on": ["batch_create", "batch_retrieve", "batch_list", "files"],
            "retry_after_s": 0.3,
        },
        {"server_errors": 4, "server_errors_on": ["batch_create", "batch_retrieve", "batch_list", "files"]},
    ],
    ids=lambda f: next(iter(f)),
)
def test_batch_faults_end_verified_with_one_batch_per_key(tmp_path, emulator, pg_dsn, fault):
    emulator.set_faults(FaultPlan.from_mapping({"polls_per_step": 1, **fault}))
    extra: dict[str, Any] = (
        {"provider_attempts": 4} if "expire_after" in fault or "cancel_after" in fault else {}
    )
    tool, texts = make_tool(tmp_path, emulator, pg_dsn, **extra)
    if "slow_creates" in fault:  # the client gives up on create before the server answers
        tool.config.write_text(
            tool.config.read_text().replace("dimensions = 64\n", "dimensions = 64\ncreate_timeout_s = 1.0\n")
        )
    run_to_end(tool, ENV)
    lossy = (
        fault.get("faulty_batches", 0) if "malformed_output_line" in fault or "delete_output" in fault else 0
    )
    assert_verified_once_billed(tool, emulator, texts, lost_batches=lossy)


def test_a_rejected_line_is_isolated_and_dead_lettered(tmp_path, emulator, pg_dsn):
    emulator.set_faults(FaultPlan(poison_substring=POISON))
    tool, texts = make_tool(tmp_path, emulator, pg_dsn, poison=True, provider_attempts=2)
    run_to_end(tool, ENV)
    letters = tool.json("dlq", "list")["dead_letters"]
    assert [d["reason"] for d in letters] == ["provider_rejected:invalid_request_error"]
    assert_verified_once_billed(tool, emulator, texts, skip=POISON)


@pytest.mark.parametrize(
    "point", ["job_after_intent", "job_after_create", "job_after_write", "job_after_apply"]
)
def test_sigkill_at_each_batch_step_never_double_bills(tmp_path, emulator, pg_dsn, point):
    tool, texts = make_tool(tmp_path, emulator, pg_dsn)
    code, _, err = tool.run("run", env={KEY_ENV: os.environ[KEY_ENV], "REINDEX_CRASH_AT": f"{point}:2"})
    assert code == -signal.SIGKILL, err
    run_to_end(tool, ENV)
    assert_verified_once_billed(tool, emulator, texts)


def test_online_endpoint_under_429_storm_and_poison_input(tmp_path, emulator, pg_dsn):
    emulator.set_faults(FaultPlan(rate_limit=5, retry_after_s=0.3, server_errors=3, poison_substring=POISON))
    # The storm's failures fall on one probing request, whose backoff doubles per attempt: start it at
    # 50 ms (capped at 0.5 s) so the test spends its time on the behaviour, not on waiting.
    backoff = {"backoff_s": 0.05, "max_backoff_s": 0.5}
    tool, texts = make_tool(tmp_path, emulator, pg_dsn, kind="openai", poison=True, embedder=backoff)
    run_to_end(tool, ENV)
    letters = tool.json("dlq", "list")["dead_letters"]
    assert [d["reason"] for d in letters] == ["provider_rejected:invalid_request_error"]
    report = tool.json("verify")
    assert report["complete"]
    stats = emulator.stats()
    assert stats["early_requests_total"] == 0
    assert stats["billed_tokens"] == unique_tokens(texts, skip=POISON)


def test_online_run_reports_its_requests_and_429s_instead_of_padding(tmp_path, emulator, pg_dsn):
    emulator.set_faults(FaultPlan(rate_limit=2, retry_after_s=0.2))
    options = {"max_inputs_per_request": 16, "backoff_s": 0.05}
    tool, texts = make_tool(tmp_path, emulator, pg_dsn, kind="openai", embedder=options)
    code, out, err = tool.run("run", "--json", env={KEY_ENV: os.environ[KEY_ENV]})
    assert code == 0, err
    report = json.loads(out)
    assert report["padding_fraction"] is None and report["model_busy_fraction"] is None
    stats = emulator.stats()
    served = stats["requests"]["embeddings"]  # the emulator counts only what it did not refuse
    assert report["requests"] == served + 2 and served >= len(set(texts)) // 16
    assert (report["rate_limited"], report["retries"]) == (2, 2)
    assert report["requests_per_second"] > 0 and report["tokens_per_minute"] > 0
    assert stats["max_in_flight"] >= 2 and stats["early_requests_total"] == 0
    assert report["billed_tokens"] == stats["billed_tokens"] == unique_tokens(texts)
    assert report["tokens"] == report["billed_tokens"]  # counted by the provider, not bounded by bytes


@pytest.mark.parametrize("kind", ["openai-batch", "openai"])
def test_budget_stops_resumably_and_raising_it_finishes(tmp_path, emulator, pg_dsn, kind):
    """The online path once exited 0 at its budget, with the run marked finished and part of it written."""
    tool, texts = make_tool(tmp_path, emulator, pg_dsn, kind=kind, max_cost_usd=0.00004)  # 2,000-4,000 tokens
    code, _, err = tool.run("run", env={KEY_ENV: os.environ[KEY_ENV]})
    assert code == 75 and "budget reached" in err
    price = 0.01 if kind == "openai-batch" else 0.02  # USD per 1M tokens of text-embedding-3-small
    assert 0 < emulator.stats()["billed_tokens"] * price / 1e6 <= 0.00004
    assert not tool.json("verify")["complete"]
    tool.config.write_text(tool.config.read_text().replace("max_cost_usd = 4e-05", "max_cost_usd = 1.0"))
    run_to_end(tool, ENV)
    if kind == "openai-batch":
        assert_verified_once_billed(tool, emulator, texts)
    else:  # nothing billed twice across the stop
        assert tool.json("verify")["complete"]
        assert emulator.stats()["billed_tokens"] == unique_tokens(texts)


def test_api_key_never_leaks(tmp_path, emulator, pg_dsn):
    tool, _ = make_tool(tmp_path, emulator, pg_dsn)
    run_to_end(tool, ENV)
    secret = os.environ[KEY_ENV]
    outputs = [tool.run(verb, "--json")[1] for verb in ("status", "plan", "verify")]
    assert all(secret not in out for out in outputs)
    ledger_files = [path for path in tool.state.parent.iterdir() if path.name.startswith(tool.state.name)]
    assert all(secret.encode() not in path.read_bytes() for path in ledger_files)


def test_the_ledger_holds_no_document_text(tmp_path, emulator, pg_dsn):
    """Issue 10, defect 10: jobs keep ids and hashes only; texts are read again from the source."""
    emulator.set_faults(FaultPlan(expire_after=3, faulty_batches=2))  # lines go out again: texts re-read
    tool, texts = make_tool(tmp_path, emulator, pg_dsn, provider_attempts=4)
    run_to_end(tool, ENV)
    assert tool.json("verify")["complete"]
    ledger_files = [path for path in tmp_path.iterdir() if path.name.startswith("state.db")]
    stored = b"".join(path.read_bytes() for path in ledger_files)
    assert not [text for text in set(texts) if text.encode() in stored]


@pytest.mark.parametrize("shape", ["response", "error"])
def test_refused_batch_lines_in_either_error_file_shape_end_dead_lettered(tmp_path, emulator, pg_dsn, shape):
    """Issue 10, defect 4: a line refused with a 400 answer or an error object is dead-lettered for every
    document with that text; the inputs that shared its request line are written; the run reconciles."""
    emulator.set_faults(FaultPlan(poison_substring=POISON, poison_shape=shape))
    tool, texts = make_tool(tmp_path, emulator, pg_dsn, poison=True, provider_attempts=1)
    docs = tmp_path / "docs.jsonl"
    copy = json.dumps({"id": "a-copy", "text": texts[-1]})
    docs.write_text(copy + "\n" + docs.read_text())  # the same poison text, in the first shard
    run_to_end(tool, ENV)
    code = "invalid_request_error" if shape == "response" else "invalid_request"
    letters = {d["doc_id"]: d["reason"] for d in tool.json("dlq", "list")["dead_letters"]}
    assert letters == {"a-copy": f"provider_rejected:{code}", "d0312": f"provider_rejected:{code}"}
    status = tool.json("status")
    assert status["reconciled"] and status["documents"] == len(texts) + 1
    assert status["written"] == len(texts) - 1 and status["dead_letters"] == 2
    assert_verified_once_billed(tool, emulator, texts, skip=POISON)


def test_api_key_never_leaks_from_a_failing_endpoint(tmp_path, emulator, pg_dsn):
    secret = "sk-test-SECRET-123"
    emulator.set_faults(FaultPlan(unauthorized=1000))  # every answer echoes the key it was sent
    tool, _ = make_tool(tmp_path, emulator, pg_dsn)
    code, out, err = tool.run("run", env={KEY_ENV: secret}, timeout=240)
    assert code == 2 and "SECRET" not in out + err, err
    text = tool.config.read_text().replace(emulator.base_url, "http://127.0.0.1:9/v1")
    text = text.replace("dimensions = 64\n", "dimensions = 64\nmax_attempts = 2\ntimeout_s = 2\n")
    tool.config.write_text(text)
    code, out, err = tool.run("run", env={KEY_ENV: secret}, timeout=240)
    assert code == 75 and "SECRET" not in out + err, err
    ledger_files = [path for path in tmp_path.iterdir() if path.name.startswith("state.db")]
    assert all(b"SECRET" not in path.read_bytes() for path in ledger_files)


def test_stragglers_of_an_expired_batch_go_online_instead_of_a_new_batch(tmp_path, emulator, pg_dsn):
    emulator.set_faults(FaultPlan(expire_after=2, faulty_batches=10))
    tool, texts = make_tool(tmp_path, emulator, pg_dsn)
    tool.config.write_text(
        tool.config.read_text().replace("dimensions = 64\n", "dimensions = 64\nstragglers_online = true\n")
    )
    run_to_end(tool, ENV)
    stats = emulator.stats()
    assert tool.json("verify")["complete"]
    assert (
        len(stats["batches"]) == 3
    )  # one per shard with new texts (the 4th holds only repeats): no resubmission
    assert stats["billed_tokens_online"] > 0 and stats["billed_tokens"] == unique_tokens(texts)
    assert stats["early_requests_total"] == 0
