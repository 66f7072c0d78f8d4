"""Scratch SQLite databases the proofs load side by side (verify's comparison, the settled target of a
flip): rows go in by chunks, one transaction each, so memory stays bounded whatever the corpus."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

from reindex.batching import chunks

CHUNK = 20_000


def load_rows(db: sqlite3.Connection, sql: str, rows: Iterable[tuple[Any, ...]]) -> None:
    for chunk in chunks(rows, CHUNK):
        db.execute("BEGIN")
        db.executemany(sql, chunk)
        db.execute("COMMIT")
