"""The OpenAI emulator's web layer: the routes (OpenAI's and Azure's), the ASGI app and `Emulator`, which
serves it on a local port."""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from reindex.ports import Embedder
from reindex_adapters.testing.emulators.faults import ApiError, FaultPlan
from reindex_adapters.testing.emulators.openai.state import EmulatorState
from reindex_adapters.testing.emulators.server import LocalServer, in_thread, routed_app

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.requests import Request
    from starlette.responses import Response

Handler = Callable[["EmulatorState", "Request"], Any]
AZURE_PREFIX = "/openai/"
# A missing api-version is a bare 404 "Resource not found" (MicrosoftDocs/azure-docs#114602). The 401 and
# DeploymentNotFound bodies below are Azure's wording as commonly reported, not checked against a source:
# the adapters act on the status codes only.
AZURE_UNAUTHORIZED = (
    "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key "
    "for an active subscription and use a correct regional API endpoint for your resource."
)
AZURE_NO_DEPLOYMENT = (
    "The API deployment for this resource does not exist. If you created the deployment within the last 5 "
    "minutes, please wait a moment and try again."
)


def parse_multipart(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """Form fields as name -> (filename, bytes); enough of RFC 7578 for the SDK's uploads."""
    boundary = _header_param(content_type, "boundary")
    if not content_type.startswith("multipart/form-data") or not boundary:
        raise ApiError(400, "Expected a multipart/form-data body.")
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in body.split(b"--" + boundary.encode())[1:-1]:
        head, _, content = part.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        lines = head.decode("utf-8", errors="replace").split("\r\n")
        disposition = next((line for line in lines if line.lower().startswith("content-disposition")), "")
        name = _header_param(disposition, "name")
        if name:
            fields[name] = (_header_param(disposition, "filename"), content.removesuffix(b"\r\n"))
    return fields


def _header_param(header: str, name: str) -> str | None:
    match = re.search(rf'(?:^|;)\s*{name}="?([^";]*)"?', header)
    return match.group(1) if match else None


async def json_body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except json.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        raise ApiError(400, "We could not parse the JSON body of your request.")
    return body


async def _embeddings(state: EmulatorState, request: Request) -> Any:
    with state.traffic.serving() as arrived:
        body = await json_body(request)
        embed = functools.partial(state.embeddings, body, client=_client(request), arrived=arrived)
        return await in_thread(embed)


async def _azure_embeddings(state: EmulatorState, request: Request) -> Any:
    """Azure's route: the deployment in the path picks the model (the body's `model` is not needed)."""
    deployment = str(request.path_params["deployment"])
    if state.deployments is not None and deployment not in state.deployments:
        raise ApiError(404, AZURE_NO_DEPLOYMENT, type=None, code="DeploymentNotFound")
    with state.traffic.serving() as arrived:
        body = {**await json_body(request), "model": deployment}
        embed = functools.partial(state.embeddings, body, client=_client(request), arrived=arrived)
        answer = await in_thread(embed)
    served = (state.deployments or {}).get(deployment)
    return {**answer, "model": served} if served else answer


def _check_azure(request: Request) -> None:
    """What Azure refuses before anything else: no `api-version` (a bare 404), no key or token (401)."""
    if not request.query_params.get("api-version"):
        raise ApiError(404, "Resource not found", type=None, code="404")
    if not (request.headers.get("api-key") or request.headers.get("authorization", "").startswith("Bearer ")):
        raise ApiError(401, AZURE_UNAUTHORIZED, type=None, code="401")


async def _create_file(state: EmulatorState, request: Request) -> Any:
    fields = parse_multipart(request.headers.get("content-type", ""), await request.body())
    filename, content = fields.get("file", (None, b""))
    return state.create_file(filename or "upload", content, fields.get("purpose", (None, b""))[1].decode())


async def _create_batch(state: EmulatorState, request: Request) -> Any:
    batch, delay = state.create_batch(await json_body(request))
    await asyncio.sleep(delay)
    return batch


async def _list_batches(state: EmulatorState, request: Request) -> Any:
    limit = request.query_params.get("limit", "20")
    if not limit.isdigit():
        raise ApiError(400, "limit must be an integer.", param="limit")
    return state.list_batches(request.query_params.get("after"), int(limit))


async def _set_faults(state: EmulatorState, request: Request) -> Any:
    plan = FaultPlan.from_mapping(await json_body(request))
    state.set_faults(plan)
    return plan.describe()


def _file_id(request: Request) -> str:
    return str(request.path_params["file_id"])


def _batch_id(request: Request) -> str:
    return str(request.path_params["batch_id"])


# method, path, route name for the fault gate (None: never refused), handler (sync or async)
ROUTE_TABLE: list[tuple[str, str, str | None, Handler]] = [
    ("POST", "/v1/embeddings", "embeddings", _embeddings),
    ("POST", "/openai/deployments/{deployment}/embeddings", "embeddings", _azure_embeddings),
    ("POST", "/v1/files", "files", _create_file),
    ("GET", "/v1/files/{file_id}", "files", lambda state, r: state.file(_file_id(r)).describe()),
    ("GET", "/v1/files/{file_id}/content", "files", lambda state, r: state.file_content(_file_id(r))),
    ("DELETE", "/v1/files/{file_id}", "files", lambda state, r: state.delete_file(_file_id(r))),
    ("POST", "/v1/batches", "batch_create", _create_batch),
    ("GET", "/v1/batches", "batch_list", _list_batches),
    (
        "GET",
        "/v1/batches/{batch_id}",
        "batch_retrieve",
        lambda s, r: in_thread(s.retrieve_batch, _batch_id(r)),
    ),
    ("POST", "/v1/batches/{batch_id}/cancel", "batch_cancel", lambda s, r: s.cancel_batch(_batch_id(r))),
    ("POST", "/_emulator/faults", None, _set_faults),
    ("GET", "/_emulator/stats", None, lambda state, r: state.stats()),
]


def create_app(
    embedder: Embedder, faults: FaultPlan | None = None, deployments: Mapping[str, str] | None = None
) -> FastAPI:
    """The emulator as an ASGI app; its state is at `app.state.emulator`."""
    return _build_app(EmulatorState(embedder, faults or FaultPlan(), deployments))


def _build_app(state: EmulatorState) -> FastAPI:
    return routed_app("OpenAI API emulator", state, ROUTE_TABLE, endpoint_for)


def endpoint_for(
    state: Any,
    route: str | None,
    handler: Callable[[Any, Request], Any],
    render: Callable[[ApiError], dict[str, Any]] = ApiError.body,
) -> Callable[[Request], Awaitable[Response]]:
    """One route: the fault gate (`state.admit`), the handler, and errors as `render` shapes them (each
    provider has its own error body)."""

    async def endpoint(request: Request) -> Response:
        from starlette.responses import JSONResponse, Response

        try:
            if request.url.path.startswith(AZURE_PREFIX):
                _check_azure(request)
            if route is not None:
                state.admit(route, _client(request))
            result = handler(state, request)
            result = await result if asyncio.iscoroutine(result) else result
        except ApiError as exc:
            return JSONResponse(render(exc), status_code=exc.status, headers=exc.headers)
        if isinstance(result, bytes):
            return Response(result, media_type="application/octet-stream")
        return JSONResponse(result)

    return endpoint


def _client(request: Request) -> str:
    """Clients are told apart by their API key (Azure's `api-key` header too), as the real rate limits are."""
    key = request.headers.get("api-key") or request.headers.get("authorization", "").removeprefix("Bearer ")
    return key.strip() or "anonymous"


class Emulator(LocalServer):
    """The OpenAI emulator, served on a free local port in a background thread.

    with Emulator(HashEmbedder()) as emu:
        client = OpenAI(base_url=emu.base_url, api_key="test", max_retries=0)
        azure = AzureOpenAI(azure_endpoint=emu.azure_endpoint, api_version="2024-10-21", api_key="test")

    `deployments` (Azure deployment name -> model) makes any other deployment a 404, as on Azure; None
    accepts every name.
    """

    def __init__(
        self,
        embedder: Embedder,
        faults: FaultPlan | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        deployments: Mapping[str, str] | None = None,
    ) -> None:
        self.state = EmulatorState(embedder, faults or FaultPlan(), deployments)
        super().__init__(_build_app(self.state), host=host, port=port, name="OpenAI emulator")

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def azure_endpoint(self) -> str:
        """What `AzureOpenAI(azure_endpoint=...)` takes: the SDK adds `/openai/...` and `api-version`."""
        return self.url

    def stats(self) -> dict[str, Any]:
        return self.state.stats()

    def set_faults(self, plan: FaultPlan) -> None:
        self.state.set_faults(plan)
