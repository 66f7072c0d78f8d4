"""The migration report: one document a change board reads before a cutover, built from the ledger.

Every figure `reindex status` also reports is taken from `commands.status` itself, so the page and
`status --json` cannot disagree. The rest comes from the ledger (shard records, dead letters, the newest
coverage and quality checks, the alias history) and, for the plan side of "plan against actual", from the
estimate `reindex plan` printed, kept beside a SQLite ledger (else the planner runs again; see `_planned`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reindex import commands
from reindex.config import Config
from reindex.errors import ConfigError
from reindex.plan.estimate import estimate, headline_eta, printed_plan, spread
from reindex.run.backfill import price_of
from reindex.run.migration import known_run, ledger_of, open_backends, open_migration
from reindex.state.ledger import Ledger
from reindex.state.records import DeadLetter, RunSummary, ShardRecord, Verification
from reindex.units import iso_utc, now, served

EXAMPLES_PER_REASON = 5


@dataclass
class Report:
    """What the page, `report --json` and the text summary show. Instants are ISO-8601 UTC strings."""

    generated_at: str
    config: str
    status: dict[str, Any]  # exactly `status --json`
    reconciliation: dict[str, Any]
    coverage: dict[str, Any] | None  # the newest `verify`: {at, complete, report}
    dead_letters: dict[str, Any]
    throughput: dict[str, Any]
    plan: dict[str, Any] | None  # the planner's figures, recomputed now (None with --no-plan)
    plan_vs_actual: list[dict[str, Any]]
    quality: dict[str, Any] | None  # the newest `compare`: {at, passed, report}
    fingerprints: dict[str, Any]
    alias_history: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary_lines(self) -> list[str]:
        """The few lines `reindex report` prints without --json or --html."""
        s, rec = self.status, self.reconciliation
        verified = self.coverage
        lines = [
            f"{s['alias']} → {s['target'] or '(no target yet)'}: {s['state']}, "
            f"{'live' if s['is_live'] else 'not live'} (alias serves {served(s['alias_target'], s.get('alias_is_physical', False), s['alias'])})",
            f"reconciliation: {rec['documents']:,} documents in = {rec['written']:,} written + "
            f"{rec['dead_letters']:,} dead-lettered + {rec['duplicates']:,} duplicate ids folded"
            + (f" + {rec['vanished']:,} vanished" if rec["vanished"] else "")
            + (" (reconciled)" if rec["reconciled"] else " (DOES NOT RECONCILE)"),
            "verify: "
            + (
                f"{'complete' if verified['complete'] else 'NOT complete'} at {verified['at']}"
                if verified
                else "never run (run `reindex verify`)"
            ),
            "quality: "
            + (
                f"gate {'passed' if self.quality['passed'] else 'FAILED'} at {self.quality['at']}"
                if self.quality
                else "not compared yet: run `reindex compare`"
            ),
        ]
        rate = self.throughput.get("docs_per_second")
        if rate is not None:
            lines.append(
                f"throughput: {rate:,.1f} documents/s, {self.throughput['tokens_per_second']:,.1f} tokens/s"
                f" over {len(self.throughput['shards']):,} shards"
            )
        return lines


def build(config: Config, *, plan: bool = True, calibrate: bool = True) -> Report:
    """Gather the report. Loads the model only for the plan side (`plan=False` skips it)."""
    status = commands.status(config).to_json()
    with open_backends(config) as (source, sink), ledger_of(config) as ledger:
        run = known_run(config, ledger, source, sink)
        plan_id = run.plan_id if run else ""
        summary = ledger.summary(plan_id) if run else None
        alias = sink.alias(config.alias)
        fingerprints = {
            "target": status["target"],
            "target_fingerprint": run.fingerprint if run else None,
            "target_model": run.model if run else None,
            "alias": alias.alias,
            "alias_target": alias.target,
            "alias_fingerprint": alias.fingerprint,
            "alias_model": dict(alias.model) if alias.model else None,
        }
        shards = ledger.shards(plan_id) if run else []
        report = Report(
            generated_at=now(),
            config=str(config.path),
            status=status,
            reconciliation=_reconciliation(status, summary),
            coverage=_newest(ledger, plan_id, "coverage"),
            dead_letters=_dead_letters(ledger.dead_letters(plan_id) if run else []),
            throughput=throughput(shards),
            plan=None,
            plan_vs_actual=[],
            quality=_newest(ledger, plan_id, "quality"),
            fingerprints=fingerprints,
            alias_history=status["history"],  # ISO-8601 instants, as status --json gives them
        )
    if plan:
        planned, price = _planned(config, calibrate=calibrate)
        report.plan = planned
        report.plan_vs_actual = plan_against_actual(planned, summary, report.throughput, price)
    return report


def _reconciliation(status: dict[str, Any], summary: RunSummary | None) -> dict[str, Any]:
    """Documents in = written + dead-lettered + duplicate ids folded (+ dead letters gone when retried)."""
    return {
        "documents": status["documents"],
        "written": status["written"],
        "dead_letters": status["dead_letters"],
        "duplicates": status["duplicates"],
        "vanished": status["vanished"],
        "reconciled": status["reconciled"],
        "tokens": summary.tokens if summary else 0,
        "truncated": summary.truncated if summary else 0,
        "reused": summary.reused if summary else 0,
        "billed_tokens": summary.billed_tokens if summary else 0,
    }


def _newest(ledger: Ledger, plan_id: str, kind: str) -> dict[str, Any] | None:
    checks: list[Verification] = ledger.verifications(plan_id, kind) if plan_id else []
    if not checks:
        return None
    check = checks[-1]
    passed = {"passed" if kind == "quality" else "complete": check.passed}
    return {"at": iso_utc(check.at), **passed, "report": check.report}


def _dead_letters(letters: list[DeadLetter]) -> dict[str, Any]:
    """Counts by reason, most frequent first, with the first few ids and details of each."""
    by_reason: dict[str, list[DeadLetter]] = defaultdict(list)
    for letter in letters:
        by_reason[letter.reason].append(letter)
    reasons = [
        {
            "reason": reason,
            "count": len(group),
            "examples": [{"id": d.doc_id, "detail": d.detail or ""} for d in group[:EXAMPLES_PER_REASON]],
        }
        for reason, group in sorted(by_reason.items(), key=lambda item: (-len(item[1]), item[0]))
    ]
    return {"total": len(letters), "reasons": reasons}


def throughput(shards: list[ShardRecord]) -> dict[str, Any]:
    """Per shard: documents/s and tokens/s over its own seconds, placed at its end since the run began."""
    if not shards:
        return {"started_at": None, "finished_at": None, "docs_per_second": None, "shards": []}
    start = min(s.written_at - s.seconds for s in shards)
    rows = [
        {
            "seq": s.seq,
            "documents": s.documents,
            "tokens": s.tokens,
            "seconds": round(s.seconds, 3),
            "written_at": iso_utc(s.written_at),
            "elapsed_seconds": round(s.written_at - start, 3),
            "docs_per_second": _rate(s.documents, s.seconds),
            "tokens_per_second": _rate(s.tokens, s.seconds),
            "worker": s.worker,
        }
        for s in shards
    ]
    seconds = sum(s.seconds for s in shards)
    return {
        "started_at": iso_utc(start),
        "finished_at": iso_utc(max(s.written_at for s in shards)),
        "seconds": round(seconds, 3),
        "docs_per_second": _rate(sum(s.documents for s in shards), seconds),
        "tokens_per_second": _rate(sum(s.tokens for s in shards), seconds),
        "windows": windows(shards, start),
        "shards": rows,
    }


WINDOWS = 20


def windows(shards: list[ShardRecord], start: float) -> list[dict[str, Any]]:
    """The run's rate over time: what was written in each of up to WINDOWS equal spans of wall time, over
    the span's length. A shard's own rate means little (workers overlap, and a shard recorded milliseconds
    after the one before showed 41,000 documents/s in a 72 documents/s run)."""
    end = max(s.written_at for s in shards)
    count = max(1, min(WINDOWS, len(shards)))
    width = max(end - start, 1e-9) / count
    documents, tokens = [0] * count, [0] * count
    for shard in shards:
        slot = min(count - 1, int((shard.written_at - start) / width))
        documents[slot] += shard.documents
        tokens[slot] += shard.tokens
    return [
        {
            "elapsed_seconds": round((slot + 1) * width, 3),
            "docs_per_second": round(documents[slot] / width, 1),
            "tokens_per_second": round(tokens[slot] / width, 1),
        }
        for slot in range(count)
    ]


def _rate(amount: int, seconds: float) -> float | None:
    return round(amount / seconds, 1) if seconds > 0 else None


def _planned(config: Config, *, calibrate: bool) -> tuple[dict[str, Any], float | None]:
    """The estimate `plan` printed for this migration (kept beside the ledger: `printed_plan`), and the
    embedder's price per 1M tokens. Where none was kept (a Postgres ledger, no `plan` before the run), the
    planner runs again now and says so (`computed_at`): its tokens are exact, its ETA a new one."""
    with open_migration(config) as m:
        price = price_of(m.embedder)
        path = printed_plan(m.config.run, m.plan_id)
        if path is not None and path.is_file():
            planned = json.loads(path.read_text())
            planned["cost_usd"] = (
                round(planned["tokens"] * price / 1_000_000, 6) if price is not None else None
            )
            planned["price_per_million_usd"] = price
            planned["computed_at"] = iso_utc(planned.pop("printed_at", None))
            planned["printed"] = True
            planned["calibrated"] = planned.get("eta_headline_seconds") is not None
            return planned, price
        plan = estimate(m.source, m.embedder, m.config.run, calibrate=calibrate)
        spread(plan, m.config.run, 1, None)
        headline_eta(plan)
    planned = plan.to_json()
    planned["printed"] = False
    planned["cost_usd"] = round(plan.tokens * price / 1_000_000, 6) if price is not None else None
    planned["price_per_million_usd"] = price
    planned["computed_at"] = now()
    planned["calibrated"] = plan.eta_seconds is not None
    return planned, price


def plan_against_actual(
    plan: dict[str, Any], summary: RunSummary | None, rates: dict[str, Any], price: float | None
) -> list[dict[str, Any]]:
    """Rows of (metric, unit, planned, actual); `key` names the status --json key an actual comes from."""
    actual_cost = (
        round(summary.billed_tokens * price / 1_000_000, 6) if summary and price is not None else None
    )
    return [
        _row(
            "documents", "documents", plan["documents"], summary.documents if summary else None, "documents"
        ),
        _row(
            "dead letters (unreadable or empty)",
            "documents",
            plan["unreadable_or_empty"],
            summary.dead_letters if summary else None,
            "dead_letters",
        ),
        _row("tokens embedded", "tokens", plan["tokens"], summary.tokens if summary else None),
        _row("cost", "USD", plan["cost_usd"], actual_cost),
        _row(
            "duration (embedding and writing)",
            "s",
            plan.get("eta_headline_seconds", plan["eta_seconds"]),
            summary.seconds if summary else None,
        ),
        _row(
            "throughput (planned: the model alone, calibrated)",
            "documents/s",
            plan["calibration_docs_per_second"],
            rates.get("docs_per_second"),
        ),
    ]


def _row(metric: str, unit: str, planned: Any, actual: Any, key: str | None = None) -> dict[str, Any]:
    ratio = round(actual / planned, 3) if isinstance(actual, int | float) and planned else None
    return {"metric": metric, "unit": unit, "planned": planned, "actual": actual, "ratio": ratio, "key": key}


def write(path: Path, page: str) -> None:
    """Write the page whole: a reader never opens half of it."""
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(page, encoding="utf-8")
        partial.replace(path)
    except OSError as exc:
        raise ConfigError(
            f"cannot write the page to {str(path)!r}: {exc.strerror or exc}",
            hint="pass --html a file in a folder that exists and is writable",
        ) from None
