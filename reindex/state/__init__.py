"""The durable record of a migration: the ledger port, its records, and the SQLite ledger."""

from __future__ import annotations
