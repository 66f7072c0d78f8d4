"""Cohere's Embed Jobs for embeddings (the v3.0 models), through the official `cohere` SDK.

    submit: find the job named after the key → else find or upload the embed-input dataset of that name
    poll:   the dataset validated → find or create the embed job of that name (neither create is ever retried)
            → when the job is terminal, read its embed-result dataset → vectors joined on each row's reindex_id,
            rows validation dropped (with Cohere's warning), billed from the job's `meta.billed_units`

Every input is a row of its own carrying its custom_id in a kept field (`keep_fields=["reindex_id"]`), so the
output joins on it whatever its order, and a refused row never fails another. Pacing, Retry-After and the
adopt-after-an-uncertain-create rule are the remote-provider toolkit's (reindex_adapters.remote).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from reindex.errors import ConfigError
from reindex.offers import EmbedderOffer, provider_entries
from reindex.ports import ONLINE, EmbedderTraits, JobItem, JobResult, TokenCounts, Tokens, Vectors
from reindex_adapters.cohere import datasets
from reindex_adapters.cohere.client import (
    BATCH_MODELS,
    COHERE_OPTIONS,
    COUNTS,
    Api,
    Settings,
    make_client,
    model_info,
    prices_for,
    tokenize,
    tokenizer,
)
from reindex_adapters.cohere.online import Requests
from reindex_adapters.remote.errors import ProviderNotFound
from reindex_adapters.remote.jobs import create_once
from reindex_adapters.remote.pacing import Pacer

if TYPE_CHECKING:
    from cohere import ClientV2, Dataset, EmbedJob

RUNNING = frozenset({"processing", "cancelling"})  # then "complete", "failed" or "cancelled"
UNANSWERED = {"failed": "batch_failed", "cancelled": "batch_cancelled"}  # rows a job left: sent again
UPLOADED = "dataset:"  # the job id submit gives before the job exists: "dataset:<the uploaded dataset's id>"
MAX_BYTES = 1_500_000_000  # "A Dataset can be as large as 1.5GB"
ESTIMATE_MARGIN = 1.25  # on cl100k estimates charged for a job that reports no billed_units


class CohereBatchEmbedder:
    """An embed-v3.0 model through Embed Jobs: one dataset and one job per key, both named after it (the key's
    digest), adopted by that name. A job takes only a validated dataset, so `submit` uploads and `poll` creates
    the job once validation is over: neither waits."""

    offer: ClassVar[EmbedderOffer] = EmbedderOffer(
        provider_entries("cohere-batch", "or cohere: online", *COHERE_OPTIONS),
        key_env="CO_API_KEY",
        claims=BATCH_MODELS,  # Embed Jobs take only the v3.0 models
    )  # what `reindex init` writes for it

    class Config(Settings):
        kind: Literal["cohere-batch"]
        create_timeout_s: float = Field(default=60.0, gt=0)
        stragglers_online: bool = False  # lines sent again go to /v2/embed instead of another job

        @model_validator(mode="after")
        def _batch_model(self) -> CohereBatchEmbedder.Config:
            if self.model not in BATCH_MODELS:
                raise ValueError(
                    f"Embed Jobs take only the v3.0 models ({', '.join(sorted(BATCH_MODELS))}); "
                    f'for {self.model} use kind "cohere"'
                )
            return self

    def __init__(self, client: ClientV2, config: Config, *, pacer: Pacer | None = None) -> None:
        self.config = config
        self.info = model_info("cohere-batch", config)
        self._api = Api(client, pacer or Pacer(), config.api_key_env)
        self._online = Requests(self._api, config, self.info.dim)
        self._codec = tokenizer()
        listed = prices_for(config.model, config.prices)
        self.traits = EmbedderTraits(
            remote=True,
            price_per_million=listed["batch"],
            prices=listed,
            completion_window_hours=24.0,  # Cohere documents none: `plan` counts a day
            stragglers_online=config.stragglers_online,
        )
        self.price_caveats: tuple[str, ...] = (
            "an embed job may report no billed_units: its tokens are then charged as cl100k estimates plus"
            f" {round((ESTIMATE_MARGIN - 1) * 100)}% (Cohere's own tokenizer counts differently)",
        )
        # the id submit gave -> each row's (custom_id, estimated tokens), in the order uploaded
        self._lines: dict[str, list[tuple[str, int]]] = {}
        self._started: dict[str, str] = {}  # dataset id -> its job's id

    @classmethod
    def from_config(cls, config: Config) -> CohereBatchEmbedder:
        client = make_client(config.base_url, config.api_key_env, config.timeout_s)
        return cls(client, config, pacer=Pacer.of(config))

    token_counts: TokenCounts = COUNTS

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        """cl100k_base counts, cut at `max_tokens`: an estimate for the plan and the budget (Cohere's tokenizer
        is fetched from the network); what was billed comes from the job's `meta.billed_units`."""
        return tokenize(texts, self._codec, self.info.max_tokens)

    # submitting -------------------------------------------------------------------------------------------

    def submit(self, key: str, items: Sequence[JobItem], *, isolate: bool = False) -> str:
        """Adopt the job named after `key`, else its dataset, else upload the dataset (never twice); the job is
        created by `poll` once the dataset has validated, so submit never waits (a SIGTERM is answered within
        seconds). Returns the job's id, or "dataset:<id>" until there is a job. Every input is already a row
        of its own, whatever `isolate` says."""
        content = datasets.input_file(items)
        if not items or len(content) > MAX_BYTES:
            raise ConfigError(
                f"an Embed Job's dataset holds 1 input to 1.5 GB, got {len(items)} inputs ({len(content):,} bytes)",
                hint="set [run] shard_size lower",
            )
        name = datasets.upload_name(key)
        job = self._find_job(name)
        if job is not None:
            job_id = job.job_id
        else:
            job_id = UPLOADED + (
                self._find_dataset(name)  # a crash may have left it without its job
                or create_once(
                    functools.partial(
                        datasets.create, self._api, name, content, self.config.create_timeout_s
                    ),
                    functools.partial(self._find_dataset, name),
                    what=f"the dataset {name}",
                )
            )
        self._lines[job_id] = [(item.custom_id, item.tokens.count) for item in items]
        return job_id

    def _find_dataset(self, name: str) -> str | None:
        found = datasets.find(self._api, name)
        return found.id if found is not None else None

    def _find_job(self, name: str) -> EmbedJob | None:
        """The newest embed job named `name`, in any status. The listing takes no filter and no page: it holds
        every job of the key's owner (docs: "all embed jobs history for that specific user")."""
        jobs = self._api.call(self._api.client.embed_jobs.list).embed_jobs or []
        found = [job for job in jobs if job.name == name]
        return max(found, key=lambda job: job.created_at) if found else None

    def _find_job_id(self, name: str) -> str | None:
        job = self._find_job(name)
        return job.job_id if job is not None else None

    def _start(self, dataset_id: str) -> str | JobResult:
        """The job of an uploaded dataset: known, found by the dataset's name, or created now that the dataset
        validated (once: an unanswered create is looked up by name); a JobResult while it validates, or once
        validation refused it."""
        if dataset_id in self._started:
            return self._started[dataset_id]
        dataset = datasets.get(self._api, dataset_id)
        if dataset is None:  # deleted (or 30 days old) before its job was made: every row is sent again
            return JobResult("dataset_deleted", True)
        if dataset.validation_status in datasets.VALIDATING:  # no job can have been made yet
            return JobResult(str(dataset.validation_status), False)
        job_id = self._find_job_id(dataset.name)
        lines = self._lines.get(UPLOADED + dataset_id, [])
        if job_id is None and (dataset.validation_status != "validated" or _all_dropped(dataset, lines)):
            return self._refused(dataset, lines)
        if job_id is None:
            create = functools.partial(
                self._api.client.embed_jobs.create,
                model=self.config.model,
                dataset_id=dataset_id,
                input_type=self.config.input_type,
                name=dataset.name,
                embedding_types=["float"],
                truncate=self.config.truncate,
                request_options={"timeout": self.config.create_timeout_s, "max_retries": 0},
            )

            def created() -> str:
                return str(self._api.once(create).job_id)

            find = functools.partial(self._find_job_id, dataset.name)
            job_id = create_once(created, find, what=f"the embed job {dataset.name}")
        self._started[dataset_id] = job_id
        return job_id

    # collecting -------------------------------------------------------------------------------------------

    def poll(self, job_id: str) -> JobResult:
        """The job's state; when terminal, its output joined on each row's id. For "dataset:<id>" (submitted,
        no job yet): the dataset's validation, then the job `_start` creates."""
        lines = self._lines.get(job_id)
        if job_id.startswith(UPLOADED):
            started = self._start(job_id.removeprefix(UPLOADED))
            if isinstance(started, JobResult):
                return started
            job_id = started
        job = self._get(job_id)
        if job.status in RUNNING:
            return JobResult(str(job.status), False)
        source = datasets.get(self._api, job.input_dataset_id)
        lines = lines if lines is not None else self._lines_of(job_id, source)
        output = datasets.get(self._api, job.output_dataset_id) if job.output_dataset_id else None
        found = datasets.rows(self._api, output, self.config.timeout_s) if output is not None else None
        is_deleted = job.output_dataset_id is not None and found is None
        vectors, failed = join(lines, found or [], self.info.dim)
        dropped = datasets.dropped(source.validation_warnings or [], [c for c, _ in lines]) if source else {}
        missing = "output_deleted" if is_deleted else UNANSWERED.get(str(job.status), "missing_output")
        for custom_id in (custom_id for custom_id, _ in lines if custom_id not in vectors):
            if custom_id in dropped:  # refused by validation: dead-lettered with Cohere's reason
                failed[custom_id] = f"row_dropped:{dropped[custom_id]}"
            else:
                failed.setdefault(custom_id, missing)
        billed = self._billed(job, lines, vectors, is_deleted)
        return JobResult(str(job.status), True, vectors, failed, billed)

    def _refused(self, dataset: Dataset, lines: Sequence[tuple[str, int]]) -> JobResult:
        """Validation refused the dataset whole: no job ran, nothing was billed. Rows its warnings name are
        refused with their reason (every row of a dataset can be dropped: an input sent alone); the others are
        sent again (`batch_failed:<Cohere's error>`), as a batch that failed validation is."""
        error = datasets.reason_of(str(dataset.validation_error or ""))
        order = [custom_id for custom_id, _ in lines]
        failed = {custom_id: f"batch_failed:{error}" for custom_id in order}
        failed |= {
            c: f"row_dropped:{why}"
            for c, why in datasets.dropped(dataset.validation_warnings or [], order).items()
        }
        return JobResult(str(dataset.validation_status), True, {}, failed, 0)

    def recall(self, job_id: str, items: Sequence[tuple[str, int]]) -> None:
        """The job's rows and their token estimates, from the ledger (`RecallsItems`): a process that did not
        submit it reads no part of its input dataset, which Cohere may not serve back (undocumented)."""
        self._lines.setdefault(job_id, list(items))

    def _lines_of(self, job_id: str, source: Dataset | None) -> list[tuple[str, int]]:
        """The job's rows and their estimated tokens: remembered from submit or recalled from the ledger, else
        read from its input dataset (a job polled without a ledger; rows validation dropped are not there,
        and come back as missing)."""
        if job_id not in self._lines and source is not None:
            found = datasets.rows(self._api, source, self.config.timeout_s) or []
            counts = [tokens.count for tokens in self.tokenize([str(row.get("text", "")) for row in found])]
            self._lines[job_id] = list(zip(datasets.ids_of(found), counts, strict=False))
        return self._lines.get(job_id, [])

    def _billed(
        self,
        job: EmbedJob,
        lines: Sequence[tuple[str, int]],
        vectors: Mapping[str, Vectors],
        is_deleted: bool,
    ) -> int:
        """The job's `meta.billed_units.input_tokens`; without it (no public example shows it on a job), the
        estimates of the rows that came back, or of every row when the output is gone (billed, but lost),
        plus ESTIMATE_MARGIN: cl100k counts may fall below Cohere's, and the budget errs high, never low."""
        units = job.meta.billed_units if job.meta is not None else None
        if units is not None and units.input_tokens is not None:
            return int(units.input_tokens)
        estimated = sum(tokens for custom_id, tokens in lines if is_deleted or custom_id in vectors)
        return math.ceil(estimated * ESTIMATE_MARGIN)

    def _get(self, job_id: str) -> EmbedJob:
        job: EmbedJob = self._api.call(functools.partial(self._api.client.embed_jobs.get, job_id))
        return job

    def embed_stragglers(self, items: Sequence[JobItem]) -> JobResult:
        """Lines sent again go through /v2/embed (`stragglers_online`): a refused text fails alone, with
        Cohere's code. Embed Jobs are not discounted, so this costs the same per token."""
        texts, counts = [str(item.tokens.data) for item in items], [item.tokens.count for item in items]
        out = np.full((len(items), self.info.dim), np.nan, dtype=np.float32)
        refused: dict[int, str] = {}
        billed = sum(
            self._online.rows(texts, counts, rows, out, refused) for rows in self._online.groups(len(items))
        )
        vectors = {item.custom_id: out[row] for row, item in enumerate(items) if row not in refused}
        failed = {
            items[row].custom_id: code.removeprefix("provider_rejected:") for row, code in refused.items()
        }
        return JobResult(ONLINE, True, vectors=vectors, failed=failed, billed_tokens=billed)

    def release(self, job_id: str) -> None:
        """Delete the job's input and output datasets; already gone is fine. The job record stays."""
        ids: list[str | None] = []
        given = job_id
        if job_id.startswith(UPLOADED):  # its job, if one was made (looked up, never created here)
            dataset_id = job_id.removeprefix(UPLOADED)
            dataset = datasets.get(self._api, dataset_id)
            found = self._find_job_id(dataset.name) if dataset is not None else None
            job_id, ids = self._started.get(dataset_id) or found or "", [dataset_id]
        if job_id:
            job = self._get(job_id)
            ids += [job.input_dataset_id, job.output_dataset_id]
        for dataset_id in dict.fromkeys(filter(None, ids)):
            try:
                self._api.call(functools.partial(self._api.client.datasets.delete, dataset_id))
            except ProviderNotFound:
                continue
        self._lines.pop(given, None)


def _all_dropped(dataset: Dataset, lines: Sequence[tuple[str, int]]) -> bool:
    """Validated, but its warnings drop every row uploaded: nothing for a job to embed (a row sent alone)."""
    order = [custom_id for custom_id, _ in lines]
    return bool(order) and len(datasets.dropped(dataset.validation_warnings or [], order)) == len(order)


def join(
    lines: Sequence[tuple[str, int]], found: Sequence[Mapping[str, Any]], dim: int
) -> tuple[dict[str, Vectors], dict[str, str]]:
    """Output rows joined on reindex_id, in any order, duplicates tolerated; a success wins."""
    wanted = {custom_id for custom_id, _ in lines}
    vectors: dict[str, Vectors] = {}
    failed: dict[str, str] = {}
    for row in found:
        custom_id = str(row.get(datasets.ID_FIELD))
        if custom_id not in wanted or custom_id in vectors:
            continue
        result = row_vector(row, dim)
        if isinstance(result, str):
            failed[custom_id] = result
        else:
            vectors[custom_id] = result
            failed.pop(custom_id, None)
    return vectors, failed


def row_vector(row: Mapping[str, Any], dim: int) -> Vectors | str:
    """An embed-result row's float vector (`{"embeddings": {"float": [...], "int8": null, ...}}`), or why not."""
    embeddings = row.get("embeddings")
    floats = embeddings.get("float") if isinstance(embeddings, dict) else embeddings
    if not isinstance(floats, list) or not floats:
        return "malformed_output"
    try:
        vector = np.asarray(floats, dtype=np.float32)
    except (TypeError, ValueError):
        return "malformed_output"
    return vector if vector.shape == (dim,) else "wrong_dimension"
