"""The ledger's logic, written once for every SQL database: SqlLedger, with hooks for what a dialect does its
own way (SqliteLedger in reindex.state.sqlite, PostgresLedger in adapters/postgres).

A shard row and its dead letters are committed in one transaction after the sink's write returned,
so the rows present are exactly the shards whose vectors are durable: resume starts after the last.
Statements are written once, in SQLite's words (`?` placeholders, bare table names); `_sql` turns each
into the dialect's.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from reindex.errors import BackendError
from reindex.state.ledger import FORGET_TABLES
from reindex.state.records import (
    Cutover,
    DeadLetter,
    Job,
    Lease,
    PlannedShard,
    RunInfo,
    RunSummary,
    ShardRecord,
    ShardResult,
    Verification,
    WorkerSummary,
    job_from_row,
    job_row,
    run_info_from_row,
    shard_row,
    worker_summaries,
)

_UPSERT_DEAD_LETTER = (
    "INSERT INTO dead_letters (plan_id, doc_id, reason, detail, content_hash, seq, created_at)"
    " VALUES (?,?,?,?,?,?,?) ON CONFLICT (plan_id, doc_id) DO UPDATE SET reason = excluded.reason,"
    " detail = excluded.detail, content_hash = excluded.content_hash, seq = coalesce(excluded.seq, dead_letters.seq)"
)
# The jobs columns in table order (`job_row`); recording a job again replaces all but its key.
_JOB_COLUMNS = (
    "plan_id",
    "key",
    "seq",
    "attempt",
    "state",
    "job_id",
    "after_cursor",
    "last_cursor",
    "documents",
    "duplicates",
    "truncated",
    "written",
    "billed_tokens",
    "items",
    "dead",
    "updated_at",
    "vanished",
    "copies",
)
_UPSERT_JOB = (
    f"INSERT INTO jobs ({', '.join(_JOB_COLUMNS)}) VALUES ({','.join('?' * len(_JOB_COLUMNS))})"
    " ON CONFLICT (plan_id, key) DO UPDATE SET "
    + ", ".join(f"{column} = excluded.{column}" for column in _JOB_COLUMNS[2:])
)
_TOTALS = (
    "SELECT count(*), coalesce(sum(documents),0), coalesce(sum(written),0), coalesce(sum(dead_letters),0),"
    " coalesce(sum(duplicates),0), coalesce(sum(vanished),0), coalesce(sum(reused),0), coalesce(sum(tokens),0),"
    " coalesce(sum(truncated),0), coalesce(sum(seconds),0), coalesce(sum(billed_tokens),0)"
    " FROM shards WHERE plan_id = ?"
)
_RUN_COLUMNS = "plan_id, alias, target, fingerprint, model, nonce, config_key"


def settlements_by_state(
    states: Sequence[tuple[str, str]], owners: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """Split text settlements into {hash: state} updates of texts no owner takes over, and upserts that hand a
    text to a new owner document, as {state: {hash: owner}} (state from `states`, else 'written'): one
    statement per state, and a shard's texts are nearly all 'written'."""
    given = dict(states)
    updates = {digest: given[digest] for digest in given.keys() - owners.keys()}
    odd = {digest: state for digest, state in given.items() if state != "written" and digest in owners}
    groups: dict[str, dict[str, str]] = {}
    for digest, state in odd.items():
        groups.setdefault(state, {})[digest] = owners[digest]
    written = (
        {digest: owner for digest, owner in owners.items() if digest not in odd} if odd else dict(owners)
    )
    if written:
        groups["written"] = written
    return updates, groups


def is_replay(plan_id: str, shard: ShardResult, recorded: Mapping[int, tuple[str | None, str]]) -> bool:
    """Check a shard against the recorded shards seq-1, seq and seq+1 ({seq: (after, last)}): True when this
    very shard is already recorded (a replayed commit); BackendError when it does not join its neighbours."""
    hint = "two runs wrote this migration; check who holds its lease"
    if shard.seq in recorded:
        if recorded[shard.seq] != (shard.after_cursor, shard.last_cursor):
            raise BackendError(
                f"shard {shard.seq} of plan {plan_id} is already recorded, up to {recorded[shard.seq][1]!r}",
                hint=hint,
            )
        return True
    before, after = recorded.get(shard.seq - 1), recorded.get(shard.seq + 1)
    if before is not None and before[1] != shard.after_cursor:
        raise BackendError(
            f"shard {shard.seq} of plan {plan_id} starts after {shard.after_cursor!r},"
            f" but shard {shard.seq - 1} ends at {before[1]!r}",
            hint=hint,
        )
    if after is not None and after[0] != shard.last_cursor:
        raise BackendError(
            f"shard {shard.seq} of plan {plan_id} ends at {shard.last_cursor!r},"
            f" but shard {shard.seq + 1} starts after {after[0]!r}",
            hint=hint,
        )
    return False


def new_nonce() -> str:
    return secrets.token_hex(16)


class SqlLedger(ABC):
    """Every Ledger method whose logic does not depend on the database. A dialect gives `_sql`, its
    transactions (`_transaction`, `_fenced` for writes a lease fences, `_reading`), batch execution, the
    settling of texts, and its own text claims, leases, alias locks and `close`."""

    # ORDER BY clauses whose tie-breaks are the dialect's own
    _RUN_ORDER: ClassVar[str]  # find_run: newest first
    _DEAD_LETTER_ORDER: ClassVar[str]  # by shard, letters found outside a shard (no seq) first, then by id
    _VERIFICATION_ORDER: ClassVar[str]  # oldest first

    _lock: threading.Lock
    _leases: dict[str, Lease]  # held by this object: every write is fenced by them

    # what a dialect does its own way ------------------------------------------------------------------

    @abstractmethod
    def _sql(self, text: str) -> str:
        """One statement as written here, in the dialect's placeholders and schema (cached where it costs)."""

    @abstractmethod
    def _transaction(self) -> AbstractContextManager[Any]:
        """A transaction on the shared connection, under the lock; yields the connection."""

    @abstractmethod
    def _fenced(self) -> AbstractContextManager[Any]:
        """A write transaction that first checks that this object's leases still hold the newest token of
        their keys (LeaseLost, nothing written, otherwise)."""

    @abstractmethod
    def _reading(self) -> AbstractContextManager[Any]:
        """The shared connection under the lock, for a read outside any transaction."""

    @abstractmethod
    def _executemany(self, db: Any, text: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement (written here) for each row, inside the transaction `db` is in."""

    @abstractmethod
    def _settle_texts(
        self, db: Any, plan_id: str, states: Sequence[tuple[str, str]], owners: Mapping[str, str]
    ) -> None:
        """Set texts' states and owners (`settlements_by_state`) inside the transaction `db` is in."""

    @abstractmethod
    def claim_texts(self, plan_id: str, owners: Mapping[str, str]) -> dict[str, tuple[str, str]]: ...

    @abstractmethod
    def text_states(self, plan_id: str, hashes: Sequence[str]) -> dict[str, tuple[str, str]]: ...

    @abstractmethod
    def release_claims(self, plan_id: str, *, keep_owners: Sequence[str] = ()) -> None: ...

    @abstractmethod
    def lease(self, key: str) -> AbstractContextManager[Lease]: ...

    @abstractmethod
    def alias_lock(self, alias: str, *, wait_seconds: float = 5.0) -> AbstractContextManager[None]: ...

    @abstractmethod
    def close(self) -> None: ...

    # the same on every database -----------------------------------------------------------------------

    def _query(self, text: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._reading() as db:
            rows: list[tuple[Any, ...]] = db.execute(self._sql(text), params).fetchall()
        return rows

    def begin(
        self,
        plan_id: str,
        *,
        alias: str,
        target: str,
        fingerprint: str,
        model: dict[str, Any],
        config_key: str | None = None,
    ) -> str:
        with self._fenced() as db:
            row = db.execute(
                self._sql(
                    "INSERT INTO runs (plan_id, alias, target, fingerprint, model, created_at, nonce, config_key)"
                    " VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (plan_id) DO UPDATE SET state = 'running',"
                    " nonce = coalesce(runs.nonce, excluded.nonce),"
                    " config_key = coalesce(excluded.config_key, runs.config_key) RETURNING nonce"
                ),
                (
                    plan_id,
                    alias,
                    target,
                    fingerprint,
                    json.dumps(model),
                    time.time(),
                    new_nonce(),
                    config_key,
                ),
            ).fetchone()
        return str(row[0])

    def run_info(self, plan_id: str) -> RunInfo | None:
        rows = self._query(f"SELECT {_RUN_COLUMNS} FROM runs WHERE plan_id = ?", (plan_id,))
        return run_info_from_row(rows[0]) if rows else None

    def find_run(self, config_key: str) -> RunInfo | None:
        rows = self._query(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE config_key = ? ORDER BY {self._RUN_ORDER} LIMIT 1",
            (config_key,),
        )
        return run_info_from_row(rows[0]) if rows else None

    def forget(self, plan_id: str) -> None:
        with self._fenced() as db:
            for table in FORGET_TABLES:
                db.execute(self._sql(f"DELETE FROM {table} WHERE plan_id = ?"), (plan_id,))

    def resume_point(self, plan_id: str) -> tuple[str | None, int]:
        """The cursor after the last written shard and the next shard number."""
        rows = self._query(
            "SELECT seq, last_cursor FROM shards WHERE plan_id = ? ORDER BY seq DESC LIMIT 1", (plan_id,)
        )
        return (None, 0) if not rows else (rows[0][1], rows[0][0] + 1)

    def fence(self, lease: Lease) -> None:
        """Check every write of this object against a lease another process holds (a Ray driver's, for
        its workers): once a newer run takes the key, their writes raise LeaseLost instead of landing."""
        self._leases[lease.key] = Lease(lease.key, lease.token)

    def plan_shards(self, plan_id: str, shards: Sequence[PlannedShard]) -> None:
        """Fix shards in advance (engine `ray`), so every worker and every rerun cuts the source alike;
        a shard already planned keeps its first plan."""
        with self._fenced() as db:
            self._executemany(
                db,
                "INSERT INTO shard_plan (plan_id, seq, after_cursor, last_cursor, documents)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                [(plan_id, s.seq, s.after_cursor, s.last_cursor, s.documents) for s in shards],
            )

    def workers(self, plan_id: str) -> list[WorkerSummary]:
        rows = self._query(
            "SELECT worker, documents, seconds, written_at FROM shards WHERE plan_id = ? AND worker IS NOT NULL",
            (plan_id,),
        )
        return worker_summaries(rows)

    def shards(self, plan_id: str) -> list[ShardRecord]:
        rows = self._query(
            "SELECT seq, documents, written, tokens, seconds, written_at, worker FROM shards"
            " WHERE plan_id = ? ORDER BY written_at, seq",
            (plan_id,),
        )
        return [
            ShardRecord(int(r[0]), int(r[1]), int(r[2]), int(r[3]), float(r[4]), float(r[5]), r[6])
            for r in rows
        ]

    def shard_plan(self, plan_id: str) -> list[PlannedShard]:
        rows = self._query(
            "SELECT p.seq, p.after_cursor, p.last_cursor, p.documents, s.seq IS NOT NULL FROM shard_plan p"
            " LEFT JOIN shards s ON s.plan_id = p.plan_id AND s.seq = p.seq WHERE p.plan_id = ? ORDER BY p.seq",
            (plan_id,),
        )
        return [PlannedShard(row[0], row[1], row[2], row[3], bool(row[4])) for row in rows]

    def record_shard(self, plan_id: str, shard: ShardResult) -> None:
        """Mark a shard written, with its dead letters and texts, atomically. Call only after the sink's
        write. Replaying it (a commit whose acknowledgement was lost, then retried) changes nothing; a
        shard that does not join its neighbours is refused."""
        now = time.time()
        with self._fenced() as db:
            recorded = db.execute(
                self._sql(
                    "SELECT seq, after_cursor, last_cursor FROM shards WHERE plan_id = ? AND seq BETWEEN ? AND ?"
                ),
                (plan_id, shard.seq - 1, shard.seq + 1),
            ).fetchall()
            if is_replay(plan_id, shard, {row[0]: (row[1], row[2]) for row in recorded}):
                return
            db.execute(
                self._sql(
                    "INSERT INTO shards (plan_id, seq, after_cursor, last_cursor, documents, written, dead_letters,"
                    " duplicates, reused, tokens, truncated, seconds, written_at, billed_tokens, vanished, worker)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
                ),
                shard_row(plan_id, shard, now),
            )
            self._executemany(
                db,
                _UPSERT_DEAD_LETTER,
                [
                    (plan_id, d.doc_id, d.reason, d.detail, d.content_hash, shard.seq, now)
                    for d in shard.dead_letters
                ],
            )
            self._settle_texts(db, plan_id, shard.texts, shard.owners)

    def settle_retry(
        self, plan_id: str, *, written: Sequence[str], vanished: Sequence[str], dead: Sequence[DeadLetter]
    ) -> None:
        """Apply a dead-letter retry: written and vanished ids leave the dead letters (their shards'
        counts move with them, so reconciliation still holds); the rest keep their newest reason."""
        with self._fenced() as db:
            for doc_id, column in [(i, "written") for i in written] + [(i, "vanished") for i in vanished]:
                row = db.execute(
                    self._sql("DELETE FROM dead_letters WHERE plan_id = ? AND doc_id = ? RETURNING seq"),
                    (plan_id, doc_id),
                ).fetchone()
                if row is not None:
                    db.execute(
                        self._sql(
                            f"UPDATE shards SET dead_letters = dead_letters - 1, {column} = {column} + 1"
                            " WHERE plan_id = ? AND seq = ?"
                        ),
                        (plan_id, row[0]),
                    )
            self._executemany(
                db,
                "UPDATE dead_letters SET reason = ?, detail = ?, content_hash = ? WHERE plan_id = ? AND doc_id = ?",
                [(d.reason, d.detail, d.content_hash, plan_id, d.doc_id) for d in dead],
            )

    def record_dead_letters(self, plan_id: str, letters: Sequence[DeadLetter]) -> None:
        """Upsert dead letters found outside a shard (sync): listed by `dlq`, not in shard totals."""
        with self._fenced() as db:
            self._executemany(
                db,
                _UPSERT_DEAD_LETTER,
                [(plan_id, d.doc_id, d.reason, d.detail, d.content_hash, None, time.time()) for d in letters],
            )

    def finish(self, plan_id: str) -> None:
        with self._fenced() as db:
            db.execute(
                self._sql("UPDATE runs SET state = 'complete', finished_at = ? WHERE plan_id = ?"),
                (time.time(), plan_id),
            )

    def summary(self, plan_id: str) -> RunSummary | None:
        """The run's totals over its shards. Sums are turned into int (Postgres sums bigints as numeric);
        seconds come as the database sums them."""
        runs = self._query(
            "SELECT alias, target, fingerprint, state, finished_at FROM runs WHERE plan_id = ?", (plan_id,)
        )
        if not runs:
            return None
        shards, documents, written, dead, duplicates, vanished, reused, tokens, truncated, seconds, billed = (
            self._query(_TOTALS, (plan_id,))[0]
        )
        last_cursor, _ = self.resume_point(plan_id)
        reasons = self._query(
            "SELECT reason, count(*) FROM dead_letters WHERE plan_id = ? GROUP BY reason", (plan_id,)
        )
        alias, target, fingerprint, state, finished_at = runs[0]
        return RunSummary(
            plan_id,
            alias,
            target,
            fingerprint,
            state,
            int(shards),
            int(documents),
            int(written),
            int(dead),
            int(duplicates),
            int(vanished),
            int(reused),
            int(tokens),
            int(truncated),
            seconds,
            last_cursor,
            {reason: int(count) for reason, count in reasons},
            int(billed),
            finished_at is not None,  # set by `finish` after the sink's finalize, kept by a later `begin`
        )

    def dead_letters(self, plan_id: str) -> list[DeadLetter]:
        rows = self._query(
            "SELECT doc_id, reason, detail, content_hash FROM dead_letters WHERE plan_id = ?"
            f" ORDER BY {self._DEAD_LETTER_ORDER}",
            (plan_id,),
        )
        return [DeadLetter(*row) for row in rows]

    def record_verification(
        self, plan_id: str, complete: bool, report: dict[str, Any], *, kind: str = "coverage"
    ) -> None:
        with self._transaction() as db:
            db.execute(
                self._sql(
                    "INSERT INTO verifications (plan_id, at, complete, report, kind) VALUES (?,?,?,?,?)"
                ),
                (plan_id, time.time(), complete, json.dumps(report), kind),
            )

    def verifications(self, plan_id: str, kind: str | None = None) -> list[Verification]:
        """The run's checks, oldest first (of one kind when given)."""
        rows = self._query(
            "SELECT at, kind, complete, report FROM verifications"
            f" WHERE plan_id = ? AND (CAST(? AS text) IS NULL OR kind = ?) ORDER BY {self._VERIFICATION_ORDER}",
            (plan_id, kind, kind),
        )
        return [Verification(row[0], row[1], bool(row[2]), json.loads(row[3])) for row in rows]

    def cutover_intent(
        self,
        alias: str,
        old: str | None,
        new: str,
        *,
        fingerprint: str | None,
        action: str,
        forced: bool,
        report: dict[str, Any] | None = None,
    ) -> int:
        """Write what is about to happen before it happens, so a crash mid-swap is resolvable."""
        with self._transaction() as db:
            rows = db.execute(
                self._sql(
                    "INSERT INTO cutovers (alias, old_target, new_target, fingerprint, action, forced, state, report,"
                    " at) VALUES (?,?,?,?,?,?,'pending',?,?) RETURNING id"
                ),
                (alias, old, new, fingerprint, action, forced, json.dumps(report), time.time()),
            ).fetchall()
        return int(rows[0][0])

    def settle_cutover(self, cutover_id: int, state: str, *, old: str | None = None) -> None:
        with self._transaction() as db:
            db.execute(
                self._sql("UPDATE cutovers SET state = ?, old_target = coalesce(?, old_target) WHERE id = ?"),
                (state, old, cutover_id),
            )

    def cutovers(self, alias: str) -> list[Cutover]:
        rows = self._query(
            "SELECT id, alias, old_target, new_target, fingerprint, action, forced, state, at"
            " FROM cutovers WHERE alias = ? ORDER BY id",
            (alias,),
        )
        return [Cutover(int(r[0]), r[1], r[2], r[3], r[4], r[5], bool(r[6]), r[7], float(r[8])) for r in rows]

    def record_job(self, plan_id: str, job: Job) -> None:
        """Store a job whole in its new state (every column replaced); the intent row is committed before the
        provider sees anything."""
        with self._fenced() as db:
            db.execute(self._sql(_UPSERT_JOB), job_row(plan_id, job))

    def jobs(self, plan_id: str) -> list[Job]:
        rows = self._query("SELECT * FROM jobs WHERE plan_id = ? ORDER BY seq, attempt", (plan_id,))
        return [job_from_row(row) for row in rows]

    def settle_texts(
        self, plan_id: str, states: Sequence[tuple[str, str]], *, owners: Mapping[str, str] | None = None
    ) -> None:
        """Set each text's state; a text in `owners` moves to that document (state from `states`, else
        'written'), whoever held it before."""
        with self._fenced() as db:
            self._settle_texts(db, plan_id, states, owners or {})
