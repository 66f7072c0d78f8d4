"""`reindex plan --html`: the dry-run flavour of the report page, handed to reviewers before any spend.

The same look as the report (reindex/report/parts.py); figures carry `data-metric="<plan --json key>"`.
"""

from __future__ import annotations

from reindex.plan.estimate import PlanReport
from reindex.report import parts as h
from reindex.units import served


def plan_page(plan: PlanReport, config: str, generated_at: str) -> str:
    """The dry-run page: what the migration will cost and where it stands, before any spend."""
    title = f"Reindex plan: {plan.alias} → {plan.target}"
    subtitle = (
        f"Dry run at {h.local_time(generated_at)} from <code>{h.text(config)}</code> · nothing was written"
        f" · plan <code>{h.metric('plan_id', plan.plan_id)}</code>"
    )
    return h.document(
        title,
        subtitle,
        [_corpus(plan), _time_and_cost(plan), _storage(plan), _target(plan), _plan_coverage(plan)],
    )


def _corpus(p: PlanReport) -> str:
    cards = [
        h.card("Documents", h.metric("documents", p.documents)),
        h.card("Embeddable", h.metric("embeddable", p.embeddable)),
        h.card(
            "Unreadable or empty",
            h.metric("unreadable_or_empty", p.unreadable_or_empty),
            "will be dead letters",
        ),
        h.card("Distinct texts", h.metric("unique_texts", p.unique_texts), "each embedded once"),
        h.card("Tokens", h.metric("tokens", p.tokens), h.text(_counted(p)) + ", after truncation"),
    ]
    facts = h.facts(
        [
            (
                "Tokens per text, mean",
                h.metric("tokens_mean", p.tokens_mean, h.decimal(p.tokens_mean, 1, "tokens")),
            ),
            (
                "Tokens per text, 90th percentile",
                h.metric("tokens_p90", p.tokens_p90, h.integer(p.tokens_p90, "tokens")),
            ),
            (
                f"Texts over {p.max_tokens:,} tokens (policy: {p.too_long_policy})",
                h.metric("over_max_tokens", p.over_max_tokens),
            ),
        ]
    )
    return h.section("corpus", "Corpus", f'<div class="cards">{"".join(cards)}</div>', facts)


def _counted(p: PlanReport) -> str:
    """Whether the token counts are exact (reindex.ports.CountsTokens), with how they were counted."""
    basis = p.token_counts["basis"]
    return f"exact: {basis}" if p.token_counts["exact"] else basis.replace("estimate:", "estimated:", 1)


def _time_and_cost(p: PlanReport) -> str:
    rows = [
        (
            "Estimated time",
            h.metric("eta_headline_seconds", p.eta_headline_seconds, h.duration(p.eta_headline_seconds)),
        ),
        (
            "Calibrated rate",
            h.metric(
                "calibration_docs_per_second",
                p.calibration_docs_per_second,
                h.decimal(p.calibration_docs_per_second, 1, "documents/s"),
            ),
        ),
        (
            "Calibrated token rate",
            h.metric(
                "calibration_tokens_per_second",
                p.calibration_tokens_per_second,
                h.decimal(p.calibration_tokens_per_second, 1, "tokens/s"),
            ),
        ),
        (
            f"On {p.workers:,} worker(s)",
            h.metric("eta_seconds_workers", p.eta_seconds_workers, h.duration(p.eta_seconds_workers)),
        ),
        ("Shards", h.metric("shards", p.shards)),
    ]
    if p.cost_online_usd is not None or p.cost_batch_usd is not None:
        rows.append(
            ("Cost, online API", h.metric("cost_online_usd", p.cost_online_usd, h.usd(p.cost_online_usd)))
        )
        rows.append(
            (
                f"Cost, batch API (within {p.batch_window or '–'})",
                h.metric("cost_batch_usd", p.cost_batch_usd, h.usd(p.cost_batch_usd)),
            )
        )
    else:
        rows.append(("Cost", "free: the embedder runs here (no provider price)"))
    note = (
        ""
        if p.eta_seconds is not None
        else '<p class="note">No calibration (<code>--no-calibrate</code>, or a paid provider: a dry run never spends money), so no time estimate.</p>'
    )
    note += "".join(f'<p class="note">Unconfirmed: {h.text(caveat)}</p>' for caveat in p.price_caveats)
    return h.section("time-and-cost", "Time and cost", h.facts(rows), note)


def _storage(p: PlanReport) -> str:
    stored = p.storage or {}
    rows = [
        ("Vector size", h.metric("dim", p.dim, h.integer(p.dim, "dimensions"))),
        (
            f"Vectors ({stored.get('type', 'float32')})",
            h.metric("vector_bytes", p.vector_bytes, h.size(p.vector_bytes)),
        ),
        (
            "With the index, about" if stored else "With an HNSW index, about",
            h.metric("index_bytes_estimate", p.index_bytes_estimate, h.size(p.index_bytes_estimate)),
        ),
    ]
    if stored:
        rows.append(("Index", h.metric("storage", stored, stored["index"])))
    return h.section("storage", "Storage", h.facts(rows))


def _target(p: PlanReport) -> str:
    rows = [
        (
            "New target",
            f"<code>{h.metric('target', p.target)}</code> {h.badge(None if p.target_exists else True, 'to be created', '', 'exists: a run resumes it')}",
        ),
        ("Its fingerprint", f"<code>{h.metric('fingerprint', p.fingerprint)}</code>"),
        ("Its model", h.text(h.model_name(p.model))),
        ("Alias", f"<code>{h.metric('alias', p.alias)}</code>"),
        (
            "Alias serves now",
            f"<code>{h.metric('alias_target', p.alias_target, served(p.alias_target, p.alias_is_physical, p.alias))}</code>",
        ),
        (
            "Fingerprint served now",
            f"<code>{h.metric('alias_fingerprint', p.alias_fingerprint, p.alias_fingerprint or '–')}</code>",
        ),
    ]
    adopt = (
        '<p class="callout">The alias is the application\'s own table or collection today: what the first'
        " cutover does with it is in the target's line above (docs/backends.md).</p>"
        if p.alias_is_physical
        else ""
    )
    return h.section("target", "Target and alias", h.facts(rows), adopt, _privileges(p), _losses(p))


def _privileges(p: PlanReport) -> str:
    """What the tool's role may not do for this migration, with the statement that grants each."""
    if not p.privileges:
        return ""
    rows = "".join(
        f"<tr><td>{h.text(x['need'])}</td><td><code>{h.text(x['fix'])}</code></td></tr>" for x in p.privileges
    )
    return (
        '<h3>What the tool\'s role lacks</h3><table id="privileges"><thead><tr><th>privilege</th>'
        f"<th>to grant it</th></tr></thead><tbody>{rows}</tbody></table>"
        '<p class="callout">Run refuses before embedding anything.</p>'
    )


def _losses(p: PlanReport) -> str:
    """What the target would not keep of what the alias serves now; `run` and `cutover` refuse what is not
    accepted."""
    if not p.losses:
        return ""
    rows = "".join(
        f"<tr><td><code>{h.text(loss['key'])}</code></td><td>{h.text(loss['what'])}</td>"
        f"<td>{h.text('; '.join(loss['objects']))}</td>"
        f"<td>{h.badge(loss['accepted'], 'accepted', 'refused')}</td></tr>"
        for loss in p.losses
    )
    refused = ", ".join(f'"{loss["key"]}"' for loss in p.losses if not loss["accepted"])
    fix = (
        f'<p class="callout">Run and cutover refuse it. To go ahead anyway, losing them, set'
        f" <code>[target] accept = [{h.text(refused)}]</code>.</p>"
        if refused
        else ""
    )
    return (
        f'<h3>What the target would not keep</h3><table id="losses">'
        "<thead><tr><th>accept key</th><th>what is lost</th><th>found</th><th></th></tr></thead>"
        f"<tbody>{rows}</tbody></table>{fix}"
    )


def _plan_coverage(p: PlanReport) -> str:
    if p.coverage is None:
        return h.section(
            "coverage",
            "Coverage",
            '<p class="empty">The target does not exist yet: nothing is covered; the run will write every embeddable document.</p>',
        )
    c = p.coverage
    names = (
        "source_documents",
        "target_vectors",
        "missing",
        "stale",
        "orphaned",
        "invalid_vectors",
        "unhashed",
    )
    rows = [(n.replace("_", " ").capitalize(), h.integer(c.get(n))) for n in names if n in c]
    head = (
        f"<p>The existing target is {h.badge(c.get('complete'), 'complete', 'not complete')}."
        " A dry run excuses no dead letter: documents that cannot be embedded count as missing here;"
        " <code>reindex verify</code> excuses those the ledger records.</p>"
    )
    return h.section("coverage", "Coverage of the existing target", head, h.facts(rows))
