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
# the models' remembered identities (reindex.run.identities): one folder per test session, not the user's
os.environ.setdefault("REINDEX_CACHE_DIR", tempfile.mkdtemp(prefix="reindex-identities-"))

_databases = itertools.count()


# The fast tier (`scripts/test --quick`, marker `quick`): modules whose tests need no database, no model
# folder, no subprocess and no emulator, so the whole tier answers in seconds.
QUICK = {
    "tests/test_batching.py",
    "tests/test_claims.py",
    "tests/test_columns.py",
    "tests/test_config.py",
    "tests/test_deferred.py",
    "tests/test_errors.py",
    "tests/test_feeding.py",
    "tests/test_pipeline.py",
    "tests/test_registry_moves.py",
    "tests/test_routing.py",
}
SLOW_FIXTURES = {"pg_server", "pg_dsn", "tiny_model"}  # a database, a model built on disk


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under `-n` (scripts/test), every Ray test runs on one worker, one after another: two local Ray
    clusters at once would split two cores between them. The QUICK modules' tests are marked `quick`, but
    for one that asks for a database or a model."""
    for item in items:
        if "/ray/" in f"/{item.nodeid}" or "bench_ray" in item.nodeid:
            item.add_marker(pytest.mark.xdist_group("ray"))
        quick = item.nodeid.split("::")[0] in QUICK
        if quick and not SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.quick)


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
    data = Path(tempfile.mkdtemp(prefix="reindex-test-pg-", dir=_memory_folder()))
    data.chmod(0o755)
    server = pgserver.get_server(data, cleanup_mode="stop")
    uri = server.get_uri()
    _throwaway_settings(uri)
    yield uri
    _stop_at_once(data)
    server.cleanup()
    shutil.rmtree(data, ignore_errors=True)


def _memory_folder() -> str | None:
    """/dev/shm when it has room: on this 2-core machine's disk a CREATE DATABASE took 130-400 ms (written
    through the WAL and flushed), in memory 20-35 ms, and the suite creates hundreds. None: the usual tmp."""
    shm = Path("/dev/shm")
    try:
        roomy = shutil.disk_usage(shm).free >= 2 * 1024**3 and os.access(shm, os.W_OK)
    except OSError:
        return None
    return str(shm) if roomy else None


def _throwaway_settings(uri: str) -> None:
    """No flush to disk: the server's data is thrown away when the session ends. A killed tool or a
    terminated connection (what the durability tests do) behaves exactly as with fsync on; only a crash
    of the whole machine would differ, and then the tests are lost anyway."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(uri, autocommit=True) as conn:
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = off").format(sql.Identifier(setting)))
        conn.execute("SELECT pg_reload_conf()")


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
def pg_dsn(pg_server: str) -> Iterator[str]:
    """A fresh database with the vector extension, so tests never see each other's tables. Dropped
    afterwards (its connections with it), so the server's memory folder holds a few databases, not hundreds."""
    import psycopg
    from psycopg import sql

    name = f"t{os.getpid()}_{next(_databases)}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = pg_server.replace("/postgres?", f"/{name}?")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    yield dsn
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BERT saved as a sentence-transformers model: real loading and encode code."""
    from tests.support.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
