"""The shared Source suite (tests/contract/test_source_contract.py) against the `sqlite` source, with no change
to the shared factories: its tests are imported here and this module's `make_source` fixture loads a table.

Its own module, apart from the sink's: both suites name a test `test_identity_is_stable_and_names_the_backend`,
and one `import *` would hide the other's."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from reindex.ports import Record, Source
from reindex_adapters.testing.sqlite import SqliteSource
from tests.contract.conftest import SourceFactory
from tests.contract.test_source_contract import *  # noqa: F403  (the suite's tests, collected here)


@pytest.fixture(params=["text key", "integer key"])
def make_source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SourceFactory]:
    """Records loaded into a `docs` table (a text primary key, or an INTEGER PRIMARY KEY where every id is a
    number), read back in pages of 100 so the suite's resumes cross page boundaries."""
    opened: list[Source] = []

    def factory(records: Sequence[Record]) -> Source:
        path = tmp_path / f"docs{len(opened)}.db"
        key = "INTEGER" if request.param == "integer key" else "TEXT"
        with sqlite3.connect(path) as conn:
            conn.execute(f"CREATE TABLE docs (id {key} PRIMARY KEY, body TEXT, category TEXT)")
            conn.executemany(
                "INSERT INTO docs VALUES (?, ?, ?)",
                [
                    (int(r.id) if key == "INTEGER" else r.id, r.text, r.payload.get("category"))
                    for r in records
                ],
            )
        conn.close()
        source = SqliteSource(path, table="docs", id_column="id", text_column="body", page_size=100)
        opened.append(source)
        return source

    yield factory
    for source in opened:
        source.close()
