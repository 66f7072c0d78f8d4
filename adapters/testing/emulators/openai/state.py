"""The OpenAI emulator's state (EmulatorState): embeddings, files and batches as the provider keeps them,
the batch clock and its result files, and the traffic it served."""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reindex.ports import Embedder, Vectors
from reindex_adapters.testing.emulators.faults import (
    INVALID_INPUT,
    ApiError,
    FaultPlan,
    check_metadata,
    line_error,
    line_failure,
    parse_batch_input,
    parse_inputs,
    shape_output,
)
from reindex_adapters.testing.emulators.openai.provider import ProviderState

PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data")
STEPPING = ("validating", "in_progress", "finalizing", "cancelling")
UNSET_BATCH_FIELDS = (
    "errors",
    "output_file_id",
    "error_file_id",
    "model",
    "usage",
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)
UNFINISHED = {
    "batch_expired": "This request could not be executed before the completion window expired.",
    "batch_cancelled": "This request was not executed because the batch was cancelled.",
}


def _new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def _now() -> int:
    return int(time.time())


@dataclass(slots=True)
class StoredFile:
    id: str
    filename: str
    purpose: str
    content: bytes
    created_at: int = field(default_factory=_now)
    is_deleted: bool = False

    def describe(self) -> dict[str, Any]:
        return dict(
            id=self.id,
            object="file",
            bytes=len(self.content),
            created_at=self.created_at,
            filename=self.filename,
            purpose=self.purpose,
            status="processed",
        )


@dataclass(slots=True)
class BatchJob:
    data: dict[str, Any]  # the wire object, updated in place
    plan: FaultPlan  # the faults in force when it was created
    polls: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[str] | None = None
    failures: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return str(self.data["id"])


def encode_vector(vector: Vectors, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector]


def shorten(vectors: Vectors, dimensions: Any) -> Vectors:
    """text-embedding-3 style `dimensions`: keep the first d components and renormalise."""
    if dimensions is None:
        return vectors
    if not isinstance(dimensions, int) or not 1 <= dimensions <= vectors.shape[1]:
        message = f"Invalid value for 'dimensions' = {dimensions}. Must be between 1 and {vectors.shape[1]}."
        raise ApiError(400, message, param="dimensions")
    short = vectors[:, :dimensions]
    norms = np.linalg.norm(short, axis=1, keepdims=True)
    unit: Vectors = (short / np.where(norms == 0, 1, norms)).astype(np.float32)
    return unit


def _result_line(request: Mapping[str, Any], status: int, body: Any) -> str:
    response = {"status_code": status, "request_id": _new_id("req_"), "body": body}
    line = {
        "id": _new_id("batch_req_"),
        "custom_id": request["custom_id"],
        "response": response,
        "error": None,
    }
    return json.dumps(line)


def _unfinished_line(request: Mapping[str, Any], code: str, message: str | None = None) -> str:
    """A line the batch did not answer over HTTP: `response: null` and an `error` object."""
    error = {"code": code, "message": message or UNFINISHED[code]}
    line = {"id": _new_id("batch_req_"), "custom_id": request["custom_id"], "response": None, "error": error}
    return json.dumps(line)


def _failure_line(request: Mapping[str, Any], exc: ApiError, plan: FaultPlan) -> str:
    """A refused request in the error file: an HTTP answer, or (`poison_shape = "error"`) an error object."""
    if plan.poison_shape == "error" and exc.status == 400:
        return _unfinished_line(request, "invalid_request", str(exc))
    return _result_line(request, exc.status, exc.body())


class Traffic:
    """Online embeddings requests being served at once, and when each arrived (for rate checks)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.arrivals: list[float] = []

    @contextmanager
    def serving(self) -> Iterator[float]:
        """Count one request in flight while it is served; yields when it arrived."""
        arrived = time.monotonic()
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.arrivals.append(arrived)
        try:
            yield arrived
        finally:
            with self.lock:
                self.in_flight -= 1

    def describe(self) -> dict[str, Any]:
        with self.lock:
            return {"max_in_flight": self.max_in_flight, "arrivals": list(self.arrivals)}


class EmulatorState(ProviderState):
    """The OpenAI emulator's: files, batches and the traffic it served, besides what every emulator keeps."""

    def __init__(
        self, embedder: Embedder, faults: FaultPlan, deployments: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(embedder, faults)
        self.deployments = dict(deployments) if deployments is not None else None  # Azure: name -> model
        self.traffic = Traffic()
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, BatchJob] = {}

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {**super().stats(), "faults": self.gate.plan.describe(), **self.traffic.describe()}

    def embeddings(
        self,
        body: Mapping[str, Any],
        batch_id: str | None = None,
        plan: FaultPlan | None = None,
        client: str = "anonymous",
        arrived: float | None = None,
    ) -> Any:
        """One /v1/embeddings request; bills its tokens when it succeeds."""
        with self.lock:
            encoding_format = body.get("encoding_format", "float")
            if encoding_format not in ("float", "base64"):
                raise ApiError(400, f"Invalid encoding_format {encoding_format!r}.", param="encoding_format")
            if not body.get("model"):
                raise ApiError(400, "You must provide a model parameter.", param="model")
            parsed = parse_inputs(body.get("input"))
            if batch_id is None:
                arrived = time.monotonic() if arrived is None else arrived  # rate limits count arrivals
                self.gate.meter(client, arrived, sum(count for _, count in parsed))
            poison = (plan or self.gate.plan).poison_substring
            if poison and any(poison in text for text, _ in parsed):
                raise ApiError(400, INVALID_INPUT)
            vectors = self.embedder.embed(self.embedder.tokenize([text for text, _ in parsed]))
            vectors = shorten(vectors, body.get("dimensions"))
            tokens = sum(count for _, count in parsed)
            self.ledger.billed.append((tokens, batch_id))
        data = [
            {"object": "embedding", "index": i, "embedding": encode_vector(v, encoding_format)}
            for i, v in enumerate(vectors)
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return {"object": "list", "data": data, "model": body["model"], "usage": usage}

    def create_file(self, filename: str, content: bytes, purpose: str) -> dict[str, Any]:
        if purpose not in PURPOSES:
            raise ApiError(400, f"Invalid purpose {purpose!r}.", param="purpose")
        if purpose == "batch" and not filename.endswith(".jsonl"):
            raise ApiError(400, "Invalid file format for Batch API. Must be .jsonl", param="file")
        return self._store(filename, content, purpose).describe()

    def _store(self, filename: str, content: bytes, purpose: str) -> StoredFile:
        stored = StoredFile(_new_id("file-"), filename, purpose, content)
        with self.lock:
            self.files[stored.id] = stored
        return stored

    def file(self, file_id: str) -> StoredFile:
        with self.lock:
            stored = self.files.get(file_id)
            if stored is None or stored.is_deleted:
                raise ApiError(404, f"No such File object: {file_id}", param="id")
            return stored

    def file_content(self, file_id: str) -> bytes:
        """A file's bytes, as `GET /v1/files/{id}/content` serves them. The real API refuses a file uploaded
        with `purpose="user_data"`: `400 Not allowed to download files of purpose: user_data`, with no
        param (public captures of the real API: github.com/BasedHardware/omi/issues/3361, 2025-11;
        github.com/ogx-ai/ogx/pull/3946, linking the OpenAI community thread "why can't I download files
        with purpose user_data"); `batch` input files and batch output files download."""
        stored = self.file(file_id)
        if stored.purpose == "user_data":
            raise ApiError(400, "Not allowed to download files of purpose: user_data")
        return stored.content

    def delete_file(self, file_id: str) -> dict[str, Any]:
        self.file(file_id).is_deleted = True
        return {"id": file_id, "object": "file", "deleted": True}

    def create_batch(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], float]:
        """Create the batch now; also return how long to hold back the response (a slow create)."""
        with self.lock:
            input_file = self._batch_input(body)
            metadata = check_metadata(body.get("metadata"))
            created = _now()
            data = dict.fromkeys(UNSET_BATCH_FIELDS)
            batch_id = _new_id("batch_")
            data.update(
                id=batch_id,
                object="batch",
                endpoint=body["endpoint"],
                input_file_id=input_file.id,
                completion_window="24h",
                status="validating",
                created_at=created,
                expires_at=created + 86_400,
                request_counts={"total": 0, "completed": 0, "failed": 0},
                metadata=metadata,
            )
            self.batches[batch_id] = BatchJob(data, self.gate.plan.for_batch(len(self.batches)))
            self.ledger.batches.append({"id": batch_id, "metadata": metadata, "created_at": created})
            return dict(data), self.gate.create_delay()

    def _batch_input(self, body: Mapping[str, Any]) -> StoredFile:
        if body.get("endpoint") != "/v1/embeddings":
            raise ApiError(400, "This emulator serves only the /v1/embeddings endpoint.", param="endpoint")
        if body.get("completion_window") != "24h":
            raise ApiError(400, "completion_window must be '24h'.", param="completion_window")
        input_file = self.files.get(str(body.get("input_file_id")))
        if input_file is None or input_file.is_deleted or input_file.purpose != "batch":
            raise ApiError(400, f"No batch input file {body.get('input_file_id')}.", param="input_file_id")
        return input_file

    def retrieve_batch(self, batch_id: str) -> dict[str, Any]:
        """Each retrieve is one tick of the emulated clock; the batch steps every `polls_per_step` ticks."""
        with self.lock:
            return self.tick(self._job(batch_id), STEPPING, self._advance)

    def list_batches(self, after: str | None, limit: int) -> dict[str, Any]:
        """Newest first; `after` is the last id of the previous page."""
        if not 1 <= limit <= 100:
            raise ApiError(400, "limit must be between 1 and 100.", param="limit")
        with self.lock:
            ids = list(reversed(self.batches))
            if after is not None and after not in ids:
                raise ApiError(400, f"No such batch: {after}", param="after")
            start = 0 if after is None else ids.index(after) + 1
            page = [dict(self.batches[batch_id].data) for batch_id in ids[start : start + limit]]
        first, last = (page[0]["id"], page[-1]["id"]) if page else (None, None)
        more = start + limit < len(ids)
        return {"object": "list", "data": page, "first_id": first, "last_id": last, "has_more": more}

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        with self.lock:
            job = self._job(batch_id)
            status = job.data["status"]
            if status in ("validating", "in_progress"):
                job.data.update(status="cancelling", cancelling_at=_now())
            elif status not in ("cancelling", "cancelled"):
                raise ApiError(400, f"Cannot cancel a batch with status '{status}'.")
            return dict(job.data)

    def _job(self, batch_id: str) -> BatchJob:
        if batch_id not in self.batches:
            raise ApiError(404, f"No batch found with id '{batch_id}'.", param="batch_id")
        return self.batches[batch_id]

    def _advance(self, job: BatchJob) -> None:
        status = job.data["status"]
        if status == "validating":
            self._validate(job)
        elif status == "in_progress":
            self._run(job)
        elif status == "finalizing":
            self._close(job, "completed")
        elif status == "cancelling":
            if job.outputs is None:
                job.requests = job.requests or self._input(job)[0]
                self._execute(job, job.plan.cancel_after or 0, "batch_cancelled")
            self._close(job, "cancelled")

    def _input(self, job: BatchJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return parse_batch_input(self.files[job.data["input_file_id"]].content, job.data["endpoint"])

    def _validate(self, job: BatchJob) -> None:
        requests, errors = self._input(job)
        if job.plan.fail_validation and not errors:
            errors = [line_error(1, "invalid_request", "The request on this line failed validation.")]
        if errors:
            job.data.update(status="failed", failed_at=_now(), errors={"object": "list", "data": errors})
            return
        job.requests = requests
        job.data.update(status="in_progress", in_progress_at=_now(), model=requests[0]["body"].get("model"))
        job.data["request_counts"] = {"total": len(requests), "completed": 0, "failed": 0}

    def _run(self, job: BatchJob) -> None:
        plan = job.plan
        if plan.expire_after is not None:
            self._execute(job, plan.expire_after, "batch_expired")
            self._close(job, "expired")
        elif plan.cancel_after is not None:
            self._execute(job, plan.cancel_after, "batch_cancelled")
            job.data.update(status="cancelling", cancelling_at=_now())
        else:
            self._execute(job, len(job.requests), "batch_expired")
            job.data.update(status="finalizing", finalizing_at=_now())

    def _execute(self, job: BatchJob, limit: int, unfinished_code: str) -> None:
        """Run the first `limit` requests; the rest come back as unfinished lines with `unfinished_code`."""
        outputs, failures, tokens = [], [], 0
        for position, request in enumerate(job.requests):
            if position >= limit:
                failures.append(_unfinished_line(request, unfinished_code))
                continue
            try:
                if position < job.plan.failed_lines:
                    raise line_failure(job.plan.failed_line_status)
                body = self.embeddings(request["body"], batch_id=job.id, plan=job.plan)
            except ApiError as exc:
                failures.append(_failure_line(request, exc, job.plan))
                continue
            outputs.append(_result_line(request, 200, body))
            tokens += body["usage"]["prompt_tokens"]
        job.outputs, job.failures = outputs, failures
        job.data["request_counts"] = {
            "total": len(job.requests),
            "completed": len(outputs),
            "failed": len(failures),
        }
        job.data["usage"] = {
            "input_tokens": tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": tokens,
        }

    def _close(self, job: BatchJob, status: str) -> None:
        """Write the output and error files and enter the terminal `status`."""
        if job.outputs:
            lines = shape_output(job.outputs, job.plan, job.id)
            output = self._store(f"{job.id}_output.jsonl", _jsonl(lines), "batch_output")
            output.is_deleted = job.plan.delete_output
            job.data["output_file_id"] = output.id
        if job.failures:
            errors = self._store(f"{job.id}_error.jsonl", _jsonl(job.failures), "batch_output")
            job.data["error_file_id"] = errors.id
        job.data.update({"status": status, f"{status}_at": _now()})


def _jsonl(lines: list[str]) -> bytes:
    return "".join(f"{line}\n" for line in lines).encode()
