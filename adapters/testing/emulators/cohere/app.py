"""The Cohere emulator's web layer: the routes as the SDK calls them, the ASGI app and `CohereEmulator`, which
serves it on a local port."""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any

from reindex.ports import Embedder
from reindex_adapters.testing.emulators.cohere.state import PARTS, CohereState, error_body
from reindex_adapters.testing.emulators.faults import FaultPlan
from reindex_adapters.testing.emulators.openai import endpoint_for, json_body, parse_multipart
from reindex_adapters.testing.emulators.server import LocalServer, in_thread, query_lists, routed_app

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.requests import Request


def _base(request: Request) -> str:
    return str(request.base_url).rstrip("/")


async def _create_dataset(state: CohereState, request: Request) -> Any:
    fields = parse_multipart(request.headers.get("content-type", ""), await request.body())
    created, delay = state.create_dataset(query_lists(request), fields.get("data", (None, b""))[1])
    await asyncio.sleep(delay)
    return created


async def _create_job(state: CohereState, request: Request) -> Any:
    created, delay = state.create_job(await json_body(request))
    await asyncio.sleep(delay)
    return created


async def _embed(state: CohereState, request: Request) -> Any:
    key = request.headers.get("authorization", "").removeprefix("Bearer ").strip() or "anonymous"
    return await in_thread(state.embed, await json_body(request), key)


def _dataset_id(request: Request) -> str:
    return str(request.path_params["dataset_id"])


def _job_id(request: Request) -> str:
    return str(request.path_params["job_id"])


# method, path, route name for the fault gate (None: never refused), handler (sync or async)
ROUTE_TABLE: list[tuple[str, str, str | None, Any]] = [
    ("POST", "/v1/datasets", "files", _create_dataset),
    ("GET", "/v1/datasets", "files", lambda s, r: s.list_datasets(query_lists(r), _base(r))),
    ("GET", "/v1/datasets/{dataset_id}", "files", lambda s, r: s.get_dataset(_dataset_id(r), _base(r))),
    ("DELETE", "/v1/datasets/{dataset_id}", "files", lambda s, r: s.delete_dataset(_dataset_id(r))),
    ("GET", PARTS + "/{part_id}", None, lambda s, r: s.part(str(r.path_params["part_id"]))),
    ("POST", "/v1/embed-jobs", "batch_create", _create_job),
    ("GET", "/v1/embed-jobs", "batch_list", lambda s, r: s.list_jobs()),
    ("GET", "/v1/embed-jobs/{job_id}", "batch_retrieve", lambda s, r: in_thread(s.get_job, _job_id(r))),
    ("POST", "/v1/embed-jobs/{job_id}/cancel", "batch_cancel", lambda s, r: s.cancel_job(_job_id(r))),
    ("POST", "/v2/embed", "embeddings", _embed),
]


def create_app(embedder: Embedder, faults: FaultPlan | None = None) -> FastAPI:
    """The emulator as an ASGI app; its state is at `app.state.emulator`."""
    return _build_app(CohereState(embedder, faults or FaultPlan()))


def _build_app(state: CohereState) -> FastAPI:
    return routed_app(
        "Cohere API emulator", state, ROUTE_TABLE, functools.partial(endpoint_for, render=error_body)
    )


class CohereEmulator(LocalServer):
    """The emulator served locally: `with CohereEmulator(HashEmbedder(dim=1024)) as emu: ...emu.base_url`."""

    def __init__(
        self, embedder: Embedder, faults: FaultPlan | None = None, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.state = CohereState(embedder, faults or FaultPlan())
        super().__init__(_build_app(self.state), host=host, port=port, name="Cohere emulator")

    @property
    def base_url(self) -> str:
        """What `cohere.ClientV2(base_url=...)` takes: the SDK adds `v1/...` and `v2/...`."""
        return self.url

    def stats(self) -> dict[str, Any]:
        return self.state.stats()

    def set_faults(self, plan: FaultPlan) -> None:
        self.state.set_faults(plan)

    def job(self, job_id: str) -> dict[str, Any]:
        """A job's wire object as it stands, without ticking its clock."""
        with self.state.lock:
            return dict(self.state._job(job_id).data)

    def dataset(self, dataset_id: str) -> dict[str, Any]:
        """A dataset's wire object (deleted ones too), without ticking its clock."""
        with self.state.lock:
            return {
                **self.state.datasets[dataset_id].data,
                "is_deleted": self.state.datasets[dataset_id].is_deleted,
            }
