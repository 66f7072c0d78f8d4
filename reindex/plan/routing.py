"""Cost routing: every declared way to embed this corpus, priced and timed from the plan's own counts, and the
cheapest one that gives the configured vectors within `[run] deadline` and `max_cost_usd`.

A route is the configured `[embedder]` or a `[[routes]]` table: a provider's online or batch tier, or the
model self-hosted on GPUs at a price per GPU-hour. Routes of another fingerprint compute other vectors: they
are listed for comparison, never picked (taking one is another migration, with its own target).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from reindex import registry
from reindex.config import Config, RouteConfig, RunConfig
from reindex.errors import ReindexError
from reindex.plan.estimate import PlanReport
from reindex.ports import DEFAULT_WINDOW_HOURS, DeferredEmbedder, Embedder, LimitsRequests, RequestLimits
from reindex.units import duration, usd

Tier = Literal["self-hosted", "online", "batch", "unknown"]
CONFIGURED = "[embedder]"  # the configured embedder's route name
PACING_SHARE = 0.98  # of a per-minute limit the online pacer aims at (adapters/remote/pacing.py)
MAX_INPUTS, MAX_REQUEST_TOKENS = 2048, 300_000  # online request limits when the section names none


@dataclass(frozen=True)
class Candidate:
    """A route before pricing: its settings, embedder section and the embedder built from it, if it could be."""

    config: RouteConfig
    section: dict[str, Any]
    embedder: Any | None
    problem: str | None = None  # why the embedder could not be built here

    @property
    def fingerprint(self) -> str | None:
        """Computed from the built embedder; else the one the route declares; else unknown."""
        return self.config.fingerprint if self.embedder is None else str(self.embedder.info.fingerprint)


@dataclass
class Route:
    name: str
    kind: str
    model: str
    tier: Tier
    fingerprint: str | None  # None: the embedder could not be built here
    is_configured: bool
    same_vectors: bool | None  # the configured embedder's fingerprint; None: unknown
    tokens: int | None
    tokens_basis: str  # how `tokens` was counted
    price_per_million_usd: float | None = None
    gpu_hour_usd: float | None = None
    gpus: int | None = None
    docs_per_second: float | None = None  # per GPU (self-hosted)
    cost_usd: float | None = None
    cost_basis: str = ""
    duration_seconds: float | None = None  # a batch tier: its whole completion window (the worst case)
    duration_basis: str = ""
    risks: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # why it cannot be picked; empty: it can

    @property
    def fits(self) -> bool:
        return not self.failures


def candidates(config: Config, embedder: Embedder) -> list[Candidate]:
    """The configured embedder first, then each `[[routes]]` table, each built once (no network)."""
    routes = [Candidate(RouteConfig(name=CONFIGURED), dict(config.tables["embedder"]), embedder)]
    for route in config.routes:
        if route.embedder is None:
            routes.append(Candidate(route, dict(config.tables["embedder"]), embedder))
            continue
        try:
            routes.append(Candidate(route, route.embedder, registry.build("embedder", route.embedder)))
        except ReindexError as exc:  # a missing key or extra: still listed, priced where it can be
            routes.append(Candidate(route, route.embedder, None, exc.message))
    return routes


def token_counters(routes: list[Candidate], fingerprint: str) -> dict[str, Any]:
    """Paid routes of another fingerprint: their own tokenizer counts the corpus (their bill is in it)."""
    return {
        route.fingerprint: route.embedder
        for route in routes
        if route.fingerprint not in (None, fingerprint) and _tier(route.embedder) in ("online", "batch")
    }


def price(report: PlanReport, run: RunConfig, routes: list[Candidate], tokens: dict[str, int]) -> list[Route]:
    """Cost, duration, risks and the constraints each route fails, from the plan's measured counts."""
    priced = [_price_one(report, route, tokens) for route in routes]
    for route in priced:
        _judge(route, run)
    return priced


def choose(routes: list[Route], run: RunConfig) -> dict[str, Any]:
    """The cheapest route giving the configured vectors that meets both constraints, and why."""
    fitting = sorted((r for r in routes if r.fits), key=_cheapest)
    constraints = _constraints(run)
    chosen = {
        "deadline": run.deadline,
        "deadline_seconds": run.deadline_seconds,
        "max_cost_usd": run.max_cost_usd,
    }
    if not fitting:
        failing = "; ".join(f"{r.name}: {', '.join(r.failures)}" for r in routes)
        reason = f"no route meets {constraints or 'the plan'} ({failing})"
        return {"name": None, "reason": reason, **chosen, "cost_usd": None, "duration_seconds": None}
    best = fitting[0]
    cheaper = [r for r in routes if not r.fits and r.cost_usd is not None and _cheapest(r) < _cheapest(best)]
    reason = (
        f"cheapest of {len(fitting)} interchangeable route{'s' * (len(fitting) != 1)} meeting "
        f"{constraints or 'the plan (no [run] deadline or max_cost_usd set)'}: {_figures(best)}"
        + (f"; next: {fitting[1].name}, {_figures(fitting[1])}" if len(fitting) > 1 else "")
        + "".join(f"; {r.name} costs less ({usd(r.cost_usd)}) but fails: {r.failures[0]}" for r in cheaper)
    )
    return {
        "name": best.name,
        "reason": reason,
        **chosen,
        "cost_usd": best.cost_usd,
        "duration_seconds": best.duration_seconds,
    }


def to_json(routes: list[Route]) -> list[dict[str, Any]]:
    return [{**asdict(route), "fits": route.fits} for route in routes]


# one route --------------------------------------------------------------------------------------------


def _price_one(report: PlanReport, route: Candidate, tokens: dict[str, int]) -> Route:
    embedder, settings = route.embedder, route.config
    tier: Tier = _tier(embedder) if embedder is not None else "unknown"
    if tier == "unknown" and (settings.gpu_hour_usd is not None or settings.docs_per_second is not None):
        tier = "self-hosted"
    fingerprint = route.fingerprint
    counted = tokens.get(fingerprint) if fingerprint and fingerprint != report.fingerprint else None
    priced = Route(
        name=settings.name,
        kind=str(route.section.get("kind", "")),
        model=str(embedder.info.model if embedder is not None else route.section.get("model", "")),
        tier=tier,
        fingerprint=fingerprint,
        is_configured=settings.name == CONFIGURED,
        same_vectors=_same_vectors(route, report),
        tokens=counted if counted is not None else report.tokens,
        tokens_basis=_tokens_basis(route, report, counted),
    )
    if route.problem:
        declared = " (fingerprint as declared)" if fingerprint else ""
        priced.risks.append(f"not built here: {route.problem}{declared}")
    elif settings.fingerprint not in (None, fingerprint):
        priced.risks.append(
            f"declared fingerprint {settings.fingerprint} ignored: built here, it is {fingerprint}"
        )
    if tier == "self-hosted":
        _self_hosted(priced, report, settings)
    elif tier in ("online", "batch"):
        _provider(priced, report, route)
        if settings.gpu_hour_usd is not None or settings.docs_per_second is not None:
            priced.risks.append("gpu_hour_usd and docs_per_second ignored: a provider serves this model")
    if priced.same_vectors is False:
        named = "" if fingerprint else " (judged by its model's name: it was not built here)"
        priced.risks.append(
            f"another model: different vectors, so another migration with its own target{named}"
        )
    return priced


def _same_vectors(route: Candidate, report: PlanReport) -> bool | None:
    """By fingerprint; a route not built here and declaring none is judged by its model's name: another name
    is another model (a false alarm only for one model under two names: declare its fingerprint then)."""
    if route.fingerprint is not None:
        return route.fingerprint == report.fingerprint
    model = route.section.get("model")
    return False if model is not None and model != report.model.get("model") else None


def _tier(embedder: Any) -> Tier:
    if isinstance(embedder, DeferredEmbedder):
        return "batch"
    if embedder.traits.price_per_million is not None or embedder.traits.remote:
        return "online"
    return "self-hosted"


def _tokens_basis(route: Candidate, report: PlanReport, counted: int | None) -> str:
    if counted is not None or route.fingerprint == report.fingerprint:
        return "counted with its own tokenizer"
    if route.fingerprint is None:
        return (
            f"estimated: counted with {report.model.get('model')}'s tokenizer (this route's was not loaded)"
        )
    return (
        f"estimated: counted with {report.model.get('model')}'s tokenizer (a self-hosted route pays by time)"
    )


def _self_hosted(route: Route, report: PlanReport, settings: RouteConfig) -> None:
    rate, gpus = settings.docs_per_second, settings.gpus
    route.gpu_hour_usd, route.gpus = settings.gpu_hour_usd, gpus
    if (
        rate is None
        and route.is_configured
        and (report.worker_docs_per_second or report.calibration_docs_per_second)
    ):
        rate, gpus = report.worker_docs_per_second or report.calibration_docs_per_second, report.workers
        route.gpus = gpus
        route.risks.append("rate calibrated on this machine from a small sample")
    route.docs_per_second = rate
    if rate is None:
        route.duration_basis = "unknown: give docs_per_second (scripts/gpu-check or scripts/bench measure it)"
    else:
        route.duration_seconds = round(report.documents / (rate * gpus), 1)
        route.duration_basis = f"{report.documents:,} documents at {rate:,.1f}/s per GPU on {_gpus(gpus)}"
        route.risks.append("excludes machine start-up, model download and the ANN index build")
    if settings.gpu_hour_usd is None:
        route.cost_basis = "machine time not priced (give gpu_hour_usd)"
    elif route.duration_seconds is not None:
        route.cost_usd = round(route.duration_seconds / 3600 * settings.gpu_hour_usd * gpus, 6)
        route.cost_basis = (
            f"{duration(route.duration_seconds)} on {_gpus(gpus)} at ${settings.gpu_hour_usd}/GPU-hour"
        )


def _gpus(gpus: int) -> str:
    return f"{gpus} GPU{'s' * (gpus != 1)}"


def _provider(route: Route, report: PlanReport, candidate: Candidate) -> None:
    embedder, section = candidate.embedder, candidate.section
    assert embedder is not None  # a provider route is priced from its built embedder
    route.price_per_million_usd = embedder.traits.price_per_million
    if route.price_per_million_usd is None:
        route.cost_basis = "no list price for this model: set prices in its embedder table"
    elif route.tokens is not None:
        route.cost_usd = round(route.tokens * route.price_per_million_usd / 1_000_000, 6)
        route.cost_basis = f"{route.tokens:,} tokens x ${route.price_per_million_usd}/1M ({route.tier})"
    if route.tier == "batch":
        hours = (
            candidate.config.completion_window_hours
            or embedder.traits.completion_window_hours
            or DEFAULT_WINDOW_HOURS
        )
        route.duration_seconds = hours * 3600
        route.duration_basis = f"up to {hours:g} h: the batch completion window"
        route.risks.append(f"a batch may take its whole {hours:g} h window; lines it leaves are sent again")
        return
    limits = embedder.request_limits if isinstance(embedder, LimitsRequests) else None
    _online_duration(route, report, section, limits)


def _online_duration(
    route: Route, report: PlanReport, section: dict[str, Any], limits: RequestLimits | None
) -> None:
    tokens_per_minute, requests_per_minute = (
        section.get("tokens_per_minute"),
        section.get("requests_per_minute"),
    )
    route.risks.append("429s and outages slow it: the pacer waits and retries, the bill does not change")
    if not tokens_per_minute and not requests_per_minute:
        route.duration_basis = "unknown: set tokens_per_minute / requests_per_minute (your account's limits)"
        return
    tokens = route.tokens or 0
    if limits is None:  # a kind that does not say: the section's limits, else OpenAI's
        limits = RequestLimits(
            int(section.get("max_inputs_per_request") or MAX_INPUTS),
            int(section.get("max_tokens_per_request") or MAX_REQUEST_TOKENS),
        )
    requests = max(
        math.ceil(report.unique_texts / limits.inputs),
        math.ceil(tokens / limits.tokens) if limits.tokens else 0,
    )
    by_tokens = tokens * 60 / (tokens_per_minute * PACING_SHARE) if tokens_per_minute else 0.0
    by_requests = requests * 60 / (requests_per_minute * PACING_SHARE) if requests_per_minute else 0.0
    route.duration_seconds = round(max(by_tokens, by_requests), 1)
    rates = ", ".join(
        f"{value:,} {name}/min"
        for name, value in (("tokens", tokens_per_minute), ("requests", requests_per_minute))
        if value
    )
    per_request = f"{limits.inputs:,} texts" + (f", {limits.tokens:,} tokens" if limits.tokens else "")
    route.duration_basis = (
        f"at most {rates}, {per_request} a request (the configured limits; latency not counted)"
    )


# the pick ---------------------------------------------------------------------------------------------


def _judge(route: Route, run: RunConfig) -> None:
    """Record every reason the route cannot be picked: other vectors, the deadline, the budget."""
    if route.same_vectors is False:
        route.failures.append("other vectors (another model or options)")
    elif route.same_vectors is None:
        route.failures.append("fingerprint unknown (not built here; declare its fingerprint)")
    deadline = run.deadline_seconds
    if deadline is not None:
        if route.duration_seconds is None:
            route.failures.append("deadline: duration unknown")
        elif route.duration_seconds > deadline:
            worst = " (its whole batch window)" if route.tier == "batch" else ""
            route.failures.append(f"deadline: {duration(route.duration_seconds)}{worst} > {run.deadline}")
    if run.max_cost_usd is not None:
        if route.cost_usd is None and route.tier != "self-hosted":
            route.failures.append("budget: cost unknown")
        elif route.cost_usd is not None and route.cost_usd > run.max_cost_usd:
            route.failures.append(f"budget: {usd(route.cost_usd)} > max_cost_usd {usd(run.max_cost_usd)}")


def _cheapest(route: Route) -> tuple[bool, float, bool, float]:
    """Known costs first, lowest first; then the shorter duration."""
    return (
        route.cost_usd is None,
        route.cost_usd or 0.0,
        route.duration_seconds is None,
        route.duration_seconds if route.duration_seconds is not None else math.inf,
    )


def _constraints(run: RunConfig) -> str:
    parts = []
    if run.deadline is not None:
        parts.append(f"the deadline {run.deadline}")
    if run.max_cost_usd is not None:
        parts.append(f"max_cost_usd {usd(run.max_cost_usd)}")
    return " and ".join(parts)


def _figures(route: Route) -> str:
    cost = usd(route.cost_usd) if route.cost_usd is not None else "cost not priced"
    if route.duration_seconds is None:
        return f"{cost}, duration unknown"
    bound = "up to " if route.tier == "batch" else "about "
    return f"{cost}, {bound}{duration(route.duration_seconds)}"
