"""Feeding the model: the next batch is prepared while the current one runs, and each result is collected
one call later, so a GPU never waits on the host between batches.

An embedder opts in with two methods:
    prepare_columns(tokens) -> prepared   pad, pin host memory, start the copy to the device (any thread)
    embed_prepared(prepared) -> handle    launch the model; `handle.result()` waits for the vectors, or the
                                          handle is already the vectors (CPU); a remote call's handle also
                                          has `rejections()` (the rows its provider refused),
                                          `billed_tokens()`, `done()` and `cancel()`
Embedders without them are called as before: `embed_columns` / `embed`, one batch at a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
from numpy.typing import NDArray

from reindex.capabilities import Pending, PendingRequests, PipelinesCalls, RefusesRows
from reindex.columns import TokenColumns, embed
from reindex.errors import TransientError
from reindex.ports import Vectors

Batch = NDArray[np.int64]
Retry = Callable[..., Any]
Ahead = Callable[[], "tuple[TokenColumns, Sequence[Batch]] | None"]  # the next window's tokens and batches
AHEAD_POLL_SECONDS = 0.002  # how often the next window is looked for while the last call runs


class Feeder:
    """Runs the model over a window's batches; a preparing thread lives for one window's calls.

    Across windows: once a window's last call is launched, `ahead` may hand over the next window (when it is
    already queued), whose first call is then launched before this window's last one is collected, so the
    model, or a provider's slots, never drain between windows. The next `calls` for that window's tokens
    collects that call first; `abandon` drops one no window came for (a stop)."""

    def __init__(self, embedder: Any, retry: Retry) -> None:
        self.embedder, self.retry = embedder, retry
        calls = embedder if isinstance(embedder, PipelinesCalls) else None
        self._prepare = calls.prepare_columns if calls is not None else None
        self._launch = calls.embed_prepared if calls is not None else None
        self._launched: tuple[TokenColumns, Batch, Any, Any] | None = None  # the next window's first call
        self.billed: int | None = None  # tokens the last `calls` paid for, when its handles say; else None

    def calls(
        self,
        tokens: TokenColumns,
        batches: Sequence[Batch],
        stopped: Callable[[], bool],
        ahead: Ahead | None = None,
    ) -> Iterator[tuple[Batch, Vectors, dict[int, str]]]:
        """(batch, its vectors, rows the provider refused) for each batch, in order; ends early on `stopped`."""
        self.billed = None
        if self._prepare is None or self._launch is None:
            for batch in batches:
                if stopped():
                    return
                vectors = self.retry(embed, self.embedder, tokens.take(batch))
                yield batch, vectors, _rejections(self.embedder)
            return
        self.billed = 0
        yield from self._pipelined(tokens, batches, stopped, ahead)

    def abandon(self) -> None:
        """Drop a call launched for a window that never came: what it has not sent yet is not sent."""
        if self._launched is not None:
            handle = self._launched[2]
            if isinstance(handle, PendingRequests):
                handle.cancel()
            self._launched = None

    def _pipelined(
        self, tokens: TokenColumns, batches: Sequence[Batch], stopped: Callable[[], bool], ahead: Ahead | None
    ) -> Iterator[tuple[Batch, Vectors, dict[int, str]]]:
        prepare, launch = self._prepare, self._launch
        assert prepare is not None and launch is not None
        waiting: tuple[Batch, Any, Any] | None = None  # (batch, its handle, its prepared input)
        first = 0
        if self._launched is not None and self._launched[0] is tokens and len(batches):
            _, batch, handle, prepared = self._launched
            self._launched, waiting, first = None, (batch, handle, prepared), 1
        with ThreadPoolExecutor(1, thread_name_prefix="reindex-feed") as pool:
            upcoming: Future[Any] | None = None
            if first < len(batches):
                upcoming = pool.submit(prepare, tokens.take(batches[first]))
            for index in range(first, len(batches)):
                batch = batches[index]
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
        if waiting is not None and ahead is not None:
            self._launch_ahead(ahead, waiting[1], stopped)
        if waiting is not None:
            yield self._collect(*waiting)

    def _launch_ahead(self, ahead: Ahead, last: Any, stopped: Callable[[], bool]) -> None:
        """Launch the next window's first call, if that window is queued before this window's last call is
        done (a handle with `done()` is watched; one without gets one look)."""
        done = last.done if isinstance(last, PendingRequests) else None
        while not stopped():
            following = ahead()
            if following is not None:
                if len(following[1]):
                    tokens, batch = following[0], following[1][0]
                    assert self._prepare is not None and self._launch is not None
                    prepared = self._prepare(tokens.take(batch))
                    self._launched = (tokens, batch, self.retry(self._launch, prepared), prepared)
                return
            if done is None or done():
                return
            time.sleep(AHEAD_POLL_SECONDS)

    def _collect(self, batch: Batch, handle: Any, prepared: Any) -> tuple[Batch, Vectors, dict[int, str]]:
        """The handle's vectors and refused rows. A handle that fails transiently (a remote call that ran
        out of attempts) is launched again under the retry policy, as an unpipelined call would be."""
        try:
            vectors = _result(handle)
        except TransientError:
            assert self._launch is not None
            launch = self._launch
            self._bill(handle)  # what its requests that did succeed were billed

            def again() -> Any:
                retried = launch(prepared)
                try:
                    _result(retried)
                except TransientError:
                    self._bill(retried)
                    raise
                return retried

            handle = self.retry(again)
            vectors = _result(handle)
        self._bill(handle)
        return batch, vectors, _refusals(handle)

    def _bill(self, handle: Any) -> None:
        if self.billed is not None:
            self.billed = (
                self.billed + handle.billed_tokens() if isinstance(handle, PendingRequests) else None
            )


def _result(handle: Any) -> Vectors:
    vectors: Vectors = handle.result() if isinstance(handle, Pending) else handle
    return vectors


def _refusals(handle: Any) -> dict[int, str]:
    """Rows a launched call's provider refused, when its handle says (a remote call's does)."""
    return dict(handle.rejections()) if isinstance(handle, PendingRequests) else {}


def _rejections(embedder: Any) -> dict[int, str]:
    """Rows of the last `embed` call a provider refused ({row: "provider_rejected:<code>"}), if it says."""
    return dict(embedder.last_rejections()) if isinstance(embedder, RefusesRows) else {}
