"""What both file sources share: a row made a Record (a poison row names its defect), cursors, file errors,
and records cut into shards."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reindex.columns import Documents
from reindex.errors import BackendError, ConfigError
from reindex.ports import Record

MISSING = object()


def _record(
    row: Mapping[str, Any], id_field: str, text_field: str, fallback: Callable[[], str], cursor: str
) -> Record:
    """Build a Record; a row that cannot be embedded keeps its fields and names its defect."""
    doc_id, text = lookup(row, id_field), lookup(row, text_field)
    if doc_id is MISSING or doc_id is None:
        return Record(fallback(), "", row, cursor=cursor, defect="missing_id")
    if text is MISSING:
        return Record(str(doc_id), "", row, cursor=cursor, defect="missing_text")
    if text is None:
        return Record(str(doc_id), "", row, cursor=cursor)
    if not isinstance(text, str):
        return Record(str(doc_id), "", row, cursor=cursor, defect="invalid_text_type")
    if not encodable(text):
        return Record(str(doc_id), "", row, cursor=cursor, defect="invalid_encoding")
    return Record(str(doc_id), text, row, cursor=cursor)


def lookup(row: Mapping[str, Any], dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return MISSING
        value = value[part]
    return value


def encodable(text: str) -> bool:
    """False for lone surrogates (JSON escapes like \\ud800), which no tokenizer accepts."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def position(cursor: str) -> int:
    try:
        return int(cursor)
    except ValueError:
        raise ConfigError(
            f"invalid file cursor {cursor!r}", hint="resume positions are row/byte numbers"
        ) from None


@contextmanager
def file_errors(path: Path) -> Iterator[None]:
    """A vanished file is a config problem; an unreadable one (corrupt, I/O error) is a backend failure."""
    arrow = sys.modules.get("pyarrow")
    unreadable = (OSError, arrow.ArrowException) if arrow else (OSError,)
    try:
        yield
    except FileNotFoundError:
        raise ConfigError(f"file not found: {path}", hint="check [source] path") from None
    except unreadable as exc:
        raise BackendError(f"cannot read {path}: {exc}") from exc


def chunked(records: Iterator[Record], size: int) -> Iterator[Documents]:
    chunk: list[Record] = []
    for record in records:
        chunk.append(record)
        if len(chunk) >= size:
            yield Documents.from_records(chunk)
            chunk = []
    if chunk:
        yield Documents.from_records(chunk)
