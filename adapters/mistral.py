"""Mistral's batch API for embeddings (`mistral-embed`), through the official `mistralai` SDK.

    submit: upload a JSONL file (one input per line) → create the job with the key in its metadata
    poll:   get the job → when terminal, download its output and error files → vectors, refusals, usage

Names are those of mistralai 3.7: `client.files.upload/download/delete`, `client.batch.jobs.create/get/list`
(README, "Mistral: batch API for mistral-embed"). Pacing, Retry-After and the join on custom_id are the
remote-provider toolkit's (reindex_adapters.remote); only the envelope of Mistral's lines and its statuses are read here.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from reindex.errors import BackendError, ConfigError, MissingDependency, ReindexError
from reindex.fingerprint import fingerprint
from reindex.offers import EmbedderOffer, Entry, key_entry
from reindex.ports import EmbedderInfo, EmbedderTraits, JobItem, JobResult, TokenCounts, Tokens, Vectors
from reindex_adapters import mistral_tokens
from reindex_adapters.remote.decoding import line_vectors
from reindex_adapters.remote.endpoint import ProviderEndpoint
from reindex_adapters.remote.errors import ProviderBusy, ProviderNotFound, retry_after
from reindex_adapters.remote.jobs import create_once
from reindex_adapters.remote.keys import api_key, redact
from reindex_adapters.remote.lines import billed_tokens, collect_lines, json_line
from reindex_adapters.remote.pacing import Paced, Pacer

if TYPE_CHECKING:
    from mistralai.client import Mistral
    from mistralai.client.errors import MistralError
    from mistralai.client.models import BatchJob

MODEL, DIM = "mistral-embed", 1024  # its one output size; it takes no dimension option
# USD per 1M input tokens on PRICES_TAKEN: online from a third-party listing of Mistral's price (Mistral's own
# price page was not read), batch as Mistral's batch guide says, "a 50% discount" (configs/pricing.toml).
PRICES_TAKEN = "2026-12-02"
PRICES: dict[str, dict[str, float]] = {MODEL: {"online": 0.10, "batch": 0.05}}
MAX_BATCH_REQUESTS = 1_000_000  # "large batches of up to 1M requests" (Mistral's batch guide)
KEY_FIELD = "reindex_key"  # job metadata
RUNNING = frozenset({"QUEUED", "RUNNING", "CANCELLATION_REQUESTED"})  # as mistralai.extra.batch has them
# Lines a terminal job never answered: sent again (reindex.run.deferred.RETRYABLE)
UNANSWERED = {"TIMEOUT_EXCEEDED": "batch_expired", "CANCELLED": "batch_cancelled", "FAILED": "batch_failed"}
PAGE = 100


def _entries(model: str, variable: str) -> list[Entry]:
    return [
        Entry("kind", "mistral-batch", "Mistral's batch API, at half the online price"),
        Entry("model", model, "mistral-embed: the one model taken (1,024 dimensions)"),
        key_entry(variable),
        Entry("server_url", "http://127.0.0.1:8090", "another endpoint (the SDK's option)", is_example=True),
        Entry(
            "timeout_hours", 24, "the job's own limit; lines not done by then are sent again", is_example=True
        ),
    ]


class MistralBatchEmbedder:
    """`mistral-embed` through Mistral's batch API: one JSONL file per job, adopted by its key.

    Every input is a line of its own (custom_id = the item's), so a refused input never fails another and
    no item map is needed: the job's input file names its lines. The job carries the key in its metadata;
    `submit` lists jobs filtered by it (checking each match itself) before creating anything, and the
    create is never retried: after a timeout the job is looked up again, and adopted if it was made.
    """

    offer: ClassVar[EmbedderOffer] = EmbedderOffer(
        _entries, key_env="MISTRAL_API_KEY", claims=frozenset(PRICES)
    )  # what `reindex init` writes for it

    class Config(Paced):
        kind: Literal["mistral-batch"]
        model: Literal["mistral-embed"] = "mistral-embed"  # codestral-embed: its batch use is not confirmed
        server_url: str | None = None  # the SDK's own option; None is https://api.mistral.ai
        api_key_env: str = "MISTRAL_API_KEY"
        max_tokens: int = Field(
            default=mistral_tokens.MAX_TOKENS, gt=0, le=mistral_tokens.MAX_TOKENS
        )  # its own
        timeout_s: float = Field(default=60.0, gt=0)
        create_timeout_s: float = Field(default=60.0, gt=0)
        timeout_hours: int = Field(default=24, gt=0)  # the job's own limit; lines not done by then expire
        prices: dict[str, float] | None = None  # {"online": x, "batch": y} USD per 1M tokens

    def __init__(
        self,
        client: Mistral,
        *,
        max_tokens: int = mistral_tokens.MAX_TOKENS,
        create_timeout_s: float = 60.0,
        timeout_hours: int = 24,
        pacer: Pacer | None = None,
        api_key_env: str = "MISTRAL_API_KEY",
        prices: Mapping[str, float] | None = None,
    ) -> None:
        self._api = Api(client, pacer or Pacer(), api_key_env)
        mistral_tokens.tokenize(["a"], max_tokens)  # mistral-common is there, or the extra is named now
        self._create_timeout_s, self._timeout_hours = create_timeout_s, timeout_hours
        options = {"max_tokens": max_tokens, "tokenizer": "mistral-common v1"}
        identity = fingerprint("mistral", MODEL, DIM, options)
        self.info = EmbedderInfo("mistral-batch", MODEL, DIM, max_tokens, identity, options)
        listed = PRICES[MODEL]
        tiers: dict[str, float | None] = {tier: (prices or listed).get(tier) for tier in listed}
        self.traits = EmbedderTraits(
            remote=True,
            price_per_million=tiers["batch"],
            prices=tiers,
            completion_window_hours=float(timeout_hours),  # the job's own limit
        )
        self._lines: dict[str, dict[str, int]] = {}  # job id -> its custom_ids' estimated tokens

    @classmethod
    def from_config(cls, config: Config) -> MistralBatchEmbedder:
        pacer = Pacer.of(config)
        return cls(
            make_client(config.server_url, config.api_key_env, config.timeout_s),
            max_tokens=config.max_tokens,
            create_timeout_s=config.create_timeout_s,
            timeout_hours=config.timeout_hours,
            pacer=pacer,
            api_key_env=config.api_key_env,
            prices=config.prices,
        )

    token_counts: TokenCounts = mistral_tokens.COUNTS

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        """Exact counts in mistral-embed's own tokenizer, a text over `max_tokens` cut in it (the API
        refuses one, truncating nothing); what was billed comes from each line's `usage`."""
        return mistral_tokens.tokenize(texts, self.info.max_tokens)

    def submit(self, key: str, items: Sequence[JobItem], *, isolate: bool = False) -> str:
        """Adopt the job already carrying `key`, else upload and create one (never retrying the create).

        Every input is sent alone whatever `isolate` says: one line per input.
        """
        if not items or len(items) > MAX_BATCH_REQUESTS:
            raise ConfigError(
                f"a batch job takes 1 to {MAX_BATCH_REQUESTS:,} inputs, got {len(items)}",
                hint=f"set [run] shard_size to at most {MAX_BATCH_REQUESTS}",
            )
        content = input_file(items)
        found = self._find(key)
        if found is not None:
            return found.id
        upload = functools.partial(
            self._api.client.files.upload,
            file={"file_name": f"{_digest(key)}.jsonl", "content": content},
            purpose="batch",
        )
        job_id = self._create(key, self._api.call(upload).id)
        self._lines[job_id] = {item.custom_id: item.tokens.count for item in items}
        return job_id

    def poll(self, job_id: str) -> JobResult:
        job = self._get(job_id)
        if job.status in RUNNING:
            return JobResult(str(job.status), False)
        estimates = self._estimates(job)
        output, is_deleted = self._download(_text(job.output_file))
        errors, _ = self._download(_text(job.error_file))
        missing = "output_deleted" if is_deleted else UNANSWERED.get(str(job.status))
        lines = {custom_id: [custom_id] for custom_id in estimates}
        vectors, failed = collect_lines(lines, [output, errors], DIM, missing=missing, read=read_line)
        billed = billed_tokens(output, "prompt_tokens")
        if is_deleted:  # billed, but the usage went with the file: charge the estimate, on the high side
            lost = sorted((estimates[c] for c, code in failed.items() if code == missing), reverse=True)
            billed += sum(lost[: max(0, job.succeeded_requests - len(vectors))])
        return JobResult(str(job.status), True, vectors, failed, billed)

    def release(self, job_id: str) -> None:
        """Delete the job's input, output and error files; already gone is fine. The job record stays."""
        job = self._get(job_id)
        for file_id in filter(None, [*job.input_files, _text(job.output_file), _text(job.error_file)]):
            try:
                self._api.call(functools.partial(self._api.client.files.delete, file_id=file_id))
            except ProviderNotFound:
                continue
        self._lines.pop(job_id, None)

    def _get(self, job_id: str) -> BatchJob:
        return self._api.call(functools.partial(self._api.client.batch.jobs.get, job_id=job_id))

    def _find(self, key: str) -> BatchJob | None:
        """The newest job carrying `key`, in any status, over every page of the listing.

        The listing is filtered by the metadata (the SDK sends it as query parameters); each job's own
        metadata is checked too, so a server that ignored the filter is read page by page instead.
        """
        jobs = self._api.client.batch.jobs
        for page in itertools.count():
            listing = functools.partial(jobs.list, page=page, page_size=PAGE, metadata={KEY_FIELD: key})
            found = self._api.call(listing)
            data = found.data or []
            match = next((job for job in data if _metadata(job).get(KEY_FIELD) == key), None)
            if match is not None or not data or (page + 1) * PAGE >= found.total:
                return match
        raise AssertionError("unreachable: the pages run out")

    def _create(self, key: str, file_id: str) -> str:
        """Create once (the SDK's retries are off); after a timeout or 5xx, adopt the job if it was made."""
        create = functools.partial(
            self._api.client.batch.jobs.create,
            input_files=[file_id],
            endpoint="/v1/embeddings",
            model=MODEL,
            metadata={KEY_FIELD: key},
            timeout_hours=self._timeout_hours,
            timeout_ms=int(self._create_timeout_s * 1000),
        )
        created = functools.partial(self._api.once, create)
        return create_once(created, functools.partial(self._find, key), what=f"the job for key {key!r}").id

    def recall(self, job_id: str, items: Sequence[tuple[str, int]]) -> None:
        """The job's items and their token estimates, from the ledger (`RecallsItems`): a process that did
        not submit it needs no read of its input file, which the provider may not serve back."""
        self._lines.setdefault(job_id, {custom_id: tokens for custom_id, tokens in items})

    def _estimates(self, job: BatchJob) -> dict[str, int]:
        """The job's lines and their estimated tokens: remembered from submit or recalled from the ledger,
        else read from its input file (another process polls it without a ledger)."""
        if job.id not in self._lines:
            content = b"".join(self._download(file_id)[0] or b"" for file_id in job.input_files)
            if not content:
                raise BackendError(f"job {job.id} has no input file (not submitted by reindex, or released)")
            lines = [json_line(raw) or {} for raw in content.splitlines() if raw.strip()]
            texts = [[str(text) for text in _inputs(line)] for line in lines]
            counts = [sum(tokens.count for tokens in self.tokenize(group)) for group in texts]
            self._lines[job.id] = {
                str(line.get("custom_id")): n for line, n in zip(lines, counts, strict=True)
            }
        return self._lines[job.id]

    def _download(self, file_id: str | None) -> tuple[bytes | None, bool]:
        """A file's bytes, or (None, is_deleted)."""
        if not file_id:
            return None, False
        download = functools.partial(self._api.client.files.download, file_id=file_id)
        try:
            return self._api.call(lambda: download().read()), False
        except ProviderNotFound:
            return None, True


def input_file(items: Sequence[JobItem]) -> bytes:
    """One line per input: `{"custom_id", "body": {"input": [text]}}`; the model is the job's."""
    lines = (
        json.dumps(
            {"custom_id": item.custom_id, "body": {"input": [str(item.tokens.data)]}}, ensure_ascii=False
        )
        for item in items
    )
    return "".join(f"{line}\n" for line in lines).encode()


def read_line(line: Mapping[str, Any], size: int, dim: int) -> list[Vectors] | str:
    """A line's vectors, or why it has none.

    The envelope is `{custom_id, response: {status_code, body}, error}`; a line is a success when it has no
    error and no 4xx/5xx status (mistralai.extra.batch reads it so). A refusal's body is Mistral's error
    object, `{object: "error", message, type, param, code}`: its `type` (and `code` when given) name it.
    """
    response, error = line.get("response"), line.get("error")
    response = response if isinstance(response, dict) else {}
    status = response.get("status_code")
    if error is None and response and (status is None or (isinstance(status, int) and status < 400)):
        return line_vectors(response.get("body"), size, dim)
    if isinstance(status, int) and status >= 400:
        return refusal_code(status, response.get("body"))
    if isinstance(error, dict):
        return str(error.get("type") or error.get("code") or "batch_error")
    return "batch_error" if error is not None else "malformed_output"


def refusal_code(status: int, body: Any) -> str:
    if status == 429:
        return "rate_limit_exceeded"
    if status in (408, 409) or status >= 500:
        return "server_error"
    detail = body if isinstance(body, dict) else {}
    kind, code = detail.get("type"), detail.get("code")
    if kind and code:
        return f"{kind}:{code}"
    return str(kind or code or f"http_{status}")


class Api(ProviderEndpoint):
    """The SDK client, through the pacer and the one error translation."""

    def __init__(self, client: Mistral, pacer: Pacer, key_env: str) -> None:
        security = getattr(client.sdk_configuration, "security", None)  # the SDK's: an object or None
        super().__init__(pacer, key_env, getattr(security, "api_key", ""), translated_errors)
        self.client = client


@contextmanager
def translated_errors(secret: str, key_env: str) -> Iterator[None]:
    """Make the SDK's exceptions ours; no message carries the key."""
    import httpx2
    from mistralai.client.errors import MistralError, NoResponseError

    try:
        yield
    except MistralError as exc:  # not chained: its message may echo the key
        raise _status_error(exc, secret, key_env) from None
    except (httpx2.TransportError, NoResponseError) as exc:  # timeouts included
        raise ProviderBusy(f"{type(exc).__name__}: {redact(str(exc), secret)}") from None


def _status_error(exc: MistralError, secret: str, key_env: str) -> ReindexError:
    status = exc.status_code
    message = f"HTTP {status}: {redact(_message(exc.body), secret)}"
    if status in (408, 409, 429) or status >= 500:
        return ProviderBusy(message, retry_after=retry_after(exc.headers), status=status)
    if status in (401, 403):
        return ConfigError(f"the Mistral API refused the API key (HTTP {status})", hint=f"check ${key_env}")
    if status == 404:
        return ProviderNotFound(message, hint="check server_url")
    return ConfigError(f"the Mistral API refused the request: {message}", hint="check [embedder]")


def _message(body: str) -> str:
    parsed = json_line(body.encode())
    return str(parsed.get("message") or body) if parsed else body[:500]


def make_client(server_url: str | None, key_env: str, timeout_s: float) -> Mistral:
    """An SDK client with its retries off (pacing is ours); the key comes only from `key_env`."""
    try:
        from mistralai.client import Mistral
    except ImportError as exc:
        raise MissingDependency("mistralai", extra="mistral") from exc
    return Mistral(
        api_key=api_key(key_env), server_url=server_url, retry_config=None, timeout_ms=int(timeout_s * 1000)
    )


def _inputs(line: Mapping[str, Any]) -> list[Any]:
    body = line.get("body")
    texts = body.get("input") if isinstance(body, dict) else None
    return texts if isinstance(texts, list) else [texts] if isinstance(texts, str) else []


def _metadata(job: BatchJob) -> Mapping[str, Any]:
    return job.metadata if isinstance(job.metadata, dict) else {}


def _text(value: object) -> str | None:
    """A file id, or None for the SDK's unset and null."""
    return value if isinstance(value, str) and value else None


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]
