"""`plan`'s rehearsal: the run's engine on the first shards into a scratch target, timed, then dropped.

What it must never do is leave anything behind or touch what the application reads: after `plan` the
database has the same tables (and Qdrant the same collections), no ledger exists, and the target the run
would build does not exist yet. The ETA's accuracy is a benchmark's business (`scripts/bench eta`), not a
timed test's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from qdrant_client import QdrantClient

from tests.cli.test_cli import invoke, write_config, write_corpus

TABLES = (
    "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'v', 'p')"
)


def tables(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {name for (name,) in conn.execute(TABLES).fetchall()}


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path / "docs.jsonl", 300)


def pgvector_config(tmp_path: Path, corpus: Path, dsn: str, embedder: str) -> Path:
    return write_config(
        tmp_path / "plan.toml",
        source=f'kind = "jsonl"\npath = "{corpus}"',
        embedder=embedder,
        target=f'kind = "pgvector"\ndsn = "{dsn}"\nalias = "docs"',
        state=tmp_path / "state.db",
    )


def test_plan_rehearses_into_a_scratch_table_and_leaves_nothing(
    tmp_path: Path, corpus: Path, pg_dsn: str
) -> None:
    config = pgvector_config(tmp_path, corpus, pg_dsn, 'kind = "hash"\ndim = 24')
    before = tables(pg_dsn)
    code, plan, stderr = invoke("plan", "-c", str(config), "--json")
    assert code == 0, stderr
    assert plan is not None and plan["rehearsal_documents"] == 301  # every shard of so small a corpus
    assert plan["rehearsal_workers"] == 1 and plan["rehearsal_devices"] == 0
    assert plan["eta_basis"].startswith("rehearsed on 301 documents in shards of 64 into a scratch target")
    assert (
        plan["eta_headline_seconds"] == plan["eta_seconds_workers"]
        and plan["rehearsal_seconds_per_document"] > 0
    )
    assert tables(pg_dsn) == before and plan["target_exists"] is False
    assert not (tmp_path / "state.db").exists()  # the rehearsal's ledger was a temporary one

    code, plain, _ = invoke("plan", "-c", str(config), "--json", "--no-rehearse")
    assert code == 0 and plain is not None and plain["rehearsal_documents"] is None
    assert plain["eta_seconds_workers"] is not None and plain["eta_basis"] is None
    assert tables(pg_dsn) == before


def test_a_scratch_table_a_killed_plan_left_is_dropped_once_old(
    tmp_path: Path, corpus: Path, pg_dsn: str
) -> None:
    """A plan killed in its rehearsal leaves its scratch table; the next rehearsal drops those an hour old
    (their names carry their creation time) and leaves a younger one, which may be another plan's."""
    config = pgvector_config(tmp_path, corpus, pg_dsn, 'kind = "hash"\ndim = 24')
    stale, young = "reindex_rehearsal_1000000000_0dead0", f"reindex_rehearsal_{int(time.time())}_0live0"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for name in (stale, young):
            conn.execute(sql.SQL("CREATE TABLE {} (id text)").format(sql.Identifier(name)))
    code, plan, stderr = invoke("plan", "-c", str(config), "--json")
    assert code == 0 and plan is not None and plan["rehearsal_documents"] == 301, stderr
    left = {name for name in tables(pg_dsn) if name.startswith("reindex_rehearsal_")}
    assert left == {young}


def test_a_model_on_a_device_is_rehearsed_through_the_processes_engine(
    tmp_path: Path, corpus: Path, pg_dsn: str
) -> None:
    """The paced kind stands for a GPU: the run feeds it from a worker process, so the rehearsal does too
    (its start-up is part of what a run pays)."""
    config = pgvector_config(tmp_path, corpus, pg_dsn, 'kind = "paced"\ndim = 16\nrate = 2000000')
    before = tables(pg_dsn)
    code, plan, stderr = invoke("plan", "-c", str(config), "--json")
    assert code == 0, stderr
    assert plan is not None and (plan["rehearsal_workers"], plan["rehearsal_devices"]) == (1, 1)
    assert plan["eta_basis"].startswith("rehearsed by the processes engine, 1 worker and 1 model process, on")
    assert (plan["workers"], plan["devices"]) == (1, 1) and plan["eta_seconds_workers"] > 0
    assert tables(pg_dsn) == before


def test_a_qdrant_rehearsal_leaves_the_collections_as_they_were(tmp_path: Path, corpus: Path) -> None:
    storage = tmp_path / "qdrant"
    config = write_config(
        tmp_path / "plan.toml",
        source=f'kind = "jsonl"\npath = "{corpus}"',
        embedder='kind = "hash"\ndim = 24',
        target=f'kind = "qdrant"\npath = "{storage}"\nalias = "docs"',
        state=tmp_path / "state.db",
    )
    code, plan, stderr = invoke("plan", "-c", str(config), "--json")
    assert code == 0, stderr
    assert plan is not None and plan["rehearsal_documents"] == 301
    client = QdrantClient(path=str(storage))
    try:
        assert [c.name for c in client.get_collections().collections] == []
    finally:
        client.close()


def test_a_paid_model_is_never_rehearsed(
    tmp_path: Path, corpus: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider's model would bill the rehearsal's texts: its ETA is what its configured limits allow
    (the endpoint here answers nothing: plan never calls it)."""
    monkeypatch.setenv("REINDEX_TEST_UNUSED_KEY", "sk-test")
    embedder = (
        'kind = "openai"\nmodel = "text-embedding-3-small"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'api_key_env = "REINDEX_TEST_UNUSED_KEY"\ntokens_per_minute = 1000000'
    )
    config = pgvector_config(tmp_path, corpus, pg_dsn, embedder)
    code, plan, stderr = invoke("plan", "-c", str(config), "--json")
    assert code == 0, stderr
    assert plan is not None and plan["rehearsal_documents"] is None
    configured = next(route for route in plan["routes"] if route["name"] == "[embedder]")
    assert plan["eta_headline_seconds"] == configured["duration_seconds"] > 0
    assert "tokens/min" in plan["eta_basis"]
    assert json.dumps(plan)  # the whole report is JSON
