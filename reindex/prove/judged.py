"""`reindex compare` measured and judged: the new target against the live index ([compare]), by the
[gate] thresholds, recorded in the ledger."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reindex import registry
from reindex.capabilities import Closes
from reindex.errors import VerificationFailed
from reindex.prove import quality
from reindex.run.migration import (
    Migration,
)
from reindex.state.ledger import Ledger


@dataclass(frozen=True)
class QualityReport:
    """`reindex compare`: the new target against the live index ([compare]), judged by [gate]."""

    report: dict[str, Any]

    @property
    def failures(self) -> list[str]:
        return list(self.report["gate"]["failures"])

    @property
    def passed(self) -> bool:
        return bool(self.report["gate"]["passed"])

    def to_json(self) -> dict[str, Any]:
        return self.report


def judged(m: Migration, ledger: Ledger) -> QualityReport:
    if m.sink.describe(m.spec.name) is None:
        raise VerificationFailed(f"target {m.spec.name!r} does not exist", hint="run `reindex run` first")
    alias = m.sink.alias(m.spec.alias)
    live = alias.alias if alias.is_physical else alias.target
    settings = m.config.compare
    old = registry.build("embedder", settings.embedder) if settings.embedder is not None else None
    sides = quality.Sides(m.spec.name, None if live == m.spec.name else live)
    try:
        report = quality.compare(m.source, m.sink, m.embedder, sides, settings, m.config.gate, old)
    finally:
        if isinstance(old, Closes):
            old.close()
    ledger.record_verification(m.plan_id, report["gate"]["passed"], report, kind="quality")
    return QualityReport(report)
