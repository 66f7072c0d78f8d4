"""The shared Sink suite (tests/contract/test_sink_contract.py) against the `sqlite` sink, with no change to
the shared factories: its tests are imported here and this module's `sink` fixture builds a SqliteSink."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reindex.ports import Sink
from reindex_adapters.testing.sqlite import SqliteSink
from tests.contract.test_sink_contract import *  # noqa: F403  (the suite's tests, collected here)


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[Sink]:
    built = SqliteSink(tmp_path / "vectors.db")
    yield built
    built.close()
