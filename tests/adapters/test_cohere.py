"""The Cohere embedders against the local emulator, through the official cohere SDK: an Embed Job per key adopted
by its name (job or dataset), the faults of a job, rows refused with Cohere's reason, billing from
`meta.billed_units`, the online /v2/embed kind, routing, and the errors."""

from __future__ import annotations

import math
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cohere
import numpy as np
import pytest

from reindex import registry
from reindex.config import RouteConfig, RunConfig
from reindex.errors import ConfigError, MissingDependency, TransientError
from reindex.plan import routing
from reindex.plan.estimate import PlanReport
from reindex.ports import DeferredEmbedder, JobResult, RecallsItems, Vectors
from reindex_adapters.cohere import PRICES, PRICES_TAKEN, CohereBatchEmbedder, CohereEmbedder, datasets
from reindex_adapters.cohere.batch import row_vector
from reindex_adapters.cohere.client import Api
from reindex_adapters.remote.pacing import Pacer
from reindex_adapters.testing.emulators.cohere import CohereEmulator
from reindex_adapters.testing.emulators.cohere import state as emulator_state
from reindex_adapters.testing.emulators.faults import FaultPlan
from reindex_adapters.testing.memory import HashEmbedder
from tests.adapters.support import TEXTS, finish, jobs, tokens

SECRET = "cohere-test-0123456789abcdefSECRET"
KEY_ENV = "REINDEX_TEST_COHERE_KEY"
HASHER = HashEmbedder(dim=1024)
Serve = Callable[..., tuple[CohereEmulator, cohere.ClientV2]]


@pytest.fixture
def serve() -> Iterator[Serve]:
    running: list[tuple[CohereEmulator, cohere.ClientV2]] = []

    def start(**faults: Any) -> tuple[CohereEmulator, cohere.ClientV2]:
        emulator = CohereEmulator(HASHER, FaultPlan(**{"polls_per_step": 0, **faults}))
        emulator.start()
        client = cohere.ClientV2(api_key=SECRET, base_url=emulator.base_url, max_retries=0, timeout=10)
        running.append((emulator, client))
        return emulator, client

    yield start
    for emulator, client in running:
        client._client_wrapper.httpx_client.httpx_client.close()
        emulator.stop()


def batcher(client: cohere.ClientV2, **options: Any) -> CohereBatchEmbedder:
    config = CohereBatchEmbedder.Config(kind="cohere-batch", api_key_env=KEY_ENV, **options)
    return CohereBatchEmbedder(client, config, pacer=Pacer(backoff_s=0.02))


def expected(texts: list[str]) -> Vectors:
    return HASHER.embed(HASHER.tokenize(texts))


def run(embedder: CohereBatchEmbedder, key: str, texts: list[str]) -> JobResult:
    return finish(embedder, embedder.submit(key, jobs(embedder, texts)))


def last_job(emulator: CohereEmulator) -> dict[str, Any]:
    """The wire object of the job created last (submit gives "dataset:<id>" until poll creates the job)."""
    return emulator.job(emulator.stats()["batches"][-1]["id"])


def test_a_job_returns_the_models_vector_per_custom_id_and_bills_from_its_meta(serve: Serve) -> None:
    emulator, client = serve(polls_per_step=1)
    embedder = batcher(client)
    assert isinstance(embedder, DeferredEmbedder)
    items = jobs(embedder, TEXTS)
    job_id = embedder.submit("plan-1-abc-0-0", items)  # the dataset, uploaded: no job until it validates
    assert job_id.startswith("dataset:") and emulator.stats()["batches_created"] == 0
    assert embedder.poll(job_id).status == "processing"  # the dataset, validating
    assert emulator.stats()["batches_created"] == 0
    assert embedder.poll(job_id).status == "processing"  # validated: the job made, and processing
    result = finish(embedder, job_id)
    assert result.status == "complete" and result.failed == {}
    for item, vector in zip(items, expected(TEXTS), strict=True):
        np.testing.assert_allclose(result.vectors[item.custom_id], vector, rtol=1e-6)
    assert result.billed_tokens == tokens(TEXTS) == sum(item.tokens.count for item in items)
    job = last_job(emulator)
    assert job["name"] == datasets.upload_name("plan-1-abc-0-0") and len(job["name"]) < 50
    assert job["meta"]["billed_units"]["input_tokens"] == result.billed_tokens
    assert emulator.dataset(job["input_dataset_id"])["preserve_fields"] == ["reindex_id"]


def test_the_same_key_twice_creates_one_job_and_another_process_can_poll_it(serve: Serve) -> None:
    emulator, client = serve()
    items = jobs(batcher(client), TEXTS)
    batcher(client).submit("key-other", items[:2])
    first = batcher(client).submit("key-a", items)
    assert batcher(client).submit("key-a", items) == first  # another process, after a crash: the dataset
    batcher(client).poll(first)  # the job, made
    assert batcher(client).submit("key-a", items) == last_job(emulator)["job_id"]  # and now the job
    other = finish(batcher(client), first)  # its rows read back from the input dataset
    assert set(other.vectors) == {item.custom_id for item in items}
    assert other.billed_tokens == tokens(TEXTS)
    stats = emulator.stats()
    assert (stats["batches_created"], stats["datasets_created"]) == (1, 2)


def test_creates_that_time_out_are_adopted_by_name_the_dataset_and_the_job(serve: Serve) -> None:
    emulator, client = serve(slow_creates=2, create_delay_s=2.0)  # the dataset's create, then the job's
    embedder = batcher(client, create_timeout_s=0.3)
    started = time.monotonic()
    job_id = embedder.submit("key-slow", jobs(embedder, TEXTS))
    assert embedder.submit("key-slow", jobs(embedder, TEXTS)) == job_id
    assert len(finish(embedder, job_id).vectors) == len(TEXTS)  # the job's create went unanswered too
    assert time.monotonic() - started < 3.0, "it waited for an answer instead of looking the create up"
    stats = emulator.stats()
    assert (stats["batches_created"], stats["datasets_created"]) == (1, 1)


def test_a_dataset_left_without_its_job_is_adopted_over_every_page(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    emulator, client = serve()
    monkeypatch.setattr(datasets, "PAGE", 2)
    embedder = batcher(client)
    items = jobs(embedder, TEXTS[:2])
    api = Api(client, Pacer(), KEY_ENV)
    name = datasets.upload_name("key-old")
    orphan = datasets.create(api, name, datasets.input_file(items), 5.0)  # a crash before the ledger knew
    for n in range(4):
        embedder.submit(f"key-{n}", items)  # the orphan is now on the third page, newest first
    assert embedder.submit("key-old", items) == f"dataset:{orphan}"
    assert emulator.stats()["datasets_created"] == 5


def test_a_create_refused_with_a_server_error_is_not_repeated(serve: Serve) -> None:
    emulator, client = serve(server_errors=1, server_errors_on=("batch_create",))
    embedder = batcher(client)
    job_id = embedder.submit("key-5xx", jobs(embedder, TEXTS))
    with pytest.raises(TransientError, match="rerun to retry"):
        embedder.poll(job_id)  # the job's create
    assert emulator.stats()["batches_created"] == 0  # refused before it was made: nothing to adopt
    assert len(finish(batcher(client), job_id).vectors) == len(TEXTS)  # the rerun makes it
    assert (emulator.stats()["batches_created"], emulator.stats()["datasets_created"]) == (1, 1)


def test_throttling_is_waited_out_with_the_retry_hint(serve: Serve) -> None:
    routes = ("files", "batch_list", "batch_create", "batch_retrieve")
    emulator, client = serve(rate_limit=4, rate_limit_on=routes, retry_after_s=0.2)
    result = run(batcher(client), "key-429", TEXTS)
    assert len(result.vectors) == len(TEXTS)
    stats = emulator.stats()
    assert stats["refused"] == {"429": 4} and stats["early_requests_total"] == 0
    assert stats["batches_created"] == 1


def test_a_failed_or_cancelled_job_keeps_its_done_rows_and_names_the_rest(serve: Serve) -> None:
    for faults, status, code in (
        ({"expire_after": 2}, "failed", "batch_failed"),
        ({"cancel_after": 2}, "cancelled", "batch_cancelled"),
        ({"failed_lines": 4}, "complete", "missing_output"),
    ):
        _, client = serve(**faults)
        result = run(batcher(client), "key", TEXTS)
        done = {"doc-0", "doc-1"} if status != "complete" else {"doc-4", "doc-5"}
        assert (result.status, set(result.vectors)) == (status, done)
        assert result.failed == {f"doc-{i}": code for i in range(len(TEXTS)) if f"doc-{i}" not in done}
        assert result.billed_tokens == tokens([TEXTS[int(c[-1])] for c in done])


def test_shuffled_duplicated_and_malformed_rows_join_on_the_id(serve: Serve) -> None:
    _, client = serve(shuffle_output=True, duplicate_output_line=True)
    embedder = batcher(client)
    items = jobs(embedder, TEXTS)
    result = finish(embedder, embedder.submit("key-shuffle", items))
    assert result.failed == {} and result.billed_tokens == tokens(TEXTS)
    for item, vector in zip(items, expected(TEXTS), strict=True):
        np.testing.assert_allclose(result.vectors[item.custom_id], vector, rtol=1e-6)
    _, client = serve(malformed_output_line=True)
    result = run(batcher(client), "key-bad", TEXTS)
    assert len(result.vectors) == len(TEXTS) - 1 and list(result.failed.values()) == ["malformed_output"]
    assert row_vector({"embeddings": {"float": [0.5] * 3}}, 1024) == "wrong_dimension"


def test_a_lost_output_dataset_fails_its_rows_for_resubmission_billed_exactly(serve: Serve) -> None:
    _, client = serve(delete_output=True)
    result = run(batcher(client), "key-gone", TEXTS)
    assert result.vectors == {} and set(result.failed.values()) == {"output_deleted"}
    assert result.billed_tokens == tokens(TEXTS)  # the job's meta still says what was billed


def test_a_refused_row_is_dropped_with_cohere_s_reason_and_a_refused_dataset_fails_whole(
    serve: Serve,
) -> None:
    emulator, client = serve(poison_substring="POISON")
    texts = [*TEXTS[:2], "a POISON pill"]
    result = run(batcher(client), "key-poison", texts)
    assert result.failed == {"doc-2": "row_dropped:the text could not be embedded"}
    assert set(result.vectors) == {"doc-0", "doc-1"} and result.billed_tokens == tokens(texts[:2])
    emulator, client = serve(fail_validation=True)
    result = run(batcher(client), "key-invalid", TEXTS)
    assert (result.status, result.billed_tokens) == ("failed", 0)  # the dataset's validation_status
    assert set(result.failed.values()) == {"batch_failed:invalid dataset: the file could not be parsed"}
    assert emulator.stats()["batches_created"] == 0


def test_a_row_sent_alone_and_dropped_makes_no_job_whether_or_not_its_dataset_fails(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    for empty_fails in (True, False):
        monkeypatch.setattr(emulator_state, "EMPTY_FAILS", empty_fails)
        emulator, client = serve(poison_substring="POISON")
        result = run(batcher(client), "key-alone", ["a POISON pill"])
        assert result.failed == {"doc-0": "row_dropped:the text could not be embedded"}
        assert emulator.stats()["batches_created"] == 0


def test_release_deletes_both_datasets_and_twice_is_fine(serve: Serve) -> None:
    emulator, client = serve()
    embedder = batcher(client)
    job_id = embedder.submit("key-release", jobs(embedder, TEXTS))
    finish(embedder, job_id)
    job = last_job(emulator)
    embedder.release(job_id)
    batcher(client).release(job_id)  # again, from another process
    assert emulator.dataset(job["input_dataset_id"])["is_deleted"]
    assert emulator.dataset(job["output_dataset_id"])["is_deleted"]


def test_stragglers_go_online_and_a_refused_text_fails_alone(serve: Serve) -> None:
    emulator, client = serve(poison_substring="POISON")
    embedder = batcher(client, stragglers_online=True)
    texts = [*TEXTS, "a POISON pill"]
    result = embedder.embed_stragglers(jobs(embedder, texts))
    assert result.failed == {"doc-6": "invalid_request"} and len(result.vectors) == len(TEXTS)
    np.testing.assert_allclose(result.vectors["doc-0"], expected(TEXTS[:1])[0], rtol=1e-6)
    assert result.billed_tokens == tokens(TEXTS) == emulator.stats()["billed_tokens_online"]


def online(client: cohere.ClientV2, **options: Any) -> CohereEmbedder:
    config = CohereEmbedder.Config(kind="cohere", api_key_env=KEY_ENV, **options)
    return CohereEmbedder(client, config, pacer=Pacer(concurrency=config.concurrency, backoff_s=0.02))


def test_the_online_kind_sends_96_texts_a_request_paced_and_isolates_a_refused_one(serve: Serve) -> None:
    emulator, client = serve(
        poison_substring="POISON", rate_limit=2, rate_limit_on=("embeddings",), retry_after_s=0.2
    )
    embedder = online(client, concurrency=2)
    texts = [f"text number {i}" for i in range(100)]
    texts[97] = "a POISON pill"
    vectors = embedder.embed(embedder.tokenize(texts))
    assert embedder.last_rejections() == {97: "provider_rejected:invalid_request"}
    clean = [text for text in texts if "POISON" not in text]
    np.testing.assert_allclose(np.delete(vectors, 97, axis=0), expected(clean), rtol=1e-6)
    assert np.isnan(vectors[97]).all()
    assert embedder.billed_tokens == tokens(clean) == emulator.stats()["billed_tokens"]
    stats = emulator.stats()  # 96 + 4 texts; the 4 refused, halved: [96, 97] (refused: [96], [97]), [98, 99]
    assert stats["refused"]["429"] == 2 and stats["early_requests_total"] == 0
    assert stats["requests"]["embeddings"] == 6


def test_refused_key_and_unreachable_server_are_errors_without_the_key(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, client = serve(unauthorized=2)
    embedder = batcher(client)
    with pytest.raises(ConfigError, match="refused the API key") as refused:
        embedder.submit("key-401", jobs(embedder, TEXTS[:1]))
    assert SECRET not in str(refused.value)
    with pytest.raises(ConfigError, match="refused the API key"):
        online(client).embed(embedder.tokenize(TEXTS[:1]))
    monkeypatch.setenv(KEY_ENV, SECRET)
    section = {
        "kind": "cohere-batch",
        "base_url": "http://127.0.0.1:9",
        "api_key_env": KEY_ENV,
        "max_attempts": 1,
    }
    unreachable = registry.build("embedder", section)
    with pytest.raises(TransientError) as busy:
        unreachable.submit("key-x", jobs(unreachable, TEXTS[:1]))
    assert SECRET not in str(busy.value)


def test_the_config_names_the_key_variable_and_the_models_each_kind_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CO_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="CO_API_KEY"):
        registry.build("embedder", {"kind": "cohere-batch"})
    monkeypatch.setenv("CO_API_KEY", SECRET)
    with pytest.raises(ConfigError, match='use kind "cohere"'):
        registry.build("embedder", {"kind": "cohere-batch", "model": "embed-v4.0"})
    with pytest.raises(ConfigError, match="output_dimension"):
        registry.build("embedder", {"kind": "cohere", "output_dimension": 512})
    batch = registry.build("embedder", {"kind": "cohere-batch", "model": "embed-multilingual-v3.0"})
    same = registry.build("embedder", {"kind": "cohere", "model": "embed-multilingual-v3.0"})
    assert (batch.info.dim, batch.info.max_tokens, batch.traits.prices) == (
        1024,
        512,
        {"online": 0.10, "batch": 0.10},
    )
    assert batch.info.fingerprint == same.info.fingerprint  # one model, either endpoint: the same vectors
    other = registry.build(
        "embedder", {"kind": "cohere", "model": "embed-multilingual-v3.0", "input_type": "clustering"}
    )
    assert other.info.fingerprint != same.info.fingerprint
    v4 = registry.build("embedder", {"kind": "cohere", "model": "embed-v4.0", "output_dimension": 512})
    assert (v4.info.dim, v4.traits.price_per_million) == (512, 0.12)


def test_routing_offers_the_batch_kind_beside_the_online_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CO_API_KEY", SECRET)
    configured = {"kind": "cohere", "tokens_per_minute": 1_000_000}
    embedder = registry.build("embedder", configured)
    report = PlanReport(
        documents=1000, unique_texts=1000, tokens=1_000_000, fingerprint=embedder.info.fingerprint
    )
    candidates = [
        routing.Candidate(RouteConfig(name=routing.CONFIGURED), configured, embedder),
        routing.Candidate(
            RouteConfig(name="jobs"),
            {"kind": "cohere-batch"},
            registry.build("embedder", {"kind": "cohere-batch"}),
        ),
    ]
    routes = {route.name: route for route in routing.price(report, RunConfig(), candidates, {})}
    assert (routes["jobs"].tier, routes["jobs"].cost_usd, routes["jobs"].same_vectors) == ("batch", 0.1, True)
    assert (routes["[embedder]"].tier, routes["[embedder]"].cost_usd) == ("online", 0.1)


def test_without_the_sdk_the_kind_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cohere", None)  # import fails as if not installed
    monkeypatch.setenv("CO_API_KEY", SECRET)
    with pytest.raises(MissingDependency) as missing:
        registry.build("embedder", {"kind": "cohere-batch"})
    assert missing.value.exit_code == 2 and "reindex-embeddings[cohere]" in str(missing.value.hint)


def test_the_price_table_matches_configs_pricing_toml() -> None:
    table = tomllib.loads((Path(__file__).parents[2] / "configs" / "pricing.toml").read_text())
    assert table["cohere"]["taken"] == PRICES_TAKEN
    assert table["cohere"]["models"] == PRICES


def test_a_job_without_billed_units_is_charged_above_the_estimates(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No public example shows billed_units on an embed job; cl100k estimates may fall below Cohere's count,
    so the budget charges them with a margin, and the embedder names the caveat for plan."""
    from reindex_adapters.cohere.batch import ESTIMATE_MARGIN

    _, client = serve()
    embedder = batcher(client)
    real = embedder._get

    def without_units(job_id: str) -> Any:
        job = real(job_id)
        if job.meta is not None:
            job.meta.billed_units = None
        return job

    monkeypatch.setattr(embedder, "_get", without_units)
    result = run(embedder, "key-no-units", TEXTS)
    assert result.billed_tokens == math.ceil(tokens(TEXTS) * ESTIMATE_MARGIN)
    assert any("billed_units" in caveat for caveat in embedder.price_caveats)


def test_a_fresh_process_polls_from_the_ledger_without_reading_the_input_dataset_back(serve: Serve) -> None:
    """Whether Cohere serves an embed-input dataset's parts back is not documented: a resume needs only the
    items the ledger recalls (`RecallsItems`), and reads the result dataset alone."""
    emulator, client = serve()
    items = jobs(batcher(client), TEXTS)
    job_id = batcher(client).submit("key-fresh", items)
    fresh = batcher(client)
    assert isinstance(fresh, RecallsItems)
    fresh.recall(job_id, [(item.custom_id, item.tokens.count) for item in items])
    result = finish(fresh, job_id)
    assert set(result.vectors) == {item.custom_id for item in items}
    job = last_job(emulator)
    assert set(emulator.stats()["parts_read"]) == {job["output_dataset_id"]}
