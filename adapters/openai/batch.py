"""The `openai-batch` embedder: the Batch API, one JSONL file per job, adopted by its key after a crash."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from reindex.errors import BackendError, ConfigError
from reindex.offers import EmbedderOffer, provider_entries
from reindex.ports import EmbedderTraits, JobItem, JobResult, Tokens
from reindex_adapters.openai.client import (
    MAX_INPUTS,
    MAX_REQUEST_TOKENS,
    OPENAI_OPTIONS,
    Endpoint,
    Settings,
    make_client,
    model_info,
    prices_for,
    request_groups,
    resolve_dim,
    token_counts,
)
from reindex_adapters.openai.online import OpenAIEmbedder
from reindex_adapters.remote.errors import ProviderNotFound
from reindex_adapters.remote.jobs import KeyIndex, create_once
from reindex_adapters.remote.lines import collect_lines, json_line
from reindex_adapters.remote.pacing import Pacer
from reindex_adapters.remote.tokens import encoding, tokenize_texts

if TYPE_CHECKING:
    from openai import OpenAI
    from openai.types import Batch

MAX_BATCH_INPUTS = 50_000  # embedding inputs per batch; also bounds its requests (50,000)
MAX_BATCH_FILE_BYTES = 200_000_000
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
KEY_FIELD, ITEMS_FIELD = "reindex_key", "reindex_items"  # batch metadata


class OpenAIBatchEmbedder:
    """The Batch API: one JSONL file per job, `inputs_per_request` inputs per line, adopted by key.

    A line's custom_id names the items it carries: `<sha256(key)[:16]>-<first>-<count>`, the positions of
    its inputs in the job's items as `submit` was given them. A process that did not submit the job gets
    those items from the ledger (`recall`) and maps every output line back without reading anything else
    from the provider: the real API refuses to serve a `purpose="user_data"` file back (400 "Not allowed
    to download files of purpose: user_data"), so a map uploaded beside the input could never be read on a
    resume. Submit adopts a batch carrying the same key in any status but `failed` (a failed batch never
    ran and billed nothing); expired and cancelled ones are adopted, as they delivered and billed some
    lines. A batch made by 0.2 (`<digest>-<n>` lines, a user_data map) is read by its map where the
    provider serves it.
    """

    offer: ClassVar[EmbedderOffer] = EmbedderOffer(
        provider_entries("openai-batch", "or openai: online", *OPENAI_OPTIONS), key_env="OPENAI_API_KEY"
    )  # what `reindex init` writes for it

    class Config(Settings):
        kind: Literal["openai-batch"]
        inputs_per_request: int = Field(default=256, gt=0, le=MAX_INPUTS)
        create_timeout_s: float = Field(default=60.0, gt=0)
        stragglers_online: bool = (
            False  # lines a batch did not finish go online (online price), not to a new batch
        )

    def __init__(
        self,
        client: OpenAI,
        *,
        model: str,
        dim: int | None = None,
        dimensions: int | None = None,
        max_tokens: int = 8191,
        tokenizer: str = "cl100k_base",
        inputs_per_request: int = 256,
        create_timeout_s: float = 60.0,
        pacer: Pacer | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        prices: Mapping[str, float] | None = None,
        stragglers_online: bool = False,
    ) -> None:
        self._endpoint = Endpoint(client, pacer or Pacer(), api_key_env)
        self._model, self._dimensions = model, dimensions
        self._online = OpenAIEmbedder(
            client,
            model=model,
            dim=dim,
            dimensions=dimensions,
            max_tokens=max_tokens,
            tokenizer=tokenizer,
            pacer=self._endpoint.pacer,
            api_key_env=api_key_env,
            prices=prices,
        )
        self._inputs_per_request, self._create_timeout_s = inputs_per_request, create_timeout_s
        self._codec = encoding(tokenizer)
        dim = resolve_dim(model, dimensions, dim)
        self.info = model_info("openai-batch", model, dim, max_tokens, dimensions, tokenizer)
        self.token_counts = token_counts(model, tokenizer)
        listed = prices_for(model, prices)
        self.traits = EmbedderTraits(
            remote=True,
            price_per_million=listed["batch"],
            prices=listed,
            completion_window_hours=24.0,
            stragglers_online=stragglers_online,
        )
        self._lines: dict[str, dict[str, list[str]]] = {}  # batch id -> line custom_id -> item custom_ids
        self._recalled: dict[str, list[str]] = {}  # batch id -> its items' custom ids, from the ledger
        self._index: KeyIndex[Batch] = KeyIndex(
            self._listing,
            id_of=lambda batch: batch.id,
            key_of=lambda batch: (batch.metadata or {}).get(KEY_FIELD),
            worth=lambda batch: batch.status != "failed",
        )

    @classmethod
    def from_config(cls, config: Config) -> OpenAIBatchEmbedder:
        pacer = Pacer.of(config)
        return cls(
            make_client(config.base_url, config.api_key_env, config.timeout_s),
            model=config.model,
            dim=config.dim,
            dimensions=config.dimensions,
            max_tokens=config.max_tokens,
            tokenizer=config.tokenizer,
            inputs_per_request=config.inputs_per_request,
            create_timeout_s=config.create_timeout_s,
            pacer=pacer,
            api_key_env=config.api_key_env,
            prices=config.prices,
            stragglers_online=config.stragglers_online,
        )

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        return tokenize_texts(texts, self._codec, self.info.max_tokens)

    def embed_stragglers(self, items: Sequence[JobItem]) -> JobResult:
        """Embed the last few lines through the online endpoint now instead of waiting on another batch."""
        before = self._online.billed_tokens
        vectors = self._online.embed([item.tokens for item in items])
        rejected = self._online.last_rejections()
        failed = {
            items[row].custom_id: reason.removeprefix("provider_rejected:")
            for row, reason in rejected.items()
        }
        done = {item.custom_id: vectors[row] for row, item in enumerate(items) if row not in rejected}
        return JobResult(
            "online", True, vectors=done, failed=failed, billed_tokens=self._online.billed_tokens - before
        )

    def submit(self, key: str, items: Sequence[JobItem], *, isolate: bool = False) -> str:
        """Adopt the batch already carrying `key`, else upload and create one (never retrying the create).

        `isolate` sends one input per request line: a resubmission after a line was rejected, so one
        poison input cannot fail the inputs that shared its request again.
        """
        lines = self._pack(key, items, 1 if isolate else self._inputs_per_request)
        content = self._input_file(lines)
        found = self._find(key)
        if found is not None:
            self._recalled.setdefault(found.id, [item.custom_id for item in items])
            return found.id
        input_file = self._upload(f"{_digest(key)}.jsonl", content, "batch")
        batch_id = self._create(key, input_file)
        self._lines[batch_id] = {line: [i.custom_id for i in group] for line, group in lines.items()}
        return batch_id

    def recall(self, job_id: str, items: Sequence[tuple[str, int]]) -> None:
        """The items this job was submitted with, in order (`RecallsItems`): its lines name positions in it."""
        self._recalled[job_id] = [custom_id for custom_id, _ in items]

    def poll(self, job_id: str) -> JobResult:
        batch = self._endpoint.call(functools.partial(self._endpoint.client.batches.retrieve, job_id))
        billed = batch.usage.input_tokens if batch.usage else 0
        if batch.status not in TERMINAL:
            return JobResult(batch.status, False, billed_tokens=billed)
        if batch.status == "failed":
            errors = batch.errors.data if batch.errors and batch.errors.data else []
            code = f"batch_failed:{(errors[0].code if errors else None) or 'unknown'}"  # never ran: retried
            failed = {item: code for group in self._line_items(batch, []).values() for item in group}
            return JobResult(batch.status, True, failed=failed, billed_tokens=billed)
        output, is_deleted = self._download(batch.output_file_id)
        errors_file, _ = self._download(batch.error_file_id)
        missing = "output_deleted" if is_deleted else None
        lines = self._line_items(batch, [output, errors_file])
        vectors, failed = collect_lines(lines, [output, errors_file], self.info.dim, missing=missing)
        return JobResult(batch.status, True, vectors, failed, billed)

    def release(self, job_id: str) -> None:
        """Delete the job's input, output, error and item-map files; already gone is fine."""
        batch = self._endpoint.call(functools.partial(self._endpoint.client.batches.retrieve, job_id))
        files = [batch.input_file_id, batch.output_file_id, batch.error_file_id]
        files.append((batch.metadata or {}).get(ITEMS_FIELD))
        for file_id in filter(None, files):
            try:
                self._endpoint.call(functools.partial(self._endpoint.client.files.delete, file_id))
            except ProviderNotFound:
                continue
        self._lines.pop(job_id, None)

    def _pack(self, key: str, items: Sequence[JobItem], per_request: int) -> dict[str, list[JobItem]]:
        if not items or len(items) > MAX_BATCH_INPUTS:
            raise ConfigError(
                f"a batch job takes 1 to {MAX_BATCH_INPUTS} inputs, got {len(items)}",
                hint=f"set [run] shard_size to at most {MAX_BATCH_INPUTS}",
            )
        if len(key) > 512:
            raise ConfigError("a batch key is at most 512 characters (batch metadata values)")
        counts = [item.tokens.count for item in items]
        groups = request_groups(counts, per_request, MAX_REQUEST_TOKENS)  # consecutive rows
        return {f"{_digest(key)}-{group[0]}-{len(group)}": [items[row] for row in group] for group in groups}

    def _input_file(self, lines: Mapping[str, Sequence[JobItem]]) -> bytes:
        body: dict[str, Any] = {"model": self._model, "encoding_format": "base64"}
        if self._dimensions:
            body["dimensions"] = self._dimensions
        requests = (
            {"custom_id": line, "method": "POST", "url": "/v1/embeddings", "body": {**body, "input": inputs}}
            for line, group in lines.items()
            for inputs in [[str(item.tokens.data) for item in group]]
        )
        content = "".join(json.dumps(request, ensure_ascii=False) + "\n" for request in requests).encode()
        if len(content) > MAX_BATCH_FILE_BYTES:
            raise ConfigError(
                f"the batch input file would be {len(content):,} bytes, over the 200 MB limit",
                hint="lower [run] shard_size",
            )
        return content

    def _find(self, key: str) -> Batch | None:
        """The newest batch carrying `key` that is worth adopting: the listing read once, then only as far
        as the batches already seen (`KeyIndex`)."""
        return self._index.find(key)

    def _listing(self) -> Iterator[Sequence[Batch]]:
        """The organization's batches, a page of 100 at a time, newest first (the Batch API's list)."""
        from openai import omit

        after: Any = omit
        while True:
            listing = functools.partial(self._endpoint.client.batches.list, limit=100, after=after)
            page = self._endpoint.call(listing)
            yield page.data
            if not page.has_more or not page.data:
                return
            after = page.data[-1].id

    def _upload(self, name: str, content: bytes, purpose: Literal["batch", "user_data"]) -> str:
        upload = functools.partial(self._endpoint.client.files.create, file=(name, content), purpose=purpose)
        return self._endpoint.call(upload).id

    def _create(self, key: str, input_file: str) -> str:
        """Create once (SDK retries off); after a timeout or 5xx, adopt the batch if it was made anyway."""
        client = self._endpoint.client.with_options(max_retries=0, timeout=self._create_timeout_s)
        create = functools.partial(
            client.batches.create,
            input_file_id=input_file,
            endpoint="/v1/embeddings",
            completion_window="24h",
            metadata={KEY_FIELD: key},
        )
        created = functools.partial(self._endpoint.once, create)
        return create_once(created, functools.partial(self._find, key), what=f"the batch for key {key!r}").id

    def _line_items(self, batch: Batch, files: Sequence[bytes | None]) -> dict[str, list[str]]:
        """Line custom_id -> its items' custom ids: as submitted here, else from the recalled items and the
        positions each line's custom_id names (every line the files hold; items no line names come back
        as one line of their own that no file holds, so they fail as missing and are sent again)."""
        if batch.id in self._lines:
            return self._lines[batch.id]
        recalled = self._recalled.get(batch.id)
        if recalled is None:
            return self._legacy_map(batch)
        prefix = _digest(str((batch.metadata or {}).get(KEY_FIELD, ""))) + "-"
        lines: dict[str, list[str]] = {}
        for custom_id in _custom_ids(files):
            first, _, count = custom_id.removeprefix(prefix).partition("-")
            if custom_id.startswith(prefix) and first.isdigit() and count.isdigit():
                lines[custom_id] = recalled[int(first) : int(first) + int(count)]
        if not lines and not any(files) and batch.metadata and ITEMS_FIELD in batch.metadata:
            return self._legacy_map(batch)  # a 0.2 batch: its lines are numbered, its map uploaded
        named = {item for group in lines.values() for item in group}
        unnamed = [item for item in recalled if item not in named]
        return lines | ({f"{prefix}unread": unnamed} if unnamed else {})

    def _legacy_map(self, batch: Batch) -> dict[str, list[str]]:
        """The item map a 0.2 submit uploaded beside the input, where the provider serves it back."""
        map_file = (batch.metadata or {}).get(ITEMS_FIELD)
        try:
            content, _ = self._download(map_file)
        except BackendError as exc:
            raise BackendError(
                f"batch {batch.id} was submitted by reindex 0.2, whose item map the provider does not serve"
                " back (OpenAI refuses user_data downloads)",
                hint="cancel it on the provider and run again: its lines are submitted anew",
            ) from exc
        if content is None:
            raise BackendError(
                f"batch {batch.id}'s items are unknown: it is not in this migration's ledger",
                hint="run from the config and ledger that submitted it",
            )
        self._lines[batch.id] = {line: list(group) for line, group in json.loads(content)["lines"].items()}
        return self._lines[batch.id]

    def _download(self, file_id: str | None) -> tuple[bytes | None, bool]:
        """A file's bytes, or (None, is_deleted)."""
        if not file_id:
            return None, False
        try:
            return self._endpoint.call(
                functools.partial(self._endpoint.client.files.content, file_id)
            ).content, False
        except ProviderNotFound:
            return None, True


def _custom_ids(files: Sequence[bytes | None]) -> list[str]:
    """Every line custom_id the output and error files hold, in order, each once."""
    found: dict[str, None] = {}
    for raw in (raw for content in files for raw in (content or b"").splitlines() if raw.strip()):
        line = json_line(raw)
        if line is not None and isinstance(line.get("custom_id"), str):
            found.setdefault(line["custom_id"])
    return list(found)


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]
