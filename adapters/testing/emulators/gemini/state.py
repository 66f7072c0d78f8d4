"""The state behind the Gemini emulator: files, upload sessions, batches as long-running operations, the
billing ledger and the fault gate, and Google's error shape. reindex_adapters.testing.emulators.gemini.app is its web layer."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reindex.ports import Embedder
from reindex_adapters.remote.tokens import cl100k
from reindex_adapters.testing.emulators.faults import ApiError, FaultPlan, line_failure, shape_output
from reindex_adapters.testing.emulators.openai import ProviderState

STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
BATCH_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1beta.EmbedContentBatch"
STEPS = ("BATCH_STATE_PENDING", "BATCH_STATE_RUNNING")  # then a terminal state


class GoogleError(Exception):
    """An error response in Google's shape; `details` as google.rpc.Status carries them."""

    def __init__(self, code: int, message: str, details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.details = code, message, details or []

    def body(self) -> dict[str, Any]:
        error = {"code": self.code, "message": self.message, "status": STATUS_NAMES.get(self.code, "UNKNOWN")}
        return {"error": {**error, "details": self.details}} if self.details else {"error": error}

    @classmethod
    def of(cls, exc: ApiError) -> GoogleError:
        """A FaultGate refusal in Google's words: a 429's Retry-After becomes RetryInfo's `retryDelay`."""
        millis = exc.headers.get("retry-after-ms")
        if exc.status != 429 or millis is None:
            return cls(exc.status, str(exc))
        info = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{int(millis) / 1000}s"}
        return cls(exc.status, str(exc), [info])


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(slots=True)
class StoredFile:
    name: str  # files/<id>
    display_name: str
    mime_type: str
    content: bytes = b""
    source: str = "UPLOADED"
    is_deleted: bool = False

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "displayName": self.display_name,
            "mimeType": self.mime_type,
            "sizeBytes": str(len(self.content)),
            "createTime": _now(),
            "state": "ACTIVE",
            "source": self.source,
        }


@dataclass(slots=True)
class Batch:
    operation: dict[str, Any]  # the wire object: {name, metadata: EmbedContentBatch, done}
    plan: FaultPlan  # the faults in force when it was created
    input_file: str
    polls: int = 0

    @property
    def metadata(self) -> dict[str, Any]:
        return dict(self.operation["metadata"])


class GeminiState(ProviderState):
    """Files, uploads and batches, besides what every emulator keeps (ProviderState)."""

    def __init__(self, embedder: Embedder, faults: FaultPlan) -> None:
        super().__init__(embedder, faults)
        self.files: dict[str, StoredFile] = {}
        self.uploads: dict[str, StoredFile] = {}
        self.batches: dict[str, Batch] = {}

    def admit(self, route: str, client: str) -> None:
        try:
            super().admit(route, client)
        except ApiError as exc:  # the fault gate's refusal, in Google's error shape
            raise GoogleError.of(exc) from None

    def stats(self) -> dict[str, Any]:
        with self.lock:
            early = dict(self.gate.early_requests)
            return {
                "billed_tokens": sum(tokens for tokens, _ in self.ledger.billed),
                "billed": [{"tokens": tokens, "batch": batch} for tokens, batch in self.ledger.billed],
                "requests": dict(self.ledger.requests),
                "batches_created": len(self.ledger.batches),
                "batches": [dict(batch) for batch in self.ledger.batches],
                "refused": {str(status): count for status, count in self.gate.refused.items()},
                "early_requests_total": sum(early.values()),
                "files": sum(not stored.is_deleted for stored in self.files.values()),
            }

    # files -------------------------------------------------------------------------------------------------

    def start_upload(self, meta: Mapping[str, Any], mime_type: str) -> str:
        stored = StoredFile(f"files/{secrets.token_hex(6)}", str(meta.get("displayName") or ""), mime_type)
        upload_id = secrets.token_hex(12)
        with self.lock:
            self.uploads[upload_id] = stored
        return upload_id

    def continue_upload(self, upload_id: str, chunk: bytes, *, is_final: bool) -> dict[str, Any] | None:
        with self.lock:
            stored = self.uploads.get(upload_id)
            if stored is None:
                raise GoogleError(404, f"No upload session {upload_id}.")
            stored.content += chunk
            if not is_final:
                return None
            del self.uploads[upload_id]
            self.files[stored.name] = stored
            return {"file": stored.describe()}

    def file(self, name: str) -> StoredFile:
        with self.lock:
            stored = self.files.get(name)
            if stored is None or stored.is_deleted:
                raise GoogleError(404, f"File {name} not found.")
            return stored

    def download(self, name: str) -> bytes:
        """A GENERATED file's bytes. An uploaded one is refused: "Files created by `upload` can't be
        downloaded" (google-genai's `files.download`, which refuses a File object without a download_uri
        before sending anything). The status the server gives a name is not documented: 403 is chosen."""
        stored = self.file(name)
        if stored.source != "GENERATED":
            raise GoogleError(403, f"File {name} was uploaded: only generated files can be downloaded.")
        return stored.content

    def delete_file(self, name: str) -> dict[str, Any]:
        self.file(name).is_deleted = True
        return {}

    # batches -----------------------------------------------------------------------------------------------

    def create_batch(self, model: str, body: Mapping[str, Any]) -> tuple[dict[str, Any], float]:
        found = body.get("batch")
        batch: dict[str, Any] = found if isinstance(found, dict) else {}
        source = batch.get("inputConfig") or {}
        file_name = str(source.get("file_name") or source.get("fileName") or "")
        with self.lock:
            if not batch.get("displayName"):
                raise GoogleError(400, "* EmbedContentBatch.display_name: A display name is required.")
            if file_name not in self.files or self.files[file_name].is_deleted:
                raise GoogleError(400, f"Input file {file_name!r} not found.")
            name = f"batches/{secrets.token_hex(10)}"
            metadata = {
                "@type": BATCH_TYPE,
                "model": model,
                "displayName": batch["displayName"],
                "inputConfig": {"fileName": file_name},
                "createTime": _now(),
                "updateTime": _now(),
                "state": STEPS[0],
                "name": name,
            }
            operation = {"name": name, "metadata": metadata, "done": False}
            self.batches[name] = Batch(operation, self.gate.plan.for_batch(len(self.batches)), file_name)
            self.ledger.batches.append({"name": name, "display_name": str(batch["displayName"])})
            return _copy(operation), self.gate.create_delay()

    def retrieve(self, name: str) -> dict[str, Any]:
        """Each get is one tick of the emulated clock; the batch steps every `polls_per_step` ticks."""
        with self.lock:
            batch = self._batch(name)
            batch.polls += 1
            steps = batch.plan.polls_per_step
            if steps <= 0:
                while not batch.operation["done"]:
                    self._advance(batch)
            elif batch.polls % steps == 0 and not batch.operation["done"]:
                self._advance(batch)
            return _copy(batch.operation)

    def list_batches(self, page_size: int, token: str | None) -> dict[str, Any]:
        with self.lock:
            names = list(reversed(self.batches))  # newest first
            start = int(token) if token and token.isdigit() else 0
            page = [
                json.loads(json.dumps(self.batches[n].operation)) for n in names[start : start + page_size]
            ]
        more = start + page_size < len(names)
        return {"operations": page, **({"nextPageToken": str(start + page_size)} if more else {})}

    def _batch(self, name: str) -> Batch:
        batch = self.batches.get(name)
        if batch is None:
            raise GoogleError(404, f"Batch {name} not found.")
        return batch

    def _advance(self, batch: Batch) -> None:
        metadata = batch.operation["metadata"]
        if metadata["state"] == STEPS[0]:
            metadata["state"] = STEPS[1]
        else:
            self._finish(batch)
        metadata["updateTime"] = _now()

    def _finish(self, batch: Batch) -> None:
        plan, metadata = batch.plan, batch.operation["metadata"]
        lines = self.files[batch.input_file].content.decode("utf-8", errors="replace").splitlines()
        requests = [_parse_line(raw) for raw in lines if raw.strip()]
        if plan.fail_validation or not requests:
            metadata["state"] = "BATCH_STATE_FAILED"
            batch.operation.update(
                done=True, error={"code": 3, "message": "The input file failed validation."}
            )
            return
        limit, state = len(requests), "BATCH_STATE_SUCCEEDED"
        if plan.expire_after is not None:
            limit, state = plan.expire_after, "BATCH_STATE_EXPIRED"
        elif plan.cancel_after is not None:
            limit, state = plan.cancel_after, "BATCH_STATE_CANCELLED"
        answered = [self._answer(batch, position, line) for position, line in enumerate(requests[:limit])]
        outputs = shape_output([json.dumps(line) for line in answered], plan, batch.operation["name"])
        failed = sum("error" in line for line in answered)
        metadata["batchStats"] = {
            "requestCount": str(len(requests)),
            "successfulRequestCount": str(len(answered) - failed),
            "failedRequestCount": str(failed),
            "pendingRequestCount": str(len(requests) - len(answered)),
        }
        if outputs:
            stored = StoredFile(
                f"files/{secrets.token_hex(6)}", "responses", "application/jsonl", source="GENERATED"
            )
            stored.content = "".join(f"{line}\n" for line in outputs).encode()
            stored.is_deleted = plan.delete_output
            self.files[stored.name] = stored
            metadata["output"] = {"responsesFile": stored.name}
        metadata["state"] = state
        metadata["endTime"] = _now()
        batch.operation.update(done=True, response={**metadata, "@type": BATCH_TYPE})

    def _answer(self, batch: Batch, position: int, line: dict[str, Any]) -> dict[str, Any]:
        key = line.get("key")
        try:
            if position < batch.plan.failed_lines:
                raise GoogleError.of(line_failure(batch.plan.failed_line_status))
            response = self._embed(line.get("request"), batch.plan, batch.operation["name"])
        except GoogleError as exc:
            return {"key": key, "error": exc.body()["error"]}
        return {"key": key, "response": response}

    def _embed(self, request: Any, plan: FaultPlan, batch: str) -> dict[str, Any]:
        """One EmbedContentRequest; bills its tokens (cl100k here) when it succeeds."""
        parts = request.get("content", {}).get("parts", []) if isinstance(request, dict) else []
        text = "".join(str(part.get("text", "")) for part in parts if isinstance(part, dict))
        if not text.strip():
            raise GoogleError(400, "* BatchEmbedContentsRequest.content: contains an empty Part.")
        if plan.poison_substring and plan.poison_substring in text:
            raise GoogleError(400, "Request contains an invalid argument.")
        vector = self.embedder.embed(self.embedder.tokenize([text]))[0]
        size = request.get("output_dimensionality", request.get("outputDimensionality"))
        if size is not None and not (isinstance(size, int) and 1 <= size <= len(vector)):
            raise GoogleError(400, f"* output_dimensionality must be between 1 and {len(vector)}.")
        tokens = len(cl100k().encode_ordinary(text))
        self.ledger.billed.append((tokens, batch))
        values = [float(x) for x in (vector[:size] if size else vector)]  # cut, not renormalised
        return {"embedding": {"values": values}, "tokenCount": str(tokens)}


def _copy(operation: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy to hand out: the state keeps changing the stored one."""
    copied: dict[str, Any] = json.loads(json.dumps(operation))
    return copied


def _parse_line(raw: str) -> dict[str, Any]:
    try:
        line = json.loads(raw)
    except json.JSONDecodeError:
        return {"key": None, "request": None}
    return line if isinstance(line, dict) else {"key": None, "request": None}
