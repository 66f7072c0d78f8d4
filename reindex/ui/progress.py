"""What a verb shows on stderr while it works: a spinner, the run's progress bar, and SIGTERM or SIGINT
turned into a stop request that lets in-flight writes finish."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from reindex.ui.consoles import err

TICK_SECONDS = 0.25  # how often the bar reads the run's progress between shards


@contextmanager
def _status(message: str, quiet: bool) -> Iterator[None]:
    if quiet or not err.is_terminal:
        yield
        return
    with err.status(message):
        yield


@contextmanager
def signals_stop(stop: threading.Event) -> Iterator[None]:
    """SIGTERM (spot reclaim) and SIGINT stop claiming shards; a second SIGINT aborts at once."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            sys.exit(130)
        stop.set()
        err.print(f"received {signal.Signals(signum).name}: finishing in-flight writes, then exiting (75)")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def progress_bar(quiet: bool) -> Iterator[tuple[Callable[[int | None, int], None], Callable[[Any], None]]]:
    """A rich bar on stderr (documents, docs/s, tokens/s, ETA); silent when not a terminal or --json."""
    if quiet or not err.is_terminal:
        yield (lambda total, done: None), (lambda progress: None)
        return
    columns = (
        TextColumn("[bold]embedding"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err) as bar:
        task = bar.add_task("run", total=None, rate="")
        resumed_at, latest, closed = [0], [None], threading.Event()

        def on_start(total: int | None, done: int) -> None:
            resumed_at[0] = done
            bar.update(task, total=total, completed=done)

        def show() -> None:
            progress = latest[0]
            if progress is None:
                return
            seconds = max(progress.seconds, 1e-9)
            rate = f"{progress.documents / seconds:,.0f} docs/s  {progress.tokens / seconds:,.0f} tok/s"
            # between shards, the model's calls (`Progress.embedding`): the bar moves as the model works
            moved = max(progress.documents, int(progress.embedding))
            bar.update(task, completed=resumed_at[0] + moved, rate=rate)

        def on_progress(progress: Any) -> None:
            latest[0] = progress
            show()

        def tick() -> None:
            while not closed.wait(TICK_SECONDS):
                show()

        ticker = threading.Thread(target=tick, name="reindex-progress", daemon=True)
        ticker.start()
        try:
            yield on_start, on_progress
        finally:
            closed.set()
            ticker.join()
