"""Feeding the model: the next batch is prepared while the current one runs, and each result is collected
one call later, so a GPU never waits on the host between batches.

An embedder opts in with two methods:
    prepare_columns(tokens) -> prepared   pad, pin host memory, start the copy to the device (any thread)
    embed_prepared(prepared) -> handle    launch the model; `handle.result()` waits for the vectors, or the
                                          handle is already the vectors (CPU); a remote call's handle also
                                          has `rejections()`: the rows its provider refused
Embedders without them are called as before: `embed_columns` / `embed`, one batch at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
from numpy.typing import NDArray

from reindex.columns import TokenColumns, embed
from reindex.errors import TransientError
from reindex.ports import Vectors

Batch = NDArray[np.int64]
Retry = Callable[..., Any]


class Feeder:
    """Runs the model over a window's batches; a preparing thread lives for one window's calls."""

    def __init__(self, embedder: Any, retry: Retry) -> None:
        self.embedder, self.retry = embedder, retry
        self._prepare = getattr(embedder, "prepare_columns", None)
        self._launch = getattr(embedder, "embed_prepared", None)

    def calls(
        self, tokens: TokenColumns, batches: Sequence[Batch], stopped: Callable[[], bool]
    ) -> Iterator[tuple[Batch, Vectors, dict[int, str]]]:
        """(batch, its vectors, rows the provider refused) for each batch, in order; ends early on `stopped`."""
        if self._prepare is None or self._launch is None:
            for batch in batches:
                if stopped():
                    return
                vectors = self.retry(embed, self.embedder, tokens.take(batch))
                yield batch, vectors, _rejections(self.embedder)
            return
        yield from self._pipelined(tokens, batches, stopped)

    def _pipelined(
        self, tokens: TokenColumns, batches: Sequence[Batch], stopped: Callable[[], bool]
    ) -> Iterator[tuple[Batch, Vectors, dict[int, str]]]:
        prepare, launch = self._prepare, self._launch
        assert prepare is not None and launch is not None
        waiting: tuple[Batch, Any, Any] | None = None  # (batch, its handle, its prepared input)
        with ThreadPoolExecutor(1, thread_name_prefix="reindex-feed") as pool:
            upcoming: Future[Any] | None = pool.submit(prepare, tokens.take(batches[0])) if batches else None
            for index, batch in enumerate(batches):
                if stopped():
                    return
                assert upcoming is not None
                prepared = upcoming.result()
                if index + 1 < len(batches):
                    upcoming = pool.submit(prepare, tokens.take(batches[index + 1]))
                handle = self.retry(launch, prepared)
                if waiting is not None:
                    yield self._collect(*waiting)
                waiting = (batch, handle, prepared)
        if waiting is not None:
            yield self._collect(*waiting)

    def _collect(self, batch: Batch, handle: Any, prepared: Any) -> tuple[Batch, Vectors, dict[int, str]]:
        """The handle's vectors and refused rows. A handle that fails transiently (a remote call that ran
        out of attempts) is launched again under the retry policy, as an unpipelined call would be."""
        try:
            vectors = _result(handle)
        except TransientError:
            assert self._launch is not None
            launch = self._launch

            def again() -> Any:
                retried = launch(prepared)
                _result(retried)
                return retried

            handle = self.retry(again)
            vectors = _result(handle)
        return batch, vectors, _refusals(handle)


def _result(handle: Any) -> Vectors:
    result = getattr(handle, "result", None)
    vectors: Vectors = result() if callable(result) else handle
    return vectors


def _refusals(handle: Any) -> dict[int, str]:
    """Rows a launched call's provider refused, when its handle says (a remote call's does)."""
    rejections = getattr(handle, "rejections", None)
    return dict(rejections()) if callable(rejections) else {}


def _rejections(embedder: Any) -> dict[int, str]:
    """Rows of the last `embed` call a provider refused ({row: "provider_rejected:<code>"}), if it says."""
    last = getattr(embedder, "last_rejections", None)
    return dict(last()) if callable(last) else {}
