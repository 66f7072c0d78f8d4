"""What the Voyage emulator keeps and computes: /v1/embeddings answers, files, batches and their lifecycle.

Vectors are the embedder's (HashEmbedder in the tests), of the text behind Voyage's input_type prompt;
tokens are counted with a given tokenizer.json (`tokenizer`), else exactly with cl100k_base: the adapter,
which estimates without Voyage's tokenizer, is thus billed less than it estimated, as a real bill would be.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from reindex.ports import Embedder, Vectors
from reindex_adapters.testing.emulators.faults import (
    ApiError,
    FaultPlan,
    check_metadata,
    line_failure,
    shape_output,
)
from reindex_adapters.testing.emulators.openai import ProviderState, StoredFile
from reindex_adapters.testing.emulators.openai.provider import LineJob
from reindex_adapters.voyage.models import FLEXIBLE_DIMS, MAX_INPUTS, MODELS, model_limits

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# The prompts Voyage prepends for an input_type (the embeddings API reference)
PROMPTS = {
    "query": "Represent the query for retrieving supporting documents: ",
    "document": "Represent the document for retrieval: ",
}
RUNNING = ("validating", "in_progress", "finalizing", "cancelling")
REFUSED = "The input could not be processed."  # a poisoned input's message (the emulator's words)
EXPIRED = "This request could not be executed before the completion window expired."  # Voyage's words


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())


class VoyageState(ProviderState):
    """Files and batches, besides what every emulator keeps (ProviderState)."""

    def __init__(self, embedder: Embedder, faults: FaultPlan, tokenizer: Tokenizer | None = None) -> None:
        super().__init__(embedder, faults)
        self.tokenizer = tokenizer
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, LineJob] = {}

    # /v1/embeddings -------------------------------------------------------------------------------------

    def embeddings(
        self, body: Mapping[str, Any], *, client: str = "anonymous", batch: LineJob | None = None
    ) -> dict[str, Any]:
        """One embeddings request (online, or a batch line with the batch's request_params); bills it."""
        with self.lock:
            texts = _inputs(body.get("input"))
            dtype, encoding = self._options(body)
            counts = [min(n, model_limits(str(body["model"])).context) for n in self.count(texts)]
            limit = model_limits(str(body["model"])).request_tokens
            if sum(counts) > limit:  # Voyage's words and error_code (docs/providers/voyage.md, "sources")
                message = (
                    f"Request to model '{body['model']}' failed. The max allowed tokens per submitted batch is"
                    f" {limit}. Your batch has {sum(counts)} tokens after truncation. Please lower the number"
                    " of tokens in the batch."
                )
                raise ApiError(400, message, code="TOO_MANY_TOKENS_IN_BATCH")
            if batch is None:
                self.gate.meter(client, time.monotonic(), sum(counts))
            poison = (batch.plan if batch else self.gate.plan).poison_substring
            if poison and any(poison in text for text in texts):
                raise ApiError(400, f"Request to model '{body['model']}' failed. {REFUSED}")
            prompt = PROMPTS.get(str(body.get("input_type")), "")
            vectors = self.embedder.embed(self.embedder.tokenize([prompt + text for text in texts]))
            self.ledger.billed.append((sum(counts), batch.data["id"] if batch else None))
        data = [
            {"object": "embedding", "embedding": _encode(vector, dtype, encoding), "index": index}
            for index, vector in enumerate(vectors)
        ]
        return {
            "object": "list",
            "data": data,
            "model": body["model"],
            "usage": {"total_tokens": sum(counts)},
        }

    def count(self, texts: list[str]) -> list[int]:
        """Voyage's count (the SDK's `count_tokens`: special tokens included), or cl100k_base's."""
        if self.tokenizer is not None:
            return [len(encoding) for encoding in self.tokenizer.encode_batch(texts)]
        from reindex_adapters.remote.tokens import cl100k

        return [len(cl100k().encode_ordinary(text)) for text in texts]

    def _options(self, body: Mapping[str, Any]) -> tuple[str, str | None]:
        """Refuse what Voyage would, or what this emulator cannot compute; (output_dtype, encoding_format)."""
        model = MODELS.get(str(body.get("model")))
        if model is None:
            raise ApiError(400, f"Model {body.get('model')!r} is not supported by this emulator.")
        if body.get("input_type") not in (None, *PROMPTS):
            raise ApiError(400, "input_type must be one of None, 'query', 'document'.")
        size = body.get("output_dimension") or model.dim
        if body.get("output_dimension") is not None and (
            not model.is_flexible or body["output_dimension"] not in FLEXIBLE_DIMS
        ):
            raise ApiError(
                400, f"output_dimension {body['output_dimension']} is not supported by {body['model']}."
            )
        if size != self.embedder.info.dim:
            raise ApiError(
                400, f"this emulator serves {self.embedder.info.dim} dimensions: set output_dimension."
            )
        dtype = str(body.get("output_dtype") or "float")
        if dtype not in ("float", "int8", "uint8"):
            raise ApiError(400, f"output_dtype {dtype!r} is not served by this emulator.")
        if dtype != "float" and not model.is_flexible:
            raise ApiError(400, f"output_dtype {dtype!r} is not supported by {body['model']}.")
        return dtype, body.get("encoding_format")

    # files ----------------------------------------------------------------------------------------------

    def upload(self, filename: str, content: bytes, purpose: str) -> dict[str, Any]:
        if purpose != "batch":
            raise ApiError(400, f"Invalid purpose {purpose!r}: the Files API takes 'batch'.")
        if not filename.endswith(".jsonl"):
            raise ApiError(400, "The Batch API only supports .jsonl files.")
        return self.describe(self._store(filename, content, "batch"))

    def _store(self, filename: str, content: bytes, purpose: str) -> StoredFile:
        stored = StoredFile(f"file-{uuid.uuid4().hex}", filename, purpose, content)
        with self.lock:
            self.files[stored.id] = stored
        return stored

    def describe(self, stored: StoredFile) -> dict[str, Any]:
        return dict(
            id=stored.id,
            object="file",
            purpose=stored.purpose,
            filename=stored.filename,
            bytes=len(stored.content),
            created_at=_now(),
        )

    def file(self, file_id: str) -> StoredFile:
        with self.lock:
            stored = self.files.get(file_id)
            if stored is None or stored.is_deleted:
                raise ApiError(404, f"File {file_id} not found.")
            return stored

    def delete_file(self, file_id: str) -> dict[str, Any]:
        self.file(file_id).is_deleted = True
        return {"id": file_id, "object": "file", "deleted": True}

    # batches --------------------------------------------------------------------------------------------

    def create_batch(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], float]:
        """Create the batch now; also return how long to hold back the response (a slow create)."""
        with self.lock:
            if body.get("endpoint") not in ("/v1/embeddings", "v1/embeddings"):
                raise ApiError(400, "This emulator serves only the /v1/embeddings endpoint.")
            if body.get("completion_window") != "12h":
                raise ApiError(400, "completion_window must be '12h'.")
            params = body.get("request_params")
            if not isinstance(params, dict) or not params.get("model"):
                raise ApiError(400, "request_params must name a model.")
            stored = self.files.get(str(body.get("input_file_id")))
            if self.gate.unseen_file():
                raise ApiError(404, "Input file not found")
            if stored is None or stored.is_deleted or stored.purpose != "batch":
                raise ApiError(400, f"No batch input file {body.get('input_file_id')}.")
            metadata = check_metadata(body.get("metadata"))
            batch_id = f"batch-{uuid.uuid4().hex}"
            data: dict[str, Any] = dict(
                id=batch_id,
                object="batch",
                endpoint="/v1/embeddings",
                errors=None,
                input_file_id=stored.id,
                completion_window="12h",
                model=params["model"],
                request_params=dict(params),
                status="validating",
                output_file_id=None,
                error_file_id=None,
                request_counts={"total": 0, "completed": 0, "failed": 0},
                metadata=metadata,
                created_at=_now(),
                **dict.fromkeys(("in_progress_at", "finalizing_at", "completed_at", "failed_at")),
                **dict.fromkeys(("cancelling_at", "cancelled_at")),
            )
            self.batches[batch_id] = LineJob(data, self.gate.plan.for_batch(len(self.batches)))
            self.ledger.batches.append(
                {"id": batch_id, "metadata": metadata or {}, "created_at": data["created_at"]}
            )
            return dict(data), self.gate.create_delay()

    def get_batch(self, batch_id: str) -> dict[str, Any]:
        """Each get is one tick of the emulated clock; the batch steps every `polls_per_step` ticks."""
        with self.lock:
            return self.tick(self._batch(batch_id), RUNNING, self._advance)

    def list_batches(self, after: str | None, limit: int) -> dict[str, Any]:
        """Newest first; `after` is the last id of the previous page. No metadata filter (as Voyage's)."""
        if not 1 <= limit <= 100:
            raise ApiError(400, "limit must be between 1 and 100.")
        with self.lock:
            ids = list(reversed(self.batches))
            start = ids.index(after) + 1 if after in ids else 0
            page = [dict(self.batches[batch_id].data) for batch_id in ids[start : start + limit]]
        first, last = (page[0]["id"], page[-1]["id"]) if page else (None, None)
        more = start + limit < len(ids)
        return {"object": "list", "data": page, "first_id": first, "last_id": last, "has_more": more}

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        with self.lock:
            batch = self._batch(batch_id)
            if batch.data["status"] not in ("validating", "in_progress"):
                raise ApiError(400, f"Cannot cancel a batch with status {batch.data['status']!r}.")
            batch.data.update(status="cancelling", cancelling_at=_now())
            return dict(batch.data)

    def _batch(self, batch_id: str) -> LineJob:
        if batch_id not in self.batches:
            raise ApiError(404, f"Batch {batch_id} not found.")
        return self.batches[batch_id]

    def _advance(self, batch: LineJob) -> None:
        status, plan = batch.data["status"], batch.plan
        if status == "validating":
            self._validate(batch)
        elif status == "in_progress":  # the window closes (expire_after) or the server cancels (cancel_after)
            done = next(
                (n for n in (plan.expire_after, plan.cancel_after) if n is not None), len(batch.requests)
            )
            self._run(batch, done, expired=plan.expire_after is not None)
            cancelled = plan.expire_after is None and plan.cancel_after is not None
            batch.data.update(status="cancelling" if cancelled else "finalizing", finalizing_at=_now())
        elif status == "finalizing":
            batch.data.update(status="completed", completed_at=_now())
        elif status == "cancelling":
            if not (batch.outputs or batch.failures):
                self._run(batch, plan.cancel_after or 0, expired=False)
            batch.data.update(status="cancelled", cancelled_at=_now())

    def _validate(self, batch: LineJob) -> None:
        requests, errors = _parse(self.files[batch.data["input_file_id"]].content)
        if batch.plan.fail_validation and not errors:
            errors = [
                {
                    "code": "invalid_request",
                    "line": 1,
                    "message": "The request failed validation.",
                    "param": None,
                }
            ]
        if errors or len(requests) > 100_000:
            errors = errors or [
                {"code": "too_many_inputs", "line": None, "message": "At most 100K inputs.", "param": None}
            ]
            batch.data.update(status="failed", failed_at=_now(), errors={"object": "list", "data": errors})
            return
        batch.requests = requests
        batch.data.update(status="in_progress", in_progress_at=_now())
        batch.data["request_counts"]["total"] = len(requests)

    def _run(self, batch: LineJob, limit: int, *, expired: bool) -> None:
        """Run the first `limit` lines; with `expired`, the rest get Voyage's batch_expired line."""
        params = batch.data["request_params"]
        for position, request in enumerate(batch.requests[:limit]):
            try:
                if position < batch.plan.failed_lines:
                    raise line_failure(batch.plan.failed_line_status)
                body = self.embeddings({**params, "input": request["body"].get("input")}, batch=batch)
            except ApiError as exc:
                answer = {"status_code": exc.status, "message": exc.error["message"]}
                batch.failures.append(_line(batch, request, answer, None))
                continue
            batch.outputs.append(_line(batch, request, {"status_code": 200, "body": body}, None))
        if expired:
            error = {"code": "batch_expired", "message": EXPIRED}
            batch.failures += [_line(batch, request, None, error) for request in batch.requests[limit:]]
        self._write_files(batch)

    def _write_files(self, batch: LineJob) -> None:
        batch_id = batch.data["id"]
        if batch.outputs:
            lines = shape_output(batch.outputs, batch.plan, batch_id)
            output = self._store(f"batch_{batch_id}_output", _jsonl(lines), "batch-output")
            output.is_deleted = batch.plan.delete_output
            batch.data["output_file_id"] = output.id
        if batch.failures:
            batch.data["error_file_id"] = self._store(
                f"batch_{batch_id}_error", _jsonl(batch.failures), "batch-output"
            ).id
        completed = len(batch.outputs)
        batch.data["request_counts"].update(completed=completed, failed=len(batch.requests) - completed)


def _inputs(raw: Any) -> list[str]:
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not texts or not all(isinstance(text, str) for text in texts):
        raise ApiError(400, "input must be a string or a non-empty list of strings.")
    if len(texts) > MAX_INPUTS:
        raise ApiError(400, f"The maximum length of the input list is {MAX_INPUTS}.")
    return texts


def _encode(vector: Vectors, dtype: str, encoding: str | None) -> Any:
    """A vector as Voyage returns it: floats, or 8-bit integers for int8/uint8; base64 of the numpy array."""
    values: np.ndarray[Any, Any] = vector.astype("<f4")
    if dtype == "int8":
        values = np.clip(np.rint(vector * 127), -128, 127).astype(np.int8)
    elif dtype == "uint8":
        values = np.clip(np.rint((vector + 1) * 127.5), 0, 255).astype(np.uint8)
    if encoding == "base64":
        return base64.b64encode(values.tobytes()).decode("ascii")
    return [float(x) if dtype == "float" else int(x) for x in values]


def _parse(content: bytes) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    requests: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.splitlines(), start=1):
        try:
            request = json.loads(raw)
        except json.JSONDecodeError:
            errors.append(
                {"code": "invalid_json", "line": number, "message": "Not valid JSON.", "param": None}
            )
            continue
        custom_id = request.get("custom_id") if isinstance(request, dict) else None
        if not isinstance(custom_id, str) or custom_id in seen or not isinstance(request.get("body"), dict):
            message = "Each line needs a unique custom_id and a body."
            errors.append(
                {"code": "invalid_request", "line": number, "message": message, "param": "custom_id"}
            )
            continue
        seen.add(custom_id)
        requests.append(request)
    return requests, errors


def _line(batch: LineJob, request: Mapping[str, Any], response: Any, error: Any) -> str:
    return json.dumps(
        {
            "batch_id": batch.data["id"],
            "custom_id": request.get("custom_id"),
            "response": response,
            "error": error,
        }
    )


def _jsonl(lines: list[str]) -> bytes:
    return "".join(f"{line}\n" for line in lines).encode()
