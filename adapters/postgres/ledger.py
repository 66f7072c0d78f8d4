"""The ledger in a shared Postgres database (`[run] state = "postgresql://..."`), for runs across machines.

Same tables and results as reindex.state.sqlite.SqliteLedger, in schema `reindex`. A lease is a session advisory
lock on a connection of its own, watched by a thread that pings it every second, plus a fencing token per
key in `reindex.lease_tokens` that every write of the holder checks in its own transaction. Alias locks
are advisory locks in a key space of their own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, Literal, LiteralString

from pydantic import BaseModel, ConfigDict

from reindex.errors import AlreadyRunning, BackendError, ConfigError, MissingDependency, TransientError
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
from reindex.state.sql import is_replay, new_nonce, settlements_by_state
from reindex_adapters.postgres.core import mask_dsn

if TYPE_CHECKING:
    import psycopg

    Connection = psycopg.Connection[tuple[Any, ...]]

# Numbered, append-only: reindex.schema_version holds one row per applied migration (alembic, in miniature).
MIGRATIONS: tuple[LiteralString, ...] = (
    """
    CREATE TABLE reindex.runs (
        plan_id text PRIMARY KEY, alias text NOT NULL, target text NOT NULL, fingerprint text NOT NULL,
        model text NOT NULL, state text NOT NULL DEFAULT 'running', created_at double precision NOT NULL,
        finished_at double precision
    );
    CREATE TABLE reindex.shards (
        plan_id text NOT NULL, seq integer NOT NULL, after_cursor text, last_cursor text NOT NULL,
        documents integer NOT NULL, written integer NOT NULL, dead_letters integer NOT NULL,
        duplicates integer NOT NULL, reused integer NOT NULL, vanished integer NOT NULL DEFAULT 0,
        tokens bigint NOT NULL, truncated integer NOT NULL, seconds double precision NOT NULL,
        attempts integer NOT NULL DEFAULT 1, written_at double precision NOT NULL,
        PRIMARY KEY (plan_id, seq)
    );
    CREATE TABLE reindex.dead_letters (
        plan_id text NOT NULL, doc_id text NOT NULL, reason text NOT NULL, detail text,
        content_hash text, seq integer, created_at double precision NOT NULL, PRIMARY KEY (plan_id, doc_id)
    );
    CREATE TABLE reindex.cutovers (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, alias text NOT NULL, old_target text,
        new_target text NOT NULL, fingerprint text, action text NOT NULL, forced boolean NOT NULL,
        state text NOT NULL, report text, at double precision NOT NULL
    );
    CREATE INDEX ON reindex.cutovers (alias, id);
    CREATE TABLE reindex.verifications (
        plan_id text NOT NULL, at double precision NOT NULL, complete boolean NOT NULL, report text NOT NULL
    );
    CREATE TABLE reindex.leases (
        key text PRIMARY KEY, host text NOT NULL, pid integer NOT NULL, since double precision NOT NULL
    );
    """,
    """
    ALTER TABLE reindex.shards ADD COLUMN billed_tokens bigint NOT NULL DEFAULT 0;
    CREATE TABLE reindex.jobs (
        plan_id text NOT NULL, key text NOT NULL, seq integer NOT NULL, attempt integer NOT NULL,
        state text NOT NULL, job_id text, after_cursor text, last_cursor text NOT NULL,
        documents integer NOT NULL, duplicates integer NOT NULL, truncated integer NOT NULL,
        written integer NOT NULL, billed_tokens bigint NOT NULL, items text NOT NULL, dead text NOT NULL,
        updated_at double precision NOT NULL, vanished integer NOT NULL, PRIMARY KEY (plan_id, key)
    );
    """,
    """
    CREATE TABLE reindex.texts (
        plan_id text NOT NULL, content_hash text NOT NULL, owner text NOT NULL, state text NOT NULL,
        PRIMARY KEY (plan_id, content_hash)
    );
    ALTER TABLE reindex.jobs ADD COLUMN copies text NOT NULL DEFAULT '[]';
    """,
    """
    ALTER TABLE reindex.runs ADD COLUMN nonce text;
    ALTER TABLE reindex.runs ADD COLUMN config_key text;
    UPDATE reindex.runs SET nonce = md5(random()::text || clock_timestamp()::text || plan_id);
    CREATE INDEX ON reindex.runs (config_key, created_at);
    CREATE TABLE reindex.lease_tokens (key text PRIMARY KEY, token bigint NOT NULL);
    """,
    """
    CREATE TABLE reindex.shard_plan (
        plan_id text NOT NULL, seq bigint NOT NULL, after_cursor text, last_cursor text NOT NULL,
        documents bigint NOT NULL, PRIMARY KEY (plan_id, seq)
    );
    ALTER TABLE reindex.shards ADD COLUMN worker text;
    """,
    """
    ALTER TABLE reindex.verifications ADD COLUMN kind text NOT NULL DEFAULT 'coverage';
    """,
)
_SETTLE: dict[str, LiteralString] = {
    "written": "UPDATE reindex.shards SET dead_letters = dead_letters - 1, written = written + 1"
    " WHERE plan_id = %s AND seq = %s",
    "vanished": "UPDATE reindex.shards SET dead_letters = dead_letters - 1, vanished = vanished + 1"
    " WHERE plan_id = %s AND seq = %s",
}
# One statement per shard, whatever its size: the rows travel as arrays.
_SETTLE_TEXTS: LiteralString = (
    "UPDATE reindex.texts AS t SET state = s.state FROM unnest(%s::text[], %s::text[]) AS s(content_hash, state)"
    " WHERE t.plan_id = %s AND t.content_hash = s.content_hash"
)
_UPSERT_TEXTS: LiteralString = (
    "INSERT INTO reindex.texts (plan_id, content_hash, owner, state)"
    " SELECT %s, d, o, s FROM unnest(%s::text[], %s::text[], %s::text[]) AS u(d, o, s)"
    " ON CONFLICT (plan_id, content_hash) DO UPDATE SET owner = excluded.owner, state = excluded.state"
)
_CLAIM_TEXTS: LiteralString = (
    "INSERT INTO reindex.texts SELECT %s, d, o, 'claimed' FROM unnest(%s::text[], %s::text[]) AS u(d, o)"
    " ON CONFLICT DO NOTHING"
)
_UPSERT_DEAD_LETTER = (
    "INSERT INTO reindex.dead_letters (plan_id, doc_id, reason, detail, content_hash, seq, created_at)"
    " VALUES (%s,%s,%s,%s,%s,%s,%s) ON CONFLICT (plan_id, doc_id) DO UPDATE SET reason = excluded.reason,"
    " detail = excluded.detail, content_hash = excluded.content_hash,"
    " seq = coalesce(excluded.seq, dead_letters.seq)"
)
_TOTALS = (
    "SELECT count(*), coalesce(sum(documents),0), coalesce(sum(written),0), coalesce(sum(dead_letters),0),"
    " coalesce(sum(duplicates),0), coalesce(sum(vanished),0), coalesce(sum(reused),0), coalesce(sum(tokens),0),"
    " coalesce(sum(truncated),0), coalesce(sum(seconds),0), coalesce(sum(billed_tokens),0)"
    " FROM reindex.shards WHERE plan_id = %s"
)
_RUN_COLUMNS: LiteralString = "plan_id, alias, target, fingerprint, model, nonce, config_key"
# The lease connection: a vanished network fails its pings within seconds instead of hanging them.
_LEASE_OPTIONS = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 1,
    "keepalives_count": 3,
    "tcp_user_timeout": 3000,
}
_PING_SECONDS = 1.0
_USERINFO = re.compile(r"(://[^:/@\s]*):\S*@")  # up to the last '@': what mask_dsn leaves of 'p@ss@host'
_QUOTED_PASSWORD = re.compile(r"(password\s*=\s*)'(?:[^'\\]|\\.)*'", re.IGNORECASE)  # "password='a b'"
_MIN_SCRUBBED = 4  # shorter passwords are masked by position only (scrubbing 'p' everywhere garbles text)


class PostgresLedger:
    """One autocommit connection shared by the pipeline's threads under a lock; reopened after a drop."""

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        kind: Literal["postgres"] = "postgres"
        url: str

    def __init__(self, url: str) -> None:
        if "://" in url and url.split("://", 1)[1].split("?", 1)[0].count("@") > 1:
            raise ConfigError(  # libpq would take part of the password for the host, and name it
                "the ledger URL has more than one '@' before its host",
                hint="percent-encode '@' in the user name or password as %40",
            )
        self.url = url
        self._secrets = _passwords(url)
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._has_connected = False
        self._leases: dict[str, Lease] = {}  # held by this object: every write is fenced by them
        with self._lock:
            self._connection()
        try:
            self._migrate()
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_config(cls, config: Config) -> PostgresLedger:
        return cls(config.url)

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
        with self._fenced() as conn:
            nonce = _one(
                conn.execute(
                    "INSERT INTO reindex.runs (plan_id, alias, target, fingerprint, model, created_at, nonce,"
                    " config_key) VALUES (%s,%s,%s,%s,%s,%s,%s,%s) ON CONFLICT (plan_id) DO UPDATE SET"
                    " state = 'running', finished_at = NULL, nonce = coalesce(runs.nonce, excluded.nonce),"
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
                )
            )
        return str(nonce)

    def run_info(self, plan_id: str) -> RunInfo | None:
        rows = self._query(f"SELECT {_RUN_COLUMNS} FROM reindex.runs WHERE plan_id = %s", (plan_id,))
        return run_info_from_row(rows[0]) if rows else None

    def find_run(self, config_key: str) -> RunInfo | None:
        rows = self._query(
            f"SELECT {_RUN_COLUMNS} FROM reindex.runs WHERE config_key = %s"
            " ORDER BY created_at DESC, plan_id DESC LIMIT 1",
            (config_key,),
        )
        return run_info_from_row(rows[0]) if rows else None

    def forget(self, plan_id: str) -> None:
        with self._fenced() as conn:
            sql = _psycopg().sql
            for table in FORGET_TABLES:
                delete = sql.SQL("DELETE FROM reindex.{} WHERE plan_id = %s").format(sql.Identifier(table))
                conn.execute(delete, (plan_id,))

    def fence(self, lease: Lease) -> None:
        """Check every write of this object against a lease another process holds (a Ray driver's, for
        its workers): once a newer run takes the key, their writes raise LeaseLost instead of landing."""
        self._leases[lease.key] = Lease(lease.key, lease.token)

    def plan_shards(self, plan_id: str, shards: Sequence[PlannedShard]) -> None:
        """Fix shards in advance (engine `ray`); a shard already planned keeps its first plan."""
        with self._fenced() as conn, conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO reindex.shard_plan (plan_id, seq, after_cursor, last_cursor, documents)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                [(plan_id, s.seq, s.after_cursor, s.last_cursor, s.documents) for s in shards],
            )

    def workers(self, plan_id: str) -> list[WorkerSummary]:
        rows = self._query(
            "SELECT worker, documents, seconds, written_at FROM reindex.shards"
            " WHERE plan_id = %s AND worker IS NOT NULL",
            (plan_id,),
        )
        return worker_summaries(rows)

    def shards(self, plan_id: str) -> list[ShardRecord]:
        rows = self._query(
            "SELECT seq, documents, written, tokens, seconds, written_at, worker FROM reindex.shards"
            " WHERE plan_id = %s ORDER BY written_at, seq",
            (plan_id,),
        )
        return [
            ShardRecord(int(r[0]), int(r[1]), int(r[2]), int(r[3]), float(r[4]), float(r[5]), r[6])
            for r in rows
        ]

    def shard_plan(self, plan_id: str) -> list[PlannedShard]:
        rows = self._query(
            "SELECT p.seq, p.after_cursor, p.last_cursor, p.documents, s.seq IS NOT NULL"
            " FROM reindex.shard_plan p LEFT JOIN reindex.shards s ON s.plan_id = p.plan_id AND s.seq = p.seq"
            " WHERE p.plan_id = %s ORDER BY p.seq",
            (plan_id,),
        )
        return [PlannedShard(row[0], row[1], row[2], row[3], bool(row[4])) for row in rows]

    def resume_point(self, plan_id: str) -> tuple[str | None, int]:
        """The cursor after the last written shard and the next shard number."""
        rows = self._query(
            "SELECT seq, last_cursor FROM reindex.shards WHERE plan_id = %s ORDER BY seq DESC LIMIT 1",
            (plan_id,),
        )
        return (None, 0) if not rows else (rows[0][1], rows[0][0] + 1)

    def record_shard(self, plan_id: str, shard: ShardResult) -> None:
        """Mark a shard written, with its dead letters and texts, atomically. Replaying it (a commit whose
        acknowledgement was lost, then retried) changes nothing; a shard that does not join its neighbours
        is refused."""
        now = time.time()
        with self._fenced() as conn:
            recorded = conn.execute(
                "SELECT seq, after_cursor, last_cursor FROM reindex.shards WHERE plan_id = %s"
                " AND seq BETWEEN %s AND %s",
                (plan_id, shard.seq - 1, shard.seq + 1),
            ).fetchall()
            if is_replay(plan_id, shard, {row[0]: (row[1], row[2]) for row in recorded}):
                return
            conn.execute(
                "INSERT INTO reindex.shards (plan_id, seq, after_cursor, last_cursor, documents, written,"
                " dead_letters, duplicates, reused, tokens, truncated, seconds, written_at, billed_tokens,"
                " vanished, worker) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                shard_row(plan_id, shard, now),
            )
            conn.cursor().executemany(
                _UPSERT_DEAD_LETTER,
                [
                    (plan_id, d.doc_id, d.reason, d.detail, d.content_hash, shard.seq, now)
                    for d in shard.dead_letters
                ],
            )
            _settle_texts(conn, plan_id, shard.texts, shard.owners)

    def settle_retry(
        self, plan_id: str, *, written: Sequence[str], vanished: Sequence[str], dead: Sequence[DeadLetter]
    ) -> None:
        """Apply a dead-letter retry: written and vanished ids leave the dead letters (their shards'
        counts move with them, so reconciliation still holds); the rest keep their newest reason."""
        moves = [(i, "written") for i in written] + [(i, "vanished") for i in vanished]
        with self._fenced() as conn:
            for doc_id, column in moves:
                row = conn.execute(
                    "DELETE FROM reindex.dead_letters WHERE plan_id = %s AND doc_id = %s RETURNING seq",
                    (plan_id, doc_id),
                ).fetchone()
                if row is not None:
                    conn.execute(_SETTLE[column], (plan_id, row[0]))
            conn.cursor().executemany(
                "UPDATE reindex.dead_letters SET reason = %s, detail = %s, content_hash = %s"
                " WHERE plan_id = %s AND doc_id = %s",
                [(d.reason, d.detail, d.content_hash, plan_id, d.doc_id) for d in dead],
            )

    def record_dead_letters(self, plan_id: str, letters: Sequence[DeadLetter]) -> None:
        """Upsert dead letters found outside a shard (sync): listed by `dlq`, not in shard totals."""
        with self._fenced() as conn:
            conn.cursor().executemany(
                _UPSERT_DEAD_LETTER,
                [(plan_id, d.doc_id, d.reason, d.detail, d.content_hash, None, time.time()) for d in letters],
            )

    def finish(self, plan_id: str) -> None:
        with self._fenced() as conn:
            conn.execute(
                "UPDATE reindex.runs SET state = 'complete', finished_at = %s WHERE plan_id = %s",
                (time.time(), plan_id),
            )

    def summary(self, plan_id: str) -> RunSummary | None:
        runs = self._query(
            "SELECT alias, target, fingerprint, state FROM reindex.runs WHERE plan_id = %s", (plan_id,)
        )
        if not runs:
            return None
        shards, documents, written, dead, duplicates, vanished, reused, tokens, truncated, seconds, billed = (
            self._query(_TOTALS, (plan_id,))[0]
        )
        reasons = self._query(
            "SELECT reason, count(*) FROM reindex.dead_letters WHERE plan_id = %s GROUP BY reason", (plan_id,)
        )
        alias, target, fingerprint, state = runs[0]
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
            float(seconds),
            self.resume_point(plan_id)[0],
            {reason: int(count) for reason, count in reasons},
            int(billed),
        )

    def dead_letters(self, plan_id: str) -> list[DeadLetter]:
        rows = self._query(
            "SELECT doc_id, reason, detail, content_hash FROM reindex.dead_letters WHERE plan_id = %s"
            ' ORDER BY seq NULLS FIRST, doc_id COLLATE "C"',
            (plan_id,),
        )
        return [DeadLetter(*row) for row in rows]

    def record_verification(
        self, plan_id: str, complete: bool, report: dict[str, Any], *, kind: str = "coverage"
    ) -> None:
        self._execute(
            "INSERT INTO reindex.verifications (plan_id, at, complete, report, kind) VALUES (%s,%s,%s,%s,%s)",
            (plan_id, time.time(), complete, json.dumps(report), kind),
        )

    def verifications(self, plan_id: str, kind: str | None = None) -> list[Verification]:
        """The run's checks, oldest first (of one kind when given)."""
        rows = self._query(
            "SELECT at, kind, complete, report FROM reindex.verifications"
            " WHERE plan_id = %s AND (%s::text IS NULL OR kind = %s) ORDER BY at",
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
        rows = self._query(
            "INSERT INTO reindex.cutovers (alias, old_target, new_target, fingerprint, action, forced, state,"
            " report, at) VALUES (%s,%s,%s,%s,%s,%s,'pending',%s,%s) RETURNING id",
            (alias, old, new, fingerprint, action, forced, json.dumps(report), time.time()),
        )
        return int(rows[0][0])

    def settle_cutover(self, cutover_id: int, state: str, *, old: str | None = None) -> None:
        self._execute(
            "UPDATE reindex.cutovers SET state = %s, old_target = coalesce(%s, old_target) WHERE id = %s",
            (state, old, cutover_id),
        )

    def cutovers(self, alias: str) -> list[Cutover]:
        rows = self._query(
            "SELECT id, alias, old_target, new_target, fingerprint, action, forced, state, at"
            " FROM reindex.cutovers WHERE alias = %s ORDER BY id",
            (alias,),
        )
        return [Cutover(int(r[0]), r[1], r[2], r[3], r[4], r[5], bool(r[6]), r[7], float(r[8])) for r in rows]

    def record_job(self, plan_id: str, job: Job) -> None:
        """Store a job whole in its new state (every column replaced); the intent row is committed before the
        provider sees anything."""
        from psycopg import sql

        row = job_row(plan_id, job)
        statement = sql.SQL(
            "INSERT INTO reindex.jobs VALUES ({})"
            " ON CONFLICT (plan_id, key) DO UPDATE SET seq = excluded.seq, attempt = excluded.attempt,"
            " state = excluded.state, job_id = excluded.job_id, after_cursor = excluded.after_cursor,"
            " last_cursor = excluded.last_cursor, documents = excluded.documents,"
            " duplicates = excluded.duplicates, truncated = excluded.truncated, written = excluded.written,"
            " billed_tokens = excluded.billed_tokens, items = excluded.items, dead = excluded.dead,"
            " updated_at = excluded.updated_at, vanished = excluded.vanished, copies = excluded.copies"
        ).format(sql.SQL(",").join([sql.Placeholder()] * len(row)))
        with self._fenced() as conn:
            conn.execute(statement, row)

    def jobs(self, plan_id: str) -> list[Job]:
        rows = self._query("SELECT * FROM reindex.jobs WHERE plan_id = %s ORDER BY seq, attempt", (plan_id,))
        return [job_from_row(row) for row in rows]

    def claim_texts(self, plan_id: str, owners: Mapping[str, str]) -> dict[str, tuple[str, str]]:
        """Claim each text unless another document already did; return {hash: (owner, state)} of the texts
        not to embed (`reindex.state.ledger.held`)."""
        with self._fenced() as conn:
            conn.execute(_CLAIM_TEXTS, (plan_id, list(owners), list(owners.values())))
            rows = conn.execute(
                "SELECT content_hash, owner, state FROM reindex.texts WHERE plan_id = %s AND content_hash = ANY(%s)",
                (plan_id, list(owners)),
            ).fetchall()
        return held(owners, {row[0]: (row[1], row[2]) for row in rows})

    def text_states(self, plan_id: str, hashes: Sequence[str]) -> dict[str, tuple[str, str]]:
        rows = self._query(
            "SELECT content_hash, owner, state FROM reindex.texts WHERE plan_id = %s AND content_hash = ANY(%s)",
            (plan_id, list(hashes)),
        )
        return {row[0]: (row[1], row[2]) for row in rows}

    def settle_texts(
        self, plan_id: str, states: Sequence[tuple[str, str]], *, owners: Mapping[str, str] | None = None
    ) -> None:
        """Set each text's state; a text in `owners` moves to that document (state from `states`, else
        'written'), whoever held it before."""
        with self._fenced() as conn:
            _settle_texts(conn, plan_id, states, owners or {})

    def release_claims(self, plan_id: str, *, keep_owners: Sequence[str] = ()) -> None:
        """Forget claims that no durable work will fulfil (their shard died in flight). Fenced: a stale
        runner cannot delete the claims of the run that took its lease over."""
        with self._fenced() as conn:
            conn.execute(
                "DELETE FROM reindex.texts WHERE plan_id = %s AND state = 'claimed' AND NOT (owner = ANY(%s))",
                (plan_id, list(keep_owners)),
            )

    @contextmanager
    def lease(self, key: str) -> Iterator[Lease]:
        """Hold the one-run-at-a-time lock of `key`: a session advisory lock on a connection of its own
        (the server drops it when that connection dies, so a run after kill -9 takes over), a new fencing
        token for this object's writes, and a watchdog that sets `lost` once the connection fails."""
        conn = self._open(application_name="reindex-lease", **_LEASE_OPTIONS)
        try:
            with self._translated():
                lease = Lease(key, _acquire(conn, key))
            stop = threading.Event()
            watchdog = threading.Thread(
                target=_watch, args=(conn, lease, stop), name="reindex-lease-watchdog", daemon=True
            )
            watchdog.start()
            self._leases[key] = lease
            try:
                yield lease
            finally:
                self._leases.pop(key, None)
                stop.set()
                watchdog.join(timeout=10)
                _release(conn, lease)
        finally:
            conn.close()

    @contextmanager
    def alias_lock(self, alias: str, *, wait_seconds: float = 5.0) -> Iterator[None]:
        """Serialise cutover, rollback and prune of one alias: an advisory lock on a connection of its
        own, polled until `wait_seconds`, then CutoverRefused."""
        key = _lock_key(f"reindex:alias:{alias}")
        deadline = time.monotonic() + wait_seconds
        conn = self._open(application_name="reindex-alias-lock")
        try:
            with self._translated():
                while not _one(conn.execute("SELECT pg_try_advisory_lock(%s)", (key,))):
                    if time.monotonic() >= deadline:
                        raise alias_busy(alias, wait_seconds)
                    time.sleep(0.1)
            try:
                yield
            finally:
                with suppress(_psycopg().Error):
                    conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        finally:
            conn.close()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()

    def _migrate(self) -> None:
        """Apply missing migrations under a transaction-scoped advisory lock: concurrent starts queue."""
        with self._transaction() as conn:
            if self._applied(conn) == len(MIGRATIONS):
                return
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key("reindex:migrate"),))
            conn.execute("CREATE SCHEMA IF NOT EXISTS reindex")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS reindex.schema_version"
                " (version integer PRIMARY KEY, applied_at double precision NOT NULL)"
            )
            for number in range(self._applied(conn), len(MIGRATIONS)):
                conn.execute(MIGRATIONS[number])
                conn.execute("INSERT INTO reindex.schema_version VALUES (%s, %s)", (number + 1, time.time()))

    def _applied(self, conn: Connection) -> int:
        """How many migrations the database holds; refuse one written by a newer reindex."""
        if _one(conn.execute("SELECT to_regclass('reindex.schema_version') IS NULL")):
            return 0
        applied = int(_one(conn.execute("SELECT coalesce(max(version), 0) FROM reindex.schema_version")))
        if applied > len(MIGRATIONS):
            raise ConfigError(
                f"the ledger at {self._redact(self.url)} was written by a newer reindex (schema {applied})",
                hint="upgrade reindex-embeddings",
            )
        return applied

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        with self._lock, self._translated():
            conn = self._connection()
            with conn.transaction():
                yield conn

    @contextmanager
    def _fenced(self) -> Iterator[Connection]:
        """A write transaction that first checks that this object's leases still hold the newest token of
        their keys (LeaseLost, nothing written, otherwise). FOR SHARE makes a new holder's token bump wait
        for this transaction, so no stale write commits after another run took over."""
        with self._transaction() as conn:
            for lease in list(self._leases.values()):
                stored = None
                if not lease.lost.is_set():
                    row = conn.execute(
                        "SELECT token FROM reindex.lease_tokens WHERE key = %s FOR SHARE", (lease.key,)
                    ).fetchone()
                    stored = None if row is None else int(row[0])
                if stored != lease.token:
                    lease.lost.set()
                    raise lease_lost(lease.key, lease.token, stored)
            yield conn

    @contextmanager
    def _translated(self) -> Iterator[None]:
        """The ledger's one error translator: dropped connections and timeouts are worth a retry.
        Messages never carry the password, whatever form the URL gave it in."""
        psycopg = _psycopg()
        try:
            yield
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise TransientError(
                f"ledger: {self._redact(_first_line(exc))}",
                hint="retry; a dropped connection is reopened on the next call",
            ) from exc
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ConfigError(
                f"ledger: {self._redact(_first_line(exc))}",
                hint="grant the [run] state user CREATE and USAGE on schema reindex",
            ) from exc
        except psycopg.Error as exc:
            raise BackendError(f"ledger: {self._redact(_first_line(exc))}") from exc

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return mask_dsn(_QUOTED_PASSWORD.sub(r"\1***", _USERINFO.sub(r"\1:***@", text)))

    def _query(self, statement: LiteralString, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock, self._translated():
            return self._connection().execute(statement, params).fetchall()

    def _execute(self, statement: LiteralString, params: Sequence[Any] = ()) -> None:
        with self._lock, self._translated():
            self._connection().execute(statement, params)

    def _connection(self) -> Connection:
        """The shared connection, reopened if it was closed or broken (call with self._lock held)."""
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = self._open()
        return self._conn

    def _open(self, application_name: str = "reindex-ledger", **options: Any) -> Connection:
        psycopg = _psycopg()
        try:
            conn: Connection = psycopg.connect(
                self.url, autocommit=True, connect_timeout=10, application_name=application_name, **options
            )
        except psycopg.Error as exc:
            message = (
                f"cannot connect to the ledger at {self._redact(self.url)}: {self._redact(_first_line(exc))}"
            )
            if self._has_connected:
                raise TransientError(message, hint="rerun to resume; the ledger is reopened") from None
            raise ConfigError(message, hint="check [run] state") from None
        self._has_connected = True
        return conn


def _acquire(conn: Connection, key: str) -> int:
    """Take the lock or name its holder, then bump the key's fencing token and return it. Server-side
    keepalives let the server free the lock when the holder's machine vanishes."""
    if not _one(conn.execute("SELECT pg_try_advisory_lock(%s)", (_lock_key(f"reindex:lease:{key}"),))):
        row = conn.execute("SELECT host, pid, since FROM reindex.leases WHERE key = %s", (key,)).fetchone()
        holder = "another process" if row is None else f"pid {row[1]} on {row[0]} since {_clock(row[2])}"
        raise AlreadyRunning(
            f"another `reindex run` of this migration is running ({holder})",
            hint="wait for it, or stop it; a killed run releases the lock",
        )
    conn.execute(
        "SELECT set_config('tcp_keepalives_idle', '30', false), set_config('tcp_keepalives_interval', '10', false),"
        " set_config('tcp_keepalives_count', '3', false)"
    )
    conn.execute(
        "INSERT INTO reindex.leases (key, host, pid, since) VALUES (%s,%s,%s,%s)"
        " ON CONFLICT (key) DO UPDATE SET host = excluded.host, pid = excluded.pid, since = excluded.since",
        (key, socket.gethostname(), os.getpid(), time.time()),
    )
    return int(
        _one(
            conn.execute(
                "INSERT INTO reindex.lease_tokens (key, token) VALUES (%s, 1) ON CONFLICT (key)"
                " DO UPDATE SET token = lease_tokens.token + 1 RETURNING token",
                (key,),
            )
        )
    )


def _watch(conn: Connection, lease: Lease, stop: threading.Event) -> None:
    """Ping the lease connection every second; once a ping fails (connection terminated, server
    restarted) or the token moved on, set `lease.lost` and stop. Never re-acquire: the run stops."""
    psycopg = _psycopg()
    while not stop.wait(_PING_SECONDS):
        try:
            row = conn.execute(
                "SELECT token FROM reindex.lease_tokens WHERE key = %s", (lease.key,)
            ).fetchone()
        except psycopg.Error:
            row = None
        if row is None or int(row[0]) != lease.token:
            lease.lost.set()
            return


def _release(conn: Connection, lease: Lease) -> None:
    """Forget the holder (if the key is still ours) and unlock. A dropped connection has released the
    lock already: nothing to undo. The token row stays, so tokens only ever grow."""
    psycopg = _psycopg()
    with suppress(psycopg.OperationalError, psycopg.InterfaceError):
        conn.execute(
            "DELETE FROM reindex.leases WHERE key = %s AND EXISTS (SELECT FROM reindex.lease_tokens"
            " WHERE key = %s AND token = %s)",
            (lease.key, lease.key, lease.token),
        )
        conn.execute("SELECT pg_advisory_unlock(%s)", (_lock_key(f"reindex:lease:{lease.key}"),))


def _settle_texts(
    conn: Connection, plan_id: str, states: Sequence[tuple[str, str]], owners: Mapping[str, str]
) -> None:
    updates, groups = settlements_by_state(states, owners)
    if updates:
        conn.execute(_SETTLE_TEXTS, (list(updates), list(updates.values()), plan_id))
    # In key order: the B-tree takes sorted keys page by page.
    upserts = sorted(
        (digest, owner, state) for state, owned in groups.items() for digest, owner in owned.items()
    )
    if upserts:
        columns = list(zip(*upserts, strict=True))
        conn.execute(_UPSERT_TEXTS, (plan_id, list(columns[0]), list(columns[1]), list(columns[2])))


def _passwords(url: str) -> tuple[str, ...]:
    """The password a conninfo string or URL carries, as written and percent-encoded, to scrub from
    messages (mask_dsn then catches what is left of a URL that does not parse)."""
    from urllib.parse import quote, quote_plus

    psycopg = _psycopg()
    try:
        password = psycopg.conninfo.conninfo_to_dict(url).get("password")
    except psycopg.Error:
        return ()
    if not password or len(str(password)) < _MIN_SCRUBBED:
        return ()
    forms = {str(password), quote(str(password), safe=""), quote(str(password)), quote_plus(str(password))}
    return tuple(sorted(forms, key=len, reverse=True))


def _lock_key(key: str) -> int:
    """A signed 64-bit advisory-lock key: advisory locks are per database, so keys only meet their own."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True)


def _clock(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def _one(cursor: Any) -> Any:
    row = cursor.fetchone()
    assert row is not None
    return row[0]


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _psycopg() -> Any:
    try:
        import psycopg
        import psycopg.conninfo
        import psycopg.sql
    except ImportError:
        raise MissingDependency("psycopg", extra="pgvector") from None
    return psycopg
