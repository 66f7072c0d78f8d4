"""The `cohere` embedder: Cohere's online /v2/embed, paced, up to 96 texts a request, `concurrency` requests in
flight, inputs the endpoint refuses isolated by halving the request (the `openai` kind's way).

`Requests` is the request itself, shared with `cohere-batch`, which sends the lines it would otherwise send in
another Embed Job through it (`stragglers_online`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from concurrent.futures import CancelledError, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from reindex.capabilities import Traffic
from reindex.errors import BackendError, ReindexError
from reindex.offers import EmbedderOffer, provider_entries
from reindex.ports import EmbedderTraits, RequestLimits, TokenCounts, Tokens, Vectors
from reindex_adapters.cohere.client import (
    BATCH_MODELS,
    COHERE_OPTIONS,
    COUNTS,
    MAX_TEXTS,
    MODELS,
    Api,
    Settings,
    make_client,
    model_info,
    prices_for,
    tokenize,
    tokenizer,
)
from reindex_adapters.remote.errors import ProviderRejected
from reindex_adapters.remote.pacing import Pacer

if TYPE_CHECKING:
    from cohere import ClientV2


class Requests:
    """/v2/embed for one configuration: `send` one request, `embed` many rows (grouped, refusals isolated)."""

    def __init__(self, api: Api, config: Settings, dim: int, *, max_texts: int = MAX_TEXTS) -> None:
        self.api, self.config, self.dim, self.max_texts = api, config, dim, max_texts
        options: dict[str, Any] = {
            "model": config.model,
            "input_type": config.input_type,
            "embedding_types": ["float"],
            "truncate": config.truncate,
        }
        if config.output_dimension is not None:
            options["output_dimension"] = config.output_dimension
        self._options = options

    def send(self, texts: list[str]) -> tuple[Vectors, int]:
        """The vectors of `texts` and the input tokens Cohere billed for them (`meta.billed_units`)."""
        response = self.api.client.embed(texts=texts, **self._options, request_options={"max_retries": 0})
        floats = response.embeddings.float_ if response.embeddings is not None else None
        vectors = np.asarray(floats if floats is not None else [], dtype=np.float32)
        if vectors.shape != (len(texts), self.dim):
            raise BackendError(
                f"Cohere returned vectors of shape {vectors.shape}, expected ({len(texts)}, {self.dim})",
                hint="check model and output_dimension",
            )
        billed = response.meta.billed_units if response.meta is not None else None
        tokens = billed.input_tokens if billed is not None else None
        return vectors, int(tokens or 0)

    def rows(
        self,
        texts: Sequence[str],
        counts: Sequence[int],
        rows: list[int],
        out: Vectors,
        refused: dict[int, str],
    ) -> int:
        """Embed `rows` in one request into `out`; on a refusal, halve until the refused inputs stand alone
        (they get "provider_rejected:<code>" in `refused`). Returns the tokens billed."""
        request = functools.partial(self.send, [texts[row] for row in rows])
        try:
            vectors, billed = self.api.call(
                request, tokens=sum(counts[row] for row in rows), usage=_billed, rejects_input=True
            )
        except ProviderRejected as exc:
            if len(rows) == 1:
                refused[rows[0]] = f"provider_rejected:{exc.code}"
                return 0
            half = len(rows) // 2
            return self.rows(texts, counts, rows[:half], out, refused) + self.rows(
                texts, counts, rows[half:], out, refused
            )
        out[rows] = vectors
        return billed

    def groups(self, count: int) -> list[list[int]]:
        return [
            list(range(start, min(start + self.max_texts, count)))
            for start in range(0, count, self.max_texts)
        ]


class CohereEmbedder:
    """/v2/embed, `concurrency` requests at a time; a refused input comes back as a NaN row, named by
    `last_rejections()` ({row: "provider_rejected:<code>"})."""

    offer: ClassVar[EmbedderOffer] = EmbedderOffer(
        provider_entries("cohere", "or cohere-batch: Embed Jobs", *COHERE_OPTIONS),
        key_env="CO_API_KEY",
        claims=frozenset(MODELS) - BATCH_MODELS,  # the v3.0 ones go to Embed Jobs, at half the price
    )  # what `reindex init` writes for it

    class Config(Settings):
        kind: Literal["cohere"]
        tokens_per_minute: int | None = Field(default=None, gt=0)
        concurrency: int = Field(default=4, gt=0, le=64)  # requests in flight at most (fewer after 429s)
        max_texts_per_request: int = Field(default=MAX_TEXTS, gt=0, le=MAX_TEXTS)

    def __init__(self, client: ClientV2, config: Config, *, pacer: Pacer | None = None) -> None:
        self.config = config
        self.info = model_info("cohere", config)
        api = Api(client, pacer or Pacer(concurrency=config.concurrency), config.api_key_env)
        self._requests = Requests(api, config, self.info.dim, max_texts=config.max_texts_per_request)
        self._codec = tokenizer()
        listed = prices_for(config.model, config.prices)
        texts = config.concurrency * config.max_texts_per_request  # a full request for every one in flight
        # tokens cost money and time, padding nothing: as many tokens a call as its texts can hold, so
        # the text count decides
        self.traits = EmbedderTraits(
            remote=True,
            price_per_million=listed["online"],
            prices=listed,
            batch_tokens=texts * self.info.max_tokens,
            max_batch=texts,
        )
        self.billed_tokens = 0
        self._rejections: dict[int, str] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: Config) -> CohereEmbedder:
        return cls(
            make_client(config.base_url, config.api_key_env, config.timeout_s), config, pacer=Pacer.of(config)
        )

    @property
    def request_limits(self) -> RequestLimits:
        """Texts one request carries (`LimitsRequests`): Cohere's 96, or the config's fewer; /v2/embed
        states no token limit per request, only one per text."""
        return RequestLimits(self.config.max_texts_per_request, None)

    @property
    def traffic(self) -> Traffic:
        return self._requests.api.pacer.traffic.describe()

    token_counts: TokenCounts = COUNTS

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        """cl100k_base counts, cut at `max_tokens`: an estimate (Cohere's tokenizer is not available offline);
        what was billed is read from each answer's `meta.billed_units.input_tokens`."""
        return tokenize(texts, self._codec, self.info.max_tokens)

    def embed(self, items: Sequence[Tokens]) -> Vectors:
        texts, counts = [str(item.data) for item in items], [item.count for item in items]
        out = np.full((len(texts), self.info.dim), np.nan, dtype=np.float32)
        refused: dict[int, str] = {}
        futures = [
            self._senders().submit(self._requests.rows, texts, counts, rows, out, refused)
            for rows in self._requests.groups(len(texts))
        ]
        billed, failure = 0, None
        for future in futures:
            try:
                billed += future.result()
            except (
                ReindexError
            ) as exc:  # the call fails; what is not sent yet is not sent, what was is billed
                failure = failure or exc
                for waiting in futures:
                    waiting.cancel()
            except CancelledError:
                continue
        with self._lock:
            self.billed_tokens += billed
        if failure is not None:
            raise failure
        self._rejections = refused
        return out

    def last_rejections(self) -> dict[int, str]:
        """Rows of the last `embed` call the endpoint refused, with "provider_rejected:<code>"."""
        return dict(self._rejections)

    def _senders(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.config.concurrency, thread_name_prefix="cohere-embed")
            return self._pool


def _billed(answer: tuple[Vectors, int]) -> int:
    return answer[1]
