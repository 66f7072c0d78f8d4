"""The `openai` embedder: online `/v1/embeddings`, paced, requests sent concurrently, poison inputs isolated.

Works with any endpoint speaking the OpenAI wire format (OpenAI, vLLM, TEI, Infinity); Azure OpenAI's
deployment routes go through reindex_adapters.openai.azure, which builds the SDK's AzureOpenAI client for this embedder.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self

import numpy as np
from pydantic import Field

from reindex.capabilities import Traffic
from reindex.columns import TokenColumns
from reindex.errors import BackendError
from reindex.offers import EmbedderOffer, provider_entries
from reindex.ports import EmbedderTraits, RequestLimits, Tokens, Vectors
from reindex_adapters.openai.client import (
    MAX_INPUTS,
    MAX_REQUEST_TOKENS,
    OPENAI_OPTIONS,
    PRICES,
    Endpoint,
    Settings,
    make_client,
    model_info,
    prices_for,
    request_groups,
    resolve_dim,
    token_counts,
)
from reindex_adapters.remote.decoding import decode, decode_vectors
from reindex_adapters.remote.errors import ProviderRejected
from reindex_adapters.remote.lines import json_line
from reindex_adapters.remote.pacing import Pacer
from reindex_adapters.remote.tokens import bounded_texts, encode_texts, encoding, tokenize_texts

if TYPE_CHECKING:
    from openai import OpenAI

Inputs = tuple[list[str], list[int]]  # an online call's texts to send and their token counts
REQUESTS_PER_SLOT = 4  # requests an online call is cut into, per request in flight
MIN_INPUTS_PER_REQUEST = 16  # fewer requests than that for a small call: each costs a round trip


class RemoteCall:
    """One online call in flight: its requests queued on the senders; `result()` waits for all of them.
    A failed request fails the call, and its requests not sent yet are dropped. `billed_tokens()` is what
    its requests that came back were billed, so a caller with several calls in flight bills each its own."""

    def __init__(
        self, out: Vectors, futures: list[Future[None]], rejections: dict[int, str], billed: list[int]
    ) -> None:
        self._out, self._futures, self._rejections, self._billed = out, futures, rejections, billed

    def billed_tokens(self) -> int:
        return sum(self._billed)

    def done(self) -> bool:
        return all(future.done() for future in self._futures)

    def cancel(self) -> None:
        """Send none of its requests not sent yet (those in flight finish)."""
        for future in self._futures:
            future.cancel()

    def result(self) -> Vectors:
        try:
            for future in self._futures:
                future.result()
        finally:
            self.cancel()  # on a failure, send nothing more
        return self._out

    def rejections(self) -> dict[int, str]:
        """Rows the endpoint refused ({row: "provider_rejected:<code>"}), once `result()` returned."""
        return dict(self._rejections)


class OpenAIEmbedder:
    """`/v1/embeddings`, `concurrency` requests at a time; a rejected input comes back as a NaN row.

    `last_rejections()` names the rejected rows of the last `embed` call ({row: "provider_rejected:<code>"}).
    """

    offer: ClassVar[EmbedderOffer] = EmbedderOffer(
        provider_entries("openai", "or openai-batch: the Batch API at about half the price", *OPENAI_OPTIONS),
        key_env="OPENAI_API_KEY",
        claims=frozenset(PRICES),
    )  # what `reindex init` writes for it

    class Config(Settings):
        kind: Literal["openai"]
        tokens_per_minute: int | None = Field(default=None, gt=0)
        concurrency: int = Field(default=4, gt=0, le=64)  # requests in flight at most (fewer after 429s)
        max_inputs_per_request: int = Field(default=MAX_INPUTS, gt=0)  # the provider's limits: override
        max_tokens_per_request: int = Field(default=MAX_REQUEST_TOKENS, gt=0)  # for a stricter endpoint

    def __init__(
        self,
        client: OpenAI,
        *,
        model: str,
        dim: int | None = None,
        dimensions: int | None = None,
        max_tokens: int = 8191,
        tokenizer: str = "cl100k_base",
        concurrency: int = 4,
        max_inputs_per_request: int = MAX_INPUTS,
        max_tokens_per_request: int = MAX_REQUEST_TOKENS,
        pacer: Pacer | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        prices: Mapping[str, float] | None = None,
        deployment: str | None = None,
    ) -> None:
        self._endpoint = Endpoint(client, pacer or Pacer(concurrency=concurrency), api_key_env)
        self._model, self._dimensions, self._concurrency = model, dimensions, concurrency
        self._served_as = deployment or model  # the name requests carry: an Azure deployment, else the model
        self._max_inputs, self._max_request_tokens = max_inputs_per_request, max_tokens_per_request
        self._codec = encoding(tokenizer)
        dim = resolve_dim(model, dimensions, dim)
        self.info = model_info("openai", model, dim, max_tokens, dimensions, tokenizer)
        self.token_counts = token_counts(model, tokenizer)
        self.billed_tokens = 0
        listed = prices_for(model, prices)
        # tokens cost money and time, padding nothing: an `embed` call fills every request in flight
        self.traits = EmbedderTraits(
            remote=True,
            price_per_million=listed["online"],
            prices=listed,
            batch_tokens=concurrency * max_tokens_per_request,
            max_batch=concurrency * max_inputs_per_request,
        )
        self._billing = threading.Lock()
        self._rejections: dict[int, str] = {}
        self._pool: ThreadPoolExecutor | None = None  # the senders, made on first use
        self._pool_lock = threading.Lock()
        # Pacing by tokens per minute needs each request's count before it is sent; otherwise the run's
        # texts are not tokenized (`bounded_texts`) and the provider's usage counts them.
        self._counts_tokens = self._endpoint.pacer.tokens_per_minute is not None

    @classmethod
    def from_config(cls, config: Config) -> OpenAIEmbedder:
        return cls.through(make_client(config.base_url, config.api_key_env, config.timeout_s), config)

    @classmethod
    def through(cls, client: Any, config: Config, **options: Any) -> Self:
        """An embedder with `config`'s settings speaking through `client` (an online kind's own SDK client)."""
        pacer = Pacer.of(config)
        return cls(
            client,
            **options,
            model=config.model,
            dim=config.dim,
            dimensions=config.dimensions,
            max_tokens=config.max_tokens,
            tokenizer=config.tokenizer,
            concurrency=config.concurrency,
            max_inputs_per_request=config.max_inputs_per_request,
            max_tokens_per_request=config.max_tokens_per_request,
            pacer=pacer,
            api_key_env=config.api_key_env,
            prices=config.prices,
        )

    @property
    def request_limits(self) -> RequestLimits:
        """Texts and tokens one request carries (`LimitsRequests`): OpenAI's, or the config's lower ones."""
        return RequestLimits(self._max_inputs, self._max_request_tokens)

    @property
    def traffic(self) -> Traffic:
        """Requests, retries, 429s and the achieved rates so far (see `Traffic`)."""
        return self._endpoint.pacer.traffic.describe()

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        return tokenize_texts(texts, self._codec, self.info.max_tokens)

    def count_tokens_exactly(self) -> None:
        """Tokenize every text in `tokenize_columns` (a cost cap reserves each shard's tokens before it is
        sent, and an upper bound would stop it early)."""
        self._counts_tokens = True

    def tokenize_columns(self, texts: Sequence[str]) -> TokenColumns:
        """`tokenize` as columns, with no object per text (the pipeline's path). Unless tokens are paced or
        capped (`count_tokens_exactly`), counts are upper bounds and only over-long texts are tokenized:
        `bounded` tells the run to record the tokens the provider billed."""
        encode = encode_texts if self._counts_tokens else bounded_texts
        sent, counts, original = encode(texts, self._codec, self.info.max_tokens)
        return TokenColumns(
            np.asarray(counts, dtype=np.int64),
            np.asarray(original, dtype=np.int64),
            texts=sent,
            bounded=not self._counts_tokens,
        )

    def embed(self, items: Sequence[Tokens]) -> Vectors:
        """Requests within the API limits, sent concurrently; any request that cannot succeed fails the call."""
        call = self.embed_prepared(([str(item.data) for item in items], [item.count for item in items]))
        try:
            return call.result()
        finally:
            self._rejections = call.rejections()

    def last_rejections(self) -> dict[int, str]:
        """Rows of the last `embed` call the endpoint refused, with "provider_rejected:<code>"."""
        return dict(self._rejections)

    def prepare_columns(self, tokens: TokenColumns) -> Inputs:
        """The texts to send and their token counts (the pipeline's feeding protocol, `reindex.run.feeding`)."""
        texts = tokens.texts if tokens.texts is not None else [str(item.data) for item in tokens]
        return texts, tokens.counts.tolist()

    def embed_prepared(self, inputs: Inputs) -> RemoteCall:
        """Queue the call's requests on the shared pool of `concurrency` senders and return at once. The
        pipeline launches the next call before it waits on this one, so the next call's requests follow
        this call's on the wire instead of waiting for its slowest request."""
        texts, counts = inputs
        out = np.full((len(texts), self.info.dim), np.nan, dtype=np.float32)
        rejections: dict[int, str] = {}
        billed: list[int] = []
        pool = self._senders()
        futures = [
            pool.submit(self._embed_rows, rows, inputs, out, rejections, billed)
            for rows in self._requests(counts)
        ]
        return RemoteCall(out, futures, rejections, billed)

    def _senders(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._concurrency, thread_name_prefix="openai-embed")
            return self._pool

    def _requests(self, counts: Sequence[int]) -> list[list[int]]:
        """Consecutive rows cut into about `REQUESTS_PER_SLOT` requests per slot in flight, of about equal
        weight (tokens, and one mean text's worth per input: each input also costs a vector to send back and
        decode), each within the provider's limits. Several requests per slot keep every slot busy to the
        end of the call: the last one to finish is a small one."""
        if not counts:
            return []
        pieces = max(1, min(self._concurrency * REQUESTS_PER_SLOT, len(counts) // MIN_INPUTS_PER_REQUEST))
        mean = max(1.0, sum(counts) / len(counts))
        weights = [count / mean + 1 for count in counts]
        total, before = sum(weights), 0.0
        shares: list[list[int]] = [[] for _ in range(pieces)]
        for row, weight in enumerate(weights):
            shares[min(pieces - 1, int(before * pieces / total))].append(row)
            before += weight
        return [
            [share[index] for index in group]
            for share in shares
            if share
            for group in request_groups(
                [counts[row] for row in share], self._max_inputs, self._max_request_tokens
            )
        ]

    def _embed_rows(
        self, rows: list[int], inputs: Inputs, out: Vectors, rejected: dict[int, str], billed: list[int]
    ) -> None:
        """Embed `rows` in one request; on a 400, bisect to isolate the inputs the endpoint refuses."""
        texts = [inputs[0][row] for row in rows]
        tokens = sum(inputs[1][row] for row in rows)
        try:
            out[rows], _ = self._endpoint.call(
                functools.partial(self._request, texts, billed), tokens=tokens, usage=_billed
            )
        except ProviderRejected as exc:
            if len(rows) == 1:
                rejected[rows[0]] = f"provider_rejected:{exc.code}"
                return
            half = len(rows) // 2
            self._embed_rows(rows[:half], inputs, out, rejected, billed)
            self._embed_rows(rows[half:], inputs, out, rejected, billed)

    def _request(self, texts: list[str], billed_to: list[int]) -> tuple[Vectors, int]:
        """The vectors of `texts`, and the tokens the provider billed for them."""
        import httpx

        request: dict[str, Any] = {"input": texts, "model": self._served_as, "encoding_format": "base64"}
        if self._dimensions:
            request["dimensions"] = self._dimensions
        # The SDK's documented `post` for the raw body, not `embeddings.create`: create walks every input
        # through its type transform (1.8 ms of GIL-held Python per request of 64 texts), and its typed
        # objects cost more client time than the request itself. Errors are raised (and translated) as before.
        response = self._endpoint.client.post("/embeddings", body=request, cast_to=httpx.Response)
        body = json_line(response.content) or {}
        try:
            data = sorted(body["data"], key=lambda embedding: int(embedding["index"]))
            vectors = decode_vectors([embedding["embedding"] for embedding in data])
            billed = int(body["usage"]["prompt_tokens"])
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendError(f"the endpoint returned a malformed embeddings body: {exc!r}") from None
        with self._billing:
            self.billed_tokens += billed
        billed_to.append(billed)  # list.append is atomic: the call's senders share it
        if vectors is None or vectors.shape != (len(texts), self.info.dim):
            shapes = sorted({np.shape(decode(embedding["embedding"])) for embedding in data})
            raise BackendError(
                f"the endpoint returned {len(data)} vectors of shapes {shapes}, expected "
                f"{len(texts)} of ({self.info.dim},)",
                hint="check dim/dimensions for this model",
            )
        return vectors, billed


def _billed(answer: tuple[Vectors, int]) -> int:
    return answer[1]
