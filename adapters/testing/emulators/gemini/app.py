"""A local Gemini Developer API for batch embeddings that computes real embeddings, for tests and dry runs.

It speaks what `google-genai`'s `client.files` and `client.batches` send (point `genai.Client(http_options=
{"base_url": emulator.base_url})` at it): the resumable upload (`POST /upload/{version}/files`, then the
`x-goog-upload-url` it answers with), `POST /{version}/models/{model}:asyncBatchEmbedContent`,
`GET /{version}/batches[/{id}]` (a long-running operation whose `metadata` is the batch), `GET
/{version}/files/{id}:download?alt=media` and `DELETE /{version}/files/{id}`. Errors have Google's shape,
`{"error": {code, message, status, details}}`; a 429 carries a google.rpc.RetryInfo `retryDelay`.

The faults are reindex_adapters.testing.emulators.faults' `FaultPlan`, spent by its `FaultGate` on the same route names
(`batch_create`, `batch_retrieve`, `batch_list`, `files`), and rendered here in Google's wire format.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from reindex.ports import Embedder
from reindex_adapters.testing.emulators.faults import ApiError, FaultPlan
from reindex_adapters.testing.emulators.gemini.state import GeminiState, GoogleError
from reindex_adapters.testing.emulators.server import LocalServer, in_thread, routed_app

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.requests import Request
    from starlette.responses import Response

Handler = Callable[["GeminiState", "Request"], Any]


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except json.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        raise GoogleError(400, "Invalid JSON payload received.")
    return body


async def _upload(state: GeminiState, request: Request) -> Any:
    """The resumable upload: `start` answers with the session URL; `upload[, finalize]` appends bytes."""
    from starlette.responses import JSONResponse, Response

    command = request.headers.get("x-goog-upload-command", "")
    if "start" in command:
        meta = (await _json(request)).get("file") or {}
        mime = request.headers.get("x-goog-upload-header-content-type") or "application/octet-stream"
        upload_id = state.start_upload(meta, mime)
        url = f"{request.url.scheme}://{request.url.netloc}{request.url.path}?upload_id={upload_id}"
        return Response(b"", headers={"x-goog-upload-url": url, "x-goog-upload-status": "active"})
    upload_id = request.query_params.get("upload_id", "")
    done = state.continue_upload(upload_id, await request.body(), is_final="finalize" in command)
    status = "final" if done is not None else "active"
    return JSONResponse(done or {}, headers={"x-goog-upload-status": status})


async def _create(state: GeminiState, request: Request) -> Any:
    model = f"models/{request.path_params['model']}"
    operation, delay = state.create_batch(model, await _json(request))
    await asyncio.sleep(delay)  # a slow create: the batch exists while the client may time out
    return operation


async def _list(state: GeminiState, request: Request) -> Any:
    size = request.query_params.get("pageSize", "50")
    page_size = int(size) if size.isdigit() else 0
    if not 1 <= page_size <= 1000:
        raise GoogleError(400, "page_size must be between 1 and 1000.")
    return state.list_batches(page_size, request.query_params.get("pageToken"))


async def _set_faults(state: GeminiState, request: Request) -> Any:
    plan = FaultPlan.from_mapping(await _json(request))
    with state.lock:
        state.gate.plan = plan
    return plan.describe()


def _file(request: Request) -> str:
    return f"files/{request.path_params['file_id']}"


def _batch(request: Request) -> str:
    return f"batches/{request.path_params['batch_id']}"


# method, path, route name for the fault gate (None: never refused), handler (sync or async)
ROUTE_TABLE: list[tuple[str, str, str | None, Handler]] = [
    ("POST", "/upload/{version}/files", "files", _upload),
    ("GET", "/{version}/files/{file_id}:download", "files", lambda s, r: s.download(_file(r))),
    ("DELETE", "/{version}/files/{file_id}", "files", lambda s, r: s.delete_file(_file(r))),
    ("POST", "/{version}/models/{model}:asyncBatchEmbedContent", "batch_create", _create),
    ("GET", "/{version}/batches", "batch_list", _list),
    ("GET", "/{version}/batches/{batch_id}", "batch_retrieve", lambda s, r: in_thread(s.retrieve, _batch(r))),
    ("POST", "/_emulator/faults", None, _set_faults),
    ("GET", "/_emulator/stats", None, lambda state, r: state.stats()),
]


def _build_app(state: GeminiState) -> FastAPI:
    return routed_app("Gemini API emulator", state, ROUTE_TABLE, _endpoint)


def _endpoint(
    state: GeminiState, route: str | None, handler: Handler
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        from starlette.responses import JSONResponse, Response

        try:
            key = request.headers.get("x-goog-api-key", "").strip()
            is_session = "upload_id" in request.query_params  # the upload URL is the credential
            if route is not None and not key and not is_session:
                raise GoogleError(403, "Method doesn't allow unregistered callers. Please use an API Key.")
            if route is not None:
                state.admit(route, key or "upload-session")
            result = handler(state, request)
            result = await result if asyncio.iscoroutine(result) else result
        except ApiError as exc:  # a bad fault plan
            result, status = GoogleError.of(exc).body(), exc.status
            return JSONResponse(result, status_code=status)
        except GoogleError as exc:
            return JSONResponse(exc.body(), status_code=exc.code)
        if isinstance(result, Response):
            return result
        if isinstance(result, bytes):
            return Response(result, media_type="application/octet-stream")
        return JSONResponse(result)

    return endpoint


class GeminiEmulator(LocalServer):
    """The emulator on a free local port, in a background thread.

    with GeminiEmulator(HashEmbedder(dim=3072)) as emu:
        client = genai.Client(api_key="test", http_options={"base_url": emu.base_url, "api_version": "v1beta"})
    """

    def __init__(
        self, embedder: Embedder, faults: FaultPlan | None = None, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.state = GeminiState(embedder, faults or FaultPlan())
        super().__init__(_build_app(self.state), host=host, port=port, name="Gemini emulator")

    @property
    def base_url(self) -> str:
        return self.url

    def stats(self) -> dict[str, Any]:
        return self.state.stats()

    def set_faults(self, plan: FaultPlan) -> None:
        self.state.set_faults(plan)
