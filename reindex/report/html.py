"""The report page (`reindex report --html`) and its dry-run flavour (`reindex plan --html`).

One self-contained HTML file: inline CSS, plots as inline SVG, no script, font or link to fetch, so it
can be attached to a change request and read offline. Figures `status --json` reports carry
`data-metric="<its key>"` (on the plan page: `plan --json` keys).
"""

from __future__ import annotations

from typing import Any

from reindex.report import Report, svg
from reindex.report import parts as h
from reindex.units import served

COUNTS = ("documents", "written", "dead_letters", "duplicates", "shards_done", "source_documents")


def page(report: Report) -> str:
    s = report.status
    title = f"Reindex report: {s['alias']} → {s['target'] or 'no target yet'}"
    subtitle = (
        f"Generated {h.local_time(report.generated_at)} from <code>{h.text(report.config)}</code>"
        f" · plan <code>{h.metric('plan_id', s['plan_id'], s['plan_id'] or 'none')}</code>"
    )
    return h.document(
        title,
        subtitle,
        [
            _summary(report),
            _coverage(report),
            _dead_letters(report),
            _throughput(report),
            _plan_against_actual(report),
            _quality(report.quality),
            _fingerprints(report),
        ],
    )


# report sections ----------------------------------------------------------------------------------------


def _summary(report: Report) -> str:
    s = report.status
    cards = [
        h.card("State", h.metric("state", s["state"])),
        h.card("Documents in", h.metric("documents", s["documents"]), "read from the source by the run"),
        h.card("Written", h.metric("written", s["written"]), "vectors in the new target"),
        h.card("Dead letters", h.metric("dead_letters", s["dead_letters"]), "documents not embedded"),
        h.card("Duplicate ids folded", h.metric("duplicates", s["duplicates"])),
        h.card("Shards done", h.metric("shards_done", s["shards_done"])),
        h.card(
            "Source documents now",
            h.metric("source_documents", s["source_documents"]),
            "" if s["source_documents"] is not None else "not counted (this source needs a scan)",
        ),
        h.card(
            "Live behind the alias",
            h.metric("is_live", s["is_live"]),
            f"{s['alias']} serves {served(s['alias_target'], s.get('alias_is_physical', False), s['alias'])}",
        ),
    ]
    verified = report.coverage
    gate = report.quality
    status_line = (
        f"Reconciliation {h.metric('reconciled', s['reconciled'], cell=h.badge(s['reconciled'], 'reconciles', 'does not reconcile'))} · "
        f"verify {h.badge(verified['complete'] if verified else None, 'complete', 'not complete', 'not run')} · "
        f"quality gate {h.badge(gate['passed'] if gate else None, 'passed', 'failed', 'not compared')}"
    )
    return h.section(
        "summary", "Summary", f"<p>{status_line}</p>", f'<div class="cards">{"".join(cards)}</div>'
    )


def _coverage(report: Report) -> str:
    r = report.reconciliation
    vanished = f" + {h.integer(r['vanished'])} gone from the source when retried" if r["vanished"] else ""
    equation = (
        f'<p class="equation">{h.metric("documents", r["documents"])} documents in = '
        f"{h.metric('written', r['written'])} written + {h.metric('dead_letters', r['dead_letters'])} dead-lettered"
        f" + {h.metric('duplicates', r['duplicates'])} duplicate ids folded{vanished} "
        + h.metric(
            "reconciled",
            r["reconciled"],
            cell=h.badge(r["reconciled"], "✓ reconciles", "✗ does not reconcile"),
        )
        + "</p>"
    )
    run_facts = h.facts(
        [
            ("Tokens embedded", h.integer(r["tokens"], "tokens")),
            ("Texts over the model's limit (truncated)", h.integer(r["truncated"])),
            ("Documents that reused an identical text's vector", h.integer(r["reused"])),
            ("Tokens billed by the provider", h.integer(r["billed_tokens"], "tokens")),
        ]
    )
    return h.section(
        "coverage", "Coverage and reconciliation", equation, run_facts, _verification(report.coverage)
    )


def _verification(check: dict[str, Any] | None) -> str:
    if check is None:
        return '<p class="callout">Not verified yet: run <code>reindex verify</code>.</p>'
    c = check["report"]
    counts = ("missing", "stale", "orphaned", "invalid_vectors", "unhashed", "conflicting", "carried")
    rows = [
        (
            "Last verify",
            f"{h.local_time(check['at'])} {h.badge(check['complete'], 'complete', 'not complete')}",
        ),
        ("Source documents (at verify)", h.integer(c.get("source_documents"))),
        ("Vectors in the target (at verify)", h.integer(c.get("target_vectors"))),
        ("Dead letters excused", h.integer(c.get("dead_letters"))),
        ("Dead-letter ceiling ([run] max_dead_letters)", h.integer(c.get("dead_letter_ceiling"))),
        *((name.replace("_", " ").capitalize(), h.integer(c.get(name))) for name in counts if name in c),
    ]
    examples = c.get("examples") or {}
    listed = [(k, ", ".join(h.text(i) for i in ids)) for k, ids in examples.items() if ids]
    extra = f"<h3>Examples of problems</h3>{h.facts(listed)}" if listed else ""
    return "<h3>Newest verify</h3>" + h.facts(rows) + extra


def _dead_letters(report: Report) -> str:
    d = report.dead_letters
    if not d["total"]:
        return h.section("dead-letters", "Dead letters by reason", '<p class="empty">No dead letters.</p>')
    rows = [
        (
            f"<code>{h.text(r['reason'])}</code>",
            h.metric(f"dead_letter_reasons.{r['reason']}", r["count"]),
            "<br>".join(
                f"<code>{h.text(e['id'])}</code>" + (f" — {h.text(e['detail'])}" if e["detail"] else "")
                for e in r["examples"]
            )
            + (
                f'<br><span class="note">and {r["count"] - len(r["examples"]):,} more</span>'
                if r["count"] > len(r["examples"])
                else ""
            ),
        )
        for r in d["reasons"]
    ]
    intro = f"<p>{h.integer(d['total'])} documents could not be embedded. Each is kept with its reason; <code>reindex dlq retry</code> tries them again.</p>"
    return h.section(
        "dead-letters",
        "Dead letters by reason",
        intro,
        h.table(["reason", "documents", "examples (id — detail)"], rows, numeric=[1]),
    )


def _throughput(report: Report) -> str:
    t = report.throughput
    shards = t["shards"]
    if not shards:
        return h.section("throughput", "Throughput over time", '<p class="empty">No shard written yet.</p>')
    span = max(row["elapsed_seconds"] for row in shards)
    scale, unit = (60.0, "min") if span >= 180 else (1.0, "s")
    x_label = f"time since the run began ({unit}); each point the end of an equal window"
    windows = t.get("windows") or []
    docs = [(row["elapsed_seconds"] / scale, row["docs_per_second"]) for row in windows]
    tokens = [(row["elapsed_seconds"] / scale, row["tokens_per_second"]) for row in windows]
    charts = (
        '<div class="charts">'
        + svg.line_chart(
            docs,
            title="Documents per second, over the run",
            x_label=x_label,
            y_label="documents/s",
            mean=t["docs_per_second"],
            unit="docs/s",
        )
        + svg.line_chart(
            tokens,
            title="Tokens per second, over the run",
            x_label=x_label,
            y_label="tokens/s",
            mean=t["tokens_per_second"],
            unit="tokens/s",
            colour="#8250df",
        )
        + "</div>"
    )
    facts = h.facts(
        [
            ("First shard began", h.local_time(t["started_at"])),
            ("Last shard written", h.local_time(t["finished_at"])),
            ("Time embedding and writing", h.duration(t["seconds"])),
            (
                "Mean rate",
                f"{h.decimal(t['docs_per_second'], 1, 'documents/s')} · {h.decimal(t['tokens_per_second'], 1, 'tokens/s')}",
            ),
        ]
    )
    note = '<p class="note">Each point is what was written in one of up to 20 equal windows of the run, over the window\'s length. The dashed line is the mean over the whole run.</p>'
    return h.section("throughput", "Throughput over time", facts, charts, note)


def _plan_against_actual(report: Report) -> str:
    if report.plan is None:
        return h.section(
            "plan", "Plan against actual", '<p class="empty">Plan not computed (<code>--no-plan</code>).</p>'
        )
    free = report.plan["price_per_million_usd"] is None
    formats = {"USD": (lambda v: "free") if free else h.usd, "s": h.duration}
    rows = []
    for row in report.plan_vs_actual:
        show = formats.get(row["unit"], lambda v, u=row["unit"]: _amount(v, u))
        actual = show(row["actual"])
        if row["key"] and row["actual"] is not None:
            actual = h.metric(row["key"], row["actual"], actual)
        rows.append((h.text(row["metric"]), show(row["planned"]), actual, h.ratio(row["ratio"])))
    p = report.plan
    price = p["price_per_million_usd"]
    notes = (
        f'<p class="note">Planned figures were recomputed by the planner at {h.local_time(p["computed_at"])} '
        "against the source as it is now, with the embedder's own tokenizer (exact tokens)"
        + (
            "; the duration and rate come from a calibration of the model on this machine"
            if p["calibrated"]
            else "; no calibration (<code>--no-calibrate</code>), so no planned duration"
        )
        + ". Price: "
        + (f"{h.usd(price)} per 1M tokens" if price is not None else "free (the embedder has no price)")
        + ". The actual duration is the run's embedding and writing time (shard by shard), without the index build.</p>"
    )
    table = h.table(["", "planned", "actual", "actual / planned"], rows, numeric=[1, 2, 3])
    return h.section("plan", "Plan against actual", table, notes)


def _amount(amount: Any, unit: str) -> str:
    if isinstance(amount, float):
        return h.decimal(amount, 1, unit)
    return h.integer(amount, unit)


def _quality(check: dict[str, Any] | None) -> str:
    if check is None:
        return h.section(
            "quality",
            "Quality: new index against the live one",
            '<p class="callout">Not compared yet: run <code>reindex compare</code>.</p>',
        )
    r = check["report"] or {}
    gate = r.get("gate") or {}
    passed = gate.get("passed", check.get("passed"))
    failures = gate.get("failures") or []
    head = h.facts(
        [
            ("Compared", f"{h.local_time(check['at'])} {h.badge(passed, 'gate passed', 'gate failed')}"),
            ("Live target", f"<code>{h.text(h.value(r.get('live')))}</code>"),
            ("New target", f"<code>{h.text(h.value(r.get('target')))}</code>"),
            ("Neighbours compared (k)", h.text(h.value(r.get("k")))),
            ("Documents sampled", h.text(h.value(r.get("sample")))),
        ]
    )
    fails = "".join(f"<li>{h.text(h.value(f))}</li>" for f in failures)
    parts = [head, f"<h3>Gate failures</h3><ul>{fails}</ul>" if fails else "", _quality_metrics(r)]
    examples = (r.get("neighbours") or {}).get("examples") or []
    if examples:
        parts.append("<h3>Examples: neighbours in the live and the new index</h3>" + _examples(examples))
    known = {"k", "sample", "live", "target", "neighbours", "ann", "judged", "gate"}
    others = [(key, h.text(h.value(v))) for key, v in r.items() if key not in known]
    if others:
        parts.append("<h3>Other figures</h3>" + h.facts(others))
    return h.section("quality", "Quality: new index against the live one", *parts)


def _quality_metrics(r: dict[str, Any]) -> str:
    neighbours, ann, judged = r.get("neighbours") or {}, r.get("ann") or {}, r.get("judged") or {}
    rows: list[tuple[str, str, str]] = []
    for key, label in (
        ("overlap_at_k", "neighbour overlap @ k (new vs live)"),
        ("rbo", "rank-biased overlap"),
    ):
        if key in neighbours:
            rows.append((label, h.text(h.value(neighbours[key])), ""))
    if "recall_at_k" in ann:
        rows.append(
            (
                "ANN recall @ k (new index against exact search)",
                h.text(h.value(ann["recall_at_k"])),
                h.text(f"{h.value(ann.get('queries'))} queries"),
            )
        )
    table = h.table(["metric", "value", ""], rows, numeric=[1]) if rows else ""
    if not ann:
        table += '<p class="note">ANN recall not measured.</p>'
    if not judged:
        return table + '<p class="note">No judged queries.</p>'
    new, live = judged.get("new") or {}, judged.get("live") or {}
    names = list(dict.fromkeys([*new, *live]))
    judged_rows = [
        (
            h.text(_metric_name(n)),
            h.text(h.value(new.get(n))),
            h.text(h.value(live.get(n)) if live else "not measured"),
        )
        for n in names
    ]
    intro = f"<h3>Judged queries ({h.text(h.value(judged.get('queries')))} queries, k = {h.text(h.value(judged.get('k')))})</h3>"
    return table + intro + h.table(["metric", "new", "live"], judged_rows, numeric=[1, 2])


def _metric_name(key: str) -> str:
    """ndcg_at_10 → nDCG@10, recall_at_k → recall@k; unknown keys as they are."""
    name, _, at = key.partition("_at_")
    name = {"ndcg": "nDCG", "mrr": "MRR", "map": "MAP"}.get(name, name.replace("_", " "))
    return f"{name}@{at}" if at else name


def _examples(examples: list[dict[str, Any]]) -> str:
    rows = []
    for e in examples[:10]:
        sample = str(e.get("text") or "")
        shown = sample if len(sample) <= 240 else sample[:240] + "…"
        rows.append(
            (
                f"<code>{h.text(e.get('id', ''))}</code>",
                f'<div class="example-text">{h.text(shown)}</div>',
                h.text(h.value(e.get("overlap"))),
                _ranked(e.get("live")),
                _ranked(e.get("new")),
            )
        )
    return h.table(["id", "text", "overlap", "live neighbours", "new neighbours"], rows, numeric=[2])


def _ranked(ids: Any) -> str:
    """A neighbour list, best first, one id per line."""
    if not isinstance(ids, list) or not ids:
        return "–"
    return '<ol class="ids mono">' + "".join(f"<li>{h.text(str(i))}</li>" for i in ids) + "</ol>"


def _fingerprints(report: Report) -> str:
    f = report.fingerprints
    s = report.status
    model = f["target_model"] or {}
    live_model = f["alias_model"] or {}
    facts = h.facts(
        [
            ("New target", f"<code>{h.metric('target', s['target'], s['target'] or 'none')}</code>"),
            ("Its fingerprint", f"<code>{h.text(f['target_fingerprint'] or '–')}</code>"),
            ("Its model", h.text(h.model_name(model))),
            ("Alias", f"<code>{h.metric('alias', s['alias'])}</code>"),
            (
                "Alias serves now",
                f"<code>{h.metric('alias_target', s['alias_target'], served(s['alias_target'], s.get('alias_is_physical', False), s['alias']))}</code>",
            ),
            ("Fingerprint served now", f"<code>{h.text(f['alias_fingerprint'] or '–')}</code>"),
            ("Model served now", h.text(h.model_name(live_model))),
        ]
    )
    history = report.alias_history
    rows = [
        (
            h.local_time(c["at"]),
            h.text(c["action"]),
            f"<code>{h.text(c['old'] or '–')}</code>",
            f"<code>{h.text(c['new'])}</code>",
            f"<code>{h.text(c['fingerprint'] or '–')}</code>",
            h.badge(not c["forced"], "verified", "forced"),
            h.text(c["state"]),
        )
        for c in reversed(history)
    ]
    table = (
        h.table(["when (local time)", "action", "from", "to", "fingerprint", "", "state"], rows)
        if rows
        else '<p class="empty">The alias has never been moved by reindex.</p>'
    )
    return h.section(
        "fingerprints",
        "Fingerprints and alias history",
        facts,
        "<h3>Alias history (newest first)</h3>",
        table,
    )
