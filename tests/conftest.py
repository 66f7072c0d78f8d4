"""Shared fixtures: one embedded PostgreSQL (pgserver) per session, a fresh database per test."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

if not os.environ.get("XDG_RUNTIME_DIR"):  # pgserver asks platformdirs, which warns without a private one
    _runtime = Path(f"/tmp/reindex-runtime-{os.getuid()}")
    _runtime.mkdir(mode=0o700, exist_ok=True)
    os.environ["XDG_RUNTIME_DIR"] = str(_runtime)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_databases = itertools.count()


@pytest.fixture(autouse=True)
def _stamina_testing() -> Iterator[None]:
    import stamina

    stamina.set_testing(True, attempts=3)
    yield
    stamina.set_testing(False)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """The server URI. The test process owns the postmaster, so killing the tool never orphans it."""
    import pgserver

    # As root, pgserver runs postgres as its own user, which cannot enter pytest's 0700 tmp folders.
    data = Path(tempfile.mkdtemp(prefix="reindex-test-pg-"))
    data.chmod(0o755)
    server = pgserver.get_server(data, cleanup_mode="stop")
    yield server.get_uri()
    _stop_at_once(data)
    server.cleanup()
    shutil.rmtree(data, ignore_errors=True)


def _stop_at_once(data: Path) -> None:
    """Immediate shutdown (SIGQUIT to the postmaster, no checkpoint): the data is thrown away next, and the
    fast shutdown's checkpoint of every test database took 15-18 s at the end of each suite."""
    try:
        pid = int((data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGQUIT)
    except (OSError, ValueError, IndexError):
        return  # not running: cleanup has nothing to stop either
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


@pytest.fixture
def pg_dsn(pg_server: str) -> str:
    """A fresh database with the vector extension, so tests never see each other's tables."""
    import psycopg
    from psycopg import sql

    name = f"t{os.getpid()}_{next(_databases)}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = pg_server.replace("/postgres?", f"/{name}?")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    return dsn


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BERT saved as a sentence-transformers model: real loading and encode code."""
    from tests.support.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
