"""What `reindex plan` prints: the estimate (documents, texts, time, cost, storage), the routes and the one
picked, and what the run would do to the target and the alias."""

from __future__ import annotations

from typing import Any

from reindex import units
from reindex.plan.estimate import PlanReport
from reindex.ui.screen import Screen, problems
from reindex.units import count, duration, integer, model_line, size, usd


def _counted(counts: dict[str, Any] | None) -> str:
    """Whether the counts are exact, in the model's own tokenizer, or estimated (reindex.ports.CountsTokens)."""
    if not counts:
        return "tokens counted with the model's own tokenizer"
    if counts["exact"]:
        return f"tokens counted exactly: {counts['basis']}"
    return (
        f"tokens estimated, {counts['basis'].removeprefix('estimate: ')}: cost and cuts may differ a little"
    )


def plan(s: Screen, p: PlanReport) -> None:
    s.headline(f"Plan: embed {count(p.documents, 'document')} into {p.target} for alias {p.alias}")
    rows = [
        ("model", model_line(p.model)),
        (
            "documents",
            f"{integer(p.documents)}: {integer(p.embeddable)} to embed, "
            f"{integer(p.unreadable_or_empty)} unreadable or empty (dead letters)"
            + (
                f", {integer(p.id_conflicts)} ids with conflicting rows (dead letters),"
                f" {integer(p.repeated_rows)} repeated rows folded"
                if p.repeated_rows
                else ""
            ),
        ),
        (
            "texts",
            f"{count(p.unique_texts, 'distinct text')}, {count(p.tokens, 'token')} to embed "
            f"(mean {units.decimal(p.tokens_mean)}, p90 {integer(p.tokens_p90)} per text)",
        ),
        ("", _counted(p.token_counts)),
        ("time", _eta(p)),
    ]
    if p.cost_online_usd is not None or p.cost_batch_usd is not None:
        rows.append(("cost", cost(p)))
        rows += [("", f"unconfirmed: {caveat}") for caveat in p.price_caveats or []]
    rows += [
        ("storage", _storage(p)),
        *(("", line) for line in [_copied(p)] if line),
        (
            "shards",
            f"{integer(p.shards)}; a reclaimed worker redoes at most "
            f"{count(p.redone_documents_per_reclaim, 'document')}",
        ),
        ("target", _plan_target(p)),
        *(("", line) for line in (p.target_layout or {}).get("summary", [])),
        ("alias", _plan_alias(p)),
        ("machine", _machine(p.backends)),
    ]
    s.facts(rows)
    if p.over_max_tokens:
        fate = "truncated" if p.too_long_policy == "truncate" else "dead-lettered"
        s.warn(
            f"{count(p.over_max_tokens, 'text')} longer than the model's {integer(p.max_tokens)} tokens "
            f'will be {fate} ([run] too_long = "{p.too_long_policy}")'
        )
    if p.unreadable_or_empty:
        s.warn(f"{count(p.unreadable_or_empty, 'document')} will be dead letters (unreadable or empty text)")
    if p.repeated_rows:
        s.warn(
            f"the id column is not unique: {count(p.repeated_rows, 'row')} repeat an earlier row's id and are"
            f" folded into it; {count(p.id_conflicts, 'id')} hold different texts in their rows and will be"
            " dead letters (duplicate_id_conflict): make the ids unique to embed them"
        )
    if p.alias_target != p.target and (p.alias_target or p.alias_is_physical):
        serves = p.alias_target or "the plain table or collection itself"
        s.warn(f"`reindex cutover` will change what alias {p.alias} serves (now {serves})")
    if p.ledger_advice:
        s.warn(p.ledger_advice)
    _privileges(s, p.privileges or [])
    _losses(s, p.alias, p.losses or [])
    refused = _routes(s, p.routes or [], p.route or {})
    s.line("Nothing was changed.")
    if any(not loss["accepted"] for loss in p.losses or []):
        s.line("Next: name what it would not keep in [target] accept, or change the table; then plan again")
        return
    if refused:
        s.line("Next: raise [run] deadline or max_cost_usd, or declare another [[routes]] table")
        return
    s.next("reindex run")


def _storage(p: PlanReport) -> str:
    """What the target stores and the index it gets, then the bytes of each."""
    stored = p.storage
    if not stored:
        return f"{size(p.vector_bytes)} of vectors, about {size(p.index_bytes_estimate)} with the HNSW index"
    line = f"{stored['type']} ({size(stored['bytes_per_vector'])} per vector), index {stored['index']}: "
    line += f"{size(p.vector_bytes)} of vectors"
    if p.index_bytes_estimate > p.vector_bytes:
        line += f", about {size(p.index_bytes_estimate)} with the index"
    return line + (f" — {stored['note']}" if stored.get("note") else "")


def _copied(p: PlanReport) -> str | None:
    """What the target holds of the documents besides the vectors, where it copies them."""
    if (p.target_layout or {}).get("mode") == "column" or not p.document_bytes_estimate:
        return None  # the vectors go into the application's own table: nothing else is copied
    return f"about {size(p.document_bytes_estimate)} of the documents' fields, copied beside the vectors"


def _routes(s: Screen, routes: list[dict[str, Any]], pick: dict[str, Any]) -> bool:
    """The routes side by side and the pick; True when none meets the deadline and the budget."""
    constrained = pick.get("deadline") is not None or pick.get("max_cost_usd") is not None
    if len(routes) < 2 and not constrained:
        return False
    rows = [
        (
            ("→ " if r["name"] == pick.get("name") else "  ") + r["name"],
            f"{units.short_model(r['model'])} ({r['kind']})" + ("" if r["same_vectors"] else _other(r)),
            r["tier"],
            usd(r["cost_usd"]) if r["cost_usd"] is not None else "not priced",
            _route_duration(r),
            "; ".join(r["failures"]) or "yes",
        )
        for r in routes
    ]
    s.table("Routes", ("route", "model", "tier", "cost", "duration", "fits"), rows, numeric=(3,))
    for r in routes:
        if r["risks"]:
            s.line(f"  {r['name']}: " + "; ".join(r["risks"]))
    if pick.get("name") is None:
        s.headline(f"Refused: {pick.get('reason')}", ok=False)
        return True
    s.line(f"Route: {pick['name']}, {pick['reason']}")
    return False


def _other(route: dict[str, Any]) -> str:
    return " [fingerprint unknown]" if route["same_vectors"] is None else " [other vectors]"


def _route_duration(route: dict[str, Any]) -> str:
    if route["duration_seconds"] is None:
        return "unknown"
    return ("up to " if route["tier"] == "batch" else "about ") + duration(route["duration_seconds"])


def _eta(p: PlanReport) -> str:
    """One ETA: the run's stages and its model on its workers where they were timed, else the model's."""
    if p.eta_seconds_workers is not None:
        workers = count(p.workers, "worker")
        basis = p.eta_basis or "timed on a sample like the corpus"
        return (
            f"about {duration(p.eta_seconds_workers)} on {workers} at "
            f"{units.rate(p.worker_docs_per_second, 'documents')} each ({basis})"
        )
    if p.eta_seconds is None:
        if p.eta_headline_seconds is not None:  # a provider's online route, by its limits
            return f"about {duration(p.eta_headline_seconds)} ({p.eta_basis})"
        return "not estimated (run `plan` without --no-calibrate to time a sample)"
    return (
        f"about {duration(p.eta_seconds)} embedding on this machine "
        f"(calibrated: {units.rate(p.calibration_docs_per_second, 'documents')}, "
        f"{units.rate(p.calibration_tokens_per_second, 'tokens')})"
    )


def cost(p: PlanReport) -> str:
    parts = []
    if p.cost_online_usd is not None:
        parts.append(f"{usd(p.cost_online_usd)} online")
    if p.cost_batch_usd is not None:
        parts.append(f"{usd(p.cost_batch_usd)} through the batch API (within {p.batch_window or '24h'})")
    return ", ".join(parts) + " for the distinct texts"


def _losses(s: Screen, alias: str, losses: list[dict[str, Any]]) -> None:
    """What the target would not keep of what the alias serves now (a table's row security, a collection's
    shard keys), each accepted or refused (`plan` then exits 2)."""
    if not losses:
        return
    s.table(
        f"The target would not keep what {alias} has",
        ("accept key", "what is lost", "found", ""),
        [
            (
                loss["key"],
                loss["what"],
                "; ".join(loss["objects"]),
                "accepted" if loss["accepted"] else "REFUSED",
            )
            for loss in losses
        ],
    )
    refused = [f'"{loss["key"]}"' for loss in losses if not loss["accepted"]]
    if refused:
        s.warn(
            f"run and cutover refuse it; to go ahead anyway, losing them, set [target] accept ="
            f" [{', '.join(refused)}]"
        )


def _privileges(s: Screen, lacking: list[dict[str, str]]) -> None:
    """What the tool's role may not do for this migration, each with the statement that grants it."""
    if not lacking:
        return
    s.table("The tool's role lacks", ("privilege", "to grant it"), [(p["need"], p["fix"]) for p in lacking])
    s.warn("run refuses before embedding anything: run the statements above as the owner, then plan again")


def _plan_target(p: PlanReport) -> str:
    if not p.target_exists:
        return f"{p.target} does not exist yet: `reindex run` creates it"
    cov = p.coverage or {}
    state = "complete" if cov.get("complete") else f"not complete ({problems(cov)})"
    return f"{p.target} exists, {integer(cov.get('target_vectors'))} vectors, {state}"


def _plan_alias(p: PlanReport) -> str:
    if p.alias_is_physical:
        return (
            f"{p.alias} is a plain table or collection today; the first cutover keeps its vectors for "
            "rollback"
        )
    if not p.alias_target:
        return f"{p.alias} does not exist yet; cutover creates it"
    if p.alias_target == p.target:
        return f"{p.alias} → {p.alias_target} (this target: already live)"
    model = f", vectors of fingerprint {p.alias_fingerprint}" if p.alias_fingerprint else ""
    return f"{p.alias} → {p.alias_target}{model}; cutover moves it to {p.target}"


def _machine(backends: dict[str, Any] | None) -> str:
    if not backends:
        return units.NONE
    cuda = backends.get("cuda") or {}
    devices = cuda.get("devices") or []
    gpus = (
        f"{len(devices)} CUDA GPU{'s' if len(devices) != 1 else ''}"
        if cuda.get("available")
        else "no CUDA GPU"
    )
    return f"{backends.get('recommendation', '?')}, {backends.get('precision', '?')} ({gpus})"
