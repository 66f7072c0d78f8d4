"""Opening a SQLite file for the source (read only, never created) or the sink, quoting names, and sqlite3's
errors turned into the error tree (reindex.errors)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from reindex.errors import BackendError, ConfigError, TransientError

BUSY_TIMEOUT_S = 30.0  # how long a statement waits for another connection's write lock


def open_readonly(path: Path) -> sqlite3.Connection:
    """The file as it is: a missing file is a ConfigError (sqlite3 would create an empty one)."""
    if not path.is_file():
        raise ConfigError(
            f"no SQLite file at {path}", hint="set [source] path to an existing file (--source-set path=FILE)"
        )
    with errors(f"open {path}"):
        conn = sqlite3.connect(
            f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S, check_same_thread=False
        )
        conn.execute("PRAGMA schema_version").fetchone()  # reads the header: "file is not a database" here
    return conn


def open_writable(path: Path) -> sqlite3.Connection:
    """The file, created if missing (its folder must exist); autocommit, each change in its own BEGIN."""
    if not path.parent.is_dir():
        raise ConfigError(
            f"no folder {path.parent} for the SQLite file", hint="create it, or set [target] path"
        )
    with errors(f"open {path}"):
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA schema_version").fetchone()
    return conn


def quote(name: str) -> str:
    """A table, view or column name as an SQL identifier: any name, quotes doubled."""
    return '"' + name.replace('"', '""') + '"'


def tables(conn: sqlite3.Connection) -> list[str]:
    return [
        row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
    ]


@contextmanager
def errors(doing: str) -> Iterator[None]:
    """sqlite3's errors as the tool's: a lock held past the timeout may clear (exit 75), the rest does not."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise TransientError(f"SQLite: {doing}: {exc}") from exc
        raise BackendError(f"SQLite: {doing}: {exc}") from exc
    except sqlite3.DatabaseError as exc:
        raise BackendError(f"SQLite: {doing}: {exc}") from exc
