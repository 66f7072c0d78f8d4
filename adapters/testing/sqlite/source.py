"""SqliteSource: one table of a SQLite file, read in key order (keyset: `WHERE id > ? ORDER BY id LIMIT n`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from reindex.errors import ConfigError
from reindex.offers import SourceOffer
from reindex.ports import Record, Section, SourceSchema
from reindex_adapters.testing.sqlite import offers
from reindex_adapters.testing.sqlite.connection import errors, open_readonly, quote, tables

_FETCH_CHUNK = 500  # ids bound in one `IN (...)`: well under SQLite's variable limit


class SqliteSource:
    """A table's rows in id order; each row's other columns are its payload (BLOB columns left out).

    The id column must be unique (a primary key): the scan resumes strictly after a key. A row's position is
    its key as JSON (`5`, `"a"`), so an integer key resumes as an integer whatever the column's affinity.
    """

    shareable = True  # a file any process can open for reading; SQLite lets readers share it
    offer: ClassVar[SourceOffer] = offers.SOURCE

    class Config(Section):
        PATHS: ClassVar[tuple[str, ...]] = ("path",)  # relative to the config file (reindex.config.anchor)
        kind: Literal["sqlite"]
        path: Path
        table: str
        id_column: str = "id"
        text_column: str = "text"
        page_size: int = Field(default=500, gt=0)

    def __init__(
        self,
        path: Path,
        *,
        table: str,
        id_column: str = "id",
        text_column: str = "text",
        page_size: int = 500,
    ) -> None:
        self.path = Path(path).absolute()
        self.table, self.id_column, self.text_column = table, id_column, text_column
        self.page_size = page_size
        self._conn = open_readonly(self.path)
        self._lock = threading.Lock()
        self.columns = self._check()
        t, i = quote(table), quote(id_column)
        self._first = f"SELECT * FROM {t} ORDER BY {i} LIMIT ?"
        self._after = f"SELECT * FROM {t} WHERE {i} > ? ORDER BY {i} LIMIT ?"

    @classmethod
    def from_config(cls, config: Config) -> SqliteSource:
        return cls(
            config.path,
            table=config.table,
            id_column=config.id_column,
            text_column=config.text_column,
            page_size=config.page_size,
        )

    def _check(self) -> list[str]:
        """The table's columns; a missing table or column is the user's to fix (exit 2)."""
        with self._lock, errors(f"read {self.path}"):
            known = tables(self._conn)
            if self.table not in known:
                listed = ", ".join(known) or "none"
                raise ConfigError(
                    f"no table {self.table!r} in {self.path} (its tables: {listed})",
                    hint="set [source] table to one of them (--source-set table=NAME)",
                )
            columns = [row[1] for row in self._conn.execute(f"PRAGMA table_info({quote(self.table)})")]
        for role, column in (("id_column", self.id_column), ("text_column", self.text_column)):
            if column not in columns:
                raise ConfigError(
                    f"table {self.table!r} has no column {column!r} (its columns: {', '.join(columns)})",
                    hint=f"set [source] {role} to one of them",
                )
        return columns

    def identity(self) -> str:
        return f"sqlite:{self.path}/{self.table}#{self.id_column},{self.text_column}"

    def schema(self) -> SourceSchema:
        return SourceSchema(id_field=self.id_column, text_field=self.text_column)

    def count(self) -> int | None:
        with self._lock, errors(f"count {self.table}"):
            return int(self._conn.execute(f"SELECT count(*) FROM {quote(self.table)}").fetchone()[0])

    def scan(self, after: str | None = None) -> Iterator[Record]:
        key = None if after is None else _key(after)
        while True:
            with self._lock, errors(f"scan {self.table}"):
                if key is None:
                    cursor = self._conn.execute(self._first, (self.page_size,))
                else:
                    cursor = self._conn.execute(self._after, (key, self.page_size))
                names = [d[0] for d in cursor.description]
                page = cursor.fetchall()
            for row in page:
                yield self._record(names, row)
            if len(page) < self.page_size:
                return
            key = page[-1][names.index(self.id_column)]

    def fetch(self, ids: Sequence[str]) -> Iterator[Record]:
        wanted = sorted(set(ids))
        for start in range(0, len(wanted), _FETCH_CHUNK):
            chunk = wanted[start : start + _FETCH_CHUNK]
            marks = ", ".join("?" * len(chunk))
            query = (
                f"SELECT * FROM {quote(self.table)} WHERE {quote(self.id_column)} IN ({marks})"
                f" ORDER BY {quote(self.id_column)}"
            )
            with self._lock, errors(f"fetch from {self.table}"):
                cursor = self._conn.execute(query, chunk)
                names = [d[0] for d in cursor.description]
                page = cursor.fetchall()
            for row in page:
                yield self._record(names, row)

    def _record(self, names: list[str], row: tuple[Any, ...]) -> Record:
        values = dict(zip(names, row, strict=True))
        raw = values[self.id_column]
        text = values[self.text_column]
        payload = {name: value for name, value in values.items() if not isinstance(value, bytes)}
        cursor = json.dumps(raw)
        if text is None:  # the dead-letter reasons the file sources give
            return Record(str(raw), "", payload, cursor=cursor, defect="missing_text")
        if not isinstance(text, str):
            return Record(str(raw), "", payload, cursor=cursor, defect="invalid_text_type")
        return Record(str(raw), text, payload, cursor=cursor)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _key(position: str) -> Any:
    """A position this source wrote (the key as JSON); a bare id (an older ledger's, `Record.id`) as text."""
    try:
        return json.loads(position)
    except ValueError:
        return position
