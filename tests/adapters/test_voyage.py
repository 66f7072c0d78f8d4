"""The Voyage embedders against the local emulator: `voyage-batch` through httpx (adoption by key, every fault of
a batch, refusals with Voyage's reason, billing from `usage`), `voyage` through the official voyageai SDK
(pacing, isolation of a refused input), token counts exact or estimated, and the configuration errors."""

from __future__ import annotations

import math
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reindex.errors import BackendError, ConfigError, MissingDependency, TransientError
from reindex.ports import DeferredEmbedder, TokenCounts, Vectors
from reindex.registry import build
from reindex_adapters.remote.tokens import cl100k
from reindex_adapters.testing.emulators.faults import FaultPlan
from reindex_adapters.testing.emulators.voyage import PROMPTS, REFUSED, VoyageEmulator
from reindex_adapters.testing.memory import HashEmbedder
from reindex_adapters.voyage import PRICES, PRICES_TAKEN, VoyageBatchEmbedder, VoyageEmbedder
from reindex_adapters.voyage.lines import read_line
from tests.adapters.support import TEXTS, finish, jobs, tokens

SECRET = "pa-voyage-test-0123456789abcdefSECRET"
KEY_ENV = "REINDEX_TEST_VOYAGE_KEY"
DIM = 256  # output_dimension: small vectors keep the files small
Serve = Callable[..., VoyageEmulator]


@pytest.fixture(scope="module")
def hasher() -> HashEmbedder:
    return HashEmbedder(dim=DIM)


@pytest.fixture
def serve(hasher: HashEmbedder, monkeypatch: pytest.MonkeyPatch) -> Iterator[Serve]:
    monkeypatch.setenv(KEY_ENV, SECRET)
    running: list[VoyageEmulator] = []

    def start(*, tokenizer: Any = None, **faults: Any) -> VoyageEmulator:
        emulator = VoyageEmulator(hasher, FaultPlan(**{"polls_per_step": 0, **faults}), tokenizer=tokenizer)
        emulator.start()
        running.append(emulator)
        return emulator

    yield start
    for emulator in running:
        emulator.stop()


def section(emulator: VoyageEmulator, kind: str = "voyage-batch", **options: Any) -> dict[str, Any]:
    return {
        "kind": kind,
        "base_url": emulator.base_url,
        "api_key_env": KEY_ENV,
        "output_dimension": DIM,
        "backoff_s": 0.02,
        **options,
    }


def batcher(emulator: VoyageEmulator, **options: Any) -> VoyageBatchEmbedder:
    embedder: VoyageBatchEmbedder = build("embedder", section(emulator, **options))
    return embedder


def online(emulator: VoyageEmulator, **options: Any) -> VoyageEmbedder:
    embedder: VoyageEmbedder = build("embedder", section(emulator, "voyage", **options))
    return embedder


def expected(hasher: HashEmbedder, texts: list[str], input_type: str = "document") -> Vectors:
    """The model's vectors of the texts behind Voyage's prompt for `input_type`."""
    return hasher.embed(hasher.tokenize([PROMPTS[input_type] + text for text in texts]))


def test_a_batch_returns_the_models_vector_per_custom_id_and_bills_from_usage(
    serve: Serve, hasher: HashEmbedder
) -> None:
    emulator = serve(polls_per_step=1)
    embedder = batcher(emulator)
    assert isinstance(embedder, DeferredEmbedder)
    items = jobs(embedder, TEXTS)
    job_id = embedder.submit("plan-1-abc-0-0", items)
    assert not embedder.poll(job_id).is_terminal  # validating, then in_progress, then finalizing
    result = finish(embedder, job_id)
    assert result.status == "completed" and result.failed == {}
    for item, vector in zip(items, expected(hasher, TEXTS), strict=True):
        np.testing.assert_allclose(result.vectors[item.custom_id], vector, rtol=1e-6)
    assert result.billed_tokens == tokens(TEXTS) == emulator.stats()["billed_tokens_batch"]
    # no Voyage tokenizer here: the estimate is the cl100k count x 1.2, rounded up, never below the bill
    assert not embedder.token_counts.exact and embedder.token_counts.basis.startswith("estimate")
    estimated = [math.ceil(len(cl100k().encode_ordinary(text)) * 1.2) for text in TEXTS]
    assert [item.tokens.count for item in items] == estimated and sum(estimated) >= result.billed_tokens
    batch = emulator.batch(job_id)
    assert batch["metadata"] == {"reindex_key": "plan-1-abc-0-0"} and batch["completion_window"] == "12h"
    assert batch["request_params"] == {
        "model": "voyage-3.5",
        "input_type": "document",
        "output_dimension": DIM,
    }


def test_the_same_key_twice_creates_one_batch_and_another_process_can_poll_it(serve: Serve) -> None:
    emulator = serve()
    items = jobs(batcher(emulator), TEXTS)
    batcher(emulator).submit("key-other", items[:2])
    first = batcher(emulator).submit("key-a", items)
    assert batcher(emulator).submit("key-a", items) == first  # another process, after a crash
    assert emulator.stats()["batches_created"] == 2
    result = finish(batcher(emulator), first)  # its lines and estimates read back from the input file
    assert set(result.vectors) == {item.custom_id for item in items}


def test_adoption_reads_every_page_of_the_listing(serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    emulator = serve()
    monkeypatch.setattr("reindex_adapters.voyage.batch.PAGE", 2)
    items = jobs(batcher(emulator), TEXTS[:1])
    first = batcher(emulator).submit("key-old", items)
    for n in range(5):
        batcher(emulator).submit(f"key-{n}", items)
    assert batcher(emulator).submit("key-old", items) == first  # on the third page, newest first
    assert emulator.stats()["batches_created"] == 6


def test_a_create_that_times_out_adopts_the_batch_it_made(serve: Serve) -> None:
    emulator = serve(slow_creates=1, create_delay_s=2.0)
    embedder = batcher(emulator, create_timeout_s=0.3)
    items = jobs(embedder, TEXTS)
    started = time.monotonic()
    job_id = embedder.submit("key-slow", items)  # the client never heard the id: found by its key
    assert time.monotonic() - started < 2.0, "it gave up on the create instead of waiting for its answer"
    assert embedder.submit("key-slow", items) == job_id
    assert emulator.stats()["batches_created"] == 1
    assert len(finish(embedder, job_id).vectors) == len(TEXTS)


def test_a_create_refused_with_a_server_error_is_not_repeated(serve: Serve) -> None:
    emulator = serve(server_errors=1, server_errors_on=("batch_create",))
    embedder = batcher(emulator)
    with pytest.raises(TransientError, match="rerun to retry"):
        embedder.submit("key-5xx", jobs(embedder, TEXTS))
    assert emulator.stats()["batches_created"] == 0  # refused before it was made: nothing to adopt


def test_throttling_is_waited_out_with_the_retry_hint_creates_included(serve: Serve) -> None:
    """A 429 refuses a create before anything is made, so the create is sent again after Retry-After."""
    routes = ("files", "batch_list", "batch_create", "batch_retrieve")
    emulator = serve(rate_limit=2, rate_limit_on=routes, retry_after_s=0.2)
    embedder = batcher(emulator)
    items = jobs(embedder, TEXTS)
    embedder.submit("key-first", items[:1])  # the two 429s fall on the listing
    emulator.set_faults(
        FaultPlan(polls_per_step=0, rate_limit=2, rate_limit_on=("batch_create",), retry_after_s=0.2)
    )
    result = finish(embedder, embedder.submit("key-429", items))
    assert len(result.vectors) == len(TEXTS)
    stats = emulator.stats()
    assert stats["refused"] == {"429": 4} and stats["early_requests_total"] == 0
    assert stats["batches_created"] == 2


def test_an_expired_batch_returns_its_done_lines_and_names_the_rest_for_resubmission(serve: Serve) -> None:
    embedder = batcher(serve(expire_after=2))
    result = finish(embedder, embedder.submit("key-exp", jobs(embedder, TEXTS)))
    assert set(result.vectors) == {"doc-0", "doc-1"}
    assert result.failed == {f"doc-{i}": "batch_expired" for i in range(2, len(TEXTS))}
    assert result.billed_tokens == tokens(TEXTS[:2])


def test_a_batch_cancelled_on_the_server_keeps_its_done_lines(serve: Serve) -> None:
    embedder = batcher(serve(cancel_after=1))
    result = finish(embedder, embedder.submit("key-cancel", jobs(embedder, TEXTS)))
    assert (result.status, set(result.vectors)) == ("cancelled", {"doc-0"})
    assert set(result.failed.values()) == {"batch_cancelled"}


def test_shuffled_duplicated_and_malformed_lines_join_on_custom_id_and_bill_once(
    serve: Serve, hasher: HashEmbedder
) -> None:
    embedder = batcher(serve(shuffle_output=True, duplicate_output_line=True))
    items = jobs(embedder, TEXTS)
    result = finish(embedder, embedder.submit("key-shuffle", items))
    assert result.failed == {} and result.billed_tokens == tokens(TEXTS)
    for item, vector in zip(items, expected(hasher, TEXTS), strict=True):
        np.testing.assert_allclose(result.vectors[item.custom_id], vector, rtol=1e-6)
    embedder = batcher(serve(malformed_output_line=True))
    result = finish(embedder, embedder.submit("key-bad", jobs(embedder, TEXTS)))
    assert len(result.vectors) == len(TEXTS) - 1 and list(result.failed.values()) == ["malformed_output"]


def test_a_lost_output_file_fails_its_lines_and_charges_their_estimates(serve: Serve) -> None:
    emulator = serve(delete_output=True)
    embedder = batcher(emulator)
    items = jobs(embedder, TEXTS)
    job_id = embedder.submit("key-gone", items)
    result = finish(embedder, job_id)
    assert result.vectors == {} and set(result.failed.values()) == {"output_deleted"}
    # billed, but the usage went with the file: the budget is charged the estimates (on the high side)
    assert result.billed_tokens == sum(item.tokens.count for item in items) >= tokens(TEXTS)
    assert finish(batcher(emulator), job_id).billed_tokens == result.billed_tokens  # from its input file


def test_a_refused_input_fails_with_voyages_reason_and_is_not_billed(serve: Serve) -> None:
    embedder = batcher(serve(poison_substring="POISON"))
    texts = [*TEXTS[:2], "a POISON pill"]
    result = finish(embedder, embedder.submit("key-poison", jobs(embedder, texts)))
    assert result.failed == {"doc-2": f"invalid_request: {REFUSED}"}
    assert set(result.vectors) == {"doc-0", "doc-1"} and result.billed_tokens == tokens(texts[:2])


def test_throttled_and_failed_lines_are_named_for_resubmission(serve: Serve) -> None:
    for status, code in ((429, "rate_limit_exceeded"), (503, "server_error")):
        embedder = batcher(serve(failed_lines=1, failed_line_status=status))
        result = finish(embedder, embedder.submit(f"key-{status}", jobs(embedder, TEXTS[:2])))
        assert result.failed == {"doc-0": code} and set(result.vectors) == {"doc-1"}


def test_a_batch_that_fails_validation_fails_every_line_for_resubmission(serve: Serve) -> None:
    embedder = batcher(serve(fail_validation=True))
    items = jobs(embedder, TEXTS)
    result = finish(embedder, embedder.submit("key-invalid", items))
    assert result.status == "failed"
    assert result.failed == {item.custom_id: "batch_failed:invalid_request" for item in items}


def test_release_deletes_every_file_of_the_batch_and_twice_is_fine(serve: Serve) -> None:
    import httpx

    emulator = serve(poison_substring="POISON")
    embedder = batcher(emulator)
    job_id = embedder.submit("key-release", jobs(embedder, [*TEXTS, "POISON"]))
    finish(embedder, job_id)
    batch = emulator.batch(job_id)
    files = [batch["input_file_id"], batch["output_file_id"], batch["error_file_id"]]
    assert all(files)
    embedder.release(job_id)
    embedder.release(job_id)
    headers = {"Authorization": f"Bearer {SECRET}"}
    for file_id in files:
        assert httpx.get(f"{emulator.base_url}/files/{file_id}/content", headers=headers).status_code == 404


def test_stragglers_go_online_with_the_same_vectors(serve: Serve, hasher: HashEmbedder) -> None:
    emulator = serve()
    embedder = batcher(emulator, stragglers_online=True)
    assert embedder.traits.stragglers_online
    result = embedder.embed_stragglers(jobs(embedder, TEXTS[:3]))
    for i, vector in enumerate(expected(hasher, TEXTS[:3])):
        np.testing.assert_allclose(result.vectors[f"doc-{i}"], vector, rtol=1e-6)
    stats = emulator.stats()
    assert result.billed_tokens == tokens(TEXTS[:3]) == stats["billed_tokens_online"]
    assert stats["batches_created"] == 0


def test_envelopes_of_either_error_kind_name_the_reason() -> None:
    line: dict[str, Any] = {"custom_id": "a", "response": {"status_code": 400, "message": "Too long."}}
    assert read_line(line, 1, DIM) == "invalid_request: Too long."
    line = {"custom_id": "a", "response": {"status_code": 422, "body": {"detail": "bad input"}}}
    assert read_line(line, 1, DIM) == "malformed_request: bad input"
    assert (
        read_line({"custom_id": "a", "response": {"status_code": 500, "message": "x"}}, 1, DIM)
        == "server_error"
    )
    line = {"custom_id": "a", "response": None, "error": {"code": "batch_expired", "message": "late"}}
    assert read_line(line, 1, DIM) == "batch_expired"
    assert read_line({"custom_id": "a", "response": None, "error": "lost"}, 1, DIM) == "batch_error"
    assert (
        read_line({"custom_id": "a", "response": {"status_code": 200, "body": {}}}, 1, DIM)
        == "malformed_output"
    )


# the online kind -----------------------------------------------------------------------------------------


def test_online_requests_are_cut_sent_concurrently_and_a_refused_input_is_isolated(
    serve: Serve, hasher: HashEmbedder
) -> None:
    emulator = serve(poison_substring="POISON", rate_limit=2, retry_after_s=0.2)
    embedder = online(emulator, concurrency=3, max_inputs_per_request=4)
    texts = [f"text number {i}" for i in range(15)] + ["a POISON pill"]
    vectors = embedder.embed(embedder.tokenize(texts))
    assert embedder.last_rejections() == {15: f"provider_rejected:invalid_request: {REFUSED}"}
    assert np.isnan(vectors[15]).all()
    np.testing.assert_allclose(vectors[:15], expected(hasher, texts[:15]), rtol=1e-6)
    stats = emulator.stats()
    assert embedder.billed_tokens == tokens(texts[:15]) == stats["billed_tokens_online"]
    assert stats["refused"] == {"429": 2} and stats["early_requests_total"] == 0
    assert embedder.traffic.rate_limited == 2
    assert stats["requests"]["embeddings"] > 4  # four requests, the refused one halved until alone


def test_int8_vectors_and_query_prompts_reach_the_request(serve: Serve, hasher: HashEmbedder) -> None:
    embedder = online(serve(), output_dtype="int8", input_type="query")
    vectors = embedder.embed(embedder.tokenize(TEXTS[:2]))
    want = np.clip(np.rint(expected(hasher, TEXTS[:2], "query") * 127), -128, 127)
    np.testing.assert_array_equal(vectors, want)
    # another dtype and prompt: other vectors, another fingerprint
    assert embedder.info.fingerprint != online(serve()).info.fingerprint
    raw = online(serve(), input_type="none")  # no input_type sent: no prompt before the text
    np.testing.assert_allclose(
        raw.embed(raw.tokenize(TEXTS[:1]))[0], hasher.embed(hasher.tokenize(TEXTS[:1]))[0]
    )


def test_an_exact_tokenizer_counts_what_voyage_bills(serve: Serve, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted({word for text in TEXTS for word in text.split()})
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}, "[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    emulator = serve(tokenizer=Tokenizer.from_file(str(tmp_path / "tokenizer.json")))
    embedder = batcher(emulator, tokenizer_path=str(tmp_path))
    assert embedder.token_counts == TokenCounts(True, f"exact: {tmp_path / 'tokenizer.json'}")
    items = jobs(embedder, TEXTS)
    result = finish(embedder, embedder.submit("key-exact", items))
    assert result.billed_tokens == sum(item.tokens.count for item in items) != tokens(TEXTS)
    assert embedder.info.fingerprint == batcher(emulator).info.fingerprint  # counting is not identity


# errors and configuration --------------------------------------------------------------------------------


def test_a_refused_key_and_an_unreachable_server_never_show_the_key(serve: Serve) -> None:
    embedder = batcher(serve(unauthorized=1))
    with pytest.raises(ConfigError, match="refused the API key") as refused:
        embedder.submit("key-401", jobs(embedder, TEXTS[:1]))
    assert SECRET not in str(refused.value) and KEY_ENV in str(refused.value.hint)
    section = {
        "kind": "voyage-batch",
        "base_url": "http://127.0.0.1:9/v1",
        "api_key_env": KEY_ENV,
        "max_attempts": 1,
    }
    unreachable = build("embedder", section)
    with pytest.raises(TransientError) as busy:
        unreachable.submit("key-x", jobs(unreachable, TEXTS[:1]))
    assert SECRET not in str(busy.value)
    with pytest.raises(TransientError) as busy:
        build("embedder", {**section, "kind": "voyage"}).embed(unreachable.tokenize(TEXTS[:1]))
    assert SECRET not in str(busy.value)


def test_a_request_voyage_refuses_for_its_parameters_is_a_config_error(serve: Serve) -> None:
    embedder = online(serve(), model="voyage-9-preview", dim=DIM, output_dimension=None)
    with pytest.raises(ConfigError, match=r"refused the request.*Model") as refused:
        embedder.embed(embedder.tokenize(TEXTS[:2]))
    assert refused.value.exit_code == 2


def test_the_config_names_the_key_variable_and_refuses_what_voyage_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VOYAGE_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="VOYAGE_API_KEY"):
        build("embedder", {"kind": "voyage-batch"})
    monkeypatch.setenv("VOYAGE_API_KEY", SECRET)
    embedder = build("embedder", {"kind": "voyage-batch"})
    assert (embedder.info.model, embedder.info.dim, embedder.info.max_tokens) == ("voyage-3.5", 1024, 32_000)
    assert (
        embedder.traits.prices == {"online": 0.06, "batch": 0.0402}
        and embedder.traits.price_per_million == 0.0402
    )
    assert embedder.traits.completion_window_hours == 12.0
    assert embedder.info.fingerprint == build("embedder", {"kind": "voyage"}).info.fingerprint
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"model": "voyage-law-2"}, "Batch API does not serve"),
        ({"model": "voyage-code-2", "output_dimension": 512}, "one output size"),
        ({"output_dimension": 300}, "not one voyage-3.5 offers"),
        ({"model": "voyage-9-preview"}, "set dim"),
        ({"output_dtype": "binary"}, "output_dtype"),
        ({"tokenizer_path": "/nonexistent"}, "tokenizer.json"),
    ]
    for options, message in refusals:
        with pytest.raises(ConfigError, match=message) as refused:
            build("embedder", {"kind": "voyage-batch", **options})
        assert refused.value.exit_code == 2
    assert build("embedder", {"kind": "voyage", "model": "voyage-9-preview", "dim": 512}).traits.prices == {
        "online": None,
        "batch": None,
    }


def test_without_the_sdk_the_online_kind_names_its_extra(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    embedder = online(serve())
    monkeypatch.setitem(sys.modules, "voyageai.client", None)  # import fails as if not installed
    with pytest.raises(MissingDependency) as missing:
        embedder.embed(embedder.tokenize(TEXTS[:1]))
    assert missing.value.exit_code == 2 and "reindex-embeddings[voyage]" in str(missing.value.hint)


def test_cost_routing_prices_both_kinds_and_times_the_batch_by_its_12_hour_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from reindex.config import RouteConfig, RunConfig
    from reindex.plan import routing
    from reindex.plan.estimate import PlanReport

    monkeypatch.setenv("VOYAGE_API_KEY", SECRET)
    online_section = {"kind": "voyage", "tokens_per_minute": 1_000_000}
    batch_section = {"kind": "voyage-batch"}
    configured = build("embedder", online_section)
    info = configured.info
    report = PlanReport(
        documents=1_000_000,
        unique_texts=900_000,
        tokens=100_000_000,
        fingerprint=info.fingerprint,
        model=info.describe(),
    )
    candidates = [
        routing.Candidate(RouteConfig(name=routing.CONFIGURED), online_section, configured),
        routing.Candidate(RouteConfig(name="batch"), batch_section, build("embedder", batch_section)),
    ]
    routes = {route.name: route for route in routing.price(report, RunConfig(deadline="13h"), candidates, {})}
    online_route, batch_route = routes[routing.CONFIGURED], routes["batch"]
    assert (online_route.tier, online_route.cost_usd) == ("online", 6.0)  # 100M tokens at $0.06
    assert (batch_route.tier, batch_route.cost_usd, batch_route.duration_seconds) == (
        "batch",
        4.02,
        12 * 3600,
    )
    assert batch_route.same_vectors and batch_route.fits
    assert routing.choose(list(routes.values()), RunConfig(deadline="13h"))["name"] == "batch"


def test_the_price_table_matches_configs_pricing_toml() -> None:
    table = tomllib.loads((Path(__file__).parents[2] / "configs" / "pricing.toml").read_text())
    assert table["voyage"]["taken"] == PRICES_TAKEN
    assert table["voyage"]["models"] == PRICES
    for prices in PRICES.values():
        assert prices["batch"] == pytest.approx(prices["online"] * 0.67)  # Voyage's 33% batch discount


def test_the_voyage_emulator_runs_as_a_module() -> None:
    import httpx

    from tests.adapters.test_emulator_modules import serve as serve_module

    process, url = serve_module("voyage", "--dim", "8")
    try:
        listing = httpx.get(f"{url}/batches", headers={"Authorization": "Bearer test"}).json()
        assert url.endswith("/v1") and listing["data"] == [] and listing["has_more"] is False
    finally:
        process.terminate()
        process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()


# Real Voyage 400 bodies, as public clients quote them (github.com/ramakay/claude-self-reflect/issues/38,
# 2025-08): every message starts "Request to model '<model>' failed." (../docs/providers/voyage.md)
TOKEN_CAP = (
    "Request to model 'voyage-4-large' failed. The max allowed tokens per submitted batch is 120000. Your batch"
    " has 126899 tokens after truncation. Please lower the number of tokens in the batch."
)


def test_real_voyage_400s_about_the_inputs_are_refusals_not_configuration_errors() -> None:
    """A 400 for the request's size or an input is split and isolated, never the end of the run (exit 2)."""
    from reindex_adapters.remote.errors import ProviderRejected
    from reindex_adapters.voyage.client import status_error

    refused = status_error(400, TOKEN_CAP, {}, SECRET, KEY_ENV, is_input=True)
    assert isinstance(refused, ProviderRejected) and "max allowed tokens" in refused.code
    tagged = status_error(
        400, TOKEN_CAP, {}, SECRET, KEY_ENV, is_input=True, error_code="TOO_MANY_TOKENS_IN_BATCH"
    )
    assert isinstance(tagged, ProviderRejected)
    poisoned = "Request to model 'voyage-3.5' failed. The input could not be processed."
    assert isinstance(status_error(400, poisoned, {}, SECRET, KEY_ENV, is_input=True), ProviderRejected)


def test_real_voyage_400s_about_a_parameter_stay_configuration_errors() -> None:
    from reindex_adapters.voyage.client import status_error

    for detail in (
        "Request to model 'voyage-3.5' failed. Value 'passage' supplied for argument 'input_type' is not valid.",
        "Model voyage-9 is not supported. Supported models are ['voyage-3.5', 'voyage-4-large'].",
        "Request to model 'voyage-3.5-lite' failed. output_dimension 4096 is not supported by this model.",
    ):
        assert isinstance(status_error(400, detail, {}, SECRET, KEY_ENV, is_input=True), ConfigError), detail


def test_an_online_request_over_voyages_token_cap_is_split_not_fatal(serve: Serve) -> None:
    """The emulator answers an over-cap request with Voyage's own words and error_code; the embedder halves
    the request instead of ending the run."""
    embedder = online(serve(), model="voyage-3.5", dim=DIM)
    embedder._max_tokens = 10**7  # an estimate below Voyage's own count (cl100k x 1.2 is an average)
    texts = [f"{i} " + "word " * 30_000 for i in range(12)]  # about 360k tokens: over voyage-3.5's 320k
    vectors = embedder.embed(embedder.tokenize(texts))
    assert embedder.last_rejections() == {} and np.isfinite(vectors).all() and vectors.shape == (12, DIM)


def test_a_status_reindex_does_not_know_is_waited_on_never_read_as_finished(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Voyage's own Batch examples carry `partial_finalizing_at`: a batch in such a status has no files yet.
    Read as finished, every line went out again while the old batch still billed."""
    emulator = serve()
    embedder = batcher(emulator)
    job_id = embedder.submit("key-partial", jobs(embedder, TEXTS))
    real = embedder._api.batch
    now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    monkeypatch.setattr(
        embedder._api, "batch", lambda i: {**real(i), "status": "partial_finalizing", "created_at": now}
    )
    assert not embedder.poll(job_id).is_terminal
    old = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - 15 * 3600))
    monkeypatch.setattr(
        embedder._api, "batch", lambda i: {**real(i), "status": "partial_finalizing", "created_at": old}
    )
    with pytest.raises(BackendError, match="partial_finalizing"):
        embedder.poll(job_id)
    monkeypatch.undo()
    assert finish(embedder, job_id).is_terminal


@pytest.mark.parametrize(
    "errors",
    [None, {"data": [{"code": "invalid_file"}]}, [{"code": "invalid_file"}], "the file is not JSONL", {}],
    ids=["null", "openai-shape", "list", "string", "empty"],
)
def test_a_failed_batch_reads_its_errors_whatever_their_shape(
    serve: Serve, monkeypatch: pytest.MonkeyPatch, errors: Any
) -> None:
    emulator = serve()
    embedder = batcher(emulator)
    job_id = embedder.submit("key-failed-" + str(type(errors).__name__), jobs(embedder, TEXTS))
    real = embedder._api.batch
    monkeypatch.setattr(embedder._api, "batch", lambda i: {**real(i), "status": "failed", "errors": errors})
    result = embedder.poll(job_id)
    assert result.is_terminal and len(result.failed) == len(TEXTS)
    assert set(result.failed.values()) <= {"batch_failed:invalid_file", "batch_failed:unknown"}


def test_a_fresh_process_polls_from_the_ledger_without_reading_the_input_file_back(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether Voyage serves a `purpose=batch` input file back is not confirmed: a resume needs only the
    ledger's items (`recall`)."""
    emulator = serve()
    items = jobs(batcher(emulator), TEXTS)
    job_id = batcher(emulator).submit("key-fresh", items)
    other = batcher(emulator)
    other.recall(job_id, [(item.custom_id, item.tokens.count) for item in items])
    read: list[object] = []
    original = other._download

    def download(file_id: Any) -> Any:
        read.append(file_id)
        return original(file_id)

    monkeypatch.setattr(other, "_download", download)
    result = finish(other, job_id)
    assert set(result.vectors) == {item.custom_id for item in items}
    batch = other._api.batch(job_id)
    assert batch["input_file_id"] not in read  # the output and error files only


def test_a_create_that_cannot_see_the_file_just_uploaded_is_sent_again_not_a_config_error(
    serve: Serve,
) -> None:
    """A public report shows Voyage answering 404 "Input file not found" to a create right after the upload;
    nothing was created, so it is waited out and sent again, as a 429 is (it ended the run with exit 2)."""
    emulator = serve(unseen_files=2)
    embedder = batcher(emulator)
    job_id = embedder.submit("key-unseen", jobs(embedder, TEXTS))
    assert emulator.stats()["batches_created"] == 1
    assert len(finish(embedder, job_id).vectors) == len(TEXTS)
