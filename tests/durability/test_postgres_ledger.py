"""A ledger in a shared Postgres database: kill the real `reindex run`, resume, and end exact and reconciled."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psycopg
import pytest

from adapters.postgres_ledger import MIGRATIONS, PostgresLedger
from reindex.errors import BackendError, ConfigError, TransientError
from reindex.ledger import ShardResult
from tests.durability.support import Tool, config_text, write_corpus


@dataclass
class PostgresStateTool(Tool):
    """Tool whose `[run] state` is a postgresql:// URL: progress is read from the reindex schema."""

    dsn: str = ""

    def ledger_written(self) -> tuple[int, int]:
        with psycopg.connect(self.dsn) as conn:
            try:
                row = conn.execute(
                    "SELECT count(*), coalesce(sum(documents), 0) FROM reindex.shards"
                ).fetchone()
            except psycopg.errors.UndefinedTable:  # schema not created yet
                return 0, 0
        assert row is not None
        return int(row[0]), int(row[1])


def test_sigkilled_runs_sharing_a_postgres_ledger_resume_to_a_verified_end(
    tmp_path: Path, pg_dsn: str
) -> None:
    corpus, config = tmp_path / "docs.jsonl", tmp_path / "reindex.toml"
    texts = write_corpus(corpus, 1500)
    target = f'kind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "docs"'
    config.write_text(config_text(corpus=corpus, state=pg_dsn, target=target, shard_size=25, latency_ms=4))  # type: ignore[arg-type]
    tool = PostgresStateTool(config, tmp_path / "unused.db", dsn=pg_dsn)
    rng = np.random.default_rng(20261130)
    recorded = []
    for _ in range(3):
        assert tool.kill_after_progress(tool.start("run"), rng, deadline=30), "finished before the kill"
        recorded.append(tool.ledger_written()[1])
    assert 0 < recorded[0] < recorded[1] < recorded[2] < len(texts), recorded
    code, _, err = tool.run("run", timeout=60)
    assert code == 0, err
    assert tool.json("verify")["complete"]
    status = tool.json("status")
    assert status["reconciled"] and status["state"] == "complete"
    assert status["written"] + status["duplicates"] == len(texts)
    with psycopg.connect(pg_dsn) as conn:
        seqs = [r[0] for r in conn.execute("SELECT seq FROM reindex.shards ORDER BY seq")]
        leases = conn.execute("SELECT count(*) FROM reindex.leases").fetchone()
    assert seqs == list(range(len(seqs))), "the shards form one contiguous prefix"
    assert leases == (0,), "a run that ends releases its lease"


def test_an_unreachable_ledger_is_a_config_error_without_the_password() -> None:
    with pytest.raises(ConfigError) as raised:
        PostgresLedger("postgresql://reindex:hunter2@127.0.0.1:1/ledger?connect_timeout=2")
    assert raised.value.hint == "check [run] state"
    assert "hunter2" not in str(raised.value) and "reindex:***@" in str(raised.value)


def test_a_dropped_connection_is_transient_and_reopened_on_the_next_call(pg_dsn: str) -> None:
    ledger = PostgresLedger(pg_dsn)
    ledger.begin("p", alias="docs", target="docs__aaaa0001", fingerprint="f" * 16, model={})
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'reindex-ledger'"
        )
    with pytest.raises(TransientError):
        ledger.resume_point("p")
    assert ledger.resume_point("p") == (None, 0)
    ledger.close()


def test_replaying_a_recorded_shard_changes_nothing_and_another_range_is_refused(pg_dsn: str) -> None:
    ledger = PostgresLedger(pg_dsn)
    ledger.begin("p", alias="docs", target="docs__aaaa0001", fingerprint="f" * 16, model={})
    shard = ShardResult(0, None, "doc-9", 10, 10, (), 0, 0, 50, 0, 0.1)
    ledger.record_shard("p", shard)
    ledger.record_shard("p", shard)
    summary = ledger.summary("p")
    assert summary is not None and (summary.shards, summary.documents) == (1, 10)
    with pytest.raises(BackendError, match="already recorded"):
        ledger.record_shard("p", ShardResult(0, None, "doc-8", 9, 9, (), 0, 0, 45, 0, 0.1))
    ledger.close()


def test_machines_starting_at_once_migrate_the_schema_once(pg_dsn: str) -> None:
    failures: list[BaseException] = []

    def start() -> None:
        try:
            PostgresLedger(pg_dsn).close()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    with psycopg.connect(pg_dsn) as conn:
        versions = conn.execute("SELECT version FROM reindex.schema_version ORDER BY version").fetchall()
    assert versions == [(n,) for n in range(1, len(MIGRATIONS) + 1)]
