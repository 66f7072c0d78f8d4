"""The Voyage emulator's web layer: Voyage's routes, its error body `{"detail": <message>}`, and
`VoyageEmulator`, which serves them on a local port.

    POST /v1/embeddings                          what `voyageai.Client(base_url=emulator.base_url).embed` sends
    POST /v1/files · GET /v1/files/{id}[/content] · DELETE /v1/files/{id}
    POST /v1/batches · GET /v1/batches[?limit&after] · GET /v1/batches/{id} · POST /v1/batches/{id}/cancel

Faults are reindex_adapters.testing.emulators.faults' `FaultPlan` on the same route names as the other
emulators (`embeddings`, `files`, `batch_create`, `batch_list`, `batch_retrieve`, `batch_cancel`).
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any

from reindex.ports import Embedder
from reindex_adapters.testing.emulators.faults import ApiError, FaultPlan
from reindex_adapters.testing.emulators.openai import endpoint_for, json_body, parse_multipart
from reindex_adapters.testing.emulators.server import LocalServer, in_thread, routed_app
from reindex_adapters.testing.emulators.voyage.state import VoyageState

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.requests import Request
    from tokenizers import Tokenizer


def error_body(exc: ApiError) -> dict[str, Any]:
    """Voyage's error object: `{"detail": <message>}` (its API reference, the 4XX response)."""
    body: dict[str, Any] = {"detail": exc.error["message"]}
    if exc.error.get("code"):  # newer bodies add it, e.g. TOO_MANY_TOKENS_IN_BATCH (public captures)
        body["error_code"] = exc.error["code"]
    return body


async def _embeddings(state: VoyageState, request: Request) -> Any:
    embed = functools.partial(state.embeddings, await json_body(request), client=_client(request))
    return await in_thread(embed)


async def _upload(state: VoyageState, request: Request) -> Any:
    fields = parse_multipart(request.headers.get("content-type", ""), await request.body())
    filename, content = fields.get("file", (None, b""))
    return state.upload(filename or "upload", content, fields.get("purpose", (None, b""))[1].decode())


async def _create(state: VoyageState, request: Request) -> Any:
    batch, delay = state.create_batch(await json_body(request))
    await asyncio.sleep(delay)
    return batch


def _list(state: VoyageState, request: Request) -> Any:
    limit = request.query_params.get("limit", "20")
    if not limit.isdigit():
        raise ApiError(400, "limit must be an integer.")
    return state.list_batches(request.query_params.get("after"), int(limit))


def _client(request: Request) -> str:
    return request.headers.get("authorization", "").removeprefix("Bearer ").strip() or "anonymous"


def _file_id(request: Request) -> str:
    return str(request.path_params["file_id"])


def _batch_id(request: Request) -> str:
    return str(request.path_params["batch_id"])


# method, path, route name for the fault gate, handler (sync or async)
ROUTE_TABLE: list[tuple[str, str, str | None, Any]] = [
    ("POST", "/v1/embeddings", "embeddings", _embeddings),
    ("POST", "/v1/files", "files", _upload),
    ("GET", "/v1/files/{file_id}", "files", lambda state, r: state.describe(state.file(_file_id(r)))),
    ("GET", "/v1/files/{file_id}/content", "files", lambda state, r: state.file(_file_id(r)).content),
    ("DELETE", "/v1/files/{file_id}", "files", lambda state, r: state.delete_file(_file_id(r))),
    ("POST", "/v1/batches", "batch_create", _create),
    ("GET", "/v1/batches", "batch_list", _list),
    ("GET", "/v1/batches/{batch_id}", "batch_retrieve", lambda s, r: in_thread(s.get_batch, _batch_id(r))),
    ("POST", "/v1/batches/{batch_id}/cancel", "batch_cancel", lambda s, r: s.cancel_batch(_batch_id(r))),
]


def create_app(
    embedder: Embedder, faults: FaultPlan | None = None, tokenizer: Tokenizer | None = None
) -> FastAPI:
    """The emulator as an ASGI app; its state is at `app.state.emulator`."""
    return _build_app(VoyageState(embedder, faults or FaultPlan(), tokenizer))


def _build_app(state: VoyageState) -> FastAPI:
    return routed_app(
        "Voyage API emulator", state, ROUTE_TABLE, functools.partial(endpoint_for, render=error_body)
    )


class VoyageEmulator(LocalServer):
    """The emulator served locally: `with VoyageEmulator(HashEmbedder(dim=1024)) as emu: ...emu.base_url`.

    `tokenizer` (a `tokenizers.Tokenizer`) counts the tokens billed, standing in for Voyage's own; without
    it they are counted with cl100k_base."""

    def __init__(
        self,
        embedder: Embedder,
        faults: FaultPlan | None = None,
        *,
        tokenizer: Tokenizer | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.state = VoyageState(embedder, faults or FaultPlan(), tokenizer)
        super().__init__(_build_app(self.state), host=host, port=port, name="Voyage emulator")

    @property
    def base_url(self) -> str:
        """What `voyageai.Client(base_url=...)` and the `[embedder] base_url` key take."""
        return f"{self.url}/v1"

    def stats(self) -> dict[str, Any]:
        return self.state.stats()

    def set_faults(self, plan: FaultPlan) -> None:
        self.state.set_faults(plan)

    def batch(self, batch_id: str) -> dict[str, Any]:
        """A batch's wire object as it stands, without ticking its clock."""
        with self.state.lock:
            return dict(self.state._batch(batch_id).data)
