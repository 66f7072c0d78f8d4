"""The Bedrock batch embedder against the local emulator (boto3 → FastAPI control plane, moto's S3)."""

from __future__ import annotations

import json
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reindex.errors import ConfigError, TransientError
from reindex.ports import DeferredEmbedder, JobItem, JobResult, RecallsItems
from reindex.registry import build
from reindex_adapters.bedrock import (
    PRICES,
    PRICES_TAKEN,
    TITAN_V2,
    BedrockBatchEmbedder,
    job_name,
)
from reindex_adapters.bedrock.records import collect_records
from reindex_adapters.remote.pacing import Pacer
from reindex_adapters.testing.emulators.bedrock import BedrockEmulator
from reindex_adapters.testing.emulators.faults import FaultPlan
from reindex_adapters.testing.emulators.openai import shorten
from reindex_adapters.testing.memory import HashEmbedder

DIM = 256
MINIMUM = 4
TEXTS = [f"document {i} about {'alpha beta ' * (i % 5)}topic" for i in range(8)]
POISON = "poisoned input"
Make = Callable[..., BedrockBatchEmbedder]


@pytest.fixture(scope="module")
def emulator() -> Iterator[BedrockEmulator]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ACCESS_KEY_ID", "testing")
        patch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        with BedrockEmulator(
            HashEmbedder(dim=1024), min_records=MINIMUM, buckets=("inputs", "outputs")
        ) as emu:
            yield emu


@pytest.fixture
def make(emulator: BedrockEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[Make]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")

    def embedder(*, faults: dict[str, Any] | None = None, **keys: Any) -> BedrockBatchEmbedder:
        emulator.set_faults(FaultPlan(**{"polls_per_step": 0, **(faults or {})}))
        section = {**config(emulator), **keys}
        built = build("embedder", section)
        assert isinstance(built, BedrockBatchEmbedder)
        built._pacer = Pacer(backoff_s=0.01, max_backoff_s=0.05, attempts=6)
        return built

    yield embedder
    emulator.set_faults(FaultPlan())


def config(emulator: BedrockEmulator) -> dict[str, Any]:
    return {
        "kind": "bedrock-batch",
        "region": "us-east-1",
        "role_arn": "arn:aws:iam::123456789012:role/batch",
        "input_s3_uri": "s3://inputs/reindex",
        "output_s3_uri": "s3://outputs/reindex",
        "dimensions": DIM,
        "min_records": MINIMUM,
        "endpoint_url": emulator.url,
        "s3_endpoint_url": emulator.s3_url,
    }


def reference(texts: list[str]) -> np.ndarray:
    hasher = HashEmbedder(dim=1024)
    return shorten(hasher.embed(hasher.tokenize(texts)), DIM)


def items(embedder: BedrockBatchEmbedder, texts: list[str] = TEXTS) -> list[JobItem]:
    return [JobItem(f"0-{i}", tokens) for i, tokens in enumerate(embedder.tokenize(texts))]


def finish(embedder: BedrockBatchEmbedder, job_id: str) -> JobResult:
    for _ in range(10):
        result = embedder.poll(job_id)
        if result.is_terminal:
            return result
    pytest.fail("the job never finished")


def created(emulator: BedrockEmulator, key: str) -> int:
    return sum(job["name"] == job_name(key) for job in emulator.stats()["jobs"])


def tokens_of(texts: list[str]) -> int:
    from reindex_adapters.remote.tokens import cl100k

    return sum(len(cl100k().encode_ordinary(text)) for text in texts)


def test_a_job_returns_the_models_vector_per_custom_id_and_bills_its_tokens(
    make: Make, emulator: BedrockEmulator
) -> None:
    embedder = make()
    assert isinstance(embedder, DeferredEmbedder)
    job = embedder.submit("key-clean", items(embedder))
    result = finish(embedder, job)
    assert result.status == "Completed" and not result.failed
    got = np.stack([result.vectors[f"0-{i}"] for i in range(len(TEXTS))])
    np.testing.assert_allclose(got, reference(TEXTS), rtol=1e-6)
    assert result.billed_tokens == tokens_of(TEXTS)


def test_the_same_key_twice_creates_one_job(make: Make, emulator: BedrockEmulator) -> None:
    embedder = make()
    first = embedder.submit("key-twice", items(embedder))
    assert make().submit("key-twice", items(embedder)) == first  # another process adopts it by name
    assert created(emulator, "key-twice") == 1


def test_a_create_that_times_out_is_adopted_by_name(make: Make, emulator: BedrockEmulator) -> None:
    embedder = make(faults={"slow_creates": 1, "create_delay_s": 2.0}, create_timeout_s=0.5)
    job = embedder.submit("key-slow", items(embedder))
    assert created(emulator, "key-slow") == 1
    assert finish(embedder, job).status == "Completed"


def test_a_conflict_on_create_adopts_the_job_that_holds_the_name(
    make: Make, emulator: BedrockEmulator
) -> None:
    embedder = make()
    job = embedder.submit("key-conflict", items(embedder))
    input_uri = f"s3://inputs/reindex/{job_name('key-conflict')}/records.jsonl"
    assert (
        embedder._create_job("another-key", job_name("key-conflict"), input_uri) == job
    )  # ConflictException
    assert created(emulator, "key-conflict") == 1


def test_throttling_is_waited_out_after_the_retry_hint(make: Make, emulator: BedrockEmulator) -> None:
    faults = {
        "rate_limit": 2,
        "rate_limit_on": ("batch_create", "batch_list", "batch_retrieve"),
        "retry_after_s": 0.2,
    }
    embedder = make(faults=faults)
    started = time.monotonic()
    job = embedder.submit("key-throttled", items(embedder))
    assert finish(embedder, job).status == "Completed"
    stats = emulator.stats()
    assert stats["refused"].get("429", 0) >= 2 and stats["early_requests_total"] == 0
    assert time.monotonic() - started >= 2 * 1.0  # Retry-After is whole seconds
    assert created(emulator, "key-throttled") == 1


def test_a_partially_completed_job_keeps_its_records_and_fails_the_rest_for_resubmission(make: Make) -> None:
    embedder = make(faults={"expire_after": 3})
    result = finish(embedder, embedder.submit("key-partial", items(embedder)))
    assert result.status == "PartiallyCompleted" and len(result.vectors) == 3
    assert set(result.failed.values()) == {"batch_expired"}
    assert result.billed_tokens == tokens_of(TEXTS[:3])


def test_a_malformed_output_line_fails_only_its_record(make: Make) -> None:
    embedder = make(faults={"malformed_output_line": True, "shuffle_output": True})
    result = finish(embedder, embedder.submit("key-malformed", items(embedder)))
    assert len(result.vectors) == len(TEXTS) - 1
    assert list(result.failed.values()) == ["malformed_output"]


def test_lost_output_files_fail_every_record_for_resubmission(make: Make) -> None:
    embedder = make(faults={"delete_output": True})
    result = finish(embedder, embedder.submit("key-lost", items(embedder)))
    assert result.status == "Completed" and not result.vectors
    assert set(result.failed.values()) == {"output_deleted"}


def test_a_rejected_input_fails_with_the_providers_code_and_goes_alone_online(make: Make) -> None:
    embedder = make(faults={"poison_substring": POISON})
    texts = [*TEXTS[:4], f"a {POISON} here"]
    result = finish(embedder, embedder.submit("key-poison", items(embedder, texts)))
    assert result.failed == {"0-4": "http_400"} and len(result.vectors) == 4
    online = embedder.embed_stragglers(items(embedder, texts)[3:])
    assert online.failed == {"0-4": "ValidationException"}
    assert list(online.vectors) == ["0-3"] and online.billed_tokens == tokens_of(texts[3:4])


def test_a_job_that_fails_validation_fails_every_record_retryably(make: Make) -> None:
    embedder = make(faults={"fail_validation": True})
    result = finish(embedder, embedder.submit("key-invalid", items(embedder)))
    assert result.status == "Failed" and set(result.failed.values()) == {"batch_failed:job_failed"}


def test_a_shard_below_the_minimum_goes_online_and_over_the_maximum_is_refused(
    make: Make, emulator: BedrockEmulator
) -> None:
    embedder = make()
    assert embedder.submit("key-small", items(embedder)[: MINIMUM - 1]) == "online"
    assert created(emulator, "key-small") == 0
    job = embedder.submit("key-shrunk", items(embedder))
    assert embedder.submit("key-shrunk", items(embedder)[:2]) == job  # recovered with fewer: still adopted
    with pytest.raises(ConfigError, match="shard_size"):
        make(max_records=5).submit("key-big", items(embedder))


def test_another_process_polls_and_release_deletes_the_jobs_objects(
    make: Make, emulator: BedrockEmulator
) -> None:
    job = make().submit("key-release", items(make()))
    other = make()
    assert len(finish(other, job).vectors) == len(TEXTS)
    other.release(job)
    s3 = emulator.s3_client()
    left = [
        entry["Key"]
        for bucket in ("inputs", "outputs")
        for entry in s3.list_objects_v2(Bucket=bucket).get("Contents", [])
        if job_name("key-release") in entry["Key"] or job.rsplit("/", 1)[-1] in entry["Key"]
    ]
    assert left == []
    other.release(job)  # already gone is fine


def test_exhausted_throttling_is_transient(make: Make) -> None:
    embedder = make(faults={"rate_limit": 50, "rate_limit_on": ("batch_list",), "retry_after_s": 0.01})
    embedder._pacer = Pacer(attempts=2)
    with pytest.raises(TransientError, match="ThrottlingException"):
        embedder.submit("key-storm", items(embedder))


def test_records_join_on_record_id_in_any_order_and_duplicates_are_harmless() -> None:
    vector = [0.5] * DIM
    good = {"recordId": "00000000001", "modelOutput": {"embedding": vector, "inputTextTokenCount": 3}}
    lines = [
        json.dumps(good),
        json.dumps(good),
        json.dumps({"recordId": "00000000000", "error": {"errorCode": 429, "errorMessage": "slow down"}}),
        json.dumps({"recordId": "00000000002", "error": {"errorCode": 500, "errorMessage": "oops"}}),
    ]
    mapping = {"00000000000": "a", "00000000001": "b", "00000000002": "c", "00000000003": "d"}
    vectors, failed, billed = collect_records(mapping, ["\n".join(lines).encode()], DIM, missing=None)
    assert list(vectors) == ["b"] and billed == 3
    assert failed == {"a": "rate_limit_exceeded", "c": "server_error", "d": "missing_output"}


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"dimensions": 300}, "256, 512 or 1024"),
        ({"input_s3_uri": "inputs/reindex"}, "not an S3 URI"),
        ({"role_arn": None}, "role_arn"),
        ({"model": "cohere.embed-english-v3"}, "model"),
    ],
)
def test_a_misconfiguration_is_a_config_error(
    emulator: BedrockEmulator, keys: dict[str, Any], message: str
) -> None:
    section = {key: value for key, value in {**config(emulator), **keys}.items() if value is not None}
    with pytest.raises(ConfigError, match=message):
        build("embedder", section)


def test_without_boto3_the_kind_names_its_extra(
    emulator: BedrockEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(ConfigError, match=r"reindex-embeddings\[bedrock\]"):
        build("embedder", config(emulator))


def test_the_fingerprint_follows_the_model_and_its_options(emulator: BedrockEmulator) -> None:
    base = build("embedder", config(emulator)).info
    moved = build("embedder", {**config(emulator), "endpoint_url": "http://elsewhere", "region": "eu-west-1"})
    assert moved.info.fingerprint == base.fingerprint
    assert build("embedder", {**config(emulator), "dimensions": 512}).info.fingerprint != base.fingerprint
    assert base.kind == "bedrock-batch" and base.model == TITAN_V2 and base.dim == DIM


def test_the_price_table_matches_configs_pricing_toml() -> None:
    table = tomllib.loads((Path(__file__).parents[2] / "configs" / "pricing.toml").read_text())
    assert table["bedrock"]["taken"] == PRICES_TAKEN
    assert table["bedrock"]["models"] == PRICES


def test_titan_v2_batch_is_priced_as_on_demand_until_the_discount_is_confirmed(make: Make) -> None:
    """AWS names no batch discount for Titan V2: the budget errs high, and plan says so."""
    from reindex.plan.estimate import PlanReport
    from reindex.ui.plan_view import cost

    embedder = make()
    assert (
        embedder.traits.prices == {"online": 0.02, "batch": 0.02}
        and embedder.traits.price_per_million == 0.02
    )
    (caveat,) = embedder.price_caveats
    assert "not confirmed" in caveat and "prices = { batch" in caveat
    told = make(prices={"online": 0.02, "batch": 0.01})  # the user's bill shows the discount
    assert told.traits.price_per_million == 0.01 and told.price_caveats == ()
    assert "price_caveats" in PlanReport().to_json() and cost(PlanReport(cost_batch_usd=1.0)).startswith("$")


# Titan's limits without its tokenizer (issue 42, item 6) -------------------------------------------------


def test_a_text_over_titans_50000_characters_is_cut_to_them_and_embedded(make: Make) -> None:
    """60,000 '=' are about 3,750 cl100k tokens: within the token limit, over the characters one."""
    embedder = make()
    long = "=" * 60_000
    assert tokens_of([long]) < 8192
    cut = embedder.tokenize([long, *TEXTS[: MINIMUM - 1]])
    assert cut[0].is_truncated and len(str(cut[0].data)) <= 50_000
    job = embedder.submit("key-chars", [JobItem(f"0-{i}", t) for i, t in enumerate(cut)])
    assert finish(embedder, job).failed == {}


def test_titan_counts_are_estimates_on_the_high_side_and_say_so(make: Make) -> None:
    embedder = make()
    counted = embedder.tokenize(TEXTS)
    assert all(t.count >= tokens_of([text]) * 1.25 for t, text in zip(counted, TEXTS, strict=True))
    assert not embedder.token_counts.exact and "estimate" in embedder.token_counts.basis
    prose = "word " * 8000  # 8,000 cl100k tokens: over 8,192 once the margin is counted
    (cut,) = embedder.tokenize([prose])
    assert cut.is_truncated and cut.count <= 8192


def test_a_fresh_process_maps_records_from_the_ledger_without_reading_the_input_folder(
    make: Make, emulator: BedrockEmulator
) -> None:
    """The tool's credentials may only write the input prefix (a least-privilege policy): a resume maps each
    recordId from the items the ledger recalls (`RecallsItems`), in submit order, not from the record map."""
    given = items(make())
    job = make().submit("key-fresh", given)
    s3 = emulator.s3_client()
    for entry in s3.list_objects_v2(Bucket="inputs").get("Contents", []):
        if entry["Key"].endswith("records.json"):
            s3.delete_object(Bucket="inputs", Key=entry["Key"])  # as good as unreadable
    fresh = make()
    assert isinstance(fresh, RecallsItems)
    fresh.recall(job, [(item.custom_id, item.tokens.count) for item in given])
    result = finish(fresh, job)
    assert set(result.vectors) == {item.custom_id for item in given} and result.failed == {}
    np.testing.assert_allclose(
        np.stack([result.vectors[i.custom_id] for i in given]), reference(TEXTS), rtol=1e-5
    )
