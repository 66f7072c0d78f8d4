"""Connections and DSNs: the `dsn`/`dsn_env` config, DSN checks and password masking, and `Database`,
the one connection of an adapter and the only translator of its errors (passwords hidden).
"""

from __future__ import annotations

import re
import struct
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Self

import numpy as np
from pydantic import ConfigDict, model_validator

from reindex.errors import BackendError, ConfigError, MissingDependency, TransientError, environment
from reindex.ports import Section

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

    Connection = psycopg.Connection[tuple[Any, ...]]


MAX_IDENTIFIER_BYTES = 63  # Postgres truncates longer names silently: refuse them instead


class DsnConfig(Section):
    model_config = ConfigDict(extra="forbid", frozen=True)
    dsn: str | None = None
    dsn_env: str | None = None

    @model_validator(mode="after")
    def _one_dsn(self) -> Self:
        if (self.dsn is None) == (self.dsn_env is None):
            raise ValueError("set exactly one of dsn and dsn_env")
        return self

    def resolved_dsn(self, section: str) -> str:
        if self.dsn is not None:
            return self.dsn
        value = environment(str(self.dsn_env), f"[{section}] dsn_env")
        if not value:
            raise ConfigError(
                f"environment variable {self.dsn_env} is not set",
                hint=f"export {self.dsn_env}=postgresql://... or set [{section}] dsn",
            )
        return value


class Database:
    """One autocommit connection, reopened after a drop, and the adapter's only error translator."""

    def __init__(self, dsn: str, section: str, *, vectors: bool, has_connected: bool = False) -> None:
        self._secrets = _check_dsn(dsn, section)
        self.dsn = dsn
        self.section = section
        self.vectors = vectors
        self._conn: Connection | None = None
        self._has_connected = has_connected  # a DSN known to work: failing to connect is then transient
        self.connection()

    def connection(self) -> Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = self._open()
        return self._conn

    def errors(self) -> AbstractContextManager[None]:
        return translated("Postgres", self._secrets)

    @contextmanager
    def setup(self) -> Iterator[Connection]:
        """Translate errors, and close the connection when the adapter cannot be built."""
        try:
            with self.errors():
                yield self.connection()
        except BaseException:
            self.close()
            raise

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        with self.errors():
            conn = self.connection()
            with conn.transaction():
                yield conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def _open(self) -> Connection:
        psycopg = load_psycopg()
        try:
            conn: Connection = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            reason = scrub(first_line(exc), self._secrets)
            message = f"cannot connect to Postgres at {scrub(self.dsn, self._secrets)}: {reason}"
            if self._has_connected:
                raise TransientError(message) from None
            raise ConfigError(message, hint=f"check [{self.section}] dsn") from None
        self._has_connected = True
        if self.vectors:
            try:
                self._register_vector(conn)
            except psycopg.OperationalError as exc:  # terminated right after connecting: a transient fault
                conn.close()
                raise TransientError(f"Postgres: {scrub(first_line(exc), self._secrets)}") from None
        return conn

    def _register_vector(self, conn: Connection) -> None:
        """Register pgvector's types, first creating the extension where it is missing and the role may
        (a fresh database just works); otherwise a ConfigError naming the statement to run."""
        from pgvector.psycopg import register_vector

        psycopg = load_psycopg()
        try:
            register_vector(conn)
        except psycopg.ProgrammingError:
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")  # autocommit: its own transaction
                register_vector(conn)
            except psycopg.Error as exc:
                conn.close()
                reason = scrub(first_line(exc), self._secrets)
                raise ConfigError(
                    f"the vector extension is missing in the {self.section} database and cannot be"
                    f" created by this role: {reason}",
                    hint="run CREATE EXTENSION vector there as a role that may (or install pgvector)",
                ) from None
        _register_packed_vectors(conn)


# `scheme://user:<password>@host`: up to the LAST '@' on the line, so an unescaped '@', ':', '/' or space in
# the password is hidden too (over-masking a later '@' is the safe side).
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)(.*)@", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"([?&](?:ssl)?password=)[^&#\s]*", re.IGNORECASE)
_KEYWORD_PASSWORD = re.compile(
    r"""(?<![?&])(\b(?:ssl|pg)?password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S+)""", re.IGNORECASE
)  # libpq keyword form: a quoted value may hold spaces and \' escapes
_DSN_HINT = (
    "percent-encode reserved characters of a URL password (@ %40, / %2F, : %3A, space %20), "
    "or quote a keyword value: password='a b'"
)


def database_of(identity: str) -> str:
    """`<system identifier>/<database>` of a source's or sink's identity."""
    return "/".join(identity.partition(":")[2].split("/")[:2])


_USERINFO = re.compile(r"(://[^:/@\s]*):\S*@")  # up to the last '@': what mask_dsn leaves of 'p@ss@host'
_QUOTED_PASSWORD = re.compile(r"(password\s*=\s*)'(?:[^'\\]|\\.)*'", re.IGNORECASE)  # "password='a b'"


def mask_dsn(text: str) -> str:
    """Hide passwords of every DSN form in `text`: URLs (encoded or not), query and keyword parameters."""
    text = _URL_PASSWORD.sub(r"\1***@", text)
    text = _QUERY_PASSWORD.sub(r"\1***", text)
    return _KEYWORD_PASSWORD.sub(r"\1***", text)


def _check_dsn(dsn: str, section: str) -> tuple[str, ...]:
    """Refuse a DSN libpq would misread (its errors echo the pieces); return the secrets to scrub."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(dsn)
    except load_psycopg().ProgrammingError:
        raise ConfigError(
            f"[{section}] dsn is not a valid Postgres connection string", hint=_DSN_HINT
        ) from None
    found = _URL_PASSWORD.match(dsn)
    raw = found.group(2) if found else ""
    password = str(params.get("password") or "")
    port = str(params.get("port") or "")
    is_port = port.isdigit() and re.split(r"[/?]", raw)[0] == port  # host:port/db?opt=a@b, no password
    if raw and urllib.parse.unquote(raw) != password and not is_port:
        raise ConfigError(f"[{section}] dsn has unescaped characters in its password", hint=_DSN_HINT)
    keyword = _KEYWORD_PASSWORD.search(dsn)
    candidates = {password, raw, urllib.parse.unquote(raw), keyword.group(2) if keyword else ""}
    return tuple(sorted((c for c in candidates if len(c) > 1), key=len, reverse=True))


def scrub(text: str, secrets: Sequence[str]) -> str:
    """`text` without the passwords: the known ones wherever they stand, then every DSN form's (mask_dsn),
    a quoted keyword value's, and what is left of a URL's user info that does not parse."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return mask_dsn(_QUOTED_PASSWORD.sub(r"\1***", _USERINFO.sub(r"\1:***@", text)))


@contextmanager
def translated(what: str, secrets: Sequence[str], *, privilege_hint: str | None = None) -> Iterator[None]:
    """The one translation of psycopg's errors, for the sinks and sources and for the ledger: a dropped
    connection or a timeout is worth a retry (TransientError); a missing privilege is a ConfigError where
    `privilege_hint` names the grant; anything else is a BackendError. No message carries a password."""
    psycopg = load_psycopg()
    try:
        yield
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        raise TransientError(
            f"{what}: {scrub(first_line(exc), secrets)}",
            hint="retry; a dropped connection is reopened on the next call",
        ) from exc
    except psycopg.errors.InsufficientPrivilege as exc:
        if privilege_hint is None:
            raise BackendError(f"{what}: {scrub(first_line(exc), secrets)}") from exc
        raise ConfigError(f"{what}: {scrub(first_line(exc), secrets)}", hint=privilege_hint) from exc
    except psycopg.Error as exc:
        raise BackendError(f"{what}: {scrub(first_line(exc), secrets)}") from exc


def load_psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise MissingDependency("psycopg", extra="pgvector") from None
    return psycopg


def split_name(name: str) -> tuple[str, ...]:
    parts = tuple(name.split("."))
    if len(parts) > 2 or not all(parts):
        raise ConfigError(f"invalid name {name!r}", hint="use name or schema.name")
    for part in parts:
        if len(part.encode()) > MAX_IDENTIFIER_BYTES:
            raise ConfigError(
                f"name {part!r} is longer than {MAX_IDENTIFIER_BYTES} bytes",
                hint="Postgres would truncate it; choose a shorter [target] name or alias",
            )
    return parts


def identifier(name: str) -> sql.Identifier:
    from psycopg import sql

    return sql.Identifier(*split_name(name))


def first_value(row: tuple[Any, ...] | None) -> Any:
    assert row is not None
    return row[0]


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _register_packed_vectors(conn: Connection) -> None:
    """Dump numpy rows straight to pgvector's binary format (4-byte header, big-endian float32)."""
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    class PackedVectorDumper(Dumper):
        format = Format.BINARY
        oid = conn.adapters.types["vector"].oid

        def dump(self, obj: Any) -> bytes:
            vector = np.asarray(obj, dtype=">f4")
            return struct.pack(">HH", vector.shape[0], 0) + vector.tobytes()

    conn.adapters.register_dumper(np.ndarray, PackedVectorDumper)
