"""What `reindex init` sees in a SQLite table: its key and text columns (the shared rules of reindex.survey),
its row count, and a sample of texts to measure."""

from __future__ import annotations

from typing import Any

from reindex.errors import ConfigError, validate
from reindex.survey import (
    ID_NAMES,
    SAMPLE_ROWS,
    Choice,
    Overrides,
    Survey,
    choose_by_name,
    choose_text,
    text_lengths,
)
from reindex_adapters.testing.sqlite.connection import errors, open_readonly, quote, tables
from reindex_adapters.testing.sqlite.source import SqliteSource


def survey(section: dict[str, Any], given: Overrides) -> Survey:
    """The [source] section as `load` reads it (its path absolute) and the fields named on the command line."""
    if given.vector_field is not None:
        raise ConfigError("a sqlite source reads no vectors", hint="leave out --vector-column")
    config = validate("source", SqliteSource.Config, section)
    conn = open_readonly(config.path)
    try:
        with errors(f"read {config.path}"):
            known = tables(conn)
            if config.table not in known:
                raise ConfigError(
                    f"no table {config.table!r} in {config.path} (its tables: {', '.join(known) or 'none'})",
                    hint="--source-set table=NAME, one of them",
                )
            table = quote(config.table)
            info = conn.execute(
                f"PRAGMA table_info({table})"
            ).fetchall()  # cid, name, type, notnull, default, pk
            unique = _unique_columns(conn, config.table)
            documents = int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
            cursor = conn.execute(f"SELECT * FROM {table} LIMIT ?", (SAMPLE_ROWS,))
            names = [d[0] for d in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    finally:
        conn.close()
    primary = [row[1] for row in info if row[5] > 0]
    keys = list(dict.fromkeys((primary if len(primary) == 1 else []) + unique))
    key = choose_by_name(keys, ID_NAMES, given.id_field)
    if not keys and given.id_field is None:
        key = Choice(None, "no column is a primary key or unique: the scan resumes after a unique key")
    texts = [row[1] for row in info if row[1] != key.field and _texty(row[2])]
    measured = text_lengths(rows)
    lengths = {name: measured.get(name) for name in texts}
    return Survey(
        kind="sqlite",
        name=config.table,
        relation="table",
        documents=documents,
        units="rows",
        id=key,
        text=choose_text(lengths, given.text_field),
        vector=choose_by_name([], (), None),
        text_lengths={name: length for name, length in lengths.items() if length is not None},
    )


def _unique_columns(conn: Any, table: str) -> list[str]:
    """Columns that alone carry a unique index (a UNIQUE constraint, a unique index, a text primary key)."""
    found = []
    for _, index, is_unique, *_ in conn.execute(f"PRAGMA index_list({quote(table)})").fetchall():
        if is_unique:
            columns = conn.execute(f"PRAGMA index_info({quote(index)})").fetchall()
            if len(columns) == 1:
                found.append(str(columns[0][2]))
    return found


def _texty(declared: str) -> bool:
    """A column SQLite gives TEXT affinity (its declared type names CHAR, CLOB or TEXT), or none declared."""
    upper = declared.upper()
    return not upper or any(word in upper for word in ("CHAR", "CLOB", "TEXT"))
