"""A ledger in a shared Postgres database: kill the real `reindex run`, resume, and end exact and reconciled."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psycopg
import pytest

from reindex.errors import AlreadyRunning, BackendError, ConfigError, LeaseLost, TransientError
from reindex.state.records import Lease, ShardResult
from reindex_adapters.postgres.ledger import MIGRATIONS, PostgresLedger
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


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://reindex:hunter22@127.0.0.1:1/ledger?connect_timeout=2",
        "postgres://reindex:hunter22@127.0.0.1:1,127.0.0.1:2/ledger?connect_timeout=2",
        "postgresql://reindex:hun%40ter22@127.0.0.1:1/ledger?connect_timeout=2",
        "postgresql://reindex:hun@ter22@127.0.0.1:1/ledger?connect_timeout=2",
        "postgresql://reindex@127.0.0.1:1/ledger?password=hunter22&connect_timeout=2",
        "postgresql://reindex:hunter22@127.0.0.1:1/ledger?connect_timeout=2&sslmode=bogus",
        "host=127.0.0.1 port=1 user=reindex password=hunter22 connect_timeout=2",
        "host=127.0.0.1 port=1 user=reindex password = 'hunter22 x' connect_timeout=2",
        "host=127.0.0.1 port=1 user=reindex password='hunter22 x' bogus",
    ],
)
def test_no_ledger_error_names_the_password_whatever_form_the_url_gives_it(url: str) -> None:
    with pytest.raises(ConfigError) as raised:
        PostgresLedger(url)
    assert "hunter22" not in str(raised.value) and "ter22" not in str(raised.value)


def _shard(seq: int) -> ShardResult:
    return ShardResult(seq, None if seq == 0 else f"doc-{seq - 1}", f"doc-{seq}", 1, 1, (), 0, 0, 5, 0, 0.1)


def _lease_backends(dsn: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'reindex-lease' AND datname = current_database()"
        ).fetchall()
    return [int(row[0]) for row in rows]


def _terminate(dsn: str, pids: list[int]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))


@contextmanager
def _lease_within(ledger: PostgresLedger, key: str, seconds: float) -> Iterator[Lease]:
    """Take `key` once the terminated holder's backend has exited (it frees its locks a moment later)."""
    deadline = time.monotonic() + seconds
    while True:
        with ExitStack() as stack:
            try:
                lease = stack.enter_context(ledger.lease(key))
            except AlreadyRunning:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
                continue
            yield lease
            return


def test_a_terminated_lease_connection_is_lost_within_seconds_and_fences_the_stale_runner(
    pg_dsn: str,
) -> None:
    stale, fresh = PostgresLedger(pg_dsn), PostgresLedger(pg_dsn)
    stale.begin("p", alias="docs", target="docs__aaaa0001", fingerprint="f" * 16, model={})
    with stale.lease("run:docs") as lease:
        stale.record_shard("p", _shard(0))
        stale.claim_texts("p", {"hash-0": "doc-0"})
        time.sleep(1.5)  # a few healthy pings: the watchdog does not cry wolf
        assert not lease.lost.is_set()
        (pid,) = _lease_backends(pg_dsn)
        _terminate(pg_dsn, [pid])
        started = time.monotonic()
        assert lease.lost.wait(3), "the watchdog noticed the dropped lease connection"
        lost_after = time.monotonic() - started
        with _lease_within(fresh, "run:docs", seconds=5) as taken:
            assert taken.token == lease.token + 1
            fresh.release_claims("p")  # the new runner's recovery: the stale claim goes
            fresh.claim_texts("p", {"hash-1": "doc-1"})
            for write in (lambda: stale.record_shard("p", _shard(1)), lambda: stale.release_claims("p")):
                lease.lost.clear()  # the stored token refuses it even before the watchdog speaks
                with pytest.raises(LeaseLost):
                    write()
            fresh.record_shard("p", _shard(1))
            assert fresh.text_states("p", ["hash-1"]) == {"hash-1": ("doc-1", "claimed")}
    assert lost_after < 3
    assert not [t for t in threading.enumerate() if t.name == "reindex-lease-watchdog"]
    assert stale.resume_point("p") == ("doc-1", 2)
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM reindex.leases").fetchone() == (0,)
        assert conn.execute("SELECT token FROM reindex.lease_tokens").fetchall() == [(lease.token + 1,)]
    stale.close()
    fresh.close()


def test_the_watchdog_marks_a_lease_lost_when_its_token_moves_on(pg_dsn: str) -> None:
    ledger = PostgresLedger(pg_dsn)
    with ledger.lease("run:docs") as lease:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("UPDATE reindex.lease_tokens SET token = token + 1")
        assert lease.lost.wait(3)
    ledger.close()
