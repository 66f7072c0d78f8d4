"""The Cohere emulator's state: datasets (validated from their upload, stored as Avro parts), embed jobs that
embed a dataset into another, and /v2/embed; what it bills; the faults of reindex_adapters.testing.emulators.faults
applied to each. The web layer (app.py) only parses and renders."""

from __future__ import annotations

import io
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from reindex.ports import Embedder
from reindex_adapters.testing.emulators.faults import ApiError, FaultPlan
from reindex_adapters.testing.emulators.openai import ProviderState

INVALID_TEXT = "the text could not be embedded"
NO_INPUT_TYPE = "invalid request: valid input_type must be provided with the provided model"
JOB_MODELS = (
    "embed-english-v3.0",
    "embed-multilingual-v3.0",
    "embed-english-light-v3.0",
    "embed-multilingual-light-v3.0",
)
MODELS = (*JOB_MODELS, "embed-v4.0")
MAX_TEXTS = 96
PARTS = "/_emulator/parts"
VALIDATING = ("queued", "processing")
EMPTY_FAILS = True  # a dataset whose every row was dropped fails validation (False: validates, empty)


def error_body(exc: ApiError) -> dict[str, Any]:
    """Cohere's error object: `{"message": ...}`."""
    return {"message": exc.error["message"]}


@dataclass(slots=True)
class Dataset:
    data: dict[str, Any]  # the wire object, less its parts' URLs (they name the host asked)
    content: bytes  # the upload (embed-input) or empty (embed-result)
    plan: FaultPlan
    keep: tuple[str, ...] = ()
    skip_malformed: bool = False
    rows: list[dict[str, Any]] = field(default_factory=list)
    parts: dict[str, bytes] = field(default_factory=dict)  # part id -> Avro file
    polls: int = 0
    is_deleted: bool = False


@dataclass(slots=True)
class Job:
    data: dict[str, Any]
    plan: FaultPlan
    polls: int = 0
    steps: int = 0


class CohereState(ProviderState):
    """Datasets and embed jobs, besides what every emulator keeps (ProviderState)."""

    def __init__(self, embedder: Embedder, faults: FaultPlan) -> None:
        super().__init__(embedder, faults)
        self.datasets: dict[str, Dataset] = {}
        self.jobs: dict[str, Job] = {}
        self._clock = 0.0
        self.uploads: list[str] = []  # the names of the datasets created, in order
        self.parts_read: Counter[str] = Counter()

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                **super().stats(),
                "datasets_created": len(self.uploads),
                "parts_read": dict(self.parts_read),  # dataset id -> its parts downloaded
                "dataset_names": list(self.uploads),
            }

    def now(self) -> str:
        """An ISO time, strictly later than the last one given (listings sort on it)."""
        self._clock = max(time.time(), self._clock + 1e-3)
        return datetime.fromtimestamp(self._clock, UTC).isoformat().replace("+00:00", "Z")

    # datasets ----------------------------------------------------------------------------------------------

    def create_dataset(self, query: Mapping[str, list[str]], content: bytes) -> tuple[dict[str, Any], float]:
        name, kind = _one(query, "name"), _one(query, "type")
        if not name:
            raise ApiError(400, "The name parameter must be set.")
        if len(name) >= 50:
            raise ApiError(400, "The name must be less than 50 characters long.")
        if kind != "embed-input":
            raise ApiError(400, "The dataset type is invalid.")
        with self.lock:
            dataset_id = f"{name[:20]}-{uuid.uuid4().hex[:6]}"
            data = self._wire(dataset_id, name, kind, "queued")
            data["preserve_fields"] = list(query.get("keep_fields", []))
            skip = _one(query, "skip_malformed_input").lower() in ("true", "1")
            self.datasets[dataset_id] = Dataset(
                data, content, self.gate.plan, tuple(query.get("keep_fields", [])), skip
            )
            self.uploads.append(name)
            return {"id": dataset_id}, self.gate.create_delay()

    def get_dataset(self, dataset_id: str, base: str) -> dict[str, Any]:
        """Each get is one tick of the emulated clock: validation steps every `polls_per_step` ticks."""
        with self.lock:
            dataset = self._dataset(dataset_id)
            dataset.polls += 1
            steps = dataset.plan.polls_per_step
            if steps <= 0:
                while dataset.data["validation_status"] in VALIDATING:
                    self._validate(dataset)
            elif dataset.polls % steps == 0 and dataset.data["validation_status"] in VALIDATING:
                self._validate(dataset)
            return {"dataset": self._describe(dataset, base)}

    def list_datasets(self, query: Mapping[str, list[str]], base: str) -> dict[str, Any]:
        """Newest first, `limit` from `offset`, filtered by `datasetType` and `validationStatus`."""
        kind, status = _one(query, "datasetType"), _one(query, "validationStatus")
        limit, offset = int(float(_one(query, "limit") or 10)), int(float(_one(query, "offset") or 0))
        with self.lock:
            found = [
                self._describe(d, base)
                for d in reversed(self.datasets.values())
                if not d.is_deleted
                and (not kind or d.data["dataset_type"] == kind)
                and (not status or d.data["validation_status"] == status)
            ]
        return {"datasets": found[offset : offset + limit]}

    def delete_dataset(self, dataset_id: str) -> dict[str, Any]:
        with self.lock:
            self._dataset(dataset_id).is_deleted = True
            return {}

    def part(self, part_id: str) -> bytes:
        with self.lock:
            for dataset_id, dataset in self.datasets.items():
                if part_id in dataset.parts and not dataset.is_deleted:
                    self.parts_read[dataset_id] += 1
                    return dataset.parts[part_id]
        raise ApiError(404, "not found")

    def _dataset(self, dataset_id: str) -> Dataset:
        dataset = self.datasets.get(dataset_id)
        if dataset is None or dataset.is_deleted:
            raise ApiError(404, f"The dataset with id '{dataset_id}' was not found.")
        return dataset

    def _wire(self, dataset_id: str, name: str, kind: str, status: str) -> dict[str, Any]:
        at = self.now()
        return dict(
            id=dataset_id,
            name=name,
            created_at=at,
            updated_at=at,
            dataset_type=kind,
            validation_status=status,
            validation_error=None,
            validation_warnings=[],
            required_fields=["text"],
            preserve_fields=[],
        )

    def _describe(self, dataset: Dataset, base: str) -> dict[str, Any]:
        parts = [
            {"id": part_id, "name": f"{part_id}.avro", "url": f"{base}{PARTS}/{part_id}", "index": index}
            for index, part_id in enumerate(dataset.parts)
        ]
        return {**dataset.data, "dataset_parts": parts}

    def _validate(self, dataset: Dataset) -> None:
        if dataset.data["validation_status"] == "queued":
            dataset.data["validation_status"] = "processing"
            return
        rows, warnings, error = self._parse(dataset)
        if error is None and not rows and EMPTY_FAILS:
            error = "the dataset has no valid rows"
        if error is not None:
            dataset.data.update(
                validation_status="failed", validation_error=error, validation_warnings=warnings
            )
            return
        dataset.rows = rows
        dataset.parts = {uuid.uuid4().hex: _avro(rows, ("text", *dataset.keep), embedded=False)}
        dataset.data.update(validation_status="validated", validation_warnings=warnings)

    def _parse(self, dataset: Dataset) -> tuple[list[dict[str, Any]], list[str], str | None]:
        """The rows kept, the warnings for rows dropped, and the error that fails the whole dataset."""
        if dataset.plan.fail_validation:
            return [], [], "invalid dataset: the file could not be parsed"
        rows: list[dict[str, Any]] = []
        warnings: list[str] = []
        for number, raw in enumerate(dataset.content.decode("utf-8", "replace").split("\n"), start=1):
            if not raw.strip():
                continue  # a blank line (the one after the last newline)
            row, why = _row(raw, dataset.keep, dataset.plan.poison_substring)
            if why is None:
                rows.append(row)
            elif dataset.skip_malformed:
                warnings.append(f"{why} (line: {number})")
            else:
                return [], [], f"{why} (line: {number})"
        return rows, warnings, None

    # jobs --------------------------------------------------------------------------------------------------

    def create_job(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], float]:
        with self.lock:
            if not body.get("input_type"):
                raise ApiError(400, NO_INPUT_TYPE)
            if body.get("model") not in JOB_MODELS:
                raise ApiError(
                    400, f"invalid request: model {body.get('model')!r} is not supported by embed jobs"
                )
            source = self._dataset(str(body.get("dataset_id")))
            if (
                source.data["dataset_type"] != "embed-input"
                or source.data["validation_status"] != "validated"
            ):
                raise ApiError(
                    400, "invalid request: the dataset must be an embed-input dataset that validated"
                )
            if not source.rows:
                raise ApiError(400, "invalid request: the dataset has no rows")
            job_id = str(uuid.uuid4())
            data: dict[str, Any] = dict(
                job_id=job_id,
                name=body.get("name"),
                status="processing",
                created_at=self.now(),
                input_dataset_id=source.data["id"],
                output_dataset_id=None,
                model=body["model"],
                truncate=body.get("truncate") or "END",
                meta={"api_version": {"version": "1"}},
            )
            self.jobs[job_id] = Job(data, self.gate.plan.for_batch(len(self.jobs)))
            self.ledger.batches.append({"id": job_id, "name": data["name"], "metadata": {}})
            return {"job_id": job_id, "meta": data["meta"]}, self.gate.create_delay()

    def get_job(self, job_id: str) -> dict[str, Any]:
        with self.lock:
            return self.tick(self._job(job_id), ("processing", "cancelling"), self._advance)

    def list_jobs(self) -> dict[str, Any]:
        with self.lock:
            return {"embed_jobs": [dict(job.data) for job in reversed(self.jobs.values())]}

    def cancel_job(self, job_id: str) -> bytes:
        with self.lock:
            job = self._job(job_id)
            if job.data["status"] == "processing":
                job.data["status"] = "cancelling"
            return b""

    def _job(self, job_id: str) -> Job:
        if job_id not in self.jobs:
            raise ApiError(404, f"embed job {job_id} not found")
        return self.jobs[job_id]

    def _advance(self, job: Job) -> None:
        """Two steps: the job starts, then ends (`cancelling` ends at once)."""
        plan, status = job.plan, job.data["status"]
        job.steps += 1
        if status not in ("processing", "cancelling") or (status == "processing" and job.steps < 2):
            return
        if status == "cancelling":
            self._finish(job, plan.cancel_after or 0, "cancelled")
        elif plan.expire_after is not None:
            self._finish(job, plan.expire_after, "failed")
        elif plan.cancel_after is not None:
            self._finish(job, plan.cancel_after, "cancelled")
        else:
            self._finish(job, None, "complete")

    def _finish(self, job: Job, limit: int | None, status: str) -> None:
        """Embed the input's first `limit` rows (all: None) less the `failed_lines`, write the output."""
        from reindex_adapters.remote.tokens import cl100k

        source = self.datasets[job.data["input_dataset_id"]]
        done = source.rows[job.plan.failed_lines : limit]
        texts = [row["text"] for row in done]
        vectors: Any = self.embedder.embed(self.embedder.tokenize(texts)) if texts else []
        tokens = sum(len(cl100k().encode_ordinary(text)) for text in texts)
        self.ledger.billed.append((tokens, job.data["job_id"]))
        rows = [
            {**row, "embeddings": {"float": [float(x) for x in vector], **dict.fromkeys(EMPTY_TYPES)}}
            for row, vector in zip(done, vectors, strict=True)
        ]
        output_id = f"{job.data['job_id'][:8]}-output"
        output = Dataset(
            self._wire(output_id, f"{job.data['name']}-output", "embed-result", "validated"), b"", job.plan
        )
        output.parts = {
            uuid.uuid4().hex: _avro(_shaped(rows, job.plan, output_id), ("text", *source.keep), embedded=True)
        }
        output.is_deleted = job.plan.delete_output
        self.datasets[output_id] = output
        job.data.update(
            status=status,
            output_dataset_id=output_id,
            meta={**job.data["meta"], "billed_units": {"input_tokens": tokens}},
        )

    # /v2/embed ---------------------------------------------------------------------------------------------

    def embed(self, body: Mapping[str, Any], client: str) -> dict[str, Any]:
        from reindex_adapters.remote.tokens import cl100k

        texts = body.get("texts")
        if body.get("model") not in MODELS:
            raise ApiError(404, f"model '{body.get('model')}' not found, make sure the model name is correct")
        if not body.get("input_type"):
            raise ApiError(400, NO_INPUT_TYPE)
        if (
            not isinstance(texts, list)
            or not 1 <= len(texts) <= MAX_TEXTS
            or not all(isinstance(t, str) for t in texts)
        ):
            raise ApiError(400, f"invalid request: texts must be a list of 1 to {MAX_TEXTS} strings")
        poison = self.gate.plan.poison_substring
        if poison and any(poison in text for text in texts):
            raise ApiError(400, f"invalid request: {INVALID_TEXT}")
        tokens = sum(len(cl100k().encode_ordinary(text)) for text in texts)
        with self.lock:
            self.gate.meter(client, time.monotonic(), tokens)
            self.ledger.billed.append((tokens, None))
        vectors = self.embedder.embed(self.embedder.tokenize(texts))
        return {
            "id": uuid.uuid4().hex,
            "response_type": "embeddings_by_type",
            "embeddings": {"float": [[float(x) for x in vector] for vector in vectors]},
            "texts": texts,
            "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}},
        }


EMPTY_TYPES = ("int8", "uint8", "binary", "ubinary")


def _row(raw: str, keep: tuple[str, ...], poison: str | None) -> tuple[dict[str, Any], str | None]:
    """A JSONL line's row, or why validation drops it."""
    try:
        line = json.loads(raw)
    except json.JSONDecodeError:
        return {}, "invalid json"
    if not isinstance(line, dict) or "text" not in line:
        return {}, "The required field text was not fund in the dataset"  # sic, Cohere's wording
    missing = [name for name in keep if name not in line]
    if missing:
        return {}, f"The required field {missing[0]} was not fund in the dataset"
    text = line["text"]
    if not isinstance(text, str) or not text.strip() or (poison and poison in text):
        return {}, INVALID_TEXT
    return {"text": text, **{name: line[name] for name in keep}}, None


def _shaped(rows: list[dict[str, Any]], plan: FaultPlan, seed: str) -> list[dict[str, Any]]:
    """The output's faults: shuffled, one row twice, one row without its vector."""
    rng = random.Random(f"{plan.seed}:{seed}")
    shaped = list(rows)
    if plan.shuffle_output and len(shaped) > 1:
        rng.shuffle(shaped)
        if shaped == rows:
            shaped = shaped[1:] + shaped[:1]
    if plan.duplicate_output_line and shaped:
        shaped.insert(rng.randrange(len(shaped) + 1), rng.choice(shaped))
    if plan.malformed_output_line and shaped:
        index = rng.randrange(len(shaped))
        shaped[index] = {**shaped[index], "embeddings": dict.fromkeys(("float", *EMPTY_TYPES))}
    return shaped


def _avro(rows: list[dict[str, Any]], fields: tuple[str, ...], *, embedded: bool) -> bytes:
    import fastavro

    values = ["null", "string", "long", "double", "boolean"]
    schema: list[dict[str, Any]] = [{"name": "text", "type": "string"}]
    schema += [{"name": name, "type": values} for name in fields if name != "text"]
    if embedded:
        vector = ["null", {"type": "array", "items": "double"}]
        types = [{"name": name, "type": vector, "default": None} for name in ("float", *EMPTY_TYPES)]
        record = {"type": "record", "name": "embeddings", "fields": types}
        schema.append({"name": "embeddings", "type": record})
    out = io.BytesIO()
    fastavro.writer(out, fastavro.parse_schema({"type": "record", "name": "row", "fields": schema}), rows)
    return out.getvalue()


def _one(query: Mapping[str, list[str]], name: str) -> str:
    values = query.get(name) or [""]
    return values[-1]
