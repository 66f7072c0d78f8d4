"""A SQLite source and sink: a test double written from docs/extending.md alone, on the standard library.

connection.py: opening a file, quoting names, sqlite3's errors in the error tree · offers.py: what `reindex
init` writes for it · source.py: SqliteSource · sink.py: SqliteSink · survey.py: what `init` sees in a
table. The entry points name the classes here, at package level.
"""

from __future__ import annotations

from reindex_adapters.testing.sqlite.sink import SqliteSink
from reindex_adapters.testing.sqlite.source import SqliteSource

__all__ = ["SqliteSink", "SqliteSource"]
