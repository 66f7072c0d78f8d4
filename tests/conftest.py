"""Shared fixtures: one embedded PostgreSQL (pgserver) per session, a fresh database per test."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
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
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server URI. The test process owns the postmaster, so killing the tool never orphans it."""
    import pgserver

    server = pgserver.get_server(tmp_path_factory.mktemp("pg"), cleanup_mode="stop")
    yield server.get_uri()
    server.cleanup()


@pytest.fixture
def pg_dsn(pg_server: str) -> str:
    """A fresh database with the vector extension, so tests never see each other's tables."""
    import psycopg

    name = f"t{os.getpid()}_{next(_databases)}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # test-only: name is generated above
    dsn = pg_server.replace("/postgres?", f"/{name}?")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    return dsn


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BERT saved as a sentence-transformers model: real loading and encode code."""
    from tests.support.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
