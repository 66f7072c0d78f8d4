"""One suite for every Ledger: SQLite (the default) and Postgres (shared runs) must give the same results."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from reindex.errors import AlreadyRunning, BackendError, ConfigError, CutoverRefused, LeaseLost
from reindex.state.ledger import Ledger
from reindex.state.records import DeadLetter, Job, ShardResult
from reindex.state.sqlite import SqliteLedger

PLAN = "plan-0001"
Opener = Callable[[], Ledger]


def _open(state: str) -> Ledger:
    if state.startswith("postgresql://"):
        from reindex_adapters.postgres.ledger import PostgresLedger

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
    seq: int,
    documents: int = 10,
    dead: tuple[DeadLetter, ...] = (),
    duplicates: int = 0,
    *,
    after: str | None = "follows",
    owners: dict[str, str] | None = None,
) -> ShardResult:
    return ShardResult(
        seq=seq,
        after_cursor=(None if seq == 0 else f"doc-{seq * 10 - 1:04d}") if after == "follows" else after,
        last_cursor=f"doc-{seq * 10 + 9:04d}",
        documents=documents,
        written=documents - len(dead) - duplicates,
        dead_letters=dead,
        duplicates=duplicates,
        reused=1,
        tokens=100,
        truncated=0,
        seconds=0.5,
        owners=owners or {},
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


def test_shards_lists_each_recorded_shard_in_write_order_for_the_report(ledger: Ledger) -> None:
    assert ledger.shards(PLAN) == []
    ledger.record_shard(PLAN, shard(0, dead=(letter("doc-0001"),)))
    ledger.record_shard(PLAN, replace(shard(1), worker="node-1/actor-0"))
    rows = ledger.shards(PLAN)
    assert [(r.seq, r.documents, r.written, r.tokens, r.seconds, r.worker) for r in rows] == [
        (0, 10, 9, 100, 0.5, None),
        (1, 10, 10, 100, 0.5, "node-1/actor-0"),
    ]
    assert rows[0].written_at <= rows[1].written_at and isinstance(rows[0].written_at, float)
    assert ledger.shards("another plan") == []


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
    ledger.record_verification(PLAN, False, {"overlap_at_k": 0.2}, kind="quality")
    checks = ledger.verifications(PLAN)
    assert [(c.kind, c.passed, c.report) for c in checks] == [
        ("coverage", False, {"missing": 3}),
        ("coverage", True, {"missing": 0}),
        ("quality", False, {"overlap_at_k": 0.2}),
    ]
    assert [c.report for c in ledger.verifications(PLAN, "quality")] == [{"overlap_at_k": 0.2}]
    assert ledger.verifications("another plan") == []


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
from reindex_adapters.postgres.ledger import PostgresLedger
from reindex.state.sqlite import SqliteLedger
state = sys.argv[1]
ledger = PostgresLedger(state) if state.startswith("postgresql://") else SqliteLedger(state)
with ledger.lease("migration-a"):
    print("held", flush=True)
    time.sleep(60)
"""


def begin(ledger: Ledger, plan_id: str = PLAN, config_key: str | None = None) -> str:
    return ledger.begin(
        plan_id,
        alias="docs",
        target=f"docs__{plan_id[-8:]}",
        fingerprint="f" * 16,
        model={"model": "m", "dim": 4},
        config_key=config_key,
    )


def test_a_run_keeps_its_nonce_across_begins_and_gets_a_new_one_after_forget(ledger: Ledger) -> None:
    first = begin(ledger)
    ledger.finish(PLAN)
    assert begin(ledger) == first and len(first) == 32 and int(first, 16) >= 0
    ledger.forget(PLAN)
    assert ledger.run_info(PLAN) is None
    renewed = begin(ledger)
    assert renewed != first
    info = ledger.run_info(PLAN)
    assert info is not None and info.nonce == renewed


def test_run_info_returns_what_begin_stored_and_find_run_the_newest_run_of_a_config_key(
    open_ledger: Opener,
) -> None:
    ledger = open_ledger()
    assert ledger.find_run("key-a") is None and ledger.run_info(PLAN) is None
    nonce = begin(ledger, "plan-00000001", config_key="key-a")
    time.sleep(0.01)
    begin(ledger, "plan-00000002", config_key="key-b")
    time.sleep(0.01)
    newest = begin(ledger, "plan-00000003", config_key="key-a")
    begin(ledger, "plan-00000001")  # a later begin without a key keeps the stored one
    info = ledger.run_info("plan-00000001")
    assert info is not None
    assert (info.alias, info.target, info.fingerprint, info.nonce, info.config_key) == (
        "docs",
        "docs__00000001",
        "f" * 16,
        nonce,
        "key-a",
    )
    assert info.model == {"model": "m", "dim": 4}
    found = ledger.find_run("key-a")
    assert found is not None and (found.plan_id, found.nonce) == ("plan-00000003", newest)
    assert ledger.find_run("key-c") is None


def test_forget_deletes_everything_of_a_run_but_its_cutovers(ledger: Ledger, state: str) -> None:
    other = "plan-00000002"
    begin(ledger, other)
    for plan_id in (PLAN, other):
        ledger.record_shard(plan_id, shard(0, dead=(letter("doc-0001"),)))
        ledger.claim_texts(plan_id, {"hash-1": "doc-0002"})
        ledger.record_job(plan_id, _job())
        ledger.record_verification(plan_id, True, {})
    ledger.cutover_intent(
        "docs", None, "docs__aaaa0001", fingerprint="f" * 16, action="cutover", forced=False
    )
    ledger.forget(PLAN)
    assert ledger.summary(PLAN) is None and ledger.dead_letters(PLAN) == []
    assert ledger.jobs(PLAN) == [] and ledger.text_states(PLAN, ["hash-1"]) == {}
    assert ledger.resume_point(PLAN) == (None, 0)
    assert _count(state, "verifications", PLAN) == 0
    assert len(ledger.cutovers("docs")) == 1
    kept = ledger.summary(other)
    assert kept is not None and kept.shards == 1 and len(ledger.jobs(other)) == 1
    assert ledger.text_states(other, ["hash-1"]) == {"hash-1": ("doc-0002", "claimed")}


def test_an_alias_lock_refuses_another_ledger_after_the_wait_until_it_is_released(
    open_ledger: Opener,
) -> None:
    first, second = open_ledger(), open_ledger()
    with first.alias_lock("docs"):
        started = time.monotonic()
        with pytest.raises(CutoverRefused) as refused, second.alias_lock("docs", wait_seconds=0.3):
            pass
        assert 0.25 <= time.monotonic() - started < 3
        assert refused.value.exit_code == 4
        assert "'docs'" in str(refused.value) and "another cutover, rollback or prune" in str(refused.value)
        with second.alias_lock("other/alias: with odd characters", wait_seconds=0):
            pass
    with second.alias_lock("docs", wait_seconds=0):
        pass


def test_an_alias_lock_waits_for_a_holder_that_finishes_within_the_wait(open_ledger: Opener) -> None:
    first, second = open_ledger(), open_ledger()
    held, entered = threading.Event(), []

    def hold() -> None:
        with first.alias_lock("docs"):
            held.set()
            time.sleep(0.5)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(5)
    with second.alias_lock("docs", wait_seconds=5):
        entered.append(time.monotonic())
    thread.join()
    assert len(entered) == 1


def test_settling_texts_with_owners_hands_each_text_to_its_new_document(ledger: Ledger) -> None:
    ledger.claim_texts(PLAN, {"hash-1": "doc-0001", "hash-2": "doc-0002"})
    ledger.settle_texts(
        PLAN,
        [("hash-1", "lost"), ("hash-2", "written"), ("hash-3", "dead:too_long")],
        owners={"hash-1": "doc-0011", "hash-3": "doc-0013", "hash-4": "doc-0014"},
    )
    assert ledger.text_states(PLAN, ["hash-1", "hash-2", "hash-3", "hash-4"]) == {
        "hash-1": ("doc-0011", "lost"),
        "hash-2": ("doc-0002", "written"),
        "hash-3": ("doc-0013", "dead:too_long"),
        "hash-4": ("doc-0014", "written"),
    }
    ledger.settle_texts(PLAN, [("hash-2", "lost")])
    assert ledger.text_states(PLAN, ["hash-2"]) == {"hash-2": ("doc-0002", "lost")}


def test_a_recorded_shard_hands_its_owned_texts_to_their_new_documents(ledger: Ledger) -> None:
    ledger.claim_texts(PLAN, {"hash-1": "doc-0001"})
    ledger.record_shard(PLAN, shard(0, owners={"hash-1": "doc-0005", "hash-2": "doc-0006"}))
    assert ledger.text_states(PLAN, ["hash-1", "hash-2"]) == {
        "hash-1": ("doc-0005", "written"),
        "hash-2": ("doc-0006", "written"),
    }


def test_lease_tokens_increase_with_every_acquisition_of_a_key(open_ledger: Opener) -> None:
    first, second = open_ledger(), open_ledger()
    tokens = []
    for ledger in (first, second, first):
        with ledger.lease("run:docs") as lease:
            assert lease.key == "run:docs" and not lease.lost.is_set()
            tokens.append(lease.token)
    with first.lease("run:other") as other:
        assert other.token == 1
    assert tokens == [tokens[0], tokens[0] + 1, tokens[0] + 2]


def test_every_write_under_a_stale_lease_token_raises_lease_lost_and_changes_nothing(
    open_ledger: Opener, state: str
) -> None:
    ledger = open_ledger()
    with ledger.lease("run:docs") as lease:
        begin(ledger)
        ledger.record_shard(PLAN, shard(0, dead=(letter("doc-0001"),)))
        ledger.claim_texts(PLAN, {"hash-1": "doc-0002"})
        _rows(state, "UPDATE {}lease_tokens SET token = token + 1")
        writes: list[Callable[[], object]] = [
            lambda: begin(ledger, "plan-00000002"),
            lambda: ledger.record_shard(PLAN, shard(1)),
            lambda: ledger.settle_retry(PLAN, written=["doc-0001"], vanished=[], dead=[]),
            lambda: ledger.record_dead_letters(PLAN, [letter("doc-0099")]),
            lambda: ledger.finish(PLAN),
            lambda: ledger.record_job(PLAN, _job()),
            lambda: ledger.claim_texts(PLAN, {"hash-2": "doc-0003"}),
            lambda: ledger.settle_texts(PLAN, [("hash-1", "written")], owners={"hash-3": "doc-0004"}),
            lambda: ledger.release_claims(PLAN),
            lambda: ledger.forget(PLAN),
        ]
        for write in writes:
            lease.lost.clear()  # the stored token alone refuses each write
            with pytest.raises(LeaseLost) as raised:
                write()
            assert raised.value.exit_code == 75 and "run:docs" in str(raised.value)
            assert lease.lost.is_set()
        ledger.record_verification(PLAN, True, {})  # verify and cutover history are not fenced
        ledger.cutover_intent(
            "docs", None, "docs__aaaa0001", fingerprint=None, action="cutover", forced=False
        )
    summary = ledger.summary(PLAN)
    assert summary is not None and (summary.state, summary.shards, summary.dead_letters) == ("running", 1, 1)
    assert ledger.run_info("plan-00000002") is None and ledger.jobs(PLAN) == []
    assert ledger.dead_letters(PLAN) == [letter("doc-0001")]
    assert ledger.text_states(PLAN, ["hash-1", "hash-2", "hash-3"]) == {"hash-1": ("doc-0002", "claimed")}
    ledger.finish(PLAN)  # holding no lease again: not fenced
    assert ledger.summary(PLAN).state == "complete"  # type: ignore[union-attr]


def test_a_stale_runner_cannot_release_the_claims_of_the_run_that_took_its_lease(
    open_ledger: Opener, state: str
) -> None:
    stale, fresh = open_ledger(), open_ledger()
    with stale.lease("run:docs"):
        begin(stale)
        stale.claim_texts(PLAN, {"hash-1": "doc-0001"})
        _rows(state, "UPDATE {}lease_tokens SET token = token + 1")  # as if its lock had been lost
        fresh.claim_texts(PLAN, {"hash-2": "doc-0002"})
        with pytest.raises(LeaseLost):
            stale.release_claims(PLAN)
    assert fresh.text_states(PLAN, ["hash-1", "hash-2"]) == {
        "hash-1": ("doc-0001", "claimed"),
        "hash-2": ("doc-0002", "claimed"),
    }


def test_a_ledger_holding_no_lease_writes_while_another_holds_one(open_ledger: Opener) -> None:
    holder, other = open_ledger(), open_ledger()
    with holder.lease("run:docs"):
        begin(holder)
        other.record_shard(PLAN, shard(0))
        holder.record_shard(PLAN, shard(1))
    assert holder.resume_point(PLAN) == ("doc-0019", 2)


def test_a_shard_that_does_not_join_its_neighbours_is_refused_and_a_replay_changes_nothing(
    ledger: Ledger,
) -> None:
    ledger.record_shard(PLAN, shard(0, dead=(letter("doc-0001"),)))
    ledger.record_shard(PLAN, shard(0, dead=(letter("doc-0001"),)))  # replayed commit
    with pytest.raises(BackendError, match="already recorded"):
        ledger.record_shard(PLAN, shard(0, after="doc-0000"))
    with pytest.raises(BackendError, match="starts after 'doc-0005'"):
        ledger.record_shard(PLAN, shard(1, after="doc-0005"))
    ledger.record_shard(
        PLAN, shard(3)
    )  # out of order (deferred jobs settle as they finish): no neighbour yet
    with pytest.raises(BackendError, match="shard 3 starts after"):
        ledger.record_shard(PLAN, replace(shard(2), last_cursor="doc-0030"))
    ledger.record_shard(PLAN, shard(1))
    ledger.record_shard(PLAN, shard(2))
    summary = ledger.summary(PLAN)
    assert summary is not None and (summary.shards, summary.documents, summary.dead_letters) == (4, 40, 1)
    assert summary.reconciled and ledger.resume_point(PLAN) == ("doc-0039", 4)


def test_recording_a_job_again_stores_it_whole_as_the_deferred_run_keeps_it(ledger: Ledger) -> None:
    """The deferred run caches each job as it records it and reads the ledger's jobs back on a rerun:
    a job recorded again replaces every column of its row, the shard columns included."""
    first = replace(
        _job(),
        items=(("0-0", "doc-0000", "hash-0", 7),),
        documents=10,
        duplicates=1,
        truncated=2,
        copies=(("doc-0001", "hash-1", "doc-0000"),),
    )
    ledger.record_job(PLAN, first)
    again = replace(
        first,
        state="applied",
        job_id="batch-1",
        after_cursor="doc-0000",
        last_cursor="doc-0019",
        items=(("0-1", "doc-0002", "hash-2", 3),),
        documents=20,
        duplicates=3,
        truncated=4,
        dead=(DeadLetter("doc-0003", "provider_rejected:invalid", "refused when sent alone", "hash-3"),),
        written=5,
        billed_tokens=60,
        vanished=1,
        copies=(),
    )
    ledger.record_job(PLAN, again)
    assert ledger.jobs(PLAN) == [again]


def _job() -> Job:
    return Job(
        key=f"{PLAN}-0-0",
        seq=0,
        attempt=0,
        state="intent",
        job_id=None,
        after_cursor=None,
        last_cursor="doc-0009",
        items=(),
    )


def _count(state: str, table: str, plan_id: str) -> int:
    if state.startswith("postgresql://"):
        with psycopg.connect(state) as conn:
            row = conn.execute(
                f"SELECT count(*) FROM reindex.{table} WHERE plan_id = %s", (plan_id,)
            ).fetchone()  # test-only: fixed names
    else:
        with sqlite3.connect(state) as db:
            row = db.execute(f"SELECT count(*) FROM {table} WHERE plan_id = ?", (plan_id,)).fetchone()
    assert row is not None
    return int(row[0])


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


def test_a_new_sqlite_ledger_has_large_pages_and_an_older_one_keeps_its_own(tmp_path: Path) -> None:
    """A new ledger is created with 64 KiB pages (random-key text rows cost less per text); a ledger made with
    SQLite's 4 KiB default opens, migrates and settles texts as before, its page size unchanged."""
    new = SqliteLedger(tmp_path / "new.db")
    new.close()
    old_path = tmp_path / "old.db"
    with sqlite3.connect(old_path) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE unrelated (x)")
    old = SqliteLedger(old_path)
    old.settle_texts(PLAN, [("h1", "written"), ("h2", "dead:too_long")], owners={"h1": "d1", "h2": "d2"})
    assert old.text_states(PLAN, ["h1", "h2", "h3"]) == {
        "h1": ("d1", "written"),
        "h2": ("d2", "dead:too_long"),
    }
    old.close()
    pages = {}
    for path in (tmp_path / "new.db", old_path):
        with sqlite3.connect(path) as db:
            pages[path.name] = db.execute("PRAGMA page_size").fetchone()[0]
    assert pages == {"new.db": 65536, "old.db": 4096}
