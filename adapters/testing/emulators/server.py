"""An ASGI app served by uvicorn on a free local port, in a background thread: what the provider emulators
(reindex_adapters.testing.emulators.openai, reindex_adapters.testing.emulators.gemini.app, reindex_adapters.testing.emulators.bedrock) share to run inside a test or
a dry run."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Self

from reindex.errors import BackendError, MissingDependency

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI
    from starlette.requests import Request
    from starlette.types import ASGIApp

Route = tuple[str, str, Any, Any]  # method, path, route name (None: no fault gate), handler


class LocalServer:
    """`start()` binds `host:port` (0: a free port, known once started) and returns once serving; a context
    manager starts and stops it."""

    def __init__(
        self, app: ASGIApp, *, host: str = "127.0.0.1", port: int = 0, name: str = "emulator"
    ) -> None:
        self.app, self.host, self.port, self.name = app, host, port, name
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self, timeout: float = 10.0) -> None:
        import uvicorn

        config = uvicorn.Config(
            self.app, log_level="warning", lifespan="off", ws="none", timeout_graceful_shutdown=1
        )
        listener = socket.create_server((self.host, self.port))
        self.port = int(listener.getsockname()[1])
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=_serve, args=(self._server, listener), name=self.name, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise BackendError(f"the {self.name} did not start on {self.url}")
            time.sleep(0.01)

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)


def _serve(server: uvicorn.Server, listener: socket.socket) -> None:
    with listener:
        server.run(sockets=[listener])


async def in_thread(function: Callable[..., Any], *args: Any) -> Any:
    """Run blocking emulator work off the event loop (the server keeps answering meanwhile)."""
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(function, *args)


def query_lists(request: Request) -> dict[str, list[str]]:
    """The query string as name -> every value given for it, in order (a repeated parameter is a list)."""
    query: dict[str, list[str]] = {}
    for key, value in request.query_params.multi_items():
        query.setdefault(key, []).append(value)
    return query


def routed_app(title: str, state: Any, routes: Iterable[Route], endpoint: Callable[..., Any]) -> FastAPI:
    """A FastAPI app serving `routes`, each wrapped by `endpoint(state, route, handler)`; the emulator's
    state at `app.state.emulator`."""
    try:
        from fastapi import FastAPI
    except ImportError as exc:
        raise MissingDependency("fastapi", extra="emulator") from exc
    app = FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.emulator = state
    for method, path, route, handler in routes:
        app.add_route(path, endpoint(state, route, handler), methods=[method])
    return app
