"""The model process and the workers' client of it.

A model process loads the embedder once (on its GPU: `CUDA_VISIBLE_DEVICES` names one) and serves batches
of tokens from every worker's pipe in arrival order: each request is launched (`embed_prepared`, which
starts the copy to the device and the model without waiting) before the one before it is collected, so
the device always has the next batch while the current one computes; the vectors go back as one array.
Its busy time (a batch's launch, or the end of the one before, to its vectors) is reported at the end.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from reindex import crashpoints, registry
from reindex.capabilities import Pending, PendingRequests, PipelinesCalls
from reindex.columns import TokenColumns, embed
from reindex.errors import BackendError, ReindexError
from reindex.ports import EmbedderInfo, EmbedderTraits, Vectors

POLL_SECONDS = 0.05  # how often an idle process looks at its parent


@dataclass(frozen=True)
class DeviceSpec:
    """What a worker needs to feed a model process without loading the model: the model's identity, its
    tokenizer (which travels), and its traits (batch sizes)."""

    info: EmbedderInfo
    tokenizer: Callable[[list[str]], TokenColumns]
    traits: EmbedderTraits

    @classmethod
    def of(cls, embedder: Any) -> DeviceSpec:
        return cls(embedder.info, embedder.column_tokenizer, embedder.traits)


def device_count(embedder: Any) -> int:
    """Model processes to start: one per GPU the embedder would use, one on a CPU."""
    return max(1, int(embedder.traits.devices))


def alive(coordinator: int) -> bool:
    """Whether the coordinator still runs (its pid still names a process: it is not reused within a run)."""
    try:
        os.kill(coordinator, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def follow_parent(coordinator: int, name: str) -> None:
    """Die with the coordinator. This process's parent is the fork server the coordinator started, which
    exits when the coordinator dies; SIGKILL comes from the kernel the moment the parent is gone (Linux),
    so a killed run's processes write nothing more; elsewhere the idle loops' `alive` checks end them. The
    coordinator's SIGINT and SIGTERM are its own to handle: it decides when the shards in flight stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        libc.prctl(PR_SET_NAME, name.encode()[:15])  # what ps and top show: reindex-worker, reindex-model
    if not alive(coordinator):  # it died before the signal was asked for
        os._exit(1)


PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def serve(
    section: dict[str, Any], fingerprint: str, conns: list[Connection], control: Connection, parent: int
) -> None:
    """A model process's main: build the embedder, then answer every worker's batches until the
    coordinator says stop (or dies). Its stats go back on `control` at the end."""
    follow_parent(parent, "reindex-model")
    try:
        embedder = registry.build("embedder", section)
        if embedder.info.fingerprint != fingerprint:
            raise BackendError(
                f"the model process loaded {embedder.info.model} with fingerprint {embedder.info.fingerprint},"
                f" the coordinator {fingerprint}",
                hint="the model's files changed during the run; rerun the same command",
            )
    except ReindexError as exc:
        control.send(("broken", pickle.dumps(exc)))
        return
    control.send(("ready", None))
    stats = _Server(embedder).loop(conns, control, parent)
    control.send(("stats", stats))


class _Server:
    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder
        calls = embedder if isinstance(embedder, PipelinesCalls) else None
        self.prepare = calls.prepare_columns if calls is not None else None
        self.launch = calls.embed_prepared if calls is not None else None
        self.busy = 0.0
        self.first: float | None = None
        self.last = 0.0
        self.batches = 0

    def loop(self, conns: list[Connection], control: Connection, parent: int) -> dict[str, float]:
        open_conns = list(conns)
        pending: tuple[Connection, int, Any, float] | None = None  # launched, not yet collected
        while open_conns and alive(parent):
            ready = wait([*open_conns, control], timeout=0 if pending is not None else POLL_SECONDS)
            if control in ready:
                break  # the coordinator's stop: every worker is done
            if not ready and pending is not None:
                self._collect(*pending)
                pending = None
                continue
            for conn in ready:
                assert isinstance(conn, Connection)
                try:
                    rid, tokens = conn.recv()
                except EOFError:
                    open_conns.remove(conn)
                    continue
                launched = self._launch(conn, rid, tokens)
                if pending is not None:
                    self._collect(*pending)
                pending = launched
        if pending is not None:
            self._collect(*pending)
        return {"busy": self.busy, "first": self.first or 0.0, "last": self.last, "batches": self.batches}

    def _launch(self, conn: Connection, rid: int, tokens: TokenColumns) -> tuple[Connection, int, Any, float]:
        crashpoints.crash_if_armed("model_process")
        started = time.monotonic()
        if self.first is None:
            self.first = started
        try:
            if self.prepare is not None and self.launch is not None:
                handle: Any = self.launch(self.prepare(tokens))
            else:
                handle = embed(self.embedder, tokens)
        except BaseException as exc:
            handle = _Failed(exc)
        return conn, rid, handle, started

    def _collect(self, conn: Connection, rid: int, handle: Any, started: float) -> None:
        try:
            vectors = handle.result() if isinstance(handle, Pending) else handle
            refused = dict(handle.rejections()) if isinstance(handle, PendingRequests) else {}
            reply: tuple[Any, ...] = (rid, vectors, refused, None)
        except BaseException as exc:
            reply = (rid, None, {}, _error(exc))
        now = time.monotonic()
        self.busy += now - max(started, self.last)
        self.last = now
        self.batches += 1
        with suppress(BrokenPipeError, EOFError, OSError):  # the worker is gone; the coordinator hears of it
            conn.send(reply)


@dataclass
class _Failed:
    exc: BaseException

    def result(self) -> Vectors:
        raise self.exc


def _error(exc: BaseException) -> bytes:
    """An error as it travels: a ReindexError as itself (its exit code and hint), anything else as a
    BackendError carrying the traceback's last line."""
    if isinstance(exc, ReindexError):
        return pickle.dumps(exc)
    line = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return pickle.dumps(BackendError(f"the model process failed: {line}"))


class DeviceClient:
    """A worker's embedder: tokenizes here with the model's own tokenizer, and sends each batch's tokens to
    the model process, one request per batch (`embed_prepared` returns at once; the pipeline's feeder
    launches the next batch before collecting this one). Lanes share it: it is thread-safe."""

    def __init__(self, spec: DeviceSpec, conn: Connection) -> None:
        self.info, self.traits = spec.info, spec.traits  # the model's, device and call sizes included
        self.column_tokenizer = spec.tokenizer
        self._conn = conn
        self._send = threading.Lock()  # one request on the pipe at a time
        self._book = threading.Lock()  # the requests waiting for their vectors
        self._waiting: dict[int, Future[tuple[Vectors, dict[int, str]]]] = {}
        self._next = 0
        self._receiver = threading.Thread(target=self._receive, name="reindex-device-replies", daemon=True)
        self._receiver.start()

    def tokenize_columns(self, texts: list[str]) -> TokenColumns:
        return self.column_tokenizer(texts)

    def tokenize(self, texts: list[str]) -> list[Any]:
        return list(self.column_tokenizer(list(texts)))

    def prepare_columns(self, tokens: TokenColumns) -> TokenColumns:
        return tokens  # padded in the model process, next to the device

    def embed_prepared(self, tokens: TokenColumns) -> _Reply:
        future: Future[tuple[Vectors, dict[int, str]]] = Future()
        with self._book:
            rid, self._next = self._next, self._next + 1
            self._waiting[rid] = future
        try:
            with self._send:  # not the book's lock: the replies are read while a big request is sent
                self._conn.send((rid, tokens))
        except (BrokenPipeError, OSError):
            with self._book:
                self._waiting.pop(rid, None)
            raise ModelProcessGone("the model process is gone", hint="rerun the same command") from None
        return _Reply(future)

    def embed_columns(self, tokens: TokenColumns) -> Vectors:
        return self.embed_prepared(tokens).result()

    def embed(self, items: list[Any]) -> Vectors:
        return self.embed_columns(TokenColumns.from_tokens(items))

    def _receive(self) -> None:
        while True:
            try:
                rid, vectors, rejections, error = self._conn.recv()
            except (EOFError, OSError):
                gone = ModelProcessGone("the model process is gone", hint="rerun the same command")
                with self._book:
                    for future in self._waiting.values():
                        future.set_exception(gone)
                    self._waiting.clear()
                return
            with self._book:
                future = self._waiting.pop(rid)
            if error is not None:
                future.set_exception(pickle.loads(error))
            else:
                future.set_result((vectors, rejections))


class ModelProcessGone(BackendError):
    """A worker's request met a closed pipe: the model process died (the coordinator names how)."""


@dataclass
class _Reply:
    future: Future[tuple[Vectors, dict[int, str]]]

    def result(self) -> Vectors:
        return self.future.result()[0]

    def rejections(self) -> dict[int, str]:
        return self.future.result()[1]

    def done(self) -> bool:
        return self.future.done()
