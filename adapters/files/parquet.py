"""ParquetSource: rows in file order, the cursor a global row index; resume skips whole row groups by metadata."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import ConfigDict, Field

from reindex.columns import Documents
from reindex.errors import ConfigError, MissingDependency
from reindex.offers import SourceOffer
from reindex.ports import Record, Section, SourceSchema
from reindex_adapters.files import offers
from reindex_adapters.files.records import _record, chunked, file_errors, position

if TYPE_CHECKING:
    import pyarrow.parquet as pq


class ParquetSource:
    """Rows of one Parquet file, read batch by batch from the row group that holds the cursor."""

    shareable = True  # several processes may open it at once (reindex.run.processes)

    offer: ClassVar[SourceOffer] = offers.PARQUET  # what `reindex init` writes for it

    class Config(Section):
        model_config = ConfigDict(extra="forbid", frozen=True)
        PATHS: ClassVar[tuple[str, ...]] = ("path",)  # relative to the config file (reindex.config.anchor)
        kind: Literal["parquet"]
        path: Path
        id_field: str = "id"
        text_field: str = "text"
        batch_rows: int = Field(default=4096, gt=0)

    def __init__(
        self, path: Path | str, *, id_field: str = "id", text_field: str = "text", batch_rows: int = 4096
    ) -> None:
        self.path, self.id_field, self.text_field = Path(path), id_field, text_field
        self.batch_rows = batch_rows
        self._file = open_parquet(self.path)
        names = set(self._file.schema_arrow.names)
        for field in (id_field, text_field):
            if field.split(".")[0] not in names:
                raise ConfigError(
                    f"column {field!r} not in {self.path}", hint=f"columns: {', '.join(sorted(names))}"
                )

    @classmethod
    def from_config(cls, config: Config) -> ParquetSource:
        return cls(
            config.path, id_field=config.id_field, text_field=config.text_field, batch_rows=config.batch_rows
        )

    def schema(self) -> SourceSchema:
        return SourceSchema(id_field=self.id_field, text_field=self.text_field)

    def count(self) -> int | None:
        return int(self._file.metadata.num_rows)

    def scan(self, after: str | None = None) -> Iterator[Record]:
        start = 0 if after is None else position(after) + 1
        group, index = self._first_group(start)
        if group is None:
            return
        groups = list(range(group, self._file.metadata.num_row_groups))
        with file_errors(self.path):
            for batch in self._file.iter_batches(batch_size=self.batch_rows, row_groups=groups):
                for row in batch.to_pylist():
                    if index >= start:
                        yield _record(
                            row, self.id_field, self.text_field, partial("row:{}".format, index), str(index)
                        )
                    index += 1

    def scan_documents(self, after: str | None, size: int) -> Iterator[Documents]:
        """Shards of `size` rows as columns: an id and a text column convert in C; rows are built only when
        the file carries other columns (the payload), nulls, or ids that are not strings or integers."""
        if "." in self.id_field or "." in self.text_field:
            yield from chunked(self.scan(after), size)
            return
        start = 0 if after is None else position(after) + 1
        group, index = self._first_group(start)
        if group is None:
            return
        groups = list(range(group, self._file.metadata.num_row_groups))
        buffer, first = Documents([], [], fields=(self.id_field, self.text_field)), start
        with file_errors(self.path):
            for batch in self._file.iter_batches(batch_size=self.batch_rows, row_groups=groups):
                skip = max(0, start - index)
                index += batch.num_rows
                if skip < batch.num_rows:
                    buffer = Documents.concat(
                        [buffer, self._columns(batch.slice(skip), index - batch.num_rows + skip)]
                    )
                while len(buffer) >= size:
                    yield _ending(buffer[:size], first + size - 1)
                    buffer, first = buffer[size:], first + size
        if len(buffer):
            yield _ending(buffer, first + len(buffer) - 1)

    def shard_bounds(self, after: str | None, size: int) -> Iterator[tuple[str, int]]:
        """(last row, rows) of each shard of `size` rows after row `after`: arithmetic on the row count."""
        start, total = (0 if after is None else position(after) + 1), int(self._file.metadata.num_rows)
        for first in range(start, total, size):
            last = min(first + size, total) - 1
            yield str(last), last - first + 1

    def _columns(self, batch: Any, first: int) -> Documents:
        import pyarrow as pa
        import pyarrow.compute as pc

        ids, texts = batch.column(self.id_field), batch.column(self.text_field)
        plain_ids = (
            pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)
        ) or pa.types.is_integer(ids.type)
        plain_texts = pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)
        if not (plain_ids and plain_texts and ids.null_count == 0 and texts.null_count == 0):
            rows = enumerate(batch.to_pylist(), start=first)  # per row, as scan() reads them
            fields = (self.id_field, self.text_field)
            return Documents.from_records(
                [_record(row, *fields, partial("row:{}".format, i), str(i)) for i, row in rows]
            )
        others = set(batch.schema.names) - {self.id_field, self.text_field}
        return Documents(
            pc.cast(ids, pa.string()).to_pylist() if pa.types.is_integer(ids.type) else ids.to_pylist(),
            texts.to_pylist(),
            batch.to_pylist() if others or pa.types.is_integer(ids.type) else None,
            (self.id_field, self.text_field),
        )

    def _first_group(self, start: int) -> tuple[int | None, int]:
        """The row group holding row `start` and that group's first row index, from metadata alone."""
        first = 0
        for group in range(self._file.metadata.num_row_groups):
            rows = self._file.metadata.row_group(group).num_rows
            if start < first + rows:
                return group, first
            first += rows
        return None, first

    def identity(self) -> str:
        """The file's absolute path and the fields read (a byte offset resumes only in the same file)."""
        return f"parquet:{self.path.resolve()}#{self.id_field},{self.text_field}"

    def fetch(self, ids: Sequence[str]) -> Iterator[Record]:
        wanted = set(ids)
        return (record for record in self.scan() if record.id in wanted)

    def close(self) -> None:
        self._file.close()


def open_parquet(path: Path) -> pq.ParquetFile:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingDependency("pyarrow", extra="files") from None
    if not path.is_file():
        raise ConfigError(f"file not found: {path}", hint="check [source] path")
    with file_errors(path):
        return pq.ParquetFile(path)


def _ending(docs: Documents, last_row: int) -> Documents:
    docs.last_position = str(last_row)
    return docs
