"""What the emulated OpenAI API refuses: the real input rules (400s, batch line errors) and scripted faults.

FaultPlan counters (`rate_limit`, `server_errors`, `slow_creates`) are spent one request at a time; the
batch faults are copied onto each batch when it is created and shape that batch only.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from pydantic import ConfigDict, TypeAdapter, ValidationError

from reindex_adapters.remote.tokens import cl100k

ROUTES = ("embeddings", "batch_create", "batch_retrieve", "batch_list", "batch_cancel", "files")
MAX_INPUTS = 2048
MAX_INPUT_TOKENS = 8192
MAX_REQUEST_TOKENS = 300_000
MAX_BATCH_REQUESTS = 50_000
INVALID_INPUT = (
    "'$.input' is invalid. Please check the API reference: https://platform.openai.com/docs/api-reference."
)
SERVER_ERROR = "The server had an error while processing your request. Sorry about that!"


class ApiError(Exception):
    """An error response in the real API's wire shape: {"error": {message, type, param, code}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error = {"message": message, "type": type, "param": param, "code": code}
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": dict(self.error)}


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """What goes wrong, and how fast batches progress. The defaults: a well-behaved API."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    polls_per_step: int = 1  # batch retrieves per status step; 0 runs a batch to its end on one retrieve
    fail_validation: bool = False  # batches fail validation with a line error
    expire_after: int | None = None  # batches expire with only their first K lines done
    cancel_after: int | None = None  # batches are cancelled server-side after K lines (and client cancels)
    shuffle_output: bool = False
    duplicate_output_line: bool = False
    malformed_output_line: bool = False
    delete_output: bool = False  # the output file is gone before anyone downloads it
    slow_creates: int = 0  # the next N batch creates answer only after `create_delay_s`
    create_delay_s: float = 2.0
    # the next N batch creates answer 404 "Input file not found" for a file just uploaded (Voyage: seen in
    # github.com/mongodb-developer/GenAI-Showcase/issues/175, cause unknown; nothing is created)
    unseen_files: int = 0
    rate_limit: int = 0  # the next N requests to `rate_limit_on` routes get 429
    rate_limit_on: tuple[str, ...] = ("embeddings",)
    retry_after_s: float = 1.0
    server_errors: int = 0  # the next N requests to `server_errors_on` routes get `server_error_status`
    server_error_status: int = 500
    server_errors_on: tuple[str, ...] = ("embeddings",)
    poison_substring: str | None = None  # an embeddings request with an input containing it gets 400
    poison_shape: Literal["response", "error"] = "response"  # a poisoned batch line: HTTP 400 answer, or
    #   `response: null, error: {code: "invalid_request"}` (both shapes appear in real error files)
    failed_lines: int = 0  # the first K requests of each batch fail with `failed_line_status` (error file)
    failed_line_status: int = 500
    unauthorized: int = 0  # the next N requests get a 401 whose message echoes the API key presented
    # Rate limits of /v1/embeddings per client, as the service enforces them: over any `limit_window_s`
    # at most that window's share of the per-minute figure; past it a 429 with the Retry-After that frees it
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    limit_window_s: float = 60.0
    seed: int = 0
    faulty_batches: int | None = None  # batch faults hit only the first N batches created (None: all)

    def for_batch(self, created_before: int) -> FaultPlan:
        """The plan a new batch runs under: clean of batch faults once `faulty_batches` have had them."""
        if self.faulty_batches is None or created_before < self.faulty_batches:
            return self
        return replace(
            self,
            fail_validation=False,
            expire_after=None,
            cancel_after=None,
            shuffle_output=False,
            duplicate_output_line=False,
            malformed_output_line=False,
            delete_output=False,
            failed_lines=0,
        )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> FaultPlan:
        """Build a plan from JSON (the admin endpoint); unknown fields, bad values or routes are a 400."""
        try:
            plan = TypeAdapter(cls).validate_python(dict(values))
        except ValidationError as exc:
            raise ApiError(400, f"invalid fault plan: {exc.errors()[0]['msg']}") from None
        unknown = set(plan.rate_limit_on + plan.server_errors_on) - set(ROUTES)
        if unknown:
            raise ApiError(400, f"unknown routes {sorted(unknown)}; use some of: {', '.join(ROUTES)}")
        return plan

    def describe(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class FaultGate:
    """Refuses requests as the plan says, and counts clients that come back before Retry-After.

    A client is identified by its API key. Not thread-safe: the emulator calls it under its lock.
    """

    def __init__(self, plan: FaultPlan) -> None:
        self.plan = plan
        self.retry_at: dict[str, float] = {}
        self.early_requests: Counter[str] = Counter()
        self.refused: Counter[int] = Counter()
        self.served: dict[str, deque[tuple[float, int]]] = {}  # per client: (time, tokens) in the window

    def admit(self, route: str, client: str, now: float) -> None:
        """Raise the scripted refusal for this request, if any; note a request that came too early."""
        if now < self.retry_at.get(client, -math.inf):
            self.early_requests[client] += 1
        plan = self.plan
        if plan.unauthorized > 0:
            self.plan = replace(plan, unauthorized=plan.unauthorized - 1)
            self.refused[401] += 1
            message = f"Incorrect API key provided: {client}. You can find your API key at the dashboard."
            raise ApiError(401, message, code="invalid_api_key")
        if plan.rate_limit > 0 and route in plan.rate_limit_on:
            self.plan = replace(plan, rate_limit=plan.rate_limit - 1)
            self.retry_at[client] = now + plan.retry_after_s
            self.refused[429] += 1
            raise rate_limited(plan.retry_after_s)
        if plan.server_errors > 0 and route in plan.server_errors_on:
            self.plan = replace(plan, server_errors=plan.server_errors - 1)
            self.refused[plan.server_error_status] += 1
            raise ApiError(plan.server_error_status, SERVER_ERROR, type="server_error")

    def meter(self, client: str, now: float, tokens: int) -> None:
        """Count one embeddings request of `tokens` against the plan's rate limits, or refuse it with 429."""
        plan = self.plan
        if plan.requests_per_minute is None and plan.tokens_per_minute is None:
            return
        window = self.served.setdefault(client, deque())
        while window and window[0][0] <= now - plan.limit_window_s:
            window.popleft()
        share = plan.limit_window_s / 60
        wait = max(
            _wait(window, now, plan.limit_window_s, plan.requests_per_minute, share, 1, count=True),
            _wait(window, now, plan.limit_window_s, plan.tokens_per_minute, share, tokens, count=False),
        )
        if wait > 0:
            self.retry_at[client] = now + wait
            self.refused[429] += 1
            raise rate_limited(wait)
        window.append((now, tokens))

    def unseen_file(self) -> bool:
        """Whether this batch create is answered "Input file not found" (`unseen_files`)."""
        if self.plan.unseen_files <= 0:
            return False
        self.plan = replace(self.plan, unseen_files=self.plan.unseen_files - 1)
        return True

    def create_delay(self) -> float:
        """Seconds to hold back the response of this batch create (the batch exists meanwhile)."""
        if self.plan.slow_creates <= 0:
            return 0.0
        self.plan = replace(self.plan, slow_creates=self.plan.slow_creates - 1)
        return self.plan.create_delay_s


def _wait(
    window: deque[tuple[float, int]],
    now: float,
    span: float,
    limit: int | None,
    share: float,
    cost: int,
    *,
    count: bool,
) -> float:
    """Seconds until `cost` more fits under `limit * share` in the sliding window (0: it fits now)."""
    if limit is None:
        return 0.0
    excess = sum(1 if count else spent for _, spent in window) + cost - max(1.0, limit * share)
    if excess <= 0:
        return 0.0
    for sent_at, spent in window:
        excess -= 1 if count else spent
        if excess <= 0:
            return sent_at + span - now
    return span  # more than the window's whole share in one request


def line_failure(status: int) -> ApiError:
    """What a batch line scripted by `failed_lines` answers: a rate limit, a server error, or a refusal."""
    if status == 429:
        return rate_limited(1.0)
    if status >= 500:
        return ApiError(status, SERVER_ERROR, type="server_error")
    return ApiError(status, INVALID_INPUT)


def rate_limited(retry_after_s: float) -> ApiError:
    """A 429 with both headers the SDK reads: `retry-after` (whole seconds, rounded up) and `-ms`."""
    millis = math.ceil(retry_after_s * 1000)
    headers = {"retry-after": str(max(1, math.ceil(retry_after_s))), "retry-after-ms": str(millis)}
    message = f"Rate limit reached for requests. Please try again in {millis}ms."
    return ApiError(429, message, type="requests", code="rate_limit_exceeded", headers=headers)


def shape_output(lines: list[str], plan: FaultPlan, seed: str) -> list[str]:
    """Apply the output-file faults: shuffled order, one duplicated line, one truncated line."""
    rng = random.Random(f"{plan.seed}:{seed}")
    shaped = list(lines)
    if plan.shuffle_output:
        rng.shuffle(shaped)
        if shaped == lines:  # a shuffle that changed nothing would hide the fault
            shaped = shaped[1:] + shaped[:1]
    if plan.duplicate_output_line and shaped:
        shaped.insert(rng.randrange(len(shaped) + 1), rng.choice(shaped))
    if plan.malformed_output_line and shaped:
        index = rng.randrange(len(shaped))
        shaped[index] = shaped[index][: len(shaped[index]) // 2]
    return shaped


def parse_inputs(raw: Any) -> list[tuple[str, int]]:
    """Each input as (text, cl100k token count); token arrays are decoded. Raise the API's 400s."""
    items = [raw] if isinstance(raw, str) or (raw and _is_token_array(raw)) else raw
    if not isinstance(items, list) or not items:
        raise ApiError(400, INVALID_INPUT)
    if len(items) > MAX_INPUTS:
        raise ApiError(400, f"Too many inputs. The max number of inputs is {MAX_INPUTS}.", param="input")
    parsed = [_parse_input(item) for item in items]
    longest = max(count for _, count in parsed)
    if longest > MAX_INPUT_TOKENS:
        message = f"This model's maximum context length is {MAX_INPUT_TOKENS} tokens, however you requested"
        raise ApiError(400, f"{message} {longest} tokens. Please reduce your prompt.")
    total = sum(count for _, count in parsed)
    if total > MAX_REQUEST_TOKENS:
        raise ApiError(400, f"Requested {total} tokens, max {MAX_REQUEST_TOKENS} tokens per request")
    return parsed


def _is_token_array(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _parse_input(item: Any) -> tuple[str, int]:
    encoding = cl100k()
    if isinstance(item, str) and item.strip():
        return item, len(encoding.encode_ordinary(item))
    is_tokens = isinstance(item, list) and item and _is_token_array(item)
    if is_tokens and all(0 <= t < encoding.n_vocab for t in item):
        return encoding.decode(item), len(item)
    raise ApiError(400, INVALID_INPUT)


def parse_batch_input(content: bytes, endpoint: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The requests of a batch input file and its validation errors ({code, message, line, param})."""
    requests: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.decode("utf-8", errors="replace").splitlines(), start=1):
        if raw.strip():
            request, error = _parse_line(raw, number, endpoint, seen)
            requests += [request] if request else []
            errors += [error] if error else []
    if not requests and not errors:
        errors.append(line_error(None, "empty_file", "The input file is empty."))
    elif len(requests) > MAX_BATCH_REQUESTS:
        errors.append(line_error(None, "too_many_requests", f"At most {MAX_BATCH_REQUESTS} requests."))
    elif len({str(r["body"].get("model")) for r in requests}) > 1:
        errors.append(line_error(None, "mismatched_model", "All requests must use the same model."))
    return requests, errors


def _parse_line(raw: str, number: int, endpoint: str, seen: set[str]) -> tuple[Any, dict[str, Any] | None]:
    try:
        request = json.loads(raw)
    except json.JSONDecodeError:
        return None, line_error(number, "invalid_json_line", "This line is not parseable as valid JSON.")
    is_shaped = isinstance(request, dict) and isinstance(request.get("custom_id"), str)
    if not is_shaped or not isinstance(request.get("body"), dict):
        return None, line_error(number, "missing_required_parameter", "custom_id and body are required.")
    if request.get("method") != "POST" or request.get("url") != endpoint:
        return None, line_error(number, "invalid_url", f"Each request must be a POST to {endpoint}.")
    if request["custom_id"] in seen:
        message = "The custom_id for this request is a duplicate of another request."
        return None, line_error(number, "duplicate_custom_id", message)
    seen.add(request["custom_id"])
    return request, None


def line_error(line: int | None, code: str, message: str) -> dict[str, Any]:
    return {"code": code, "message": message, "line": line, "param": None}


def check_metadata(value: Any) -> dict[str, str] | None:
    """Batch metadata: at most 16 pairs, keys up to 64 characters, string values up to 512."""
    if value is None:
        return None
    is_valid = isinstance(value, dict) and len(value) <= 16
    if not is_valid or any(not isinstance(v, str) or len(k) > 64 or len(v) > 512 for k, v in value.items()):
        message = "metadata takes at most 16 pairs, keys up to 64 characters, string values up to 512."
        raise ApiError(400, message, param="metadata")
    return dict(value)
