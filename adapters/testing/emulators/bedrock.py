"""A local Amazon Bedrock batch inference API (control plane and InvokeModel) over a local S3 server.

Speaks the REST-JSON wire format boto3 uses (routes and shapes from botocore's `bedrock` 2023-04-20 and
`bedrock-runtime` service models): CreateModelInvocationJob, GetModelInvocationJob, ListModelInvocationJobs,
StopModelInvocationJob and InvokeModel for Titan Text Embeddings V2. Jobs read their records from, and write
`<input file>.out` and `manifest.json.out` under `<output>/<job id>/` to, an S3-compatible server (moto's,
started here unless one is given). Faults are reindex_adapters.testing.emulators.faults' FaultPlan: its routes map onto
`batch_create`, `batch_retrieve`, `batch_list`, `batch_cancel` and `embeddings` (InvokeModel).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reindex.ports import Embedder
from reindex_adapters.remote.tokens import cl100k
from reindex_adapters.testing.emulators.faults import ApiError, FaultPlan, shape_output
from reindex_adapters.testing.emulators.openai import Ledger, ProviderState, shorten
from reindex_adapters.testing.emulators.server import LocalServer, in_thread, routed_app

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.requests import Request
    from starlette.responses import Response

ACCOUNT = "123456789012"
MODELS = {"amazon.titan-embed-text-v2:0": (256, 512, 1024)}
JOB_NAME = re.compile(r"[a-zA-Z0-9]{1,63}(-*[a-zA-Z0-9\+\-\.]){0,63}")  # botocore: ModelInvocationJobName
MAX_INPUT_TOKENS, MAX_INPUT_CHARACTERS = 8192, 50_000
STEPPING = ("Submitted", "Validating", "InProgress", "Stopping")
AWS_ERRORS = {  # our status -> (status, the error code boto3 reads from x-amzn-ErrorType)
    400: (400, "ValidationException"),
    401: (403, "AccessDeniedException"),
    404: (404, "ResourceNotFoundException"),
    409: (400, "ConflictException"),
    429: (429, "ThrottlingException"),
    500: (500, "InternalServerException"),
    503: (503, "ServiceUnavailableException"),
}
Handler = Callable[["BedrockState", "Request"], Any]


class AwsError(ApiError):
    """An error in the REST-JSON shape: `x-amzn-ErrorType: <code>` and `{"message": ...}`."""

    def __init__(
        self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(status, message, headers=headers)
        self.code = code


def aws_error(exc: ApiError) -> AwsError:
    """A FaultGate refusal (OpenAI-shaped) as Bedrock answers it; a 429 keeps its `retry-after` header."""
    if isinstance(exc, AwsError):
        return exc
    status, code = AWS_ERRORS.get(exc.status, (exc.status, "InternalServerException"))
    headers = {k: v for k, v in exc.headers.items() if k == "retry-after"}
    return AwsError(status, code, str(exc), headers)


@dataclass(slots=True)
class Job:
    data: dict[str, Any]  # the GetModelInvocationJob answer, updated in place
    plan: FaultPlan
    polls: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)
    input_name: str = "records.jsonl"

    @property
    def id(self) -> str:
        return str(self.data["jobArn"]).rsplit("/", 1)[-1]


@dataclass
class JobLedger(Ledger):
    """The provider's ledger in Bedrock's words: jobs, not batches."""

    creates: list[dict[str, Any]] = field(default_factory=list)  # every job created: name, id, time

    def describe(self) -> dict[str, Any]:
        batch = sum(tokens for tokens, job in self.billed if job)
        total = sum(tokens for tokens, _ in self.billed)
        return dict(
            billed_tokens=total,
            billed_tokens_batch=batch,
            billed_tokens_online=total - batch,
            billed=[{"tokens": t, "job_id": j} for t, j in self.billed],
            requests=dict(self.requests),
            jobs_created=len(self.creates),
            jobs=[dict(job) for job in self.creates],
        )


class BedrockState(ProviderState):
    """Jobs, besides what every emulator keeps (ProviderState); S3 is the local server's, reached through
    boto3."""

    def __init__(
        self, embedder: Embedder, faults: FaultPlan, s3: Any, *, region: str, min_records: int
    ) -> None:
        super().__init__(embedder, faults)
        self.ledger: JobLedger = JobLedger()
        self.s3, self.region, self.min_records = s3, region, min_records
        self.jobs: dict[str, Job] = {}

    # InvokeModel ------------------------------------------------------------------------------------

    def invoke(
        self, model: str, body: Mapping[str, Any], job_id: str | None = None, plan: FaultPlan | None = None
    ) -> dict[str, Any]:
        """One Titan Text Embeddings V2 request; bills its tokens when it succeeds."""
        sizes = MODELS.get(model)
        if sizes is None:
            raise AwsError(
                404, "ResourceNotFoundException", f"Could not resolve the foundation model from {model}."
            )
        text, dimensions = body.get("inputText"), body.get("dimensions", 1024)
        if not isinstance(text, str) or not text.strip() or dimensions not in sizes:
            raise AwsError(
                400,
                "ValidationException",
                "Malformed input request, please reformat your input and try again.",
            )
        tokens = len(cl100k().encode_ordinary(text))
        if tokens > MAX_INPUT_TOKENS or len(text) > MAX_INPUT_CHARACTERS:
            raise AwsError(400, "ValidationException", "Too many input tokens. Max input tokens: 8192.")
        poison = (plan or self.gate.plan).poison_substring
        if poison and poison in text:
            raise AwsError(400, "ValidationException", "The input text was refused by the model.")
        with self.lock:
            vectors = shorten(self.embedder.embed(self.embedder.tokenize([text])), dimensions)
            self.ledger.billed.append((tokens, job_id))
        return {"embedding": [float(x) for x in vectors[0]], "inputTextTokenCount": tokens}

    # the control plane ------------------------------------------------------------------------------

    def create(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], float]:
        """Create the job now; also return how long to hold back the answer (a slow create)."""
        for required in ("jobName", "roleArn", "modelId", "inputDataConfig", "outputDataConfig"):
            if not body.get(required):
                raise AwsError(
                    400, "ValidationException", f"1 validation error detected: {required} is required."
                )
        name = str(body["jobName"])
        if not JOB_NAME.fullmatch(name):
            raise AwsError(400, "ValidationException", f"jobName {name!r} does not match the pattern.")
        with self.lock:
            same = [job for job in self.jobs.values() if job.data["jobName"] == name]
            if (
                same
                and body.get("clientRequestToken")
                and same[0].data.get("clientRequestToken") == body["clientRequestToken"]
            ):
                return {"jobArn": same[0].data["jobArn"]}, 0.0  # the same request again: ignored
            if same:
                raise AwsError(400, "ConflictException", f"A job with the name {name} already exists.")
            if body["modelId"] not in MODELS:
                raise AwsError(
                    400,
                    "ValidationException",
                    f"The model {body['modelId']} is not supported for batch inference.",
                )
            job_id = secrets.token_hex(6)  # 12 lowercase alphanumerics, as the job identifier pattern says
            arn = f"arn:aws:bedrock:{self.region}:{ACCOUNT}:model-invocation-job/{job_id}"
            now = _timestamp()
            data = {
                "jobArn": arn,
                "jobName": name,
                "modelId": body["modelId"],
                "clientRequestToken": body.get("clientRequestToken"),
                "roleArn": body["roleArn"],
                "status": "Submitted",
                "submitTime": now,
                "lastModifiedTime": now,
                "inputDataConfig": body["inputDataConfig"],
                "outputDataConfig": body["outputDataConfig"],
                "timeoutDurationInHours": body.get("timeoutDurationInHours", 24),
            }
            self.jobs[job_id] = Job(data, self.gate.plan.for_batch(len(self.jobs)))
            self.ledger.creates.append({"name": name, "id": job_id, "submit_time": now})
            return {"jobArn": arn}, self.gate.create_delay()

    def get(self, identifier: str) -> dict[str, Any]:
        """Each get is one tick of the emulated clock; the job steps every `polls_per_step` ticks."""
        with self.lock:
            return self.tick(self._job(identifier), STEPPING, self._advance)

    def list(self, name_contains: str | None, max_results: int, next_token: str | None) -> dict[str, Any]:
        """Newest first, filtered by `nameContains`; `nextToken` is the position of the next page."""
        if not 1 <= max_results <= 1000:
            raise AwsError(400, "ValidationException", "maxResults must be between 1 and 1000.")
        with self.lock:
            jobs = [job.data for job in reversed(self.jobs.values())]
            matching = [dict(job) for job in jobs if not name_contains or name_contains in job["jobName"]]
        start = int(next_token) if next_token and next_token.isdigit() else 0
        answer: dict[str, Any] = {"invocationJobSummaries": matching[start : start + max_results]}
        if start + max_results < len(matching):
            answer["nextToken"] = str(start + max_results)
        return answer

    def stop(self, identifier: str) -> dict[str, Any]:
        with self.lock:
            job = self._job(identifier)
            if job.data["status"] not in ("Submitted", "Validating", "Scheduled", "InProgress"):
                raise AwsError(
                    400, "ConflictException", f"The job is {job.data['status']} and cannot be stopped."
                )
            self._set(job, "Stopping")
            return {}

    def _job(self, identifier: str) -> Job:
        job = self.jobs.get(identifier.rsplit("/", 1)[-1])
        if job is None:
            raise AwsError(404, "ResourceNotFoundException", f"The job {identifier} was not found.")
        return job

    def _advance(self, job: Job) -> None:
        status = job.data["status"]
        if status == "Submitted":
            self._set(job, "Validating")
        elif status == "Validating":
            self._validate(job)
        elif status == "InProgress":
            self._run(job)
        elif status == "Stopping":
            self._execute(job, job.plan.cancel_after or 0)
            self._set(job, "Stopped")

    def _validate(self, job: Job) -> None:
        """Read the records from S3; refuse a job that is not JSONL records or has too few of them."""
        bucket, key = _split(job.data["inputDataConfig"]["s3InputDataConfig"]["s3Uri"])
        try:
            content = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            records = [json.loads(line) for line in content.splitlines() if line.strip()]
        except (ValueError, self.s3.exceptions.NoSuchKey) as exc:
            self._fail(job, f"The input file could not be read: {type(exc).__name__}.")
            return
        if job.plan.fail_validation or any(not isinstance(r, dict) or "modelInput" not in r for r in records):
            self._fail(job, "Input file validation failed: every record needs recordId and modelInput.")
        elif len(records) < self.min_records:
            self._fail(job, f"The job has {len(records)} records, below the minimum of {self.min_records}.")
        else:
            job.records, job.input_name = records, key.rsplit("/", 1)[-1]
            job.data["totalRecordCount"] = len(records)
            self._set(job, "InProgress")

    def _run(self, job: Job) -> None:
        expire = job.plan.expire_after
        self._execute(job, len(job.records) if expire is None else expire)
        self._set(job, "Completed" if expire is None else "PartiallyCompleted")

    def _execute(self, job: Job, limit: int) -> None:
        """Answer the first `limit` records and write the output file and the manifest to S3."""
        lines, tokens, errors = [], 0, 0
        for position, record in enumerate(job.records[:limit]):
            answer: dict[str, Any] = {"recordId": record.get("recordId"), "modelInput": record["modelInput"]}
            try:
                if position < job.plan.failed_lines:
                    raise AwsError(job.plan.failed_line_status, "ModelErrorException", "The model failed.")
                output = self.invoke(job.data["modelId"], record["modelInput"], job.id, job.plan)
                answer["modelOutput"], tokens = output, tokens + output["inputTextTokenCount"]
            except AwsError as exc:
                answer["error"], errors = {"errorCode": exc.status, "errorMessage": str(exc)}, errors + 1
            lines.append(json.dumps(answer))
        counts = {
            "totalRecordCount": len(job.records),
            "processedRecordCount": len(lines),
            "successRecordCount": len(lines) - errors,
            "errorRecordCount": errors,
        }
        job.data.update(counts)
        bucket, prefix = _split(job.data["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"])
        folder = "/".join(filter(None, [prefix, job.id]))
        if not job.plan.delete_output:
            shaped = "".join(f"{line}\n" for line in shape_output(lines, job.plan, job.id))
            self.s3.put_object(Bucket=bucket, Key=f"{folder}/{job.input_name}.out", Body=shaped.encode())
        manifest = {**counts, "inputTokenCount": tokens, "outputTokenCount": 0}
        self.s3.put_object(
            Bucket=bucket, Key=f"{folder}/manifest.json.out", Body=json.dumps(manifest).encode()
        )

    def _fail(self, job: Job, message: str) -> None:
        job.data["message"] = message
        self._set(job, "Failed")

    @staticmethod
    def _set(job: Job, status: str) -> None:
        job.data.update(status=status, lastModifiedTime=_timestamp())
        if status in ("Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired"):
            job.data["endTime"] = job.data["lastModifiedTime"]


def _timestamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key.strip("/")


# the web layer ------------------------------------------------------------------------------------------


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except json.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        raise AwsError(400, "ValidationException", "The request body is not a JSON object.")
    return body


async def _create(state: BedrockState, request: Request) -> Any:
    answer, delay = state.create(await _json(request))
    await asyncio.sleep(delay)
    return answer


async def _invoke(state: BedrockState, request: Request) -> Any:
    model = str(request.path_params["model_id"])
    return await in_thread(state.invoke, model, await _json(request))


def _list(state: BedrockState, request: Request) -> Any:
    query = request.query_params
    size = query.get("maxResults", "100")
    if not size.isdigit():
        raise AwsError(400, "ValidationException", "maxResults must be an integer.")
    return state.list(query.get("nameContains"), int(size), query.get("nextToken"))


async def _set_faults(state: BedrockState, request: Request) -> Any:
    plan = FaultPlan.from_mapping(await _json(request))
    with state.lock:
        state.gate.plan = plan
    return plan.describe()


def _identifier(request: Request) -> str:
    return str(request.path_params["job"])


# method, path, route name for the fault gate (None: never refused), handler. An ARN in the path arrives
# percent-decoded, slashes included: the identifier is its last segment.
ROUTE_TABLE: list[tuple[str, str, str | None, Handler]] = [
    ("POST", "/model-invocation-job", "batch_create", _create),
    ("POST", "/model-invocation-job/{job:path}/stop", "batch_cancel", lambda s, r: s.stop(_identifier(r))),
    (
        "GET",
        "/model-invocation-job/{job:path}",
        "batch_retrieve",
        lambda s, r: in_thread(s.get, _identifier(r)),
    ),
    ("GET", "/model-invocation-jobs", "batch_list", _list),
    ("POST", "/model/{model_id}/invoke", "embeddings", _invoke),
    ("POST", "/_emulator/faults", None, _set_faults),
    ("GET", "/_emulator/stats", None, lambda state, r: state.stats()),
]


def build_app(state: BedrockState) -> FastAPI:
    return routed_app("Amazon Bedrock emulator", state, ROUTE_TABLE, _endpoint)


def _endpoint(
    state: BedrockState, route: str | None, handler: Handler
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        from starlette.responses import JSONResponse

        try:
            if route is not None:
                state.admit(route, _client(request))
            result = handler(state, request)
            result = await result if asyncio.iscoroutine(result) else result
        except ApiError as exc:
            error = aws_error(exc)
            headers = {**error.headers, "x-amzn-ErrorType": error.code}
            return JSONResponse({"message": str(error)}, status_code=error.status, headers=headers)
        return JSONResponse(result)

    return endpoint


def _client(request: Request) -> str:
    """Clients are told apart by the access key id in their SigV4 `Credential=` scope."""
    match = re.search(r"Credential=([^/,\s]+)", request.headers.get("authorization", ""))
    return match.group(1) if match else "anonymous"


class BedrockEmulator(LocalServer):
    """The Bedrock emulator on a free local port, with moto's S3 server beside it unless `s3_url` is given.

    with BedrockEmulator(HashEmbedder(dim=1024)) as emu:
        bedrock = boto3.client("bedrock", endpoint_url=emu.url, region_name="us-east-1")
        s3 = boto3.client("s3", endpoint_url=emu.s3_url, region_name="us-east-1")
    """

    def __init__(
        self,
        embedder: Embedder,
        faults: FaultPlan | None = None,
        *,
        region: str = "us-east-1",
        min_records: int = 100,
        s3_url: str | None = None,
        buckets: tuple[str, ...] = (),
    ) -> None:
        self._moto: Any = None
        self.region, self.s3_url, self.buckets = region, s3_url, buckets
        self.state = BedrockState(
            embedder, faults or FaultPlan(), None, region=region, min_records=min_records
        )
        super().__init__(build_app(self.state), name="Bedrock emulator")

    def start(self, timeout: float = 10.0) -> None:
        if self.s3_url is None:
            from moto.server import ThreadedMotoServer

            logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per S3 request
            self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            self._moto.start()
            host, port = self._moto.get_host_and_port()
            self.s3_url = f"http://{host}:{port}"
        self.state.s3 = self.s3_client()
        for bucket in self.buckets:
            self.state.s3.create_bucket(Bucket=bucket)
        super().start(timeout)

    def stop(self) -> None:
        super().stop()
        if self._moto is not None:
            self._moto.stop()
            self._moto = None

    def s3_client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.s3_url,
            region_name=self.region,
            aws_access_key_id="emulator",
            aws_secret_access_key="emulator",
        )

    def stats(self) -> dict[str, Any]:
        return self.state.stats()

    def set_faults(self, plan: FaultPlan) -> None:
        self.state.set_faults(plan)
