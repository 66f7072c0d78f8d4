"""The durable record of a migration: shards written, dead letters, cutover history. SQLite by default.

A shard row and its dead letters are committed in one transaction after the sink's write returned,
so the rows present are exactly the shards whose vectors are durable: resume starts after the last.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reindex.errors import AlreadyRunning, BackendError, ConfigError
from reindex.state.ledger import FORGET_TABLES, alias_busy, held, lease_lost
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

# Numbered, append-only: PRAGMA user_version holds how many have been applied (alembic, in miniature).
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE runs (
        plan_id TEXT PRIMARY KEY, alias TEXT NOT NULL, target TEXT NOT NULL, fingerprint TEXT NOT NULL,
        model TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'running', created_at REAL NOT NULL,
        finished_at REAL
    );
    CREATE TABLE shards (
        plan_id TEXT NOT NULL, seq INTEGER NOT NULL, after_cursor TEXT, last_cursor TEXT NOT NULL,
        documents INTEGER NOT NULL, written INTEGER NOT NULL, dead_letters INTEGER NOT NULL,
        duplicates INTEGER NOT NULL, reused INTEGER NOT NULL, vanished INTEGER NOT NULL DEFAULT 0,
        tokens INTEGER NOT NULL, truncated INTEGER NOT NULL,
        seconds REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 1, written_at REAL NOT NULL,
        PRIMARY KEY (plan_id, seq)
    );
    CREATE TABLE dead_letters (
        plan_id TEXT NOT NULL, doc_id TEXT NOT NULL, reason TEXT NOT NULL, detail TEXT,
        content_hash TEXT, seq INTEGER, created_at REAL NOT NULL, PRIMARY KEY (plan_id, doc_id)
    );
    CREATE TABLE cutovers (
        id INTEGER PRIMARY KEY AUTOINCREMENT, alias TEXT NOT NULL, old_target TEXT, new_target TEXT NOT NULL,
        fingerprint TEXT, action TEXT NOT NULL, forced INTEGER NOT NULL, state TEXT NOT NULL,
        report TEXT, at REAL NOT NULL
    );
    CREATE TABLE verifications (
        plan_id TEXT NOT NULL, at REAL NOT NULL, complete INTEGER NOT NULL, report TEXT NOT NULL
    );
    """,
    """
    ALTER TABLE shards ADD COLUMN billed_tokens INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE jobs (
        plan_id TEXT NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL, attempt INTEGER NOT NULL,
        state TEXT NOT NULL, job_id TEXT, after_cursor TEXT, last_cursor TEXT NOT NULL,
        documents INTEGER NOT NULL, duplicates INTEGER NOT NULL, truncated INTEGER NOT NULL,
        written INTEGER NOT NULL, billed_tokens INTEGER NOT NULL, items TEXT NOT NULL, dead TEXT NOT NULL,
        updated_at REAL NOT NULL, vanished INTEGER NOT NULL, PRIMARY KEY (plan_id, key)
    );
    """,
    """
    CREATE TABLE texts (
        plan_id TEXT NOT NULL, content_hash TEXT NOT NULL, owner TEXT NOT NULL, state TEXT NOT NULL,
        PRIMARY KEY (plan_id, content_hash)
    ) WITHOUT ROWID;
    ALTER TABLE jobs ADD COLUMN copies TEXT NOT NULL DEFAULT '[]';
    """,
    """
    ALTER TABLE runs ADD COLUMN nonce TEXT;
    ALTER TABLE runs ADD COLUMN config_key TEXT;
    UPDATE runs SET nonce = lower(hex(randomblob(16)));
    CREATE INDEX runs_by_config_key ON runs (config_key, created_at);
    CREATE TABLE lease_tokens (key TEXT PRIMARY KEY, token INTEGER NOT NULL) WITHOUT ROWID;
    """,
    """
    CREATE TABLE shard_plan (
        plan_id TEXT NOT NULL, seq INTEGER NOT NULL, after_cursor TEXT, last_cursor TEXT NOT NULL,
        documents INTEGER NOT NULL, PRIMARY KEY (plan_id, seq)
    ) WITHOUT ROWID;
    ALTER TABLE shards ADD COLUMN worker TEXT;
    """,
    """
    ALTER TABLE verifications ADD COLUMN kind TEXT NOT NULL DEFAULT 'coverage';
    """,
)


# The text rows are random keys: each shard's commit dirties about one page per text it inserts (up to the
# whole table) and the WAL takes every dirty page whole. Fewer, larger pages cost less per text: measured
# inserting 500,000 texts in shards of 5,000, 6.8 s of CPU at 64 KiB against 13.3 s at SQLite's 4 KiB default.
PAGE_SIZE = 65536

# One statement per shard, whatever its size: {hash: state} as one JSON object. The ORDER BY makes the
# planner read the JSON first and look each text up by key (without it, it scans the plan's texts per row).
_SETTLE_TEXTS = (
    "UPDATE texts SET state = settled.state"
    " FROM (SELECT key AS content_hash, value AS state FROM json_each(?) ORDER BY 1) AS settled"
    " WHERE texts.plan_id = ? AND texts.content_hash = settled.content_hash"
)
_UPSERT_TEXTS = (  # {hash: owner} of one state; in key order, so the B-tree takes them page by page
    "INSERT INTO texts (plan_id, content_hash, owner, state)"
    " SELECT ?, key, value, ? FROM json_each(?) WHERE true ORDER BY key"
    " ON CONFLICT (plan_id, content_hash) DO UPDATE SET owner = excluded.owner, state = excluded.state"
)
_NEXT_TOKEN = (
    "INSERT INTO lease_tokens (key, token) VALUES (?, 1)"
    " ON CONFLICT (key) DO UPDATE SET token = lease_tokens.token + 1 RETURNING token"
)
_UPSERT_DEAD_LETTER = (
    "INSERT INTO dead_letters (plan_id, doc_id, reason, detail, content_hash, seq, created_at)"
    " VALUES (?,?,?,?,?,?,?) ON CONFLICT (plan_id, doc_id) DO UPDATE SET reason = excluded.reason,"
    " detail = excluded.detail, content_hash = excluded.content_hash, seq = coalesce(excluded.seq, dead_letters.seq)"
)


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


_RUN_COLUMNS = "plan_id, alias, target, fingerprint, model, nonce, config_key"


class SqliteLedger:
    """WAL + synchronous=FULL: a committed shard survives kill -9 and power loss.

    Leases are flock files beside the database (the kernel frees them when the holder dies) plus a
    fencing token per key in `lease_tokens`; alias locks are flock files too.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
            self._db.execute(f"PRAGMA page_size={PAGE_SIZE}")  # a new ledger only: it must precede WAL
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(
                f"cannot open the ledger at {str(self.path)!r}: {exc}",
                hint="set [run] state to a writable path",
            ) from None
        self._lock = threading.Lock()
        self._leases: dict[str, Lease] = {}  # held by this object: every write is fenced by them
        self._migrate()

    def _migrate(self) -> None:
        applied = self._db.execute("PRAGMA user_version").fetchone()[0]
        if applied > len(MIGRATIONS):
            raise ConfigError(
                f"the ledger {str(self.path)!r} was written by a newer reindex",
                hint="upgrade reindex-embeddings",
            )
        for number in range(applied, len(MIGRATIONS)):
            with self._transaction() as db:
                db.executescript(
                    f"BEGIN IMMEDIATE; {MIGRATIONS[number]}; PRAGMA user_version = {number + 1};"
                )

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            try:
                yield self._db
                if self._db.in_transaction:
                    self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    @contextmanager
    def _fenced(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that first checks, under the write lock, that this object's leases still
        hold the newest token of their keys (LeaseLost, nothing written, otherwise)."""
        with self._transaction() as db:
            db.execute("BEGIN IMMEDIATE")
            for lease in self._leases.values():
                row = db.execute("SELECT token FROM lease_tokens WHERE key = ?", (lease.key,)).fetchone()
                if lease.lost.is_set() or row is None or row[0] != lease.token:
                    lease.lost.set()
                    raise lease_lost(lease.key, lease.token, None if row is None else row[0])
            yield db

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

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
                "INSERT INTO runs (plan_id, alias, target, fingerprint, model, created_at, nonce, config_key)"
                " VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (plan_id) DO UPDATE SET state = 'running',"
                " finished_at = NULL, nonce = coalesce(runs.nonce, excluded.nonce),"
                " config_key = coalesce(excluded.config_key, runs.config_key) RETURNING nonce",
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
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE config_key = ? ORDER BY created_at DESC, rowid DESC LIMIT 1",
            (config_key,),
        )
        return run_info_from_row(rows[0]) if rows else None

    def forget(self, plan_id: str) -> None:
        with self._fenced() as db:
            for table in FORGET_TABLES:
                db.execute(f"DELETE FROM {table} WHERE plan_id = ?", (plan_id,))

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
            db.executemany(
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
        return [ShardRecord(*row) for row in rows]

    def shard_plan(self, plan_id: str) -> list[PlannedShard]:
        rows = self._query(
            "SELECT p.seq, p.after_cursor, p.last_cursor, p.documents, s.seq IS NOT NULL FROM shard_plan p"
            " LEFT JOIN shards s ON s.plan_id = p.plan_id AND s.seq = p.seq WHERE p.plan_id = ? ORDER BY p.seq",
            (plan_id,),
        )
        return [PlannedShard(row[0], row[1], row[2], row[3], bool(row[4])) for row in rows]

    def record_shard(self, plan_id: str, shard: ShardResult) -> None:
        """Mark a shard written, with its dead letters and texts, atomically. Call only after the sink's
        write. Replaying it changes nothing; a shard that does not join its neighbours is refused."""
        now = time.time()
        with self._fenced() as db:
            recorded = db.execute(
                "SELECT seq, after_cursor, last_cursor FROM shards WHERE plan_id = ? AND seq BETWEEN ? AND ?",
                (plan_id, shard.seq - 1, shard.seq + 1),
            ).fetchall()
            if is_replay(plan_id, shard, {row[0]: (row[1], row[2]) for row in recorded}):
                return
            db.execute(
                "INSERT INTO shards (plan_id, seq, after_cursor, last_cursor, documents, written, dead_letters,"
                " duplicates, reused, tokens, truncated, seconds, written_at, billed_tokens, vanished, worker)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                shard_row(plan_id, shard, now),
            )
            db.executemany(
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
                    "DELETE FROM dead_letters WHERE plan_id = ? AND doc_id = ? RETURNING seq",
                    (plan_id, doc_id),
                ).fetchone()
                if row is not None:
                    db.execute(
                        f"UPDATE shards SET dead_letters = dead_letters - 1, {column} = {column} + 1"
                        " WHERE plan_id = ? AND seq = ?",
                        (plan_id, row[0]),
                    )
            db.executemany(
                "UPDATE dead_letters SET reason = ?, detail = ?, content_hash = ?"
                " WHERE plan_id = ? AND doc_id = ?",
                [(d.reason, d.detail, d.content_hash, plan_id, d.doc_id) for d in dead],
            )

    def record_dead_letters(self, plan_id: str, letters: Sequence[DeadLetter]) -> None:
        """Upsert dead letters found outside a shard (sync): listed by `dlq`, not in shard totals."""
        with self._fenced() as db:
            db.executemany(
                _UPSERT_DEAD_LETTER,
                [(plan_id, d.doc_id, d.reason, d.detail, d.content_hash, None, time.time()) for d in letters],
            )

    def finish(self, plan_id: str) -> None:
        with self._fenced() as db:
            db.execute(
                "UPDATE runs SET state = 'complete', finished_at = ? WHERE plan_id = ?",
                (time.time(), plan_id),
            )

    def summary(self, plan_id: str) -> RunSummary | None:
        runs = self._query("SELECT alias, target, fingerprint, state FROM runs WHERE plan_id = ?", (plan_id,))
        if not runs:
            return None
        totals = self._query(
            "SELECT count(*), coalesce(sum(documents),0), coalesce(sum(written),0), coalesce(sum(dead_letters),0),"
            " coalesce(sum(duplicates),0), coalesce(sum(vanished),0), coalesce(sum(reused),0), coalesce(sum(tokens),0), coalesce(sum(truncated),0),"
            " coalesce(sum(seconds),0), coalesce(sum(billed_tokens),0) FROM shards WHERE plan_id = ?",
            (plan_id,),
        )[0]
        last_cursor, _ = self.resume_point(plan_id)
        reasons = dict(
            self._query(
                "SELECT reason, count(*) FROM dead_letters WHERE plan_id = ? GROUP BY reason", (plan_id,)
            )
        )
        alias, target, fingerprint, state = runs[0]
        shards, documents, written, dead, duplicates, vanished, reused, tokens, truncated, seconds, billed = (
            totals
        )
        return RunSummary(
            plan_id,
            alias,
            target,
            fingerprint,
            state,
            shards,
            documents,
            written,
            dead,
            duplicates,
            vanished,
            reused,
            tokens,
            truncated,
            seconds,
            last_cursor,
            reasons,
            billed,
        )

    def dead_letters(self, plan_id: str) -> list[DeadLetter]:
        rows = self._query(
            "SELECT doc_id, reason, detail, content_hash FROM dead_letters WHERE plan_id = ?"
            " ORDER BY seq, doc_id",
            (plan_id,),
        )
        return [DeadLetter(*row) for row in rows]

    def record_verification(
        self, plan_id: str, complete: bool, report: dict[str, Any], *, kind: str = "coverage"
    ) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO verifications (plan_id, at, complete, report, kind) VALUES (?,?,?,?,?)",
                (plan_id, time.time(), int(complete), json.dumps(report), kind),
            )

    def verifications(self, plan_id: str, kind: str | None = None) -> list[Verification]:
        """The run's checks, oldest first (of one kind when given)."""
        rows = self._query(
            "SELECT at, kind, complete, report FROM verifications WHERE plan_id = ? AND (?2 IS NULL OR kind = ?2)"
            " ORDER BY at, rowid",
            (plan_id, kind),
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
            cursor = db.execute(
                "INSERT INTO cutovers (alias, old_target, new_target, fingerprint, action, forced, state, report,"
                " at) VALUES (?,?,?,?,?,?,'pending',?,?)",
                (alias, old, new, fingerprint, action, int(forced), json.dumps(report), time.time()),
            )
            return int(cursor.lastrowid or 0)

    def settle_cutover(self, cutover_id: int, state: str, *, old: str | None = None) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE cutovers SET state = ?, old_target = coalesce(?, old_target) WHERE id = ?",
                (state, old, cutover_id),
            )

    def cutovers(self, alias: str) -> list[Cutover]:
        rows = self._query(
            "SELECT id, alias, old_target, new_target, fingerprint, action, forced, state, at"
            " FROM cutovers WHERE alias = ? ORDER BY id",
            (alias,),
        )
        return [Cutover(r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6]), r[7], r[8]) for r in rows]

    def record_job(self, plan_id: str, job: Job) -> None:
        """Store a job whole in its new state (every column replaced); the intent row is committed before the
        provider sees anything."""
        row = job_row(plan_id, job)
        with self._fenced() as db:
            db.execute(f"INSERT OR REPLACE INTO jobs VALUES ({','.join('?' * len(row))})", row)

    def jobs(self, plan_id: str) -> list[Job]:
        return [
            job_from_row(row)
            for row in self._query("SELECT * FROM jobs WHERE plan_id = ? ORDER BY seq, attempt", (plan_id,))
        ]

    def claim_texts(self, plan_id: str, owners: Mapping[str, str]) -> dict[str, tuple[str, str]]:
        """Claim each text (content hash -> the document that will carry its vector) unless another
        document already did; return {hash: (owner, state)} for the texts owned elsewhere."""
        with self._fenced() as db:
            inserted = db.execute(
                "INSERT INTO texts (plan_id, content_hash, owner, state) SELECT ?, key, value, 'claimed'"
                " FROM json_each(?) WHERE true ORDER BY key ON CONFLICT DO NOTHING RETURNING content_hash",
                (plan_id, json.dumps(dict(owners))),
            ).fetchall()
            mine = {row[0] for row in inserted}
            taken = [digest for digest in owners if digest not in mine]
            rows = self._states(db, plan_id, taken) if taken else {}
        return held(owners, rows)

    def text_states(self, plan_id: str, hashes: Sequence[str]) -> dict[str, tuple[str, str]]:
        with self._lock:
            return self._states(self._db, plan_id, hashes)

    @staticmethod
    def _states(db: sqlite3.Connection, plan_id: str, hashes: Sequence[str]) -> dict[str, tuple[str, str]]:
        rows = db.execute(
            "SELECT content_hash, owner, state FROM texts WHERE plan_id = ?"
            " AND content_hash IN (SELECT value FROM json_each(?))",
            (plan_id, json.dumps(list(hashes))),
        ).fetchall()
        return {row[0]: (row[1], row[2]) for row in rows}

    def settle_texts(
        self, plan_id: str, states: Sequence[tuple[str, str]], *, owners: Mapping[str, str] | None = None
    ) -> None:
        """Set each text's state; a text in `owners` moves to that document (state from `states`, else
        'written'), whoever held it before."""
        with self._fenced() as db:
            self._settle_texts(db, plan_id, states, owners or {})

    @staticmethod
    def _settle_texts(
        db: sqlite3.Connection, plan_id: str, states: Sequence[tuple[str, str]], owners: Mapping[str, str]
    ) -> None:
        updates, groups = settlements_by_state(states, owners)
        if updates:
            db.execute(_SETTLE_TEXTS, (json.dumps(updates), plan_id))
        for state, owned in groups.items():
            db.execute(_UPSERT_TEXTS, (plan_id, state, json.dumps(owned)))

    def release_claims(self, plan_id: str, *, keep_owners: Sequence[str] = ()) -> None:
        """Forget claims that no durable work will fulfil (their shard died in flight)."""
        keep = set(keep_owners)
        with self._fenced() as db:
            rows = db.execute(
                "SELECT content_hash, owner FROM texts WHERE plan_id = ? AND state = 'claimed'", (plan_id,)
            ).fetchall()
            db.executemany(
                "DELETE FROM texts WHERE plan_id = ? AND content_hash = ?",
                [(plan_id, digest) for digest, owner in rows if owner not in keep],
            )

    @contextmanager
    def lease(self, key: str) -> Iterator[Lease]:
        """Hold the one-run-at-a-time lock of `key` and fence this object's writes with a new token. The
        kernel drops the lock when the process dies, so a run after kill -9 takes over with no cleanup."""
        with self._lock_file("lease", key).open("a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                raise AlreadyRunning(
                    f"another `reindex run` of this migration is running ({holder})",
                    hint="wait for it, or stop it; a killed run releases the lock",
                ) from None
            try:
                handle.seek(0)
                handle.truncate()
                handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}")
                handle.flush()
                with self._transaction() as db:
                    db.execute("BEGIN IMMEDIATE")
                    token = db.execute(_NEXT_TOKEN, (key,)).fetchone()[0]
                lease = Lease(key, int(token))
                self._leases[key] = lease
                try:
                    yield lease
                finally:
                    self._leases.pop(key, None)
            finally:
                handle.truncate(0)
                fcntl.flock(handle, fcntl.LOCK_UN)

    @contextmanager
    def alias_lock(self, alias: str, *, wait_seconds: float = 5.0) -> Iterator[None]:
        """Serialise cutover, rollback and prune of one alias (a flock file beside the ledger)."""
        deadline = time.monotonic() + wait_seconds
        with self._lock_file("alias", alias).open("a+") as handle:
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise alias_busy(alias, wait_seconds) from None
                    time.sleep(0.05)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _lock_file(self, kind: str, name: str) -> Path:
        """`<ledger>.<kind>-<hash of name>.lock`: any string is a safe file name this way."""
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        return self.path.with_name(f"{self.path.name}.{kind}-{digest}.lock")

    def close(self) -> None:
        with self._lock:
            self._db.close()
