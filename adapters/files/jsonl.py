"""JsonlSource: one JSON object per line, the cursor a byte offset; resume seeks to the line and skips it.

Shards read blocks of lines: a block of plain lines parses as one JSON array, any other block line by line.
"""

from __future__ import annotations

import itertools
import json
import operator
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import ConfigDict

from reindex.columns import Documents
from reindex.errors import ConfigError
from reindex.offers import SourceOffer
from reindex.ports import Record, Section, SourceSchema
from reindex_adapters.files import offers
from reindex_adapters.files.records import (
    MISSING,
    _record,
    chunked,
    encodable,
    file_errors,
    lookup,
    position,
)

BOM = b"\xef\xbb\xbf"
_NEWLINE, _BRACE = ord("\n"), ord("{")
Int64s = NDArray[np.int64]
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB]")  # \ud800-\udfff: the only way JSON spells a lone surrogate


class JsonlSource:
    """One JSON object per line. The cursor is the line's byte offset, so resume is one seek."""

    shareable = True  # several processes may open it at once (reindex.run.processes)

    offer: ClassVar[SourceOffer] = offers.JSONL  # what `reindex init` writes for it

    class Config(Section):
        model_config = ConfigDict(extra="forbid", frozen=True)
        PATHS: ClassVar[tuple[str, ...]] = ("path",)  # relative to the config file (reindex.config.anchor)
        kind: Literal["jsonl"]
        path: Path
        id_field: str = "id"
        text_field: str = "text"  # a dotted path reaches into objects: "metadata.text"

    def __init__(self, path: Path | str, *, id_field: str = "id", text_field: str = "text") -> None:
        self.path, self.id_field, self.text_field = Path(path), id_field, text_field
        if not self.path.is_file():
            raise ConfigError(f"file not found: {self.path}", hint="check [source] path")

    @classmethod
    def from_config(cls, config: Config) -> JsonlSource:
        return cls(config.path, id_field=config.id_field, text_field=config.text_field)

    def schema(self) -> SourceSchema:
        return SourceSchema(id_field=self.id_field, text_field=self.text_field)

    def count(self) -> int | None:
        return None

    def scan(self, after: str | None = None) -> Iterator[Record]:
        for start, line, lines in self._lines(after):
            yield self._parse(line, str(start), lines.name)

    def _lines(self, after: str | None) -> Iterator[tuple[int, bytes, _LineNumbers]]:
        """(byte offset, line, line numbering) of each non-blank line after the line at offset `after`."""
        with file_errors(self.path), self.path.open("rb") as stream:
            offset, lines = 0, _LineNumbers(self.path, known=True)
            if after is not None:
                offset, lines = position(after), _LineNumbers(self.path, known=False)
                stream.seek(offset)
                offset += len(stream.readline())
            for raw in stream:
                start, offset = offset, offset + len(raw)
                lines.advance(start)
                line = raw.removeprefix(BOM) if start == 0 else raw
                if line.strip():
                    yield start, line, lines

    def shard_bounds(self, after: str | None, size: int) -> Iterator[tuple[str, int]]:
        """(byte offset of the last line, lines) of each shard of `size` non-blank lines after the line at
        offset `after`: one pass over the bytes, no JSON parsed, so a driver plans a big file quickly."""
        with file_errors(self.path), self.path.open("rb", buffering=1 << 20) as stream:
            offset = 0
            if after is not None:
                offset = position(after)
                stream.seek(offset)
                offset += len(stream.readline())
            count, last = 0, -1
            for raw in stream:
                line = raw.removeprefix(BOM) if offset == 0 else raw
                if line.strip():  # as `_lines` reads: blank lines are no documents
                    count, last = count + 1, offset
                    if count == size:
                        yield str(last), count
                        count = 0
                offset += len(raw)
            if count:
                yield str(last), count

    def scan_range(self, after: str | None, last: str) -> Documents:
        """The documents of the lines after the line at offset `after`, up to the line at offset `last`
        included: a planned shard's byte range as the file is now. The ranges of consecutive shards meet
        where they met when planned, so a file rewritten between runs is read once over, as the one-process
        pipeline's cursor reads it (and `sync` catches up what moved behind it)."""
        bound = position(last)
        with file_errors(self.path), self.path.open("rb") as stream:
            stream.seek(bound)
            end = bound + len(stream.readline())
        if "." in self.id_field or "." in self.text_field:
            records = [
                r for r in itertools.takewhile(lambda r: position(r.position) <= bound, self.scan(after))
            ]
            parts = [Documents.from_records(records)]
        else:
            parts = list(self.scan_documents(after, 1 << 40, until=end))
        return replace(Documents.concat(parts) if parts else Documents.from_records([]), last_position=last)

    def scan_documents(self, after: str | None, size: int, until: int | None = None) -> Iterator[Documents]:
        """Shards of `size` documents as columns (of the lines that start before byte `until`, if given).
        A block of plain lines (each a JSON object with a string-like id and a string text) is parsed by one
        `json.loads` of the block as an array; a block with anything else (a blank or defective line, a
        byte-order mark, text that is not valid Unicode) is read line by line, each line as `scan` reads
        it."""
        if "." in self.id_field or "." in self.text_field:
            yield from chunked(self.scan(after), size)
            return
        pending = _Pending(size, (self.id_field, self.text_field))
        for start, block, lines in self._blocks(after, until):
            starts = _line_starts(block)
            rows = _plain_rows(block, starts, self.id_field, self.text_field)
            if rows is None:
                self._scan_lines(pending, start, block, lines)
            else:
                pending.add_rows(*rows, starts=starts + start)
                lines.skip(len(starts), start + len(block))
            yield from pending.full()
        pending.seal_rest()
        yield from pending.rest()

    def _blocks(
        self, after: str | None, until: int | None = None
    ) -> Iterator[tuple[int, bytes, _LineNumbers]]:
        """(byte offset, whole lines) of the file after the line at offset `after` (and before byte `until`,
        a line's end), in blocks of about BLOCK_BYTES; the last block may lack its final newline."""
        with file_errors(self.path), self.path.open("rb", buffering=0) as stream:
            offset, lines = 0, _LineNumbers(self.path, known=True)
            if after is not None:
                offset, lines = position(after), _LineNumbers(self.path, known=False)
                with self.path.open("rb") as skip:
                    skip.seek(offset)
                    offset += len(skip.readline())
                stream.seek(offset)
            carry = b""
            while chunk := stream.read(
                BLOCK_BYTES if until is None else max(0, min(BLOCK_BYTES, until - offset - len(carry)))
            ):
                data = carry + chunk
                end = data.rfind(b"\n") + 1
                if end == 0:
                    carry = data
                    continue
                carry = data[end:]
                yield offset, data[:end], lines
                offset += end
            if carry:
                yield offset, carry, lines

    def _scan_lines(self, pending: _Pending, start: int, block: bytes, lines: _LineNumbers) -> None:
        """Each line of a block that is not all plain lines: plain lines by one lookup each, the rest as `scan`
        reads them (a defect becomes a dead letter with its line number)."""
        id_field, text_field, loads = self.id_field, self.text_field, json.loads
        for raw in _split_lines(block):
            offset, start = start, start + len(raw)
            lines.advance(offset)
            line = raw.removeprefix(BOM) if offset == 0 else raw
            if not line.strip():
                continue
            try:
                obj = loads(line.decode("utf-8"))  # bytes would let json guess UTF-16 or UTF-32
            except ValueError:
                obj = None
            doc_id = text = None
            if obj.__class__ is dict:
                doc_id, text = obj.get(id_field), obj.get(text_field)
            if text.__class__ is str and doc_id is not None and (b"\\u" not in line or encodable(text)):
                pending.add_row(doc_id, text, obj, str(offset))
            else:
                pending.add_record(self._parse(line, str(offset), lines.name), str(offset))

    def _parse(self, line: bytes, cursor: str, fallback: Callable[[], str]) -> Record:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            return _defective(line.decode("utf-8", errors="replace"), self.id_field, fallback, cursor)
        obj = _loads(text)
        if obj is None:
            return Record(fallback(), "", {}, cursor=cursor, defect="invalid_json")
        return _record(obj, self.id_field, self.text_field, fallback, cursor)

    def identity(self) -> str:
        """The file's absolute path and the fields read (a byte offset resumes only in the same file)."""
        return f"jsonl:{self.path.resolve()}#{self.id_field},{self.text_field}"

    def fetch(self, ids: Sequence[str]) -> Iterator[Record]:
        wanted = set(ids)
        return (record for record in self.scan() if record.id in wanted)

    def close(self) -> None:
        pass


class _LineNumbers:
    """Names defect lines `line:<n>`; after a seek, n is counted from the file start only when needed."""

    def __init__(self, path: Path, *, known: bool) -> None:
        self._path, self._start = path, 0
        self._number: int | None = 0 if known else None

    def advance(self, start: int) -> None:
        self._start = start
        if self._number is not None:
            self._number += 1

    def skip(self, count: int, end: int) -> None:
        """`count` lines passed, the last one ending at byte `end`."""
        self._start = end
        if self._number is not None:
            self._number += count

    def name(self) -> str:
        if self._number is None:
            self._number = _count_lines(self._path, self._start) + 1
        return f"line:{self._number}"


def _defective(text: str, id_field: str, fallback: Callable[[], str], cursor: str) -> Record:
    """A line that is not UTF-8: keep its id if the JSON still parses with replacement characters."""
    obj = _loads(text)
    doc_id = MISSING if obj is None else lookup(obj, id_field)
    name = fallback() if doc_id is MISSING or doc_id is None else str(doc_id)
    return Record(name, "", obj or {}, cursor=cursor, defect="invalid_encoding")


def _loads(text: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _count_lines(path: Path, end: int) -> int:
    """Newlines before byte `end`: read in blocks, only when a defect after a seek needs its line number."""
    count, remaining = 0, end
    with path.open("rb") as stream:
        while remaining > 0 and (block := stream.read(min(remaining, 1 << 20))):
            count += block.count(b"\n")
            remaining -= len(block)
    return count


class _Pending:
    """Columns being filled for the next shard: a shard is sealed as its `size`-th row arrives, and `full`
    hands the sealed ones out."""

    def __init__(self, size: int, fields: tuple[str, str]) -> None:
        self.size, self.fields = size, fields
        self.ready: list[Documents] = []
        self._reset()

    def _reset(self) -> None:
        self.ids: list[str] = []
        self.texts: list[str] = []
        self.payloads: list[Mapping[str, Any]] = []
        self.defects: dict[int, tuple[str, str]] = {}
        self.extra, self.last = False, ""  # extra: some row's payload is more than its string id and text

    def add_row(self, doc_id: Any, text: str, obj: Mapping[str, Any], cursor: str) -> None:
        """A plain document: a JSON object with a string text and an id that is not null."""
        if doc_id.__class__ is not str:
            doc_id, self.extra = str(doc_id), True
        self.ids.append(doc_id)
        self.texts.append(text)
        self.payloads.append(obj)
        self.extra = self.extra or len(obj) != 2
        self._added(cursor)

    def add_record(self, record: Record, cursor: str) -> None:
        if record.defect:
            self.defects[len(self.ids)] = (record.defect, f"source position {record.position}")
        self.ids.append(record.id)
        self.texts.append(record.text)
        self.payloads.append(record.payload)
        self.extra = True
        self._added(cursor)

    def add_rows(
        self, ids: list[str], texts: list[str], payloads: list[Any], odd: list[int], starts: Int64s
    ) -> None:
        """Plain documents in bulk (`_plain_rows`); `odd` lists the rows whose payload must travel."""
        row = 0
        while row < len(ids):
            end = min(len(ids), row + self.size - len(self.ids))
            self.ids += ids[row:end]
            self.texts += texts[row:end]
            self.payloads += payloads[row:end]
            self.extra = self.extra or any(row <= odd_row < end for odd_row in odd)
            row = end
            self._added(str(int(starts[end - 1])))

    def _added(self, cursor: str) -> None:
        self.last = cursor
        if len(self.ids) >= self.size:
            self.seal_rest()

    def seal_rest(self) -> None:
        """Close the filled columns as one shard ending at the last row's source position."""
        if not self.ids:
            return
        payloads = self.payloads if self.extra or self.defects else None
        self.ready.append(Documents(self.ids, self.texts, payloads, self.fields, self.defects, self.last))
        self._reset()

    def full(self) -> Iterator[Documents]:
        while self.ready:
            yield self.ready.pop(0)

    rest = full


BLOCK_BYTES = 1 << 21  # the JSONL reader's unit: about 6,000 lines of a typical corpus


def _line_starts(block: bytes) -> Int64s:
    """Byte offset of each line of a block of whole lines (the last one may lack its newline)."""
    ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == _NEWLINE)
    starts = np.zeros(len(ends) + (not block.endswith(b"\n")), dtype=np.int64)
    starts[1:] = ends[: len(starts) - 1] + 1
    return starts


def _plain_rows(
    block: bytes, starts: Int64s, id_field: str, text_field: str
) -> tuple[list[str], list[str], list[Any], list[int]] | None:
    """(ids, texts, objects, odd rows) when every line of the block is one JSON object with an id that is not
    null and a string text, all valid Unicode; else None. One `json.loads` reads the block as an array: a
    line opening with "{" holds at least one value, so as many values as lines means one object per line.
    Odd rows carry more than a string id and the text: their payload travels, their id becomes a string."""
    if not len(starts) or (np.frombuffer(block, dtype=np.uint8)[starts] != _BRACE).any():
        return None  # a blank line, leading whitespace or a byte-order mark: line by line
    try:
        body = block.decode("utf-8")  # bytes would let json guess UTF-16 or UTF-32
        ended = body.endswith("\n")  # its newline becomes a trailing comma: a 0 follows it, popped below
        objects = json.loads("[" + body.replace("\n", ",") + ("0]" if ended else "]"))
        if ended:
            objects.pop()
        if len(objects) != len(starts):
            return None
        ids = list(map(operator.itemgetter(id_field), objects))
        texts = list(map(operator.itemgetter(text_field), objects))
    except (ValueError, KeyError, TypeError):
        return None
    if None in ids or set(map(type, texts)) != {str}:
        return None
    if _SURROGATE_ESCAPE.search(body) and not encodable("".join(texts)):
        return None  # a lone surrogate: that line's record says invalid_encoding
    odd: list[int] = []
    if set(map(len, objects)) != {2} or set(map(type, ids)) != {str}:
        odd = [row for row, obj in enumerate(objects) if len(obj) != 2 or ids[row].__class__ is not str]
    for row in odd:
        ids[row] = str(ids[row])
    return ids, texts, objects, odd


def _split_lines(block: bytes) -> list[bytes]:
    """A block's lines with their newlines, split at b"\\n" only, as iterating a binary file does."""
    lines = [line + b"\n" for line in block.split(b"\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]
