"""The model is fed one batch ahead and read one call behind, and gives the same vectors as plain calls."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from reindex.batching import token_batches
from reindex.columns import TokenColumns, tokenize
from reindex.errors import TransientError
from reindex.ports import Vectors
from reindex.run.feeding import Feeder
from reindex_adapters.testing.memory import HashEmbedder


class Handle:
    def __init__(self, log: list[str], name: str, vectors: Vectors) -> None:
        self.log, self.name, self.vectors = log, name, vectors

    def result(self) -> Vectors:
        self.log.append(f"result {self.name}")
        return self.vectors


class AsyncHash(HashEmbedder):
    """The hash embedder behind the prepare/launch protocol a GPU embedder offers."""

    def __init__(self) -> None:
        super().__init__(dim=8)
        self.log: list[str] = []

    def prepare_columns(self, tokens: TokenColumns) -> Any:
        self.log.append(f"prepare {len(tokens)}")
        return tokens

    def embed_prepared(self, prepared: TokenColumns) -> Handle:
        self.log.append(f"launch {len(prepared)}")
        return Handle(self.log, str(len(prepared)), super().embed(list(prepared)))


def direct(tokens: TokenColumns, embedder: HashEmbedder) -> Vectors:
    return embedder.embed(list(tokens))


def test_pipelined_feeding_gives_the_plain_vectors_in_batch_order() -> None:
    embedder = AsyncHash()
    texts = [" ".join(["w"] * (i % 13 + 1)) + f" {i}" for i in range(200)]
    tokens = tokenize(embedder, texts)
    batches = token_batches(tokens.counts, 64, 16)
    seen = list(Feeder(embedder, lambda f, *a: f(*a)).calls(tokens, batches, lambda: False))
    assert [b.tolist() for b, _, _ in seen] == [b.tolist() for b in batches]
    for batch, vectors, refused in seen:
        assert refused == {}
        np.testing.assert_array_equal(vectors, direct(tokens.take(batch), HashEmbedder(dim=8)))
    first_result = embedder.log.index(next(e for e in embedder.log if e.startswith("result")))
    assert embedder.log[:first_result].count("launch " + str(len(batches[0]))) >= 1
    assert sum(e.startswith("launch") for e in embedder.log[:first_result]) == 2  # the next launched first


def test_a_stop_ends_the_calls_early() -> None:
    embedder = AsyncHash()
    tokens = tokenize(embedder, [f"text {i}" for i in range(100)])
    batches = token_batches(tokens.counts, 8, 4)
    calls = 0

    def stopped() -> bool:
        return calls >= 3

    for _ in Feeder(embedder, lambda f, *a: f(*a)).calls(tokens, batches, stopped):
        calls += 1
    assert 0 < calls < len(batches)


class FailingOnce(Handle):
    """A remote call that ran out of attempts the first time its input was awaited (TransientError)."""

    failed: ClassVar[set[str]] = set()

    def result(self) -> Vectors:
        if self.name not in FailingOnce.failed:
            FailingOnce.failed.add(self.name)
            raise TransientError(f"gave up on call {self.name}")
        return super().result()

    def rejections(self) -> dict[int, str]:
        return {0: "provider_rejected:invalid_request"}

    # the rest of a remote call's handle (`capabilities.PendingRequests`)
    def done(self) -> bool:
        return True

    def cancel(self) -> None:
        pass

    def billed_tokens(self) -> int:
        return 0


class FlakyRemote(AsyncHash):
    def embed_prepared(self, prepared: TokenColumns) -> Handle:
        self.log.append(f"launch {len(prepared)}")
        return FailingOnce(self.log, str(id(prepared)), HashEmbedder.embed(self, list(prepared)))


def test_a_launched_call_that_fails_transiently_is_launched_again_under_the_retry_policy() -> None:
    embedder = FlakyRemote()
    FailingOnce.failed.clear()
    tokens = tokenize(embedder, [f"text {i}" for i in range(40)])
    batches = token_batches(tokens.counts, 1000, 16)
    retried: list[Any] = []

    def retry(function: Any, *args: Any) -> Any:
        retried.append(function)
        return function(*args)

    seen = list(Feeder(embedder, retry).calls(tokens, batches, lambda: False))
    assert len(seen) == len(batches) == 3
    assert sum(entry.startswith("launch") for entry in embedder.log) == 6  # each call launched again once
    assert len(retried) == 6  # the three launches, and the three launches again, under the retry policy
    for batch, vectors, refused in seen:
        np.testing.assert_array_equal(vectors, direct(tokens.take(batch), HashEmbedder(dim=8)))
        assert refused == {0: "provider_rejected:invalid_request"}  # the handle's own refusals


class Billed(Handle):
    """A remote call that bills its inputs, and can be cancelled before it is sent."""

    def __init__(self, log: list[str], name: str, vectors: Vectors) -> None:
        super().__init__(log, name, vectors)
        self.cancelled = False

    def billed_tokens(self) -> int:
        return 10 * len(self.vectors)

    def done(self) -> bool:
        return True

    def cancel(self) -> None:
        self.cancelled = True
        self.log.append(f"cancel {self.name}")

    def rejections(self) -> dict[int, str]:
        return {}


class BilledRemote(AsyncHash):
    def embed_prepared(self, prepared: TokenColumns) -> Handle:
        self.log.append(f"launch {len(prepared)}")
        return Billed(self.log, str(len(prepared)), HashEmbedder.embed(self, list(prepared)))


def test_the_next_windows_first_call_is_launched_before_this_windows_last_is_collected() -> None:
    """No drain between windows: once a window's last call is launched, the next window (when queued) has
    its first call launched before that last call is waited on; the next window's calls start from it,
    and each window is billed its own calls only."""
    embedder = BilledRemote()
    feeder = Feeder(embedder, lambda f, *a: f(*a))
    first = tokenize(embedder, [f"first {i}" for i in range(30)])
    second = tokenize(embedder, [f"second window {i}" for i in range(20)])
    first_batches, second_batches = (
        token_batches(first.counts, 1000, 16),
        token_batches(second.counts, 1000, 8),
    )
    asked: list[int] = []

    def ahead() -> tuple[TokenColumns, list[Any]]:
        asked.append(1)
        return second, second_batches

    seen = list(feeder.calls(first, first_batches, lambda: False, ahead))
    assert len(asked) == 1 and feeder.billed == 10 * 30
    last_result = max(i for i, entry in enumerate(embedder.log) if entry.startswith("result"))
    assert embedder.log[last_result - 1 :] == ["launch 8", f"result {len(first_batches[-1])}"]
    embedder.log.clear()
    again = list(feeder.calls(second, second_batches, lambda: False))
    results = [entry for entry in embedder.log if entry.startswith("result")]
    assert results[0] == "result 8"  # the call launched ahead is collected first, not launched again
    assert sum(entry.startswith("launch") for entry in embedder.log) == len(second_batches) - 1
    assert feeder.billed == 10 * 20
    for (batch, vectors, _), tokens in [*((s, first) for s in seen), *((s, second) for s in again)]:
        np.testing.assert_array_equal(vectors, direct(tokens.take(batch), HashEmbedder(dim=8)))


def test_a_call_launched_ahead_for_a_window_that_never_comes_is_cancelled() -> None:
    embedder = BilledRemote()
    feeder = Feeder(embedder, lambda f, *a: f(*a))
    first = tokenize(embedder, [f"first {i}" for i in range(10)])
    second = tokenize(embedder, [f"second {i}" for i in range(10)])
    batches = token_batches(first.counts, 1000, 16)
    list(
        feeder.calls(first, batches, lambda: False, lambda: (second, token_batches(second.counts, 1000, 16)))
    )
    feeder.abandon()
    assert embedder.log[-1] == "cancel 10"
