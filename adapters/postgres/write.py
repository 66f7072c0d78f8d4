"""The write path: one binary COPY per batch (stage + upsert when keys are already there), row by row
for other layouts, big batches cut into slices written at once on extra connections.
"""

from __future__ import annotations

import itertools
import operator
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from reindex.columns import Documents, documents
from reindex.errors import RowsRejected
from reindex.ports import Rows
from reindex_adapters.postgres import copy_format as pg_copy
from reindex_adapters.postgres.catalog import BOOKKEEPING, ORIGIN, RESERVED, Layout
from reindex_adapters.postgres.connection import Database, first_line, load_psycopg
from reindex_adapters.postgres.ddl import AS_THE_TOOL

if TYPE_CHECKING:
    from psycopg import sql

    from reindex_adapters.postgres.connection import Connection


_TEXT_OID = 25
_PARALLEL_ROWS = 2000  # a write this big is cut into slices for the writer connections...
_SLICE_ROWS = 1000  # ...of at least this many rows each
BulkColumns = pg_copy.Schemaless | pg_copy.Schema


@contextmanager
def rejections(target: str) -> Iterator[None]:
    """Refusals caused by the rows' content (SQLSTATE class 22, psycopg's NUL check) → RowsRejected."""
    psycopg = load_psycopg()
    try:
        yield
    except psycopg.DataError as exc:
        code = exc.sqlstate or ("nul_byte" if "NUL" in str(exc) else "invalid_value")
        raise RowsRejected(
            f"Postgres refused rows for {target!r}: {first_line(exc)}", reason=f"sink_rejected:{code}"
        ) from exc


class Writers:
    """Extra connections, one thread each, for the slices of a big write (psycopg waits without the GIL).
    They know pgvector's types like the sink's own: a source table's columns may hold some."""

    def __init__(self, dsn: str, count: int) -> None:
        self._dbs: list[Database] = []
        try:
            self._dbs += [Database(dsn, "target", vectors=True, has_connected=True) for _ in range(count)]
        except BaseException:
            self.close()
            raise
        self._threads = ThreadPoolExecutor(count, thread_name_prefix="pgvector-writer")

    def write(self, layout: Layout, columns: BulkColumns, parts: list[Rows], *, direct: bool) -> bool:
        """Every slice, each in its own transaction; after all have ended, the first slice's error."""
        futures = [
            self._threads.submit(write_bulk, db, layout, columns, part, direct=direct)
            for db, part in zip(self._dbs, parts, strict=False)
        ]
        wait(futures)
        return any([future.result() for future in futures])

    def close(self) -> None:
        if hasattr(self, "_threads"):
            self._threads.shutdown()
        for db in self._dbs:
            db.close()


def write_rows(conn: Connection, layout: Layout, rows: Rows) -> None:
    """Any layout: COPY row by row (psycopg's dumpers) into a temporary stage, then upsert from it."""
    from psycopg import sql

    binary, types = _copy_format(conn, layout)
    copy = sql.SQL("COPY reindex_stage ({}) FROM STDIN (FORMAT {})").format(
        sql.SQL(", ").join(a.ident for a in layout.columns), sql.SQL("BINARY" if binary else "TEXT")
    )
    _create_stage(conn, layout)
    with conn.cursor().copy(copy) as stream:
        stream.set_types(types)
        for values in _row_values(layout, rows):
            stream.write_row(values)
    _upsert_stage(conn, layout)


def write_bulk(db: Database, layout: Layout, columns: BulkColumns, rows: Rows, *, direct: bool) -> bool:
    """One binary COPY of the whole batch: into the target when `direct`, falling back to stage + upsert
    when a key is already there. True when that fallback was taken."""
    from psycopg import sql

    psycopg = load_psycopg()
    with db.errors(), rejections(layout.name):
        conn = db.connection()
        payload = _encoded(conn, layout.name, columns, rows)
        if direct:
            try:
                with conn.transaction():
                    _copy_payload(conn, layout.ident, payload)
                return False
            except psycopg.errors.UniqueViolation:
                pass
        with conn.transaction():
            _create_stage(conn, layout)
            _copy_payload(conn, sql.Identifier("reindex_stage"), payload)
            _upsert_stage(conn, layout)
        return direct


def _encoded(conn: Connection, target: str, columns: BulkColumns, rows: Rows) -> pg_copy.Payload:
    docs = documents(rows.records)
    try:
        if isinstance(columns, pg_copy.Schema):
            fields = _dumped(conn, columns, docs)
            return pg_copy.encode_schema(columns, fields, rows.vectors, rows.content_hashes, rows.fingerprint)
        return pg_copy.encode(columns, docs, rows.vectors, rows.content_hashes, rows.fingerprint)
    except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 form, the server would refuse it too
        raise RowsRejected(
            f"Postgres refused rows for {target!r}: text is not valid UTF-8 ({exc.reason})",
            reason="sink_rejected:22021",
        ) from None


def _copy_payload(conn: Connection, table: sql.Identifier, payload: pg_copy.Payload) -> None:
    from psycopg import sql

    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        table, sql.SQL(", ").join(map(sql.Identifier, payload.columns))
    )
    with conn.cursor().copy(statement) as copy:
        copy.write(payload.data)


def _create_stage(conn: Connection, layout: Layout) -> None:
    from psycopg import sql

    conn.execute(sql.SQL("CREATE TEMP TABLE reindex_stage (LIKE {}) ON COMMIT DROP").format(layout.ident))


def schemaless_copy(layout: Layout) -> pg_copy.Schemaless | None:
    """The bulk encoder's columns when `layout` is a schemaless target as prepare() made it, else None."""
    meta = layout.meta
    text = str(meta.get("text_field", ""))
    if not meta.get("schemaless") or layout.vector is None or layout.key.name != "id":
        return None
    found = {a.name: a.type_name[1] for a in layout.columns}
    expected = {"id": "text", text: "text", "payload": "jsonb", layout.vector.name: layout.storage.column}
    bookkeeping = BOOKKEEPING if ORIGIN in found else RESERVED  # older targets lack the origin
    if found != expected | dict.fromkeys(bookkeeping, "text"):
        return None
    carried = frozenset({str(meta.get("id_field", "")), text})
    return pg_copy.Schemaless("id", text, "payload", layout.vector.name, carried, layout.storage)


def schema_copy(conn: Connection, layout: Layout) -> pg_copy.Schema | None:
    """The bulk encoder's columns for a target with the source table's columns, when every one of them has
    a binary dumper (else None: row by row, as `_copy_format` decides)."""
    meta = layout.meta
    text = str(meta.get("text_field", ""))
    if meta.get("schemaless") or layout.vector is None:
        return None
    source = [a for a in layout.columns if a != layout.vector and a.name not in BOOKKEEPING]
    names = {a.name for a in source}
    if (
        layout.key.name not in names
        or text not in names
        or not set(RESERVED) <= {a.name for a in layout.columns}
    ):
        return None
    if not all(_has_dumper(conn, a.oid, binary=True) for a in source):
        return None
    return pg_copy.Schema(
        tuple(a.name for a in source),
        tuple(a.oid for a in source),
        layout.key.name,
        text,
        layout.vector.name,
        layout.storage,
    )


def _dumped(conn: Connection, target: pg_copy.Schema, docs: Documents) -> list[tuple[Any, ...]]:
    """Each source column's values as their types' binary dumpers write them, column by column (None:
    NULL): one C call per row (`dump_sequence`), the same dumpers a row-by-row COPY would use."""
    from psycopg.adapt import PyFormat, Transformer
    from psycopg.pq import Format

    transformer = Transformer(conn)
    transformer.set_dumper_types(list(target.types), Format.BINARY)
    formats = [PyFormat.BINARY] * len(target.columns)
    pick = operator.itemgetter(*target.columns)
    single = len(target.columns) == 1
    rows: list[Any] = []
    for i in range(len(docs)):
        payload = docs.payload(i)
        try:
            values = (pick(payload),) if single else pick(payload)
        except KeyError:  # a column the document lacks: NULL, its key and text from the record
            fallback = {target.key: docs.ids[i], target.text: docs.texts[i]}
            values = tuple(payload.get(name, fallback.get(name)) for name in target.columns)
        rows.append(transformer.dump_sequence(values, formats))
    return list(zip(*rows, strict=True)) if rows else [() for _ in target.columns]


def _slices(count: int, writers: int) -> list[tuple[int, int]]:
    parts = min(writers, count // _SLICE_ROWS) if count >= _PARALLEL_ROWS else 1
    bounds = [count * i // max(parts, 1) for i in range(max(parts, 1) + 1)]
    return list(itertools.pairwise(bounds))


def slice(rows: Rows, start: int, stop: int) -> Rows:
    docs = documents(rows.records)  # already columns: O(1)
    payloads = None if docs.payloads is None else docs.payloads[start:stop]
    part = Documents(docs.ids[start:stop], docs.texts[start:stop], payloads, docs.fields)
    return Rows(part, rows.vectors[start:stop], rows.content_hashes[start:stop], rows.fingerprint)


def default_writers() -> int:
    return min(4, os.cpu_count() or 1)


def _copy_format(conn: Connection, layout: Layout) -> tuple[bool, list[int]]:
    """Binary COPY when every column type has a binary dumper; else text, unknown types passed as text."""
    binary = all(_has_dumper(conn, a.oid, binary=True) for a in layout.columns)
    return binary, [a.oid if _has_dumper(conn, a.oid, binary=binary) else _TEXT_OID for a in layout.columns]


def _has_dumper(conn: Connection, oid: int, *, binary: bool) -> bool:
    from psycopg.pq import Format

    try:
        conn.adapters.get_dumper_by_oid(oid, Format.BINARY if binary else Format.TEXT)
    except load_psycopg().ProgrammingError:
        return False
    return True


def _row_values(layout: Layout, rows: Rows) -> Iterator[tuple[Any, ...]]:
    from psycopg.types.json import Jsonb

    is_schemaless = bool(layout.meta.get("schemaless"))
    text_field = str(layout.meta.get("text_field", ""))
    carried = {str(layout.meta.get("id_field", "")), text_field}  # already columns: not again in payload
    vector_name = layout.vector.name if layout.vector else ""
    vectors = np.ascontiguousarray(rows.vectors, dtype=np.float32)
    storage = layout.storage
    for i, record in enumerate(rows.records):
        fixed = {
            "reindex_fingerprint": rows.fingerprint,
            "reindex_content_hash": rows.content_hashes[i],
            ORIGIN: None,  # the tool's own row, also when it rewrites one the application wrote
            vector_name: storage.row_value(vectors[i]),
        }
        if is_schemaless:
            fixed |= {
                layout.key.name: record.id,
                text_field: record.text,
                "payload": Jsonb(
                    {k: v for k, v in record.payload.items() if k not in carried}, dumps=pg_copy.json_dumps
                ),
            }
        else:
            fixed |= {
                layout.key.name: record.payload.get(layout.key.name, record.id),
                text_field: record.payload.get(text_field, record.text),
            }
        yield tuple(fixed[a.name] if a.name in fixed else record.payload.get(a.name) for a in layout.columns)


def _upsert_stage(conn: Connection, layout: Layout) -> None:
    """Upsert the stage as the tool: the trigger leaves these rows' bookkeeping (origin NULL) as written."""
    conn.execute(AS_THE_TOOL)
    conn.execute(_upsert(layout))


def _upsert(layout: Layout) -> sql.Composed:
    from psycopg import sql

    names = sql.SQL(", ").join(a.ident for a in layout.columns)
    updates = sql.SQL(", ").join(
        sql.SQL("{} = EXCLUDED.{}").format(a.ident, a.ident) for a in layout.columns if a != layout.key
    )
    return sql.SQL(
        "INSERT INTO {} ({}) SELECT {} FROM reindex_stage ON CONFLICT ({}) DO UPDATE SET {}"
    ).format(layout.ident, names, names, layout.key.ident, updates)
