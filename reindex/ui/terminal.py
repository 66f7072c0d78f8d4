"""What each verb prints for a person at a terminal: a short summary in sentences and small tables.

Renderers read the verb's typed result, whose JSON document is its fields (`asdict`): nothing is shown that
`--json` does not carry, and mypy checks every field a renderer reads. Compare builds its document as one (a
dict of sections) and is rendered from it.
Values from a source, a ledger or a config are printed as text, never as markup. The layout (light rules
on a colour terminal, plain text with no box drawing for NO_COLOR, logs and pipes) is `screen.Screen`'s;
`reindex plan`'s summary is in plan_view.py, every other verb's here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console

from reindex import units
from reindex.commands import DeadLetterReport, InspectReport, PruneReport, ResolveReport, StatusReport
from reindex.flip.cutover import AliasMove
from reindex.flip.sync import SyncReport
from reindex.prove.verify import Coverage
from reindex.run.backfill import RunReport
from reindex.ui.plan_view import plan
from reindex.ui.screen import LISTED, Screen
from reindex.units import count, duration, integer, local_time, model_line, ratio, usd

# run, sync, dead letters --------------------------------------------------------------------------------


def run(s: Screen, r: RunReport) -> None:
    done = r.reconciled
    this_run = r.documents_this_run
    if this_run is not None and this_run < r.documents:  # a resume: the totals are the run's, the time ours
        headline = (
            f"Run finished: {count(r.written, 'vector')} in {r.target}; this invocation read "
            f"{count(this_run, 'document')} in {duration(r.seconds)} (the rest before it was resumed)"
        )
    else:
        headline = (
            f"Run finished: {count(r.written, 'vector')} written to {r.target} in {duration(r.seconds)}"
        )
    s.headline(headline, ok=done)
    rows = [
        ("documents", _reconciliation(r)),
        (
            "tokens",
            f"{integer(r.tokens)} embedded ({count(r.truncated, 'document')} cut at the model's limit)",
        ),
        ("throughput", _throughput(r)),
    ]
    if r.requests is not None:  # a remote model: its traffic, not padding or busy time
        rows.append(
            (
                "requests",
                f"{integer(r.requests)} sent ({integer(r.retries)} retries, {integer(r.rate_limited)} "
                f"answered 429), {units.decimal(r.requests_per_second)} requests/s, "
                f"{units.decimal(r.tokens_per_minute, 0)} tokens/min",
            )
        )
    if r.reused:
        rows.append(("reused", f"{count(r.reused, 'document')} shared an already embedded text"))
    if r.finalize_seconds:
        index = f" (ANN index {duration(r.index_seconds)})" if r.index_seconds is not None else ""
        rows.append(("finalize", f"{duration(r.finalize_seconds)}{index}"))
    if r.cost_usd is not None:
        rows.append(("cost", f"{usd(r.cost_usd)} for {count(r.billed_tokens, 'billed token')}"))
    s.facts(rows)
    _dead_letter_warning(s, r.dead_letters, r.dead_letter_reasons)
    if not done:
        s.warn("the run does not reconcile: see `reindex status`")
        return
    s.next("reindex verify")


def _throughput(r: RunReport) -> str:
    rates = f"{units.rate(r.docs_per_second, 'documents')}, {units.rate(r.tokens_per_second, 'tokens')}"
    if r.model_busy_fraction is None:
        return rates
    return f"{rates} (model busy {ratio(r.model_busy_fraction)}, padding {ratio(r.padding_fraction)})"


def _reconciliation(r: RunReport | StatusReport) -> str:
    gone = r.vanished if isinstance(r, StatusReport) else 0  # a run counts none: it read what was there
    vanished = f" + {integer(gone)} vanished" if gone else ""
    verdict = "reconciled" if r.reconciled else "DOES NOT RECONCILE"
    return (
        f"{integer(r.documents)} in = {integer(r.written)} written + {integer(r.dead_letters)} "
        f"dead-lettered + {integer(r.duplicates)} duplicate ids folded{vanished} ({verdict})"
    )


def _dead_letter_warning(s: Screen, total: int, reasons: dict[str, int]) -> None:
    if total:
        by_reason = ", ".join(f"{integer(n)} {reason}" for reason, n in sorted(reasons.items()))
        s.warn(f"{count(total, 'dead letter')} ({by_reason}): `reindex dlq list -c {s.config}`")


def sync(s: Screen, r: SyncReport) -> None:
    changes = r.added + r.changed + r.repaired + r.deleted
    s.headline(
        f"Synced {r.target} in {duration(r.seconds)}: "
        + (
            "no changes"
            if not changes
            else (
                f"{integer(r.added)} added, {integer(r.changed)} changed, {integer(r.repaired)} repaired, "
                f"{integer(r.deleted)} deleted"
            )
        )
    )
    if r.adopted:
        s.line(
            f"Adopted {count(r.adopted, 'vector')} the application wrote: each agrees with a fresh"
            " embedding of its text, content hashes stored, vectors kept"
        )
    _after_flip(s, r.after_flip)
    _dead_letter_warning(s, r.dead_letters, r.dead_letter_reasons)


def dlq_list(s: Screen, r: DeadLetterReport) -> None:
    if not r.total:
        s.headline("No dead letters.", ok=True)
        return
    s.headline(f"{count(r.total, 'dead letter')}: documents that could not be embedded")
    s.table(
        "", ("reason", "documents"), [(k, integer(n)) for k, n in sorted(r.reasons.items())], numeric=(1,)
    )
    letters = r.dead_letters
    s.table(
        "", ("id", "reason", "detail"), [(d["doc_id"], d["reason"], d["detail"]) for d in letters[:LISTED]]
    )
    if len(letters) > LISTED:
        s.line(f"… and {integer(len(letters) - LISTED)} more (--json lists them all)")
    s.line(f"Fix the source or the policy, then: reindex dlq retry -c {s.config}")


def dlq_retry(s: Screen, r: DeadLetterReport) -> None:
    if not r.retried:
        s.headline("No dead letters to retry.", ok=True)
        return
    s.headline(
        f"Retried {count(r.retried, 'dead letter')}: {integer(r.written)} written, "
        f"{integer(r.vanished)} gone from the source, {integer(r.total)} still dead",
        ok=r.total == 0,
    )
    if r.total:
        s.line(f"See them: reindex dlq list -c {s.config}")


# status, verify, inspect --------------------------------------------------------------------------------


def status(s: Screen, r: StatusReport) -> None:
    if r.state == "not-started":
        s.headline(f"No run yet for alias {r.alias}.")
    else:
        live = "live" if r.is_live else "not live"
        s.headline(f"{r.target}: {r.state}, {live}", ok=r.state == "complete" and r.reconciled)
    serves = units.served(r.alias_target, r.alias_is_physical, r.alias)
    rows = [
        ("alias", f"{r.alias} → {serves}"),
        (
            "source",
            count(r.source_documents, "document") if r.source_documents is not None else units.NONE,
        ),
    ]
    if r.state != "not-started":
        rows += [
            ("documents", _reconciliation(r)),
            ("shards", f"{integer(r.shards_done)} written"),
        ]
    s.facts(rows)
    _dead_letter_warning(s, r.dead_letters, r.dead_letter_reasons)
    if r.workers:
        s.table(
            "Workers",
            ("worker", "shards", "documents", "documents/s", "last minute", "last write"),
            [
                (
                    w["worker"],
                    integer(w["shards"]),
                    integer(w["documents"]),
                    units.decimal(w["docs_per_second"], 0),
                    units.decimal(w["recent_docs_per_second"], 0),
                    local_time(w["last_written_at"]),
                )
                for w in r.workers
            ],
            numeric=(1, 2, 3, 4),
        )
    if r.history:
        _history(s, r.history)
    if r.state == "running":
        s.next("reindex run")
    elif r.state == "complete" and not r.is_live:
        s.next("reindex verify", "reindex cutover")


def _history(s: Screen, history: list[dict[str, Any]]) -> None:
    s.table(
        "Alias history",
        ("when", "action", "from", "to", "state"),
        [
            (
                local_time(h["at"]),
                h["action"] + (" (forced)" if h["forced"] else ""),
                h["old"] or units.NONE,
                h["new"],
                h["state"],
            )
            for h in history[-LISTED:]
        ],
    )


def verify(s: Screen, c: Coverage) -> None:
    if not c.target_exists:
        s.headline(f"Not complete: {c.target} does not exist yet.", ok=False)
        s.next("reindex run")
        return
    _coverage(s, c)
    if c.complete and c.is_live:
        s.line(f"The alias already serves {c.target}: nothing to cut over. Later: reindex sync -c {s.config}")
    elif c.complete:
        s.next("reindex cutover")
    elif c.after_flip_pending:
        s.next("reindex cutover --sync")
    elif c.run_unfinished:
        s.next("reindex run")


def _coverage(s: Screen, c: Coverage) -> None:
    if c.complete:
        s.headline(
            f"Complete: every one of {count(c.source_documents, 'source document')} has a current vector "
            f"in {c.target}" + (f" or a dead letter ({integer(c.dead_letters)})" if c.dead_letters else ""),
            ok=True,
        )
    else:
        s.headline(f"Not complete: {c.target} has {c.problems()}", ok=False)
    fingerprints = c.fingerprints
    expected = c.expected_fingerprint
    s.facts(
        [
            (
                "vectors",
                f"{integer(c.target_vectors)} for {count(c.source_documents, 'source document')}",
            ),
            (
                "fingerprints",
                ", ".join(
                    f"{fp}{' (expected)' if fp == expected else ''}: {integer(n)}"
                    for fp, n in fingerprints.items()
                )
                or units.NONE,
            ),
            *([("written by the application", integer(c.application_rows))] if c.application_rows else []),
            ("checked", f"in {duration(c.seconds)} ({units.rate(c.ids_per_second, 'ids')})"),
        ]
    )
    problems = [
        (name, integer(n), ", ".join(c.examples.get(key, [])[:3]))
        for key, name, n in (
            ("missing", "missing", c.missing),
            ("stale", "stale (text changed)", c.stale),
            ("orphaned", "orphaned (document gone)", c.orphaned),
            ("invalid_vectors", "invalid vectors", c.invalid_vectors),
            ("unhashed", "without content hash", c.unhashed),
            ("conflicting", "ids with two texts", c.conflicting),
        )
        if n
    ]
    if problems:
        s.table("", ("problem", "vectors", "examples"), problems, numeric=(1,))
    if c.dead_letter_ceiling is not None and c.dead_letters > c.dead_letter_ceiling:
        s.warn(
            f"{count(c.dead_letters, 'dead letter')} exceed [run] max_dead_letters "
            f"({integer(c.dead_letter_ceiling)} for this source)"
        )
    if c.sample:
        sample = c.sample
        s.line(
            f"Re-embedding check: {integer(sample['checked'])} sampled, {integer(sample['failures'])} differ "
            f"(cosine below {sample['threshold']})"
        )
    _application_check(s, c.application_check)


def _application_check(s: Screen, check: dict[str, Any] | None) -> None:
    """The application's rows re-embedded by verify (`reindex.prove.verify.refute_application_rows`)."""
    if check and check["checked"]:
        s.line(
            f"Rows written by the application re-embedded: {integer(check['checked'])}, "
            f"{integer(check['stale'])} differ from their stored vector (cosine below {check['threshold']}):"
            " counted stale"
        )


def inspect(s: Screen, r: InspectReport) -> None:
    serving = f", served by alias {r.alias}" if r.alias_target == r.inspected else ""
    s.headline(f"{r.inspected}{serving}")
    built = model_line(r.model) if r.built_by_reindex else "not built by reindex (no fingerprint recorded)"
    s.facts([("model", built)])
    _coverage(s, r.coverage)


# compare ------------------------------------------------------------------------------------------------


def compare(s: Screen, q: dict[str, Any]) -> None:
    against = (
        f"against the live index {q['live']}" if q["live"] else "(the alias serves it already: no live side)"
    )
    s.headline(
        f"Quality of {q['target']} {against}: {count(q['sample'], 'sampled query', 'sampled queries')}, "
        f"k = {q['k']}, {q['distance']} distance"
    )
    gate = q["gate"]
    thresholds = gate["thresholds"]
    rows = []
    for label, measured, name in _quality_metrics(q):
        limit = thresholds.get(name) if name else None
        bound = (
            units.NONE
            if name is None or limit is None
            else f"{'≤' if name.startswith('max_') else '≥'} {limit}"
        )
        rows.append((label, units.NONE if measured is None else f"{measured:.4f}", bound))
    s.table("", ("metric", "value", "gate"), rows, numeric=(1,))
    for example in ((q.get("neighbours") or {}).get("examples") or [])[:3]:
        text = " ".join(str(example["text"]).split())  # one line, whatever the document's layout
        s.line(f"changed most: {example['id']} (overlap {example['overlap']:.2f}) “{text[:80]}”")
    if gate["passed"]:
        s.headline(
            "Gate passed." if thresholds else "No [gate] thresholds set: nothing is enforced.", ok=True
        )
    else:
        s.headline("Gate FAILED: cutover will refuse without --force.", ok=False)
        for failure in gate["failures"]:
            s.line(f"  - {failure}")


def _quality_metrics(q: dict[str, Any]) -> list[tuple[str, float | None, str | None]]:
    """(label, value, the [gate] threshold that judges it, if any) for each metric compare reports."""
    k = q["k"]
    neighbours = q.get("neighbours") or {}
    judged = q.get("judged") or {}
    new, live = judged.get("new") or {}, judged.get("live") or {}
    drop = (
        live["ndcg_at_10"] - new["ndcg_at_10"]
        if live.get("ndcg_at_10") is not None and new.get("ndcg_at_10") is not None
        else None
    )
    rows: list[tuple[str, float | None, str | None]] = [
        (f"overlap@{k}, live vs new", neighbours.get("overlap_at_k"), "min_overlap_at_k"),
        ("rank-biased overlap (p = 0.9)", neighbours.get("rbo"), "min_rbo"),
        (f"ANN recall@{k} of the new index", (q.get("ann") or {}).get("recall_at_k"), "min_ann_recall"),
    ]
    if judged:
        rows += [
            ("nDCG@10, new model", new.get("ndcg_at_10"), "min_ndcg_at_10"),
            (f"Recall@{judged.get('k', k)}, new model", new.get("recall_at_k"), "min_recall_at_k"),
        ]
        if live:
            rows.append(("nDCG@10, live model", live.get("ndcg_at_10"), None))
        rows.append(("nDCG@10 drop (live − new)", drop, "max_ndcg_drop"))
    return rows


# alias moves ---------------------------------------------------------------------------------------------


def alias_move(s: Screen, m: AliasMove) -> None:
    if m.action == "restore":
        s.headline(
            f"Alias {m.alias} is the application's table again, serving {m.target} (was a view over it).",
            ok=True,
        )
        s.line(f"Next: reindex run -c {s.config}, then reindex cutover -c {s.config}")
        return
    verb = "rolled back to" if m.action == "rollback" else "now serves"
    if not m.changed:
        s.headline(f"Alias {m.alias} already serves {m.target}: nothing changed.", ok=True)
        return
    was = f" (was {m.previous})" if m.previous else ""
    s.headline(f"Alias {m.alias} {verb} {m.target}{was}.", ok=not m.forced)
    if m.forced:
        s.warn("forced past a failed verification or quality gate; recorded in the alias history")
    _after_flip(s, m.after_flip)
    if m.unserved:
        s.warn(
            f"{count(m.unserved, 'document')} written while {m.previous} was live have no vector in"
            f" {m.target}: the alias does not serve them by vector until the next cutover, and"
            f" {m.previous} keeps theirs (ids in --json)"
        )
    if m.action == "rollback":
        s.line(f"Roll forward with: reindex cutover --sync -c {s.config}")
    else:
        s.line(f"Roll back with: reindex rollback -c {s.config}")


def _after_flip(s: Screen, after: dict[str, Any] | None) -> None:
    """The catch-up after a flip nothing held the writers for (`reindex.flip.sync.AfterFlip`)."""
    if not after:
        return
    where = "the index it replaced" if after["read"] == "previous" else "the source"
    s.line(
        f"Caught up after the flip from {where}: {after['carried']} written, {after['deleted']} deleted"
        + (f", {after['kept']} left as the application rewrote them since" if after["kept"] else "")
        + (f", {after['dead_letters']} dead letters" if after["dead_letters"] else "")
        + "."
    )
    if after.get("uncertain"):
        s.warn(
            f"{count(after['uncertain'], 'document')} only in {where}, left alone: inserted there just before"
            " the flip, or deleted through the alias since (the cutover that flipped was killed before its"
            f" catch-up, so nothing tells which): {', '.join(after['examples'][:3])}"
        )


def prune(s: Screen, r: PruneReport) -> None:
    would = r.dry_run
    if not r.dropped:
        s.headline(f"Nothing to drop for alias {r.alias}.", ok=True)
    else:
        s.headline(f"{'Would drop' if would else 'Dropped'} {', '.join(r.dropped)}.")
    s.facts([("kept", ", ".join(r.kept) or units.NONE)])
    if would and r.dropped:
        s.line(f"Drop them: reindex prune -c {s.config}")


def resolve(s: Screen, r: ResolveReport) -> None:
    target = r.target or f"{r.alias} (a table or collection, not an alias yet)"
    s.headline(f"Alias {r.alias} → {target}")
    model = r.model or {}
    if r.model_from == "config":
        line = f"{_named_model(model)}, as [compare] embedder names it (the tool did not build this index)"
    else:
        line = model_line(model) if model else "unknown: not built by reindex; [compare] embedder can name it"
    rows = [("model", line)]
    options = model.get("options") or {}
    if options.get("prompt"):
        rows.append(("query prefix", f"documents were embedded with prompt {options['prompt']!r}"))
    if "normalize" in options:
        rows.append(("normalized", "yes" if options["normalize"] else "no"))
    s.facts(rows)
    if model:
        s.line("Embed queries with this model so they compare with the stored vectors.")


def _named_model(table: dict[str, Any]) -> str:
    """An [embedder] table as a config names it: kind and model (or the kind alone)."""
    name = table.get("model") or table.get("model_id")
    return f"{table.get('kind', '?')} {name}" if name else str(table.get("kind", "?"))


# each renders the verb's typed result (mypy checks every field read); compare renders the JSON document
# its verb builds as one (reindex.prove.quality)
RENDERERS: dict[str, Callable[[Screen, Any], None]] = {
    "plan": plan,
    "run": run,
    "status": status,
    "verify": verify,
    "compare": compare,
    "cutover": alias_move,
    "rollback": alias_move,
    "prune": prune,
    "inspect": inspect,
    "resolve": resolve,
    "sync": sync,
    "dlq list": dlq_list,
    "dlq retry": dlq_retry,
}


def show(console: Console, verb: str, result: Any, config: str) -> None:
    """`result` as a person reads it: the typed result itself, or compare's JSON document."""
    RENDERERS[verb](Screen(console, config), result.to_json() if verb in AS_DOCUMENTS else result)


AS_DOCUMENTS = ("compare",)
