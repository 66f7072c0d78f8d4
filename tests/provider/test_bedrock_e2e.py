"""Bedrock batch inference end to end: `reindex` (a real process) → boto3 → the Bedrock emulator and moto's S3.

A clean run (vectors equal to the model's, billed for the unique texts), a refused input dead-lettered with
Bedrock's reason, a spending limit, and a SIGKILL right after a create: each ends verified, with one job per
key, or refuses as it should."""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector
from psycopg import sql

from reindex_adapters.testing.emulators.bedrock import BedrockEmulator
from reindex_adapters.testing.emulators.faults import FaultPlan
from reindex_adapters.testing.emulators.openai import shorten
from reindex_adapters.testing.memory import HashEmbedder
from tests.durability.support import Tool
from tests.provider.support import POISON, run_to_end, unique_tokens, write_config

DIM = 256
SHARD = 100
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@pytest.fixture
def emulator(monkeypatch: pytest.MonkeyPatch) -> Iterator[BedrockEmulator]:
    for name, value in AWS_ENV.items():
        monkeypatch.setenv(name, value)  # the verbs that only read run in this process
    with BedrockEmulator(HashEmbedder(dim=1024), min_records=50, buckets=("inputs", "outputs")) as emu:
        yield emu


def corpus(path: Path, *, poison: bool) -> dict[str, str]:
    """240 documents and 10 repeats of one; the poison input sits inside the first batch job."""
    texts = [f"document {i} about {'alpha beta ' * (i % 9)}topic {i % 41}" for i in range(240)]
    texts += [texts[5]] * 10
    if poison:
        texts[40] = f"this is a {POISON} for the provider"
    documents = {f"d{i:04d}": text for i, text in enumerate(texts)}
    path.write_text("".join(json.dumps({"id": key, "text": text}) + "\n" for key, text in documents.items()))
    return documents


def make_tool(
    tmp_path: Path, emulator: BedrockEmulator, pg_dsn: str, *, poison: bool = False, **run: object
) -> tuple[Tool, dict[str, str]]:
    documents = corpus(tmp_path / "docs.jsonl", poison=poison)
    embedder = {
        "kind": "bedrock-batch",
        "region": "us-east-1",
        "role_arn": "arn:aws:iam::123456789012:role/reindex-batch",
        "input_s3_uri": "s3://inputs/reindex",
        "output_s3_uri": "s3://outputs/reindex",
        "dimensions": DIM,
        "min_records": 50,
        "endpoint_url": emulator.url,
        "s3_endpoint_url": emulator.s3_url,
        "backoff_s": 0.05,
        "max_backoff_s": 0.2,
    }
    options = {"shard_size": SHARD, "poll_seconds": 0.05, "poll_max_seconds": 0.2, **run}
    return write_config(tmp_path, pg_dsn, embedder, options, name="bedrock.toml"), documents


def assert_one_job_per_key(emulator: BedrockEmulator) -> None:
    names = Counter(job["name"] for job in emulator.stats()["jobs"])
    assert names and max(names.values()) == 1, names


def stored_vectors(pg_dsn: str, target: str) -> dict[str, np.ndarray]:
    with psycopg.connect(pg_dsn) as conn:
        register_vector(conn)
        query = sql.SQL("SELECT id, embedding FROM {}").format(sql.Identifier(target))
        rows = conn.execute(query).fetchall()
    return {str(key): np.asarray(vector, dtype=np.float32) for key, vector in rows}


def test_a_run_is_verified_with_the_models_vectors_and_billed_once_per_unique_text(
    tmp_path: Path, emulator: BedrockEmulator, pg_dsn: str
) -> None:
    tool, documents = make_tool(tmp_path, emulator, pg_dsn)
    plan = tool.json("plan")
    # Titan V2's batch discount is unconfirmed: priced as on-demand, and plan says so
    assert plan["cost_batch_usd"] == pytest.approx(plan["cost_online_usd"], abs=1e-9)
    assert any("not confirmed" in caveat for caveat in plan["price_caveats"])
    run_to_end(tool, AWS_ENV, attempts=4)
    assert tool.json("verify")["complete"]
    stats = emulator.stats()
    texts = list(documents.values())
    # Titan's tokenizer is not published: the plan's counts are estimates on the high side, and say so
    assert stats["billed_tokens"] == unique_tokens(texts) <= plan["tokens"]
    assert not plan["token_counts"]["exact"] and "estimate" in plan["token_counts"]["basis"]
    assert stats["jobs_created"] == 2 and stats["billed_tokens_online"] > 0  # the last 50 texts: online
    assert_one_job_per_key(emulator)
    stored = stored_vectors(pg_dsn, plan["target"])
    hasher = HashEmbedder(dim=1024)
    ids = sorted(documents)
    expected = shorten(hasher.embed(hasher.tokenize([documents[key] for key in ids])), DIM)
    np.testing.assert_allclose(np.stack([stored[key] for key in ids]), expected, rtol=1e-5, atol=1e-6)


def test_a_refused_input_is_dead_lettered_with_bedrocks_reason(
    tmp_path: Path, emulator: BedrockEmulator, pg_dsn: str
) -> None:
    emulator.set_faults(FaultPlan(poison_substring=POISON))
    tool, documents = make_tool(tmp_path, emulator, pg_dsn, poison=True)
    run_to_end(tool, AWS_ENV, attempts=4)
    letters = tool.json("dlq", "list")["dead_letters"]
    assert [(d["doc_id"], d["reason"]) for d in letters] == [
        ("d0040", "provider_rejected:ValidationException")
    ]
    assert tool.json("verify")["complete"]
    assert emulator.stats()["billed_tokens"] == unique_tokens(list(documents.values()), skip=POISON)
    assert_one_job_per_key(emulator)


def test_max_cost_usd_stops_resumably_and_raising_it_finishes(
    tmp_path: Path, emulator: BedrockEmulator, pg_dsn: str
) -> None:
    tool, documents = make_tool(tmp_path, emulator, pg_dsn, max_cost_usd=0.00002)
    code, _, err = tool.run("run", env=AWS_ENV)
    assert code == 75 and "budget reached" in err
    assert emulator.stats()["billed_tokens"] * 0.02 / 1e6 <= 0.00002  # at the price the budget charges
    tool.config.write_text(tool.config.read_text().replace("max_cost_usd = 2e-05", "max_cost_usd = 1.0"))
    run_to_end(tool, AWS_ENV, attempts=4)
    assert tool.json("verify")["complete"]
    assert emulator.stats()["billed_tokens"] == unique_tokens(list(documents.values()))


def test_sigkill_after_a_create_then_rerun_adopts_the_job_and_never_creates_twice(
    tmp_path: Path, emulator: BedrockEmulator, pg_dsn: str
) -> None:
    tool, documents = make_tool(tmp_path, emulator, pg_dsn)
    code, _, err = tool.run("run", env={**AWS_ENV, "REINDEX_CRASH_AT": "job_after_create:1"})
    assert code == -signal.SIGKILL, err
    assert emulator.stats()["jobs_created"] == 1
    run_to_end(tool, AWS_ENV, attempts=4)
    assert tool.json("verify")["complete"]
    assert_one_job_per_key(emulator)
    assert emulator.stats()["billed_tokens"] == unique_tokens(list(documents.values()))
