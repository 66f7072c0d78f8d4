"""Reading shards from a source and writing rows to a sink, resumed or retried across transient faults:
`scan_documents` (reopened after the last shard on a fault) and `write_rows` (refused rows dead-lettered)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator
from typing import TypeVar

from reindex.batching import chunks
from reindex.capabilities import ScansColumns
from reindex.columns import Documents
from reindex.errors import RowsRejected, TransientError
from reindex.ports import Record, Rows, Sink, Source
from reindex.retry import retrying
from reindex.run.shards import Shard
from reindex.state.records import DeadLetter

T = TypeVar("T")
_END = object()


def write_rows(sink: Sink, target: str, rows: Rows) -> list[DeadLetter]:
    """Upsert `rows`; rows the sink refuses for their content are isolated by bisection and dead-lettered."""
    if not rows.records:
        return []
    try:
        retrying(sink.write, target, rows)
        return []
    except RowsRejected as exc:
        if len(rows.records) == 1:
            return [DeadLetter(rows.records[0].id, exc.reason, exc.message[:200], rows.content_hashes[0])]
        half, end = len(rows.records) // 2, len(rows.records)
        return write_rows(sink, target, slice(rows, 0, half)) + write_rows(
            sink, target, slice(rows, half, end)
        )


def scan_documents(source: Source, after: str | None, size: int) -> Iterator[Documents]:
    """Shards of up to `size` documents after `after`, as columns: the source's own `scan_documents` when it
    has one (files: no Record per document), else `scan` in chunks. Reopened after the last shard yielded
    when a transient fault breaks it."""
    if not isinstance(source, ScansColumns):
        for records in chunks(resumable_scan(source, after), size):
            yield Documents.from_records(records)
        return
    columnar = source.scan_documents
    iterator: Iterator[Documents] = iter(columnar(after, size))
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            return
        except TransientError:
            iterator = retrying(_reopened, functools.partial(columnar, size=size), after)
            continue
        if batch.last_position is not None:
            after = batch.last_position
        yield batch


def resumable_scan(source: Source, after: str | None) -> Iterator[Record]:
    """`source.scan(after)`, reopened after the last record yielded when a transient fault breaks it."""
    iterator: Iterator[Record] = iter(source.scan(after))
    while True:
        try:
            record = next(iterator)
        except StopIteration:
            return
        except TransientError:
            iterator = retrying(_reopened, source.scan, after)
            continue
        after = record.position
        yield record


def _reopened(scan: Callable[[str | None], Iterator[T]], after: str | None) -> Iterator[T]:
    """Open a scan and read its first item now, so a fault surfaces inside the retry."""
    iterator = iter(scan(after))
    first = next(iterator, _END)
    return iter(()) if first is _END else itertools.chain([first], iterator)  # type: ignore[list-item]


def _rows(shard: Shard, fingerprint: str) -> Rows:
    assert shard.vectors is not None
    return Rows(shard.records, shard.vectors, shard.hashes, fingerprint)


def slice(rows: Rows, start: int, end: int) -> Rows:
    return Rows(
        rows.records[start:end], rows.vectors[start:end], rows.content_hashes[start:end], rows.fingerprint
    )
