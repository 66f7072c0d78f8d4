"""The `gemini-batch` embedder: Gemini's Batch API for embeddings through the official `google-genai` SDK.

One job is one uploaded JSONL file, one input per line: `{"key": <custom_id>, "request": {"content": {"parts":
[{"text": ...}]}, "output_dimensionality": d}}`, created by `client.batches.create_embeddings(model=...,
src={"file_name": ...}, config={"display_name": <key>})` (`POST models/{model}:asyncBatchEmbedContent`).
The job's display name is the deterministic key: `submit` lists the batches and adopts the one carrying it
before creating anything, and again after a create that timed out. Results come back as a responses file
whose lines carry the same `key` with a `response` (the embedding) or an `error` (a google.rpc.Status), in
any order; lines missing from it (an expired job, a lost file, an unreadable line) are left for the run to
send again. Vertex AI has no such method (the SDK refuses it there), so this kind is the Developer API only.
"""

from __future__ import annotations

import functools
import io
import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

import numpy as np
from pydantic import Field

from reindex.capabilities import Traffic
from reindex.errors import ConfigError
from reindex.fingerprint import fingerprint
from reindex.offers import EmbedderOffer, Entry, key_entry
from reindex.ports import EmbedderInfo, EmbedderTraits, JobItem, JobResult, TokenCounts, Tokens, Vectors
from reindex_adapters.gemini.client import make_client, translated_errors
from reindex_adapters.gemini.responses import read_responses
from reindex_adapters.remote.errors import ProviderNotFound
from reindex_adapters.remote.jobs import create_once
from reindex_adapters.remote.pacing import Paced, Pacer
from reindex_adapters.remote.tokens import encoding, tokenize_texts

if TYPE_CHECKING:
    from google.genai import Client
    from google.genai.types import BatchJob

T = TypeVar("T")
KNOWN_DIMS = {"gemini-embedding-001": 3072}
MAX_INPUT_TOKENS = 2048  # gemini-embedding-001's input limit
MAX_FILE_BYTES = 2_000_000_000  # the Files API's limit per file
PRICES_TAKEN = "2026-12-02"
PRICES: dict[str, dict[str, float]] = {  # USD per 1M input tokens (configs/pricing.toml, [gemini])
    "gemini-embedding-001": {"online": 0.15, "batch": 0.075},
}
TERMINAL = frozenset(
    {
        "JOB_STATE_SUCCEEDED",
        "JOB_STATE_PARTIALLY_SUCCEEDED",
        "JOB_STATE_FAILED",
        "JOB_STATE_CANCELLED",
        "JOB_STATE_EXPIRED",
    }
)


def _entries(model: str, variable: str) -> list[Entry]:
    return [
        Entry("kind", "gemini-batch", "Gemini's Batch API, at half the online price"),
        Entry("model", model),
        key_entry(variable),
        Entry("output_dimensionality", 768, "768, 1536 or 3072 (part of the fingerprint)", is_example=True),
        Entry(
            "task_type",
            "RETRIEVAL_DOCUMENT",
            "sent with every text (part of the fingerprint)",
            is_example=True,
        ),
    ]


class GeminiBatchEmbedder:
    """`gemini-batch`: a provider batch job per shard, adopted by display name; see the module docstring."""

    offer: ClassVar[EmbedderOffer] = EmbedderOffer(
        _entries, key_env="GEMINI_API_KEY", claims=frozenset(PRICES)
    )  # what `reindex init` writes for it

    class Config(Paced):
        kind: Literal["gemini-batch"]
        model: str = "gemini-embedding-001"
        api_key_env: str = "GEMINI_API_KEY"
        base_url: str | None = None  # the SDK's HttpOptions.base_url (a local emulator); default Google's
        output_dimensionality: int | None = Field(default=None, gt=0)  # sent with every line
        dim: int | None = Field(default=None, gt=0)  # the output size of a model whose size is not known
        task_type: str | None = None  # e.g. RETRIEVAL_DOCUMENT; sent with every line, part of the identity
        normalize: bool = True  # unit length here: below 3072 dimensions the model's vectors are not
        max_tokens: int = Field(default=MAX_INPUT_TOKENS, gt=0)
        tokenizer: str = "cl100k_base"  # an estimate: Gemini's own tokenizer is not available offline
        timeout_s: float = Field(default=60.0, gt=0)
        create_timeout_s: float = Field(default=60.0, gt=0)
        prices: dict[str, float] | None = None  # {"online": x, "batch": y} USD per 1M tokens

    def __init__(
        self,
        client: Client,
        *,
        model: str = "gemini-embedding-001",
        output_dimensionality: int | None = None,
        dim: int | None = None,
        task_type: str | None = None,
        normalize: bool = True,
        max_tokens: int = MAX_INPUT_TOKENS,
        tokenizer: str = "cl100k_base",
        create_timeout_s: float = 60.0,
        pacer: Pacer | None = None,
        api_key_env: str = "GEMINI_API_KEY",
        prices: Mapping[str, float] | None = None,
    ) -> None:
        self._client, self._pacer, self._key_env = client, pacer or Pacer(), api_key_env
        self._secret = str(getattr(getattr(client, "_api_client", None), "api_key", "") or "")
        self._model, self._dimensions, self._task_type = model, output_dimensionality, task_type
        self._is_normalized, self._create_timeout_s = normalize, create_timeout_s
        self._codec = encoding(tokenizer)
        self.token_counts = TokenCounts(
            False, f"estimate: {tokenizer} (Gemini's tokenizer is not available offline)"
        )
        size = _resolve_dim(model, output_dimensionality, dim)
        options = {
            "output_dimensionality": output_dimensionality,
            "task_type": task_type,
            "normalize": normalize,
            "max_tokens": max_tokens,
            "tokenizer": tokenizer,
        }
        identity = fingerprint("gemini", model, size, options)
        self.info = EmbedderInfo("gemini-batch", model, size, max_tokens, identity, options)
        table = {"online": None, "batch": None, **PRICES.get(model, {}), **(prices or {})}
        tiers: dict[str, float | None] = {tier: table[tier] for tier in ("online", "batch")}
        self.traits = EmbedderTraits(remote=True, price_per_million=tiers["batch"], prices=tiers)

    @classmethod
    def from_config(cls, config: Config) -> GeminiBatchEmbedder:
        pacer = Pacer.of(config)
        return cls(
            make_client(config.base_url, config.api_key_env, config.timeout_s),
            model=config.model,
            output_dimensionality=config.output_dimensionality,
            dim=config.dim,
            task_type=config.task_type,
            normalize=config.normalize,
            max_tokens=config.max_tokens,
            tokenizer=config.tokenizer,
            create_timeout_s=config.create_timeout_s,
            pacer=pacer,
            api_key_env=config.api_key_env,
            prices=config.prices,
        )

    @property
    def traffic(self) -> Traffic:
        return self._pacer.traffic.describe()

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        """Estimated counts (see `Config.tokenizer`); texts longer than `max_tokens` are cut by that count."""
        return tokenize_texts(texts, self._codec, self.info.max_tokens)

    def submit(self, key: str, items: Sequence[JobItem], *, isolate: bool = False) -> str:
        """Adopt the batch whose display name is `key`, else upload the file and create one (no retry).

        Every line carries one input already, so `isolate` changes nothing here.
        """
        content = self._input_file(items)
        found = self._find(key)
        if found is not None:
            return str(found.name)
        return self._create(key, self._upload(key, content))

    def poll(self, job_id: str) -> JobResult:
        job = self._call(functools.partial(self._client.batches.get, name=job_id))
        state = _state(job)
        if state not in TERMINAL:
            return JobResult(state, False)
        file_name = job.dest.file_name if job.dest else None
        content = self._download(file_name) if file_name else None
        vectors, failed, billed = read_responses(content or b"", self.info.dim)
        if self._is_normalized:
            vectors = {key: _unit(vector) for key, vector in vectors.items()}
        return JobResult(state, True, vectors, failed, billed)

    def release(self, job_id: str) -> None:
        """Delete the job's responses file; gone is fine, and so is a refusal: whether a key may delete a
        GENERATED file is not documented, the Files API removes files after 48 hours, and the vectors are
        stored by now, so a 403 leaves the file rather than ending the run (the key itself was just
        accepted by the `batches.get`). Uploaded input files are not deleted: the batch object does not
        name them."""
        job = self._call(functools.partial(self._client.batches.get, name=job_id))
        if job.dest and job.dest.file_name:
            try:
                self._delete_file(job.dest.file_name)
            except ConfigError:
                return

    # submitting ------------------------------------------------------------------------------------------

    def _input_file(self, items: Sequence[JobItem]) -> bytes:
        if not items:
            raise ConfigError("a batch job takes at least one input")
        request: dict[str, Any] = {}
        if self._dimensions:
            request["output_dimensionality"] = self._dimensions
        if self._task_type:
            request["task_type"] = self._task_type
        lines = (
            {
                "key": item.custom_id,
                "request": {"content": {"parts": [{"text": str(item.tokens.data)}]}, **request},
            }
            for item in items
        )
        content = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()
        if len(content) > MAX_FILE_BYTES:
            raise ConfigError(
                f"the batch input file would be {len(content):,} bytes, over the Files API's 2 GB",
                hint="lower [run] shard_size",
            )
        return content

    def _find(self, key: str) -> BatchJob | None:
        """The batch whose display name is `key` and that did not fail, over every page of the listing."""
        pager = self._call(functools.partial(self._client.batches.list, config={"page_size": 100}))
        while True:
            for job in pager.page:
                if job.display_name == key and _state(job) != "JOB_STATE_FAILED":
                    return job
            if not pager.config.get("page_token"):
                return None
            self._call(pager.next_page)

    def _upload(self, key: str, content: bytes) -> str:
        from google.genai import types

        config = types.UploadFileConfig(mime_type="jsonl", display_name=key)
        upload = functools.partial(self._client.files.upload, file=io.BytesIO(content), config=config)
        return str(self._call(upload).name)

    def _create(self, key: str, file_name: str) -> str:
        """Create once; after a timeout or 5xx, adopt the batch if it was made anyway."""
        from google.genai import types
        from google.genai.errors import ExperimentalWarning

        timeout = types.HttpOptions(timeout=int(self._create_timeout_s * 1000))
        create = functools.partial(
            self._client.batches.create_embeddings,
            model=self._model,
            src=types.EmbeddingsBatchJobSource(file_name=file_name),
            config=types.CreateEmbeddingsBatchJobConfig(display_name=key, http_options=timeout),
        )

        def created() -> BatchJob:
            with warnings.catch_warnings():  # the SDK marks create_embeddings experimental, once per call
                warnings.simplefilter("ignore", ExperimentalWarning)
                return self._once(create)

        found = functools.partial(self._find, key)
        return str(create_once(created, found, what=f"the batch for key {key!r}").name)

    # files and calls ---------------------------------------------------------------------------------------

    def _download(self, file_name: str) -> bytes | None:
        try:
            return self._call(functools.partial(self._client.files.download, file=file_name))
        except ProviderNotFound:
            return None

    def _delete_file(self, file_name: str) -> None:
        try:
            self._call(functools.partial(self._client.files.delete, name=file_name))
        except ProviderNotFound:
            return

    def _call(self, request: Callable[[], T]) -> T:
        """Paced and retried (429 and 5xx, after the server's RetryInfo delay when it gives one)."""
        return self._pacer.call(functools.partial(self._once, request))

    def _once(self, request: Callable[[], T]) -> T:
        with translated_errors(self._secret, self._key_env):
            return request()


def _state(job: BatchJob) -> str:
    state = job.state
    return str(state.value if state is not None and hasattr(state, "value") else state)


def _unit(vector: Vectors) -> Vectors:
    norm = float(np.linalg.norm(vector))
    return (vector / norm).astype(np.float32) if norm > 0 else vector


def _resolve_dim(model: str, output_dimensionality: int | None, dim: int | None) -> int:
    if output_dimensionality is not None and dim is not None and output_dimensionality != dim:
        raise ConfigError(
            f"output_dimensionality={output_dimensionality} and dim={dim} disagree",
            hint="set only output_dimensionality",
        )
    resolved = output_dimensionality or dim or KNOWN_DIMS.get(model)
    if resolved is None:
        raise ConfigError(f"the output dimension of model {model!r} is unknown", hint="set dim in [embedder]")
    return resolved
