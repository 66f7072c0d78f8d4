"""The SQLite ledger (the default, `[run] state` a file): its schema, connection, transactions and fencing,
flock leases and alias locks, and the texts table read and written with json_each."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reindex.errors import AlreadyRunning, ConfigError
from reindex.state.ledger import alias_busy, held, lease_lost
from reindex.state.records import Lease
from reindex.state.sql import SqlLedger, settlements_by_state

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


class SqliteLedger(SqlLedger):
    """WAL + synchronous=FULL: a committed shard survives kill -9 and power loss.

    Leases are flock files beside the database (the kernel frees them when the holder dies) plus a
    fencing token per key in `lease_tokens`; alias locks are flock files too.
    """

    _RUN_ORDER = "created_at DESC, rowid DESC"
    _DEAD_LETTER_ORDER = "seq, doc_id"
    _VERIFICATION_ORDER = "at, rowid"

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

    def _sql(self, text: str) -> str:
        """The shared statements are written in SQLite's words already."""
        return text

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

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self._db

    def _executemany(self, db: sqlite3.Connection, text: str, rows: Sequence[Sequence[Any]]) -> None:
        db.executemany(text, rows)

    def _settle_texts(
        self,
        db: sqlite3.Connection,
        plan_id: str,
        states: Sequence[tuple[str, str]],
        owners: Mapping[str, str],
    ) -> None:
        updates, groups = settlements_by_state(states, owners)
        if updates:
            db.execute(_SETTLE_TEXTS, (json.dumps(updates), plan_id))
        for state, owned in groups.items():
            db.execute(_UPSERT_TEXTS, (plan_id, state, json.dumps(owned)))

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
        with self._reading() as db:
            return self._states(db, plan_id, hashes)

    @staticmethod
    def _states(db: sqlite3.Connection, plan_id: str, hashes: Sequence[str]) -> dict[str, tuple[str, str]]:
        rows = db.execute(
            "SELECT content_hash, owner, state FROM texts WHERE plan_id = ?"
            " AND content_hash IN (SELECT value FROM json_each(?))",
            (plan_id, json.dumps(list(hashes))),
        ).fetchall()
        return {row[0]: (row[1], row[2]) for row in rows}

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
