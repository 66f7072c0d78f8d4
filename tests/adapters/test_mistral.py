"""The Mistral batch embedder against the local emulator, through the official mistralai SDK: adoption by
key, the faults of a batch job, refusals with Mistral's reason, billing from `usage`, and the errors."""

from __future__ import annotations

import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mistralai.client import Mistral
from mistralai.client.errors import SDKError

from reindex.errors import ConfigError, MissingDependency, TransientError
from reindex.ports import DeferredEmbedder, JobItem, Tokens, Vectors
from reindex.registry import build
from reindex_adapters.mistral import DIM, PRICES, PRICES_TAKEN, MistralBatchEmbedder, read_line
from reindex_adapters.remote.pacing import Pacer
from reindex_adapters.testing.emulators import mistral as mistral_emulator
from reindex_adapters.testing.emulators.faults import FaultPlan
from reindex_adapters.testing.emulators.mistral import MistralEmulator
from reindex_adapters.testing.memory import HashEmbedder
from tests.adapters.support import TEXTS, finish, jobs
from tests.provider.support import mistral_count

SECRET = "mistral-test-0123456789abcdefSECRET"
Serve = Callable[..., tuple[MistralEmulator, Mistral]]


@pytest.fixture(scope="module")
def hasher() -> HashEmbedder:
    return HashEmbedder(dim=DIM)


@pytest.fixture
def serve(hasher: HashEmbedder) -> Iterator[Serve]:
    running: list[MistralEmulator] = []

    def start(**faults: Any) -> tuple[MistralEmulator, Mistral]:
        emulator = MistralEmulator(hasher, FaultPlan(**{"polls_per_step": 0, **faults}))
        emulator.start()
        running.append(emulator)
        return emulator, Mistral(api_key=SECRET, server_url=emulator.server_url, retry_config=None)

    yield start
    for emulator in running:
        emulator.stop()


def batcher(client: Mistral, **options: Any) -> MistralBatchEmbedder:
    options.setdefault("pacer", Pacer(backoff_s=0.02))
    return MistralBatchEmbedder(client, **options)


def tokens(texts: list[str]) -> int:
    """What the emulator bills: mistral-embed's own count (`mistral_count`)."""
    return sum(mistral_count(text) for text in texts)


def expected(hasher: HashEmbedder, texts: list[str]) -> Vectors:
    return hasher.embed(hasher.tokenize(texts))


def test_a_job_returns_the_models_vector_per_custom_id_and_bills_from_usage(
    serve: Serve, hasher: HashEmbedder
) -> None:
    emulator, client = serve(polls_per_step=1)
    embedder = batcher(client)
    assert isinstance(embedder, DeferredEmbedder)
    items = jobs(embedder, TEXTS)
    job_id = embedder.submit("plan-1-abc-0-0", items)
    assert not embedder.poll(job_id).is_terminal  # QUEUED, then RUNNING
    result = finish(embedder, job_id)
    assert result.status == "SUCCESS" and result.failed == {}
    for item, vector in zip(items, expected(hasher, TEXTS), strict=True):
        np.testing.assert_allclose(result.vectors[item.custom_id], vector, rtol=1e-6)
    assert result.billed_tokens == tokens(TEXTS) == sum(item.tokens.count for item in items)
    assert emulator.stats()["billed_tokens_batch"] == result.billed_tokens
    assert emulator.job(job_id)["metadata"] == {"reindex_key": "plan-1-abc-0-0"}


def test_the_same_key_twice_creates_one_job_and_another_process_can_poll_it(serve: Serve) -> None:
    emulator, client = serve()
    items = jobs(batcher(client), TEXTS)
    batcher(client).submit("key-other", items[:2])  # another job: the listing is filtered by the key
    first = batcher(client).submit("key-a", items)
    assert batcher(client).submit("key-a", items) == first  # another process, after a crash
    assert emulator.stats()["batches_created"] == 2
    assert set(finish(batcher(client), first).vectors) == {item.custom_id for item in items}


def test_adoption_reads_every_page_of_the_listing(serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    emulator, client = serve()
    monkeypatch.setattr("reindex_adapters.mistral.PAGE", 2)
    ignored = {*mistral_emulator.LIST_PARAMETERS, "reindex_key"}
    monkeypatch.setattr(mistral_emulator, "LIST_PARAMETERS", ignored)
    items = jobs(batcher(client), TEXTS[:1])  # the emulator now ignores the filter, as a server might
    first = batcher(client).submit("key-old", items)
    for n in range(5):
        batcher(client).submit(f"key-{n}", items)
    assert batcher(client).submit("key-old", items) == first
    assert emulator.stats()["batches_created"] == 6


def test_a_create_that_times_out_adopts_the_job_it_made(serve: Serve) -> None:
    emulator, client = serve(slow_creates=1, create_delay_s=2.0)
    embedder = batcher(client, create_timeout_s=0.3)
    items = jobs(embedder, TEXTS)
    started = time.monotonic()
    job_id = embedder.submit("key-slow", items)  # the client never heard the id: found by its key
    assert time.monotonic() - started < 2.0, "it gave up on the create instead of waiting for its answer"
    assert embedder.submit("key-slow", items) == job_id
    assert emulator.stats()["batches_created"] == 1
    assert len(finish(embedder, job_id).vectors) == len(TEXTS)


def test_a_create_refused_with_a_server_error_is_not_repeated(serve: Serve) -> None:
    emulator, client = serve(server_errors=1, server_errors_on=("batch_create",))
    embedder = batcher(client)
    with pytest.raises(TransientError, match="rerun to retry"):
        embedder.submit("key-5xx", jobs(embedder, TEXTS))
    assert emulator.stats()["batches_created"] == 0  # refused before it was made: nothing to adopt


def test_throttling_is_waited_out_with_the_retry_hint(serve: Serve) -> None:
    routes = ("files", "batch_list", "batch_create", "batch_retrieve")
    emulator, client = serve(rate_limit=4, rate_limit_on=routes, retry_after_s=0.2)
    embedder = batcher(client)
    result = finish(embedder, embedder.submit("key-429", jobs(embedder, TEXTS)))
    assert len(result.vectors) == len(TEXTS)
    stats = emulator.stats()
    assert stats["refused"] == {"429": 4} and stats["early_requests_total"] == 0
    assert stats["batches_created"] == 1


def test_a_timed_out_job_returns_its_done_lines_and_expires_the_rest(serve: Serve) -> None:
    _, client = serve(expire_after=2)
    embedder = batcher(client)
    result = finish(embedder, embedder.submit("key-exp", jobs(embedder, TEXTS)))
    assert result.status == "TIMEOUT_EXCEEDED"
    assert set(result.vectors) == {"doc-0", "doc-1"}
    assert result.failed == {f"doc-{i}": "batch_expired" for i in range(2, len(TEXTS))}
    assert result.billed_tokens == tokens(TEXTS[:2])


def test_a_job_cancelled_on_the_server_keeps_its_done_lines(serve: Serve) -> None:
    _, client = serve(cancel_after=1)
    embedder = batcher(client)
    result = finish(embedder, embedder.submit("key-cancel", jobs(embedder, TEXTS)))
    assert (result.status, set(result.vectors)) == ("CANCELLED", {"doc-0"})
    assert set(result.failed.values()) == {"batch_cancelled"}


def test_shuffled_and_duplicated_lines_join_on_custom_id_and_bill_once(
    serve: Serve, hasher: HashEmbedder
) -> None:
    _, client = serve(shuffle_output=True, duplicate_output_line=True)
    embedder = batcher(client)
    items = jobs(embedder, TEXTS)
    result = finish(embedder, embedder.submit("key-shuffle", items))
    assert result.failed == {} and result.billed_tokens == tokens(TEXTS)
    for item, vector in zip(items, expected(hasher, TEXTS), strict=True):
        np.testing.assert_allclose(result.vectors[item.custom_id], vector, rtol=1e-6)


def test_a_malformed_output_line_fails_only_its_input(serve: Serve) -> None:
    _, client = serve(malformed_output_line=True)
    embedder = batcher(client)
    result = finish(embedder, embedder.submit("key-bad", jobs(embedder, TEXTS)))
    assert len(result.vectors) == len(TEXTS) - 1
    assert list(result.failed.values()) == ["malformed_output"]


def test_a_lost_output_file_fails_its_lines_for_resubmission(serve: Serve) -> None:
    _, client = serve(delete_output=True)
    embedder = batcher(client)
    job_id = embedder.submit("key-gone", jobs(embedder, TEXTS))
    result = finish(embedder, job_id)
    assert result.vectors == {} and set(result.failed.values()) == {"output_deleted"}
    # the job says its lines succeeded (and were billed): the budget is charged their estimated tokens
    assert result.billed_tokens == tokens(TEXTS)
    assert finish(batcher(client), job_id).billed_tokens == tokens(TEXTS)  # estimated from its input file


def test_a_rejected_input_fails_with_mistrals_reason_and_is_not_billed(serve: Serve) -> None:
    _, client = serve(poison_substring="POISON")
    embedder = batcher(client)
    texts = [*TEXTS[:2], "a POISON pill"]
    result = finish(embedder, embedder.submit("key-poison", jobs(embedder, texts)))
    assert result.failed == {"doc-2": "invalid_request_error"}
    assert set(result.vectors) == {"doc-0", "doc-1"} and result.billed_tokens == tokens(texts[:2])


def test_throttled_and_failed_lines_are_named_for_resubmission(serve: Serve) -> None:
    for status, code in ((429, "rate_limit_exceeded"), (503, "server_error")):
        _, client = serve(failed_lines=1, failed_line_status=status)
        embedder = batcher(client)
        result = finish(embedder, embedder.submit(f"key-{status}", jobs(embedder, TEXTS[:2])))
        assert result.failed == {"doc-0": code} and set(result.vectors) == {"doc-1"}


def test_a_job_that_fails_validation_fails_every_line_for_resubmission(serve: Serve) -> None:
    _, client = serve(fail_validation=True)
    embedder = batcher(client)
    items = jobs(embedder, TEXTS)
    result = finish(embedder, embedder.submit("key-invalid", items))
    assert result.status == "FAILED"
    assert result.failed == {item.custom_id: "batch_failed" for item in items}


def test_release_deletes_every_file_of_the_job_and_twice_is_fine(serve: Serve) -> None:
    emulator, client = serve(poison_substring="POISON")
    embedder = batcher(client)
    job_id = embedder.submit("key-release", jobs(embedder, [*TEXTS, "POISON"]))
    finish(embedder, job_id)
    job = emulator.job(job_id)
    files = [*job["input_files"], job["output_file"], job["error_file"]]
    assert all(files)
    embedder.release(job_id)
    embedder.release(job_id)
    for file_id in files:
        with pytest.raises(SDKError, match="404"):
            client.files.download(file_id=file_id)


def test_envelopes_of_either_error_kind_name_the_reason() -> None:
    refusal = {
        "object": "error",
        "message": "bad",
        "type": "invalid_request_file",
        "param": None,
        "code": "3310",
    }
    assert read_line({"custom_id": "a", "response": {"status_code": 400, "body": refusal}}, 1, DIM) == (
        "invalid_request_file:3310"
    )
    assert read_line({"custom_id": "a", "response": None, "error": {"message": "x"}}, 1, DIM) == "batch_error"
    assert read_line({"custom_id": "a", "response": None, "error": "lost"}, 1, DIM) == "batch_error"
    assert read_line({"custom_id": "a", "response": {"status_code": 200, "body": {}}}, 1, DIM) == (
        "malformed_output"
    )


def test_refused_key_and_unknown_server_are_config_errors_without_the_key(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, client = serve(unauthorized=1)
    embedder = batcher(client)
    with pytest.raises(ConfigError, match="refused the API key") as refused:
        embedder.submit("key-401", jobs(embedder, TEXTS[:1]))
    assert SECRET not in str(refused.value)
    monkeypatch.setenv("REINDEX_TEST_MISTRAL_KEY", SECRET)
    section = {
        "kind": "mistral-batch",
        "server_url": "http://127.0.0.1:9",
        "api_key_env": "REINDEX_TEST_MISTRAL_KEY",
    }
    unreachable = build("embedder", {**section, "max_attempts": 1})
    with pytest.raises(TransientError) as busy:
        unreachable.submit("key-x", jobs(unreachable, TEXTS[:1]))
    assert SECRET not in str(busy.value)


def test_the_config_names_the_model_and_the_key_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MISTRAL_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="MISTRAL_API_KEY"):
        build("embedder", {"kind": "mistral-batch"})
    with pytest.raises(ConfigError, match="model"):
        build("embedder", {"kind": "mistral-batch", "model": "codestral-embed"})
    monkeypatch.setenv("MISTRAL_API_KEY", SECRET)
    embedder = build("embedder", {"kind": "mistral-batch"})
    assert (embedder.info.kind, embedder.info.model, embedder.info.dim) == (
        "mistral-batch",
        "mistral-embed",
        1024,
    )
    assert (
        embedder.traits.prices == {"online": 0.10, "batch": 0.05}
        and embedder.traits.price_per_million == 0.05
    )


def test_without_the_sdk_the_kind_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mistralai.client", None)  # import fails as if not installed
    monkeypatch.setenv("MISTRAL_API_KEY", SECRET)
    with pytest.raises(MissingDependency) as missing:
        build("embedder", {"kind": "mistral-batch"})
    assert missing.value.exit_code == 2 and "reindex-embeddings[mistral]" in str(missing.value.hint)


def test_the_price_table_matches_configs_pricing_toml() -> None:
    table = tomllib.loads((Path(__file__).parents[2] / "configs" / "pricing.toml").read_text())
    assert table["mistral"]["taken"] == PRICES_TAKEN
    assert table["mistral"]["models"] == PRICES


def test_a_fresh_process_polls_from_the_ledger_without_reading_the_input_file_back(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume needs only the ledger's items (`recall`), not a read of the job's input file."""
    _, client = serve()
    items = jobs(batcher(client), TEXTS)
    job_id = batcher(client).submit("key-fresh", items)
    other = batcher(client)
    other.recall(job_id, [(item.custom_id, item.tokens.count) for item in items])
    read: list[object] = []
    original = other._download

    def download(file_id: Any) -> Any:
        read.append(file_id)
        return original(file_id)

    monkeypatch.setattr(other, "_download", download)
    result = finish(other, job_id)
    assert set(result.vectors) == {item.custom_id for item in items}
    inputs = set(client.batch.jobs.get(job_id=job_id).input_files)
    assert not inputs & set(read)  # the output and error files only


# mistral-embed's own tokenizer (issue 42, item 6) --------------------------------------------------------

PROSE = "The committee reviewed the quarterly figures, and the numbers, once again, told a careful story. "


def test_a_long_text_is_cut_to_mistral_embeds_own_limit_and_embedded_not_refused(serve: Serve) -> None:
    """Cut at 8,000 cl100k tokens, English prose is about 9,300 of mistral-embed's, which the API refuses:
    the cut is made in mistral-embed's own tokenizer, so a long document is embedded truncated."""
    _, client = serve()
    embedder = batcher(client)
    long = PROSE * 600  # about 11,000 cl100k tokens
    (item,) = jobs(embedder, [long])
    assert item.tokens.is_truncated and item.tokens.count <= 8190
    assert mistral_count(str(item.tokens.data)) == item.tokens.count
    result = finish(embedder, embedder.submit("key-long", [item]))
    assert result.failed == {} and set(result.vectors) == {"doc-0"}
    assert result.billed_tokens == item.tokens.count


def test_counts_are_exact_in_mistral_embeds_tokenizer_and_say_so(serve: Serve) -> None:
    _, client = serve()
    embedder = batcher(client)
    assert [t.count for t in embedder.tokenize(TEXTS)] == [mistral_count(text) for text in TEXTS]
    assert embedder.token_counts.exact and "mistral-embed" in embedder.token_counts.basis


def test_the_emulator_refuses_a_text_over_the_limit_as_the_api_does(serve: Serve) -> None:
    _, client = serve()
    embedder = batcher(client)
    over = PROSE * 600
    item = JobItem("doc-0", Tokens(9999, 9999, over))  # sent whole, as a cl100k cut would
    result = finish(embedder, embedder.submit("key-over", [item]))
    assert result.failed == {"doc-0": "invalid_request_error"} and result.billed_tokens == 0
