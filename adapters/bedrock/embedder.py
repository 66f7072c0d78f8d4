"""Amazon Bedrock batch inference for Titan Text Embeddings V2, through boto3 (`bedrock`, `bedrock-runtime`, `s3`).

    submit: items → s3://<input>/<job name>/records.jsonl (+ records.json, recordId → custom_id)
            → CreateModelInvocationJob(jobName=<from the key>, clientRequestToken=<from the key>)
    poll:   GetModelInvocationJob → when terminal, every `*.jsonl.out` under s3://<output>/<job id>/
    release: delete the input, the record map and the job's output objects

A job's name is unique per account, so the name made from the key finds the job again after a crash
(ListModelInvocationJobs(nameContains=...)), and a create that timed out is adopted, never repeated.
Bedrock refuses a job with fewer records than its minimum, so a shard below it, and every line sent again,
goes through InvokeModel (the `online` job of reindex.run.deferred) instead.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import Field, field_validator

from reindex.errors import BackendError, ConfigError
from reindex.fingerprint import fingerprint
from reindex.offers import EmbedderOffer, Entry
from reindex.ports import (
    ONLINE,
    EmbedderInfo,
    EmbedderTraits,
    JobItem,
    JobResult,
    TokenCounts,
    Tokens,
    Vectors,
)
from reindex_adapters.bedrock.connection import (
    S3_URI,
    JobNameTaken,
    make_clients,
    once,
    split_s3_uri,
)
from reindex_adapters.bedrock.records import collect_records, embedding
from reindex_adapters.remote.errors import ProviderBusy, ProviderNotFound, ProviderRejected
from reindex_adapters.remote.jobs import create_once
from reindex_adapters.remote.pacing import Paced, Pacer
from reindex_adapters.remote.tokens import encoding, estimate_texts

T = TypeVar("T")
TITAN_V2 = "amazon.titan-embed-text-v2:0"
DIMENSIONS = (256, 512, 1024)  # Titan Text Embeddings V2's output sizes
# Titan V2 takes 8,192 tokens and 50,000 characters and truncates nothing (its model card). Its tokenizer is not
# published, so its counts are cl100k_base's with a margin: a chosen 25%, not a measured ratio, so that a cut
# text is rarely refused and the plan and budget err high. Bedrock bills its own count (inputTextTokenCount).
TITAN_ESTIMATE_FACTOR = 1.25
MAX_CHARACTERS = 50_000
TITAN_COUNTS = TokenCounts(
    False,
    f"estimate: cl100k_base x {TITAN_ESTIMATE_FACTOR} (Titan's tokenizer is not published), and at most "
    f"{MAX_CHARACTERS:,} characters",
)
PRICES_TAKEN = "2026-12-02"
# USD per 1M input tokens; see configs/pricing.toml [bedrock]. Titan V2's batch tier is priced as on-demand: AWS's
# page offers 50% off in batch for "select" models without naming Titan V2 (an older copy says batch costs the
# same), so the budget errs high until a bill shows otherwise (`prices = { batch = 0.01 }` then).
PRICES: dict[str, dict[str, float]] = {
    TITAN_V2: {"online": 0.02, "batch": 0.02},
}
UNCONFIRMED_BATCH_DISCOUNT = (
    "Bedrock's 50% batch discount is not confirmed for {model}: the batch tier is priced as on-demand"
    " (${price}/1M); set prices = {{ batch = ... }} in [embedder] when your bill shows the discount"
)
TERMINAL = frozenset({"Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired"})
JOB_PREFIX = "reindex-"
RECORDS, RECORD_MAP = "records.jsonl", "records.json"


def job_name(key: str) -> str:
    """The job's name, unique per account: `reindex-` and 40 hex digits of the key (a name is at most 63)."""
    return f"{JOB_PREFIX}{hashlib.sha256(key.encode()).hexdigest()[:40]}"


# the embedder -------------------------------------------------------------------------------------------


def _entries(model: str, _: str) -> list[Entry]:
    return [
        Entry(
            "kind",
            "bedrock-batch",
            "Bedrock batch inference; credentials from boto3's chain",
            above=("AWS credentials come from AWS_PROFILE, the AWS_* variables or an instance role",),
        ),
        Entry("model", model),
        Entry("region", "us-east-1", "your Bedrock region", fill_in=True),
        Entry(
            "role_arn",
            "arn:aws:iam::123456789012:role/bedrock-batch",
            "the service role Bedrock assumes",
            fill_in=True,
        ),
        Entry(
            "input_s3_uri",
            "s3://your-bucket/reindex/in",
            "where records are written for Bedrock",
            fill_in=True,
        ),
        Entry(
            "output_s3_uri", "s3://your-bucket/reindex/out", "where Bedrock writes its results", fill_in=True
        ),
        Entry("dimensions", 1024, "256, 512 or 1024 (part of the fingerprint)"),
    ]


class BedrockBatchEmbedder:
    """Titan Text Embeddings V2 through Bedrock batch inference; one record per text (`inputText`)."""

    offer: ClassVar[EmbedderOffer] = EmbedderOffer(
        _entries, no_key="credentials come from boto3's chain", claims=frozenset(PRICES)
    )  # what `reindex init` writes for it

    class Config(Paced):
        kind: Literal["bedrock-batch"]
        model: Literal["amazon.titan-embed-text-v2:0"] = "amazon.titan-embed-text-v2:0"
        region: str
        role_arn: str  # the service role Bedrock assumes to read the input and write the output
        input_s3_uri: str  # s3://bucket/prefix: each job's records go under <prefix>/<job name>/
        output_s3_uri: str  # s3://bucket/prefix: Bedrock writes under <prefix>/<job id>/
        dimensions: int = 1024
        normalize: bool = True
        max_tokens: int = Field(
            default=8192, gt=0
        )  # Titan V2's input limit, in estimated tokens (TITAN_COUNTS)
        min_records: int = Field(default=100, gt=0)  # the account's quotas (Service Quotas, Bedrock)
        max_records: int = Field(default=50_000, gt=0)
        endpoint_url: str | None = None  # bedrock and bedrock-runtime (a local emulator)
        s3_endpoint_url: str | None = None
        timeout_s: float = Field(default=60.0, gt=0)
        create_timeout_s: float = Field(default=60.0, gt=0)
        prices: dict[str, float] | None = None  # {"online": x, "batch": y} USD per 1M tokens

        @field_validator("dimensions")
        @classmethod
        def _titan_size(cls, value: int) -> int:
            if value not in DIMENSIONS:
                raise ValueError(f"Titan Text Embeddings V2 gives 256, 512 or 1024 dimensions, not {value}")
            return value

        @field_validator("input_s3_uri", "output_s3_uri")
        @classmethod
        def _is_s3(cls, value: str) -> str:
            if S3_URI.fullmatch(value) is None:
                raise ValueError(f"{value!r} is not an S3 URI; write s3://<bucket>/<prefix>")
            return value

    def __init__(self, clients: Mapping[str, Any], config: Config, *, pacer: Pacer | None = None) -> None:
        """`clients`: boto3 clients for "bedrock", "bedrock-runtime" and "s3", their own retries off."""
        self._bedrock, self._runtime, self._s3 = clients["bedrock"], clients["bedrock-runtime"], clients["s3"]
        self._create = clients.get("bedrock-create", self._bedrock)  # the same, with create_timeout_s
        self.config = config
        self._pacer = pacer or Pacer()
        self._codec = encoding("cl100k_base")
        options = {
            "dimensions": config.dimensions,
            "normalize": config.normalize,
            "max_tokens": config.max_tokens,
            "tokens": f"cl100k_base x {TITAN_ESTIMATE_FACTOR}",
            "max_characters": MAX_CHARACTERS,
        }
        identity = fingerprint("bedrock", config.model, config.dimensions, options)
        dim = config.dimensions
        self.info = EmbedderInfo("bedrock-batch", config.model, dim, config.max_tokens, identity, options)
        listed = PRICES.get(config.model, {})
        tiers: dict[str, float | None] = {
            tier: (config.prices or listed).get(tier) for tier in ("online", "batch")
        }
        self.traits = EmbedderTraits(
            remote=True,
            price_per_million=tiers["batch"],
            prices=tiers,
            stragglers_online=True,  # lines sent again are far fewer than a job's minimum records
        )
        unconfirmed = config.prices is None or "batch" not in config.prices
        self.price_caveats: tuple[str, ...] = (
            (UNCONFIRMED_BATCH_DISCOUNT.format(model=config.model, price=tiers["batch"]),)
            if unconfirmed and tiers["batch"] is not None
            else ()
        )
        self._maps: dict[str, dict[str, str]] = {}  # job arn -> recordId -> custom_id

    @classmethod
    def from_config(cls, config: Config) -> BedrockBatchEmbedder:
        pacer = Pacer.of(config)
        return cls(make_clients(config), config, pacer=pacer)

    token_counts = TITAN_COUNTS

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        """Estimated counts (`TITAN_COUNTS`), a text cut to fit the token and the character limits (Titan
        refuses, truncating nothing); billing is Bedrock's own `inputTextTokenCount`."""
        return estimate_texts(
            texts, self._codec, self.info.max_tokens, factor=TITAN_ESTIMATE_FACTOR, max_chars=MAX_CHARACTERS
        )

    # submitting ---------------------------------------------------------------------------------------

    def submit(self, key: str, items: Sequence[JobItem], *, isolate: bool = False) -> str:
        """Adopt the job named after `key`, else write its records and create it (never twice).

        Fewer items than `min_records`: Bedrock would refuse the job, so they go online (the core collects
        an `online` job through `embed_stragglers`). `isolate` changes nothing: a record holds one text.
        """
        if len(items) > self.config.max_records:
            raise ConfigError(
                f"a Bedrock batch job takes at most {self.config.max_records} records, got {len(items)}",
                hint=f"set [run] shard_size to at most {self.config.max_records}",
            )
        name = job_name(key)
        found = self._find(name)  # first: a job made before the shard lost documents is still adopted
        if found is not None:
            return found
        if len(items) < self.config.min_records:
            return ONLINE
        bucket, prefix = split_s3_uri(self.config.input_s3_uri)
        folder = "/".join(filter(None, [prefix, name]))
        records, mapping = self._records(items)
        self._put(bucket, f"{folder}/{RECORD_MAP}", json.dumps({"key": key, "records": mapping}).encode())
        self._put(bucket, f"{folder}/{RECORDS}", records)
        arn = self._create_job(key, name, f"s3://{bucket}/{folder}/{RECORDS}")
        self._maps[arn] = mapping
        return arn

    def _records(self, items: Sequence[JobItem]) -> tuple[bytes, dict[str, str]]:
        """The JSONL body (recordId: 11 digits, alphanumeric as the docs ask) and recordId → custom_id."""
        mapping = {f"{row:011d}": item.custom_id for row, item in enumerate(items)}
        lines = (
            json.dumps({"recordId": record_id, "modelInput": self._body(str(item.tokens.data))})
            for record_id, item in zip(mapping, items, strict=True)
        )
        return "".join(f"{line}\n" for line in lines).encode(), mapping

    def _body(self, text: str) -> dict[str, Any]:
        """InvokeModel's body for Titan Text Embeddings V2, which is also a batch record's modelInput."""
        return {"inputText": text, "dimensions": self.config.dimensions, "normalize": self.config.normalize}

    def _create_job(self, key: str, name: str, input_uri: str) -> str:
        """Create once; a ConflictException, timeout or 5xx means it may exist: adopt it by name."""
        create = functools.partial(
            self._create.create_model_invocation_job,
            jobName=name,
            roleArn=self.config.role_arn,
            clientRequestToken=hashlib.sha256(key.encode()).hexdigest()[:64],
            modelId=self.config.model,
            inputDataConfig={"s3InputDataConfig": {"s3Uri": input_uri, "s3InputFormat": "JSONL"}},
            outputDataConfig={"s3OutputDataConfig": {"s3Uri": self.config.output_s3_uri}},
        )
        return create_once(
            lambda: str(once(create)["jobArn"]),
            functools.partial(self._find, name),
            what=f"the batch job for key {key!r}",
            unsure=(JobNameTaken, ProviderBusy),
        )

    def _find(self, name: str) -> str | None:
        """The ARN of the job with exactly this name, over every page of the filtered listing."""
        token: str | None = None
        while True:
            options: dict[str, Any] = {"nameContains": name, "maxResults": 100}
            options.update({"nextToken": token} if token else {})
            page = self._call(functools.partial(self._bedrock.list_model_invocation_jobs, **options))
            for job in page.get("invocationJobSummaries", []):
                if job.get("jobName") == name:
                    return str(job["jobArn"])
            token = page.get("nextToken")
            if not token:
                return None

    # collecting ---------------------------------------------------------------------------------------

    def poll(self, job_id: str) -> JobResult:
        job = self._call(functools.partial(self._bedrock.get_model_invocation_job, jobIdentifier=job_id))
        status = str(job["status"])
        if status not in TERMINAL:
            return JobResult(status, False)
        mapping = self._map(job_id, job)
        if status == "Failed":  # validation refused it: nothing ran, nothing billed
            return JobResult(status, True, failed=dict.fromkeys(mapping.values(), "batch_failed:job_failed"))
        outputs = self._outputs(job)
        missing = {
            "PartiallyCompleted": "batch_expired",
            "Expired": "batch_expired",
            "Stopped": "batch_cancelled",
        }
        vectors, failed, billed = collect_records(
            mapping, outputs, self.info.dim, missing=missing.get(status)
        )
        return JobResult(status, True, vectors, failed, billed)

    def recall(self, job_id: str, items: Sequence[tuple[str, int]]) -> None:
        """recordId -> custom_id from the ledger (`RecallsItems`): the items in submit order, numbered as
        `_records` numbers them, so a process that did not submit the job needs no read of the input prefix
        (the tool's credentials may only write there)."""
        self._maps.setdefault(job_id, {f"{row:011d}": custom_id for row, (custom_id, _) in enumerate(items)})

    def _map(self, job_id: str, job: Mapping[str, Any]) -> dict[str, str]:
        """recordId -> custom_id: remembered, recalled, else the record map beside the input (a 0.2 job)."""
        if job_id not in self._maps:
            bucket, key = split_s3_uri(job["inputDataConfig"]["s3InputDataConfig"]["s3Uri"])
            content = self._get(bucket, key.rsplit("/", 1)[0] + f"/{RECORD_MAP}")
            if content is None:
                raise BackendError(
                    f"batch job {job_id} has no record map (not submitted by reindex, or released)"
                )
            self._maps[job_id] = dict(json.loads(content)["records"])
        return self._maps[job_id]

    def _outputs(self, job: Mapping[str, Any]) -> list[bytes] | None:
        """Every `.jsonl.out` the job wrote under <output>/<job id>/; None when there are none."""
        bucket, prefix = _output_folder(job)
        keys = [key for key in self._list(bucket, prefix) if key.endswith(".jsonl.out")]
        contents = [self._get(bucket, key) for key in keys]
        found = [content for content in contents if content is not None]
        return found or None

    def embed_stragglers(self, items: Sequence[JobItem]) -> JobResult:
        """InvokeModel, one text per request: a refused text fails alone, with the provider's code."""
        vectors: dict[str, Vectors] = {}
        failed: dict[str, str] = {}
        billed = 0
        for item in items:
            try:
                body = self._call(
                    functools.partial(self._invoke, str(item.tokens.data)), tokens=item.tokens.count
                )
            except ProviderRejected as exc:
                failed[item.custom_id] = exc.code
                continue
            result = embedding(body, self.info.dim)
            if isinstance(result, str):
                failed[item.custom_id] = result
            else:
                vectors[item.custom_id], billed = result, billed + int(body.get("inputTextTokenCount", 0))
        return JobResult(ONLINE, True, vectors=vectors, failed=failed, billed_tokens=billed)

    def _invoke(self, text: str) -> dict[str, Any]:
        answer = self._runtime.invoke_model(
            modelId=self.config.model,
            body=json.dumps(self._body(text)),
            contentType="application/json",
            accept="application/json",
        )
        body = json.loads(answer["body"].read())
        return body if isinstance(body, dict) else {}

    def release(self, job_id: str) -> None:
        """Delete the job's records, record map and outputs; already gone is fine."""
        job = self._call(functools.partial(self._bedrock.get_model_invocation_job, jobIdentifier=job_id))
        bucket, key = split_s3_uri(job["inputDataConfig"]["s3InputDataConfig"]["s3Uri"])
        folder = key.rsplit("/", 1)[0]
        for name in (RECORDS, RECORD_MAP):
            self._call(functools.partial(self._s3.delete_object, Bucket=bucket, Key=f"{folder}/{name}"))
        out_bucket, prefix = _output_folder(job)
        for name in self._list(out_bucket, prefix):
            self._call(functools.partial(self._s3.delete_object, Bucket=out_bucket, Key=name))
        self._maps.pop(job_id, None)

    # S3 and pacing ------------------------------------------------------------------------------------

    def _put(self, bucket: str, key: str, content: bytes) -> None:
        self._call(functools.partial(self._s3.put_object, Bucket=bucket, Key=key, Body=content))

    def _get(self, bucket: str, key: str) -> bytes | None:
        try:
            answer = self._call(functools.partial(self._s3.get_object, Bucket=bucket, Key=key))
        except ProviderNotFound:
            return None
        content: bytes = answer["Body"].read()
        return content

    def _list(self, bucket: str, prefix: str) -> list[str]:
        keys: list[str] = []
        token: str | None = None
        while True:
            options: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
            options.update({"ContinuationToken": token} if token else {})
            page = self._call(functools.partial(self._s3.list_objects_v2, **options))
            keys += [str(entry["Key"]) for entry in page.get("Contents", [])]
            token = page.get("NextContinuationToken")
            if not token:
                return keys

    def _call(self, request: Callable[[], T], *, tokens: int = 0) -> T:
        """Paced and retried (reads, and writes safe to repeat)."""
        return self._pacer.call(functools.partial(once, request), tokens=tokens)


def _output_folder(job: Mapping[str, Any]) -> tuple[str, str]:
    bucket, prefix = split_s3_uri(job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"])
    job_id = str(job["jobArn"]).rsplit("/", 1)[-1]
    return bucket, "/".join(filter(None, [prefix, job_id])) + "/"
