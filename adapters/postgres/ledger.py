"""The ledger in a shared Postgres database (`[run] state = "postgresql://..."`), for runs across machines.

The shared logic is SqlLedger's (reindex.state.sql); this module holds what Postgres does its own way. Same
tables and results as reindex.state.sqlite.SqliteLedger, in schema `reindex`. A lease is a session advisory
lock on a connection of its own, watched by a thread that pings it every second, plus a fencing token per
key in `reindex.lease_tokens` that every write of the holder checks in its own transaction. Alias locks
are advisory locks in a key space of their own.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from typing import TYPE_CHECKING, Any, Literal, LiteralString, cast

from pydantic import BaseModel, ConfigDict

from reindex.errors import AlreadyRunning, ConfigError, TransientError
from reindex.state.ledger import alias_busy, held, lease_lost
from reindex.state.records import Lease
from reindex.state.sql import SqlLedger, settlements_by_state
from reindex_adapters.postgres.connection import first_line, load_psycopg, scrub, translated

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
# The tables of the shared statements (reindex.state.sql): Postgres keeps them in schema `reindex`.
_TABLE = re.compile(
    r"\b(FROM|INTO|UPDATE|JOIN) (?=(?:runs|shards|shard_plan|dead_letters|texts|jobs|verifications|cutovers)\b)"
)
# The lease connection: a vanished network fails its pings within seconds instead of hanging them.
_LEASE_OPTIONS = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 1,
    "keepalives_count": 3,
    "tcp_user_timeout": 3000,
}
_PING_SECONDS = 1.0
_MIN_SCRUBBED = 4  # shorter passwords are masked by position only (scrubbing 'p' everywhere garbles text)


class PostgresLedger(SqlLedger):
    """One autocommit connection shared by the pipeline's threads under a lock; reopened after a drop."""

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        kind: Literal["postgres"] = "postgres"
        url: str

    _RUN_ORDER = "created_at DESC, plan_id DESC"
    _DEAD_LETTER_ORDER = 'seq NULLS FIRST, doc_id COLLATE "C"'  # ids bytewise, as SQLite sorts them
    _VERIFICATION_ORDER = "at"

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

    def _sql(self, text: str) -> LiteralString:
        # psycopg takes a LiteralString: the shared statements are constants of reindex.state.sql, whose only
        # interpolations are fixed table, column and ORDER BY names (mypy reads LiteralString as str)
        return cast(LiteralString, _in_postgres(text))  # type: ignore[redundant-cast]

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        with self._lock, self._translated():
            yield self._connection()

    def _executemany(self, db: Connection, text: str, rows: Sequence[Sequence[Any]]) -> None:
        with db.cursor() as cursor:
            cursor.executemany(self._sql(text), rows)

    def _settle_texts(
        self, db: Connection, plan_id: str, states: Sequence[tuple[str, str]], owners: Mapping[str, str]
    ) -> None:
        updates, groups = settlements_by_state(states, owners)
        if updates:
            db.execute(_SETTLE_TEXTS, (list(updates), list(updates.values()), plan_id))
        # In key order: the B-tree takes sorted keys page by page.
        upserts = sorted(
            (digest, owner, state) for state, owned in groups.items() for digest, owner in owned.items()
        )
        if upserts:
            columns = list(zip(*upserts, strict=True))
            db.execute(_UPSERT_TEXTS, (plan_id, list(columns[0]), list(columns[1]), list(columns[2])))

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
        with self._reading() as conn:
            rows = conn.execute(
                "SELECT content_hash, owner, state FROM reindex.texts WHERE plan_id = %s AND content_hash = ANY(%s)",
                (plan_id, list(hashes)),
            ).fetchall()
        return {row[0]: (row[1], row[2]) for row in rows}

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
                with suppress(load_psycopg().Error):
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

    def _translated(self) -> AbstractContextManager[None]:
        """psycopg's errors as the sinks get them (`connection.translated`), for the ledger."""
        hint = "grant the [run] state user CREATE and USAGE on schema reindex"
        return translated("ledger", self._secrets, privilege_hint=hint)

    def _redact(self, text: str) -> str:
        return scrub(text, self._secrets)

    def _connection(self) -> Connection:
        """The shared connection, reopened if it was closed or broken (call with self._lock held)."""
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = self._open()
        return self._conn

    def _open(self, application_name: str = "reindex-ledger", **options: Any) -> Connection:
        psycopg = load_psycopg()
        try:
            conn: Connection = psycopg.connect(
                self.url, autocommit=True, connect_timeout=10, application_name=application_name, **options
            )
        except psycopg.Error as exc:
            message = (
                f"cannot connect to the ledger at {self._redact(self.url)}: {self._redact(first_line(exc))}"
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
    psycopg = load_psycopg()
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
    psycopg = load_psycopg()
    with suppress(psycopg.OperationalError, psycopg.InterfaceError):
        conn.execute(
            "DELETE FROM reindex.leases WHERE key = %s AND EXISTS (SELECT FROM reindex.lease_tokens"
            " WHERE key = %s AND token = %s)",
            (lease.key, lease.key, lease.token),
        )
        conn.execute("SELECT pg_advisory_unlock(%s)", (_lock_key(f"reindex:lease:{lease.key}"),))


@functools.cache
def _in_postgres(text: str) -> str:
    """A shared statement in Postgres's words: %s placeholders (a literal % doubled), tables in `reindex`."""
    return _TABLE.sub(r"\1 reindex.", text.replace("%", "%%").replace("?", "%s"))


def _passwords(url: str) -> tuple[str, ...]:
    """The password a conninfo string or URL carries, as written and percent-encoded, to scrub from
    messages (mask_dsn then catches what is left of a URL that does not parse)."""
    from urllib.parse import quote, quote_plus

    psycopg = load_psycopg()
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
