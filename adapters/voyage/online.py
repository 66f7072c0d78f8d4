"""The `voyage` embedder: Voyage's /v1/embeddings through the official `voyageai` SDK, paced, requests sent
concurrently, an input Voyage refuses isolated by halving its request until it stands alone.

For small corpora and for the lines a `voyage-batch` job left (`stragglers_online`): the batch tier costs a
third less but may take its whole 12-hour window.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from reindex.capabilities import Traffic
from reindex.errors import BackendError
from reindex.offers import EmbedderOffer, provider_entries
from reindex.ports import EmbedderTraits, JobItem, JobResult, RequestLimits, Tokens, Vectors
from reindex_adapters.remote.errors import ProviderRejected
from reindex_adapters.remote.pacing import Pacer
from reindex_adapters.remote.tokens import request_groups
from reindex_adapters.voyage.client import VoyageApi
from reindex_adapters.voyage.models import (
    MAX_INPUTS,
    VOYAGE_OPTIONS,
    VoyageSettings,
    identity,
    model_limits,
    prices_for,
    request_params,
)
from reindex_adapters.voyage.tokens import TokenCounter


class VoyageEmbedder:
    """`/v1/embeddings`, `concurrency` requests at a time; a refused input comes back as a NaN row, named by
    `last_rejections()` ({row: "provider_rejected:<reason>"})."""

    offer: ClassVar[EmbedderOffer] = EmbedderOffer(
        provider_entries("voyage", "or voyage-batch: the Batch API, a third off", *VOYAGE_OPTIONS),
        key_env="VOYAGE_API_KEY",
    )  # what `reindex init` writes for it

    class Config(VoyageSettings):
        kind: Literal["voyage"]
        tokens_per_minute: int | None = Field(default=None, gt=0)  # your account's limits (Voyage's rate
        concurrency: int = Field(default=4, gt=0, le=64)  # limits guide); requests in flight at most
        max_inputs_per_request: int = Field(default=MAX_INPUTS, gt=0, le=MAX_INPUTS)
        max_tokens_per_request: int | None = Field(default=None, gt=0)  # default: the model's own limit

    def __init__(
        self,
        api: VoyageApi,
        settings: VoyageSettings,
        *,
        concurrency: int = 4,
        max_inputs_per_request: int = MAX_INPUTS,
        max_tokens_per_request: int | None = None,
        counter: TokenCounter | None = None,
    ) -> None:
        self._api, self._concurrency = api, concurrency
        self.info = identity("voyage", settings)
        self._options = request_params(settings)
        limits = model_limits(settings.model)
        self._max_inputs = max_inputs_per_request
        self._max_tokens = max_tokens_per_request or limits.request_tokens
        self._counter = counter or TokenCounter(settings.model, limits.context, settings.tokenizer_path)
        self.token_counts = (
            self._counter.counts_are
        )  # exact from a file, or estimated (docs/providers/voyage.md)
        listed = prices_for(settings.model, settings.prices)
        # tokens cost money and time, padding nothing: an `embed` call fills every request in flight
        self.traits = EmbedderTraits(
            remote=True,
            price_per_million=listed["online"],
            prices=listed,
            batch_tokens=concurrency * self._max_tokens,
            max_batch=concurrency * max_inputs_per_request,
        )
        self.billed_tokens = 0
        self._billing = threading.Lock()
        self._rejections: dict[int, str] = {}

    @classmethod
    def from_config(cls, config: Config) -> VoyageEmbedder:
        pacer = Pacer.of(config)
        api = VoyageApi.connect(config.base_url, config.api_key_env, config.timeout_s, pacer)
        return cls(
            api,
            config,
            concurrency=config.concurrency,
            max_inputs_per_request=config.max_inputs_per_request,
            max_tokens_per_request=config.max_tokens_per_request,
        )

    @property
    def request_limits(self) -> RequestLimits:
        """Texts and tokens one request carries (`LimitsRequests`): Voyage's 1,000 texts and the model's
        token cap, or the config's lower ones."""
        return RequestLimits(self._max_inputs, self._max_tokens)

    @property
    def traffic(self) -> Traffic:
        return self._api.pacer.traffic.describe()

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        return self._counter.tokenize(texts)

    def embed(self, items: Sequence[Tokens]) -> Vectors:
        """Requests within Voyage's limits, sent concurrently; an error other than a refused input fails the
        call (the run retries it)."""
        texts, counts = [str(item.data) for item in items], [item.count for item in items]
        out = np.full((len(texts), self.info.dim), np.nan, dtype=np.float32)
        rejected: dict[int, str] = {}
        groups = request_groups(counts, self._max_inputs, self._max_tokens)
        send = functools.partial(self._embed_rows, texts=texts, counts=counts, out=out, rejected=rejected)
        try:
            if len(groups) <= 1:
                for rows in groups:
                    send(rows)
            else:
                with ThreadPoolExecutor(min(self._concurrency, len(groups)), "voyage-embed") as pool:
                    for done in [pool.submit(send, rows) for rows in groups]:
                        done.result()
        finally:
            self._rejections = dict(rejected)
        return out

    def last_rejections(self) -> dict[int, str]:
        """Rows of the last `embed` call Voyage refused, with "provider_rejected:<reason>"."""
        return dict(self._rejections)

    def embed_stragglers(self, items: Sequence[JobItem]) -> JobResult:
        """Lines a batch left, embedded now at the online price (`voyage-batch`'s `stragglers_online`)."""
        before = self.billed_tokens
        vectors = self.embed([item.tokens for item in items])
        rejected = self.last_rejections()
        failed = {
            items[row].custom_id: code.removeprefix("provider_rejected:") for row, code in rejected.items()
        }
        done = {item.custom_id: vectors[row] for row, item in enumerate(items) if row not in rejected}
        return JobResult("online", True, done, failed, self.billed_tokens - before)

    def _embed_rows(
        self, rows: list[int], *, texts: list[str], counts: list[int], out: Vectors, rejected: dict[int, str]
    ) -> None:
        """Embed `rows` in one request; on a refusal, halve it until the refused input stands alone."""
        request = functools.partial(self._request, [texts[row] for row in rows])
        try:
            out[rows], _ = self._api.call(request, tokens=sum(counts[row] for row in rows), usage=_billed)
        except ProviderRejected as exc:
            if len(rows) == 1:
                rejected[rows[0]] = f"provider_rejected:{exc.code}"
                return
            half = len(rows) // 2
            for part in (rows[:half], rows[half:]):
                self._embed_rows(part, texts=texts, counts=counts, out=out, rejected=rejected)

    def _request(self, texts: list[str]) -> tuple[Vectors, int]:
        """The vectors of `texts` and the tokens Voyage billed for them (`usage.total_tokens`)."""
        options: dict[str, Any] = dict(self._options)
        answer = self._api.sdk().embed(texts, truncation=True, **options)
        vectors = np.asarray(answer.embeddings, dtype=np.float32)
        if vectors.shape != (len(texts), self.info.dim):
            raise BackendError(
                f"Voyage returned vectors of shape {vectors.shape}, expected ({len(texts)}, {self.info.dim})",
                hint="check model, output_dimension and dim in [embedder]",
            )
        billed = int(answer.total_tokens)
        with self._billing:
            self.billed_tokens += billed
        return vectors, billed


def _billed(answer: tuple[Vectors, int]) -> int:
    return answer[1]
