"""The durable record of a migration.

ledger.py: the Ledger port · records.py: what it records and returns · sql.py: SqlLedger, the ledger's logic
once for every SQL database · sqlite.py: the SQLite ledger, the default (Postgres: reindex_adapters.postgres).
"""

from __future__ import annotations

from reindex.state.ledger import Ledger
from reindex.state.records import (
    Cutover,
    DeadLetter,
    Job,
    Lease,
    PlannedShard,
    RunInfo,
    RunSummary,
    ShardRecord,
    ShardResult,
    Verification,
    WorkerSummary,
)
from reindex.state.sqlite import SqliteLedger

__all__ = [
    "Cutover",
    "DeadLetter",
    "Job",
    "Lease",
    "Ledger",
    "PlannedShard",
    "RunInfo",
    "RunSummary",
    "ShardRecord",
    "ShardResult",
    "SqliteLedger",
    "Verification",
    "WorkerSummary",
]
