"""A local Mistral files + batch jobs API for embeddings, for tests and dry runs.

Point the official SDK at it: `Mistral(api_key=..., server_url=MistralEmulator(embedder).server_url)`.
The faults are the OpenAI emulator's FaultPlan (reindex_adapters.testing.emulators.faults), with the same route names:

    polls_per_step      job gets per status step (QUEUED → RUNNING → terminal); 0: terminal on one get
    expire_after        TIMEOUT_EXCEEDED with only the first K lines done (the rest never answered)
    cancel_after        CANCELLED (server side) after K lines
    slow_creates        the job exists at once, the create answers only after `create_delay_s`
    rate_limit(_on)     429 with Retry-After and retry-after-ms (the SDK's own retry reads both)
    server_errors(_on)  5xx
    poison_substring    a line whose input contains it is refused with Mistral's error object (400)
    failed_lines        the first K lines of each job fail with `failed_line_status`
    shuffle/duplicate/malformed_output_line, delete_output: the output file's faults
    fail_validation     the job FAILS before running (its `errors` say why)

Vectors are the embedder's (HashEmbedder: deterministic from the text); tokens are counted in mistral-embed's
own tokenizer (mistral-common v1, BOS included) and billed per answered line, as `usage.prompt_tokens`. An
input over 8,190 of them is refused (400), as the API refuses it: 8,190 embedded and 8,192 refused in
github.com/langchain-ai/langchain/issues/20523. The refusal's envelope is Mistral's error object (seen in
github.com/aurelio-labs/semantic-router/issues/297: `{"object": "error", "message", "type":
"invalid_request_error", "param": null, "code": null}`); its wording for one long input is not public, so
it is modelled on the per-request one quoted there ("Too many tokens in batch. Max is 16384 got 17555").
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from reindex.ports import Embedder
from reindex_adapters.testing.emulators.faults import ApiError, FaultPlan, line_failure, shape_output
from reindex_adapters.testing.emulators.openai import (
    ProviderState,
    StoredFile,
    endpoint_for,
    json_body,
    parse_multipart,
)
from reindex_adapters.testing.emulators.openai.provider import LineJob
from reindex_adapters.testing.emulators.server import LocalServer, in_thread, query_lists, routed_app

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.requests import Request

RUNNING = ("QUEUED", "RUNNING", "CANCELLATION_REQUESTED")
LIST_PARAMETERS = {
    "page",
    "page_size",
    "model",
    "agent_id",
    "created_after",
    "created_by_me",
    "status",
    "order_by",
}
INVALID_INPUT = "Invalid input: the text could not be embedded."


def error_body(exc: ApiError) -> dict[str, Any]:
    """Mistral's error object: `{object: "error", message, type, param, code}` at the top level."""
    return {"object": "error", **exc.error}


def _now() -> int:
    return int(time.time())


class MistralState(ProviderState):
    """Files and jobs, besides what every emulator keeps (ProviderState)."""

    def __init__(self, embedder: Embedder, faults: FaultPlan) -> None:
        super().__init__(embedder, faults)
        self.files: dict[str, StoredFile] = {}
        self.sample_types: dict[str, str] = {}  # file id -> batch_request, batch_result or batch_error
        self.jobs: dict[str, LineJob] = {}

    # files -------------------------------------------------------------------------------------------------

    def upload(self, filename: str, content: bytes, purpose: str) -> dict[str, Any]:
        if purpose not in ("batch", "fine-tune", "ocr"):
            raise ApiError(422, f"Invalid purpose {purpose!r}.", param="purpose")
        return self.describe(self._store(filename, content, purpose, "batch_request"))

    def _store(self, filename: str, content: bytes, purpose: str, sample_type: str) -> StoredFile:
        stored = StoredFile(str(uuid.uuid4()), filename, purpose, content)
        with self.lock:
            self.files[stored.id] = stored
            self.sample_types[stored.id] = sample_type
        return stored

    def describe(self, stored: StoredFile) -> dict[str, Any]:
        sample_type = self.sample_types[stored.id]
        return dict(
            id=stored.id,
            object="file",
            bytes=len(stored.content),
            created_at=stored.created_at,
            filename=stored.filename,
            purpose=stored.purpose,
            sample_type=sample_type,
            source="upload" if sample_type == "batch_request" else "mistral",
            num_lines=stored.content.count(b"\n"),
        )

    def file(self, file_id: str) -> StoredFile:
        with self.lock:
            stored = self.files.get(file_id)
            if stored is None or stored.is_deleted:
                raise ApiError(404, f"File {file_id} not found.", type="not_found", code="1001")
            return stored

    def delete_file(self, file_id: str) -> dict[str, Any]:
        self.file(file_id).is_deleted = True
        return {"id": file_id, "object": "file", "deleted": True}

    # jobs --------------------------------------------------------------------------------------------------

    def create_job(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], float]:
        """Create the job now; also return how long to hold back the response (a slow create)."""
        with self.lock:
            if body.get("endpoint") != "/v1/embeddings":
                raise ApiError(422, "This emulator serves only /v1/embeddings.", param="endpoint")
            inputs = [str(file_id) for file_id in body.get("input_files") or []]
            kinds = [self.sample_types[self.file(file_id).id] for file_id in inputs]
            if not inputs or any(kind != "batch_request" for kind in kinds):
                raise ApiError(422, "input_files must name uploaded batch files.", param="input_files")
            metadata = body.get("metadata")
            if metadata is not None and not all(isinstance(v, str) for v in dict(metadata).values()):
                raise ApiError(422, "metadata values must be strings.", param="metadata")
            job_id = str(uuid.uuid4())
            data: dict[str, Any] = dict(
                id=job_id,
                object="batch",
                input_files=inputs,
                metadata=metadata,
                endpoint=body["endpoint"],
                model=body.get("model"),
                output_file=None,
                error_file=None,
                errors=[],
                status="QUEUED",
                created_at=_now(),
                total_requests=0,
                completed_requests=0,
                succeeded_requests=0,
                failed_requests=0,
                started_at=None,
                completed_at=None,
            )
            self.jobs[job_id] = LineJob(data, self.gate.plan.for_batch(len(self.jobs)))
            self.ledger.batches.append(
                {"id": job_id, "metadata": metadata or {}, "created_at": data["created_at"]}
            )
            return dict(data), self.gate.create_delay()

    def get_job(self, job_id: str) -> dict[str, Any]:
        """Each get is one tick of the emulated clock; the job steps every `polls_per_step` ticks."""
        with self.lock:
            return self.tick(self._job(job_id), RUNNING, self._advance)

    def list_jobs(self, query: Mapping[str, list[str]]) -> dict[str, Any]:
        """Newest first, `page` of `page_size`; query parameters the listing does not define are the
        metadata filter (the SDK sends `metadata={"k": "v"}` exploded, as `?k=v`)."""
        page, size = int(query.get("page", ["0"])[0]), int(query.get("page_size", ["100"])[0])
        wanted = {key: values[-1] for key, values in query.items() if key not in LIST_PARAMETERS}
        statuses = set(query.get("status", []))
        with self.lock:
            found = [
                dict(job.data)
                for job in reversed(self.jobs.values())
                if all((job.data["metadata"] or {}).get(k) == v for k, v in wanted.items())
                and (not statuses or job.data["status"] in statuses)
            ]
        return {"data": found[page * size : (page + 1) * size], "object": "list", "total": len(found)}

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        with self.lock:
            job = self._job(job_id)
            if job.data["status"] in ("QUEUED", "RUNNING"):
                job.data["status"] = "CANCELLATION_REQUESTED"
            return dict(job.data)

    def _job(self, job_id: str) -> LineJob:
        if job_id not in self.jobs:
            raise ApiError(404, f"Batch job {job_id} not found.", type="not_found")
        return self.jobs[job_id]

    def _advance(self, job: LineJob) -> None:
        status = job.data["status"]
        if status == "QUEUED":
            self._validate(job)
        elif status == "RUNNING":
            plan = job.plan
            if plan.expire_after is not None:
                self._finish(job, plan.expire_after, "TIMEOUT_EXCEEDED")
            elif plan.cancel_after is not None:
                self._finish(job, plan.cancel_after, "CANCELLED")
            else:
                self._finish(job, len(job.requests), "SUCCESS")
        elif status == "CANCELLATION_REQUESTED":
            job.requests = job.requests or self._requests(job)[0]
            self._finish(job, job.plan.cancel_after or 0, "CANCELLED")

    def _validate(self, job: LineJob) -> None:
        requests, errors = self._requests(job)
        if job.plan.fail_validation and not errors:
            errors = ["Line 1: the request body failed validation."]
        if errors:
            job.data.update(
                status="FAILED", completed_at=_now(), errors=[{"message": e, "count": 1} for e in errors]
            )
            return
        job.requests = requests
        job.data.update(status="RUNNING", started_at=_now(), total_requests=len(requests))

    def _requests(self, job: LineJob) -> tuple[list[dict[str, Any]], list[str]]:
        requests: list[dict[str, Any]] = []
        errors: list[str] = []
        content = b"".join(self.files[file_id].content for file_id in job.data["input_files"])
        for number, raw in enumerate(content.splitlines(), start=1):
            try:
                request = json.loads(raw)
            except json.JSONDecodeError:
                errors.append(f"Line {number}: not valid JSON.")
                continue
            if not isinstance(request, dict) or not isinstance(request.get("body"), dict):
                errors.append(f"Line {number}: each line needs a `body`.")
                continue
            requests.append(request)
        return requests, errors

    def _finish(self, job: LineJob, limit: int, status: str) -> None:
        """Run the first `limit` lines (those past it are never answered), write the files, end in `status`."""
        for position, request in enumerate(job.requests[:limit]):
            try:
                if position < job.plan.failed_lines:
                    raise line_failure(job.plan.failed_line_status)
                body = self._embed(request["body"], job)
            except ApiError as exc:
                job.failures.append(_line(request, exc.status, error_body(exc)))
                continue
            job.outputs.append(_line(request, 200, body))
        if job.outputs:
            lines = shape_output(job.outputs, job.plan, job.data["id"])
            output = self._store(f"{job.data['id']}.jsonl", _jsonl(lines), "batch", "batch_result")
            output.is_deleted = job.plan.delete_output
            job.data["output_file"] = output.id
        if job.failures:
            errors = self._store(
                f"{job.data['id']}_error.jsonl", _jsonl(job.failures), "batch", "batch_error"
            )
            job.data["error_file"] = errors.id
        done = len(job.outputs) + len(job.failures)
        job.data.update(
            status=status,
            completed_at=_now(),
            completed_requests=done,
            succeeded_requests=len(job.outputs),
            failed_requests=len(job.failures),
        )

    def _embed(self, body: Mapping[str, Any], job: LineJob) -> dict[str, Any]:
        """One embeddings request of a job: Mistral's EmbeddingResponse; bills its tokens."""
        from reindex_adapters.mistral_tokens import MAX_TOKENS, count

        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        if (
            not isinstance(texts, list)
            or not texts
            or not all(isinstance(t, str) and t.strip() for t in texts)
        ):
            raise ApiError(400, INVALID_INPUT)
        poison = job.plan.poison_substring
        if poison and any(poison in text for text in texts):
            raise ApiError(400, INVALID_INPUT)
        counts = [count(text) for text in texts]
        if max(counts) > MAX_TOKENS:
            raise ApiError(400, f"Too many tokens in input. Max is {MAX_TOKENS} got {max(counts)}")
        vectors = self.embedder.embed(self.embedder.tokenize(texts))
        tokens = sum(counts)
        self.ledger.billed.append((tokens, job.data["id"]))
        data = [
            {"object": "embedding", "embedding": [float(x) for x in v], "index": i}
            for i, v in enumerate(vectors)
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}
        model = body.get("model") or job.data["model"]
        return {"id": uuid.uuid4().hex, "object": "list", "data": data, "model": model, "usage": usage}


def _line(request: Mapping[str, Any], status: int, body: Any) -> str:
    """An output or error line: `{custom_id, response: {status_code, body}, error}`."""
    return json.dumps(
        {
            "custom_id": request.get("custom_id"),
            "response": {"status_code": status, "body": body},
            "error": None,
        }
    )


def _jsonl(lines: list[str]) -> bytes:
    return "".join(f"{line}\n" for line in lines).encode()


# the web layer ---------------------------------------------------------------------------------------------


async def _upload(state: MistralState, request: Request) -> Any:
    fields = parse_multipart(request.headers.get("content-type", ""), await request.body())
    filename, content = fields.get("file", (None, b""))
    return state.upload(filename or "upload", content, fields.get("purpose", (None, b""))[1].decode())


async def _create(state: MistralState, request: Request) -> Any:
    job, delay = state.create_job(await json_body(request))
    await asyncio.sleep(delay)
    return job


def _file_id(request: Request) -> str:
    return str(request.path_params["file_id"])


def _job_id(request: Request) -> str:
    return str(request.path_params["job_id"])


# method, path, route name for the fault gate (None: never refused), handler (sync or async)
ROUTE_TABLE: list[tuple[str, str, str | None, Any]] = [
    ("POST", "/v1/files", "files", _upload),
    ("GET", "/v1/files/{file_id}", "files", lambda state, r: state.describe(state.file(_file_id(r)))),
    ("GET", "/v1/files/{file_id}/content", "files", lambda state, r: state.file(_file_id(r)).content),
    ("DELETE", "/v1/files/{file_id}", "files", lambda state, r: state.delete_file(_file_id(r))),
    ("POST", "/v1/batch/jobs", "batch_create", _create),
    ("GET", "/v1/batch/jobs", "batch_list", lambda s, r: s.list_jobs(query_lists(r))),
    ("GET", "/v1/batch/jobs/{job_id}", "batch_retrieve", lambda s, r: in_thread(s.get_job, _job_id(r))),
    ("POST", "/v1/batch/jobs/{job_id}/cancel", "batch_cancel", lambda s, r: s.cancel_job(_job_id(r))),
]


def create_app(embedder: Embedder, faults: FaultPlan | None = None) -> FastAPI:
    """The emulator as an ASGI app; its state is at `app.state.emulator`."""
    return _build_app(MistralState(embedder, faults or FaultPlan()))


def _build_app(state: MistralState) -> FastAPI:
    return routed_app(
        "Mistral API emulator", state, ROUTE_TABLE, functools.partial(endpoint_for, render=error_body)
    )


class MistralEmulator(LocalServer):
    """The emulator served locally: `with MistralEmulator(HashEmbedder(dim=1024)) as emu: ...emu.server_url`."""

    def __init__(
        self, embedder: Embedder, faults: FaultPlan | None = None, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.state = MistralState(embedder, faults or FaultPlan())
        super().__init__(_build_app(self.state), host=host, port=port, name="Mistral emulator")

    @property
    def server_url(self) -> str:
        """What `Mistral(server_url=...)` takes: the SDK adds `/v1/...`."""
        return self.url

    def stats(self) -> dict[str, Any]:
        return self.state.stats()

    def set_faults(self, plan: FaultPlan) -> None:
        self.state.set_faults(plan)

    def job(self, job_id: str) -> dict[str, Any]:
        """A job's wire object as it stands, without ticking its clock."""
        with self.state.lock:
            return dict(self.state._job(job_id).data)
