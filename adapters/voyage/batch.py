"""The `voyage-batch` embedder: Voyage's Batch API, one JSONL file per job, adopted by its key after a crash.

    submit: list batches (every page) for one whose metadata carries the key → else upload the input file
            (`purpose=batch`) and create the batch (`endpoint=/v1/embeddings`, `completion_window=12h`,
            `request_params`, `metadata={"reindex_key": key}`), never repeating an uncertain create
    poll:   get the batch → when terminal, download its output and error files → vectors, refusals, usage

Statuses (docs.voyageai.com/docs/batch-inference, "Batch lifecycle"): validating → in_progress → finalizing →
completed; validating → failed; cancelling → cancelled. A batch the 12-hour window closes on completes with
the lines it finished; the others are in its error file as `batch_expired`, and are sent again.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import Field

from reindex.capabilities import Traffic
from reindex.errors import BackendError, ConfigError, TransientError
from reindex.offers import EmbedderOffer, provider_entries
from reindex.ports import EmbedderTraits, JobItem, JobResult, Tokens
from reindex_adapters.remote.errors import ProviderBusy, ProviderNotFound
from reindex_adapters.remote.jobs import KeyIndex, create_once
from reindex_adapters.remote.lines import billed_tokens, collect_lines
from reindex_adapters.remote.pacing import Pacer
from reindex_adapters.voyage.client import VoyageApi
from reindex_adapters.voyage.lines import input_file, input_lines, read_line
from reindex_adapters.voyage.models import (
    MODELS,
    PRICES,
    VOYAGE_OPTIONS,
    VoyageSettings,
    identity,
    prices_for,
    request_params,
)
from reindex_adapters.voyage.online import VoyageEmbedder
from reindex_adapters.voyage.tokens import TokenCounter

MAX_BATCH_INPUTS = 100_000  # "Each batch can contain up to 100K inputs" (Batch Inference guide)
KEY_FIELD = "reindex_key"  # batch metadata: at most 16 pairs, values up to 512 characters
RUNNING = frozenset({"validating", "in_progress", "finalizing", "cancelling", "canceling"})
# The statuses after which nothing more comes. The guide's table lists completed, failed and cancelled; its own
# Batch object examples also carry `partially_completed_at` (and `canceled_at` beside `cancelled_at`), and the
# window closing is read as expired. Any other status (`partial_finalizing`, whose `partial_finalizing_at` the
# examples show) is taken as running: reading a batch before its files exist would send every line again
# while the old batch still bills. One that stays unknown past the window is an error that says so.
TERMINAL = frozenset({"completed", "failed", "cancelled", "canceled", "expired", "partially_completed"})
WINDOW_S = 12 * 3600  # the Batch API's completion window
GRACE_S = 2 * 3600  # how long past it a batch may stay in a status the tool does not know
# Lines a terminal batch never answered (no line in either file): sent again (reindex.run.deferred.RETRYABLE)
UNANSWERED = {
    "cancelled": "batch_cancelled",
    "canceled": "batch_cancelled",
    "expired": "batch_expired",
    "partially_completed": "batch_expired",
}
PAGE = 100  # the listing's largest `limit`


class UncertainCreate(TransientError):
    """A create that may have made the batch (a timeout, a dropped connection, a 5xx): look before retrying."""


class VoyageBatchEmbedder:
    """Voyage's Batch API; see the module docstring. Every input is a line of its own (custom_id = the
    item's), so a refused input fails no other and any process can read a job's lines from its input file."""

    offer: ClassVar[EmbedderOffer] = EmbedderOffer(
        provider_entries("voyage-batch", "or voyage: online", *VOYAGE_OPTIONS),
        key_env="VOYAGE_API_KEY",
        claims=frozenset(PRICES),
    )  # what `reindex init` writes for it

    class Config(VoyageSettings):
        kind: Literal["voyage-batch"]
        create_timeout_s: float = Field(default=60.0, gt=0)
        stragglers_online: bool = (
            False  # lines a batch left go to /v1/embeddings (online price), not a new batch
        )

    def __init__(
        self,
        api: VoyageApi,
        settings: VoyageSettings,
        *,
        create_timeout_s: float = 60.0,
        stragglers_online: bool = False,
    ) -> None:
        known = MODELS.get(settings.model)
        if known is not None and not known.in_batch:
            raise ConfigError(
                f"Voyage's Batch API does not serve {settings.model}", hint='use kind = "voyage"'
            )
        self._api, self._create_timeout_s = api, create_timeout_s
        self.info = identity("voyage-batch", settings)
        self._params = request_params(settings)
        self._counter = TokenCounter(settings.model, self.info.max_tokens, settings.tokenizer_path)
        self.token_counts = self._counter.counts_are
        listed = prices_for(settings.model, settings.prices)
        self.traits = EmbedderTraits(
            remote=True,
            price_per_million=listed["batch"],
            prices=listed,
            completion_window_hours=12.0,  # Voyage's only window: what `plan` counts against a deadline
            stragglers_online=stragglers_online,
        )
        self._online = VoyageEmbedder(api, settings, counter=self._counter)
        self._lines: dict[str, dict[str, int]] = {}  # batch id -> its custom_ids' estimated tokens
        self._index: KeyIndex[dict[str, Any]] = KeyIndex(
            self._listing,
            id_of=lambda batch: str(batch.get("id")),
            key_of=lambda batch: (batch.get("metadata") or {}).get(KEY_FIELD),
            worth=lambda batch: True,  # any status: a failed Voyage batch is adopted, its lines sent again
        )

    @classmethod
    def from_config(cls, config: Config) -> VoyageBatchEmbedder:
        api = VoyageApi.connect(config.base_url, config.api_key_env, config.timeout_s, Pacer.of(config))
        return cls(
            api, config, create_timeout_s=config.create_timeout_s, stragglers_online=config.stragglers_online
        )

    @property
    def traffic(self) -> Traffic:
        return self._api.pacer.traffic.describe()

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        """Exact with Voyage's tokenizer when this machine has it, else an estimate on the high side
        (`token_counts` says which); the tokens billed come from each answered line's usage."""
        return self._counter.tokenize(texts)

    def embed_stragglers(self, items: Sequence[JobItem]) -> JobResult:
        return self._online.embed_stragglers(items)

    def submit(self, key: str, items: Sequence[JobItem], *, isolate: bool = False) -> str:
        """Adopt the batch already carrying `key`, else upload and create one. Every input is sent alone
        whatever `isolate` says: one line per input."""
        if not items or len(items) > MAX_BATCH_INPUTS:
            raise ConfigError(
                f"a Voyage batch takes 1 to {MAX_BATCH_INPUTS:,} inputs, got {len(items)}",
                hint=f"set [run] shard_size to at most {MAX_BATCH_INPUTS}",
            )
        if len(key) > 512:
            raise ConfigError("a batch key is at most 512 characters (batch metadata values)")
        content = input_file(items)
        found = self._find(key)
        if found is not None:
            return str(found["id"])
        file_id = self._api.upload(f"{_digest(key)}.jsonl", content)
        batch_id = self._create(key, file_id)
        self._lines[batch_id] = {item.custom_id: item.tokens.count for item in items}
        return batch_id

    def poll(self, job_id: str) -> JobResult:
        batch = self._api.batch(job_id)
        status = str(batch.get("status"))
        if status not in TERMINAL:
            _refuse_if_stuck(batch, status)
            return JobResult(status, False)
        estimates = self._estimates(batch)
        lines = {custom_id: [custom_id] for custom_id in estimates}
        if status == "failed":  # validation failed: nothing ran, nothing billed; the lines are sent again
            code = f"batch_failed:{_first_error_code(batch.get('errors'))}"
            return JobResult(status, True, failed=dict.fromkeys(estimates, code))
        output, is_deleted = self._download(batch.get("output_file_id"))
        errors_file, _ = self._download(batch.get("error_file_id"))
        missing = "output_deleted" if is_deleted else UNANSWERED.get(status)
        vectors, failed = collect_lines(
            lines, [output, errors_file], self.info.dim, missing=missing, read=read_line
        )
        billed = billed_tokens(output, "total_tokens")
        if is_deleted:  # billed, but the usage went with the file: charge the estimates, the largest first
            lost = sorted((estimates[c] for c, code in failed.items() if code == missing), reverse=True)
            done = int((batch.get("request_counts") or {}).get("completed") or 0)
            billed += sum(lost[: max(0, done - len(vectors))])
        return JobResult(status, True, vectors, failed, billed)

    def release(self, job_id: str) -> None:
        """Delete the batch's input, output and error files; already gone is fine. The batch record stays."""
        batch = self._api.batch(job_id)
        for field in ("input_file_id", "output_file_id", "error_file_id"):
            if batch.get(field):
                try:
                    self._api.delete(str(batch[field]))
                except ProviderNotFound:
                    continue
        self._lines.pop(job_id, None)

    def _find(self, key: str) -> dict[str, Any] | None:
        """The newest listed batch carrying `key`, in any status: the listing has no metadata filter
        (list-batches takes only `limit` and `after`), so it is read once, then only as far as the batches
        already seen (`KeyIndex`)."""
        return self._index.find(key)

    def _listing(self) -> Iterator[Sequence[dict[str, Any]]]:
        after: str | None = None
        while True:
            page = self._api.batches(after, PAGE)
            data = [batch for batch in page.get("data") or [] if isinstance(batch, dict)]
            yield data
            if not data or not page.get("has_more"):
                return
            after = str(page.get("last_id") or data[-1]["id"])

    def _create(self, key: str, file_id: str) -> str:
        """Create once. A 429 refused it before anything was made (the pacer waits its Retry-After and sends
        it again); after a timeout or a 5xx the batch may exist: it is looked up by its key and adopted."""
        body = {
            "endpoint": "/v1/embeddings",
            "completion_window": "12h",
            "input_file_id": file_id,
            "request_params": self._params,
            "metadata": {KEY_FIELD: key},
        }
        send = functools.partial(
            self._api.json, "POST", "/batches", json=body, timeout=self._create_timeout_s
        )
        created = functools.partial(self._api.pacer.call, functools.partial(self._attempt, send))
        batch = create_once(
            created,
            functools.partial(self._find, key),
            what=f"the batch for key {key!r}",
            unsure=(UncertainCreate,),
        )
        return str(batch["id"])

    def _attempt(self, send: functools.partial[dict[str, Any]]) -> dict[str, Any]:
        """One create. A 404 "Input file not found" for the file just uploaded made nothing (a public report,
        github.com/mongodb-developer/GenAI-Showcase/issues/175, cause unknown): waited out as a 429 is."""
        try:
            return self._api.once(send)
        except ProviderNotFound as exc:
            if "input file not found" in str(exc).lower():
                raise ProviderBusy(str(exc), status=404) from exc
            raise
        except ProviderBusy as exc:
            if exc.status == 429:
                raise
            raise UncertainCreate(str(exc)) from exc

    def recall(self, job_id: str, items: Sequence[tuple[str, int]]) -> None:
        """The job's items and their token estimates, from the ledger (`RecallsItems`): a process that did
        not submit it needs no read of its input file, which the provider may not serve back."""
        self._lines.setdefault(job_id, {custom_id: tokens for custom_id, tokens in items})

    def _estimates(self, batch: dict[str, Any]) -> dict[str, int]:
        """The batch's lines and their estimated tokens: remembered from submit or recalled from the ledger,
        else read from its input file (another process polls it without a ledger)."""
        batch_id = str(batch["id"])
        if batch_id not in self._lines:
            content, _ = self._download(batch.get("input_file_id"))
            if not content:
                raise BackendError(
                    f"batch {batch_id} has no input file (not submitted by reindex, or released)"
                )
            pairs = list(input_lines(content))
            counts = self._counter.counts([text for _, text in pairs])
            self._lines[batch_id] = {
                custom_id: min(n, self.info.max_tokens)
                for (custom_id, _), n in zip(pairs, counts, strict=True)
            }
        return self._lines[batch_id]

    def _download(self, file_id: object) -> tuple[bytes | None, bool]:
        """A file's bytes, or (None, is_deleted)."""
        if not isinstance(file_id, str) or not file_id:
            return None, False
        try:
            return self._api.download(file_id), False
        except ProviderNotFound:
            return None, True


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _first_error_code(errors: Any) -> str:
    """The first error's code of a failed batch, whatever shape `errors` has: the OpenAI-like `{"data":
    [{code, message}]}`, a bare list, a string, or nothing (the docs show only `null`)."""
    data = errors.get("data") if isinstance(errors, Mapping) else errors
    first = data[0] if isinstance(data, list) and data else data
    code = first.get("code") if isinstance(first, Mapping) else None
    return str(code) if code else "unknown"


def _refuse_if_stuck(batch: Mapping[str, Any], status: str) -> None:
    """A status outside the known ones is waited on, until the window and a grace period have passed."""
    if status in RUNNING:
        return
    created = _epoch(batch.get("created_at"))
    if created is not None and time.time() - created > WINDOW_S + GRACE_S:
        raise BackendError(
            f"Voyage batch {batch.get('id')} has been in status {status!r}, which reindex does not know,"
            f" for longer than its 12-hour window",
            hint="check it on Voyage's dashboard; cancel it there and rerun to send its lines again",
        )


def _epoch(value: Any) -> float | None:
    """A timestamp as Voyage gives it (ISO 8601, or seconds since the epoch), in seconds."""
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None
