"""One suite for every Ledger: SQLite (the default) and Postgres (shared runs) must give the same results."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from reindex.errors import AlreadyRunning, BackendError, ConfigError
from reindex.ledger import DeadLetter, Ledger, ShardResult, SqliteLedger

PLAN = "plan-0001"
Opener = Callable[[], Ledger]


def _open(state: str) -> Ledger:
    if state.startswith("postgresql://"):
        from adapters.postgres_ledger import PostgresLedger

        return PostgresLedger(state)
    return SqliteLedger(state)


@pytest.fixture(params=["sqlite", "postgres"])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "state.db")
    return str(request.getfixturevalue("pg_dsn"))


@pytest.fixture
def open_ledger(state: str) -> Iterator[Opener]:
    opened: list[Ledger] = []

    def opener() -> Ledger:
        opened.append(_open(state))
        return opened[-1]

    yield opener
    for ledger in opened:
        ledger.close()


@pytest.fixture
def ledger(open_ledger: Opener) -> Ledger:
    built = open_ledger()
    built.begin(PLAN, alias="docs", target="docs__aaaa0001", fingerprint="f" * 16, model={"model": "m"})
    return built


def shard(
    seq: int, documents: int = 10, dead: tuple[DeadLetter, ...] = (), duplicates: int = 0
) -> ShardResult:
    return ShardResult(
        seq=seq,
        after_cursor=None if seq == 0 else f"doc-{seq * 10 - 1:04d}",
        last_cursor=f"doc-{seq * 10 + 9:04d}",
        documents=documents,
        written=documents - len(dead) - duplicates,
        dead_letters=dead,
        duplicates=duplicates,
        reused=1,
        tokens=100,
        truncated=0,
        seconds=0.5,
    )


def letter(doc_id: str, reason: str = "empty_text") -> DeadLetter:
    return DeadLetter(doc_id, reason, f"detail of {doc_id}", f"hash-{doc_id}")


def test_begin_is_idempotent_and_reopens_a_finished_run(ledger: Ledger) -> None:
    ledger.finish(PLAN)
    ledger.begin(PLAN, alias="docs", target="docs__aaaa0001", fingerprint="f" * 16, model={"model": "m"})
    summary = ledger.summary(PLAN)
    assert summary is not None
    assert (summary.state, summary.shards, summary.target) == ("running", 0, "docs__aaaa0001")
    assert ledger.summary("no-such-plan") is None


def test_resume_point_follows_the_last_recorded_shard(ledger: Ledger) -> None:
    assert ledger.resume_point(PLAN) == (None, 0)
    ledger.record_shard(PLAN, shard(0))
    ledger.record_shard(PLAN, shard(1))
    assert ledger.resume_point(PLAN) == ("doc-0019", 2)


def test_a_shard_and_its_dead_letters_commit_together_or_not_at_all(ledger: Ledger) -> None:
    ledger.record_shard(PLAN, shard(0, dead=(letter("doc-0003"),)))
    broken = DeadLetter("doc-0014", None)  # type: ignore[arg-type]  # violates NOT NULL inside the transaction
    with pytest.raises((sqlite3.IntegrityError, BackendError)):
        ledger.record_shard(PLAN, shard(1, dead=(letter("doc-0013"), broken)))
    assert [d.doc_id for d in ledger.dead_letters(PLAN)] == ["doc-0003"]
    assert ledger.resume_point(PLAN) == ("doc-0009", 1)
    summary = ledger.summary(PLAN)
    assert summary is not None and (summary.shards, summary.dead_letters) == (1, 1)


def test_summary_totals_every_shard_and_reconciles(ledger: Ledger) -> None:
    ledger.record_shard(PLAN, shard(0, dead=(letter("doc-0001"), letter("doc-0002", "too_long"))))
    ledger.record_shard(PLAN, shard(1, duplicates=2))
    summary = ledger.summary(PLAN)
    assert summary is not None
    assert (summary.shards, summary.documents, summary.written, summary.dead_letters) == (2, 20, 16, 2)
    assert (summary.duplicates, summary.reused, summary.tokens, summary.seconds) == (2, 2, 200, 1.0)
    assert summary.dead_letter_reasons == {"empty_text": 1, "too_long": 1}
    assert summary.last_cursor == "doc-0019"
    assert summary.reconciled


def test_settle_retry_moves_counts_and_keeps_reconciliation(ledger: Ledger) -> None:
    letters = (letter("doc-0001"), letter("doc-0002"), letter("doc-0003"))
    ledger.record_shard(PLAN, shard(0, dead=letters))
    ledger.settle_retry(
        PLAN, written=["doc-0001"], vanished=["doc-0002"], dead=[letter("doc-0003", "provider_rejected")]
    )
    summary = ledger.summary(PLAN)
    assert summary is not None
    assert (summary.written, summary.dead_letters, summary.vanished) == (8, 1, 1)
    assert summary.reconciled
    assert ledger.dead_letters(PLAN) == [letter("doc-0003", "provider_rejected")]


def test_the_same_dead_letter_twice_is_one_row_with_the_newest_reason(ledger: Ledger) -> None:
    ledger.record_shard(PLAN, shard(0, dead=(letter("doc-0005"),)))
    ledger.record_shard(PLAN, shard(1, dead=(letter("doc-0005", "too_long"), letter("Zed-0001"))))
    assert ledger.dead_letters(PLAN) == [letter("Zed-0001"), letter("doc-0005", "too_long")]


def test_dead_letters_found_outside_a_shard_are_listed_first_and_not_counted_in_shards(
    ledger: Ledger,
) -> None:
    ledger.record_shard(PLAN, shard(0, dead=(letter("doc-0003"),)))
    ledger.record_dead_letters(PLAN, [letter("doc-0003", "too_long"), letter("new-0001")])
    assert ledger.dead_letters(PLAN) == [letter("new-0001"), letter("doc-0003", "too_long")]
    ledger.record_shard(PLAN, shard(1))
    summary = ledger.summary(PLAN)
    assert summary is not None and summary.reconciled
    assert summary.dead_letters == 1
    assert summary.dead_letter_reasons == {"too_long": 1, "empty_text": 1}


def test_cutover_intents_settle_and_list_in_order(ledger: Ledger) -> None:
    first = ledger.cutover_intent(
        "docs", None, "docs__aaaa0001", fingerprint="f" * 16, action="cutover", forced=False
    )
    second = ledger.cutover_intent(
        "docs", "docs__aaaa0001", "docs__bbbb0002", fingerprint=None, action="cutover", forced=True, report={}
    )
    ledger.settle_cutover(first, "done", old="docs__old00000")
    ledger.settle_cutover(second, "aborted")
    moves = ledger.cutovers("docs")
    assert second > first
    assert [(m.id, m.old, m.new, m.state, m.forced) for m in moves] == [
        (first, "docs__old00000", "docs__aaaa0001", "done", False),
        (second, "docs__aaaa0001", "docs__bbbb0002", "aborted", True),
    ]
    assert all(isinstance(m.at, float) for m in moves)
    assert ledger.cutovers("other") == []


def test_record_verification_keeps_every_report(ledger: Ledger, state: str) -> None:
    ledger.record_verification(PLAN, False, {"missing": 3})
    ledger.record_verification(PLAN, True, {"missing": 0})
    assert _rows(state, "SELECT complete, report FROM {}verifications ORDER BY at") == [
        (False, '{"missing": 3}'),
        (True, '{"missing": 0}'),
    ]


def test_a_newer_schema_is_refused(open_ledger: Opener, state: str) -> None:
    open_ledger().close()
    if state.startswith("postgresql://"):
        _rows(state, "INSERT INTO reindex.schema_version VALUES (99, 0)")
    else:
        with sqlite3.connect(state) as db:
            db.execute("PRAGMA user_version = 99")
    with pytest.raises(ConfigError, match="newer reindex"):
        open_ledger()


def test_a_lease_refuses_a_second_holder_until_released(open_ledger: Opener) -> None:
    first, second = open_ledger(), open_ledger()
    refused: list[BaseException] = []

    def try_second() -> None:
        try:
            with second.lease("migration-a"):
                pass
        except AlreadyRunning as exc:
            refused.append(exc)

    with first.lease("migration-a"):
        thread = threading.Thread(target=try_second)
        thread.start()
        thread.join()
        with second.lease("migration-b"):
            pass
    assert len(refused) == 1 and "pid" in str(refused[0])
    with second.lease("migration-a"):
        pass


def test_a_lease_is_freed_when_its_process_is_killed(open_ledger: Opener, state: str) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, state],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        ledger = open_ledger()
        with pytest.raises(AlreadyRunning, match=f"pid {holder.pid}"), ledger.lease("migration-a"):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate()
    _take_within(ledger, "migration-a", seconds=5)


_HOLDER = """
import sys, time
from adapters.postgres_ledger import PostgresLedger
from reindex.ledger import SqliteLedger
state = sys.argv[1]
ledger = PostgresLedger(state) if state.startswith("postgresql://") else SqliteLedger(state)
with ledger.lease("migration-a"):
    print("held", flush=True)
    time.sleep(60)
"""


def _take_within(ledger: Ledger, key: str, seconds: float) -> None:
    """The server notices a dead client's socket at once, but its backend exits a moment later."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with ledger.lease(key):
                return
        except AlreadyRunning:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _rows(state: str, statement: str) -> list[tuple[object, ...]]:
    if state.startswith("postgresql://"):
        with psycopg.connect(state) as conn:
            cursor = conn.execute(statement.format("reindex."))  # test-only: fixed statements above
            return cursor.fetchall() if cursor.description else []
    with sqlite3.connect(state) as db:
        return [(bool(r[0]), r[1]) for r in db.execute(statement.format("")).fetchall()]
