"""What `reindex init` sees in a JSONL or Parquet export: id, text and old-vector fields from a sample, rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reindex.errors import ConfigError, validate
from reindex.survey import (
    ID_NAMES,
    SAMPLE_ROWS,
    VECTOR_NAMES,
    Overrides,
    Survey,
    choose_by_name,
    choose_text,
    text_lengths,
    vector_sizes,
)
from reindex_adapters.files.jsonl import BOM, JsonlSource, _loads
from reindex_adapters.files.parquet import ParquetSource, open_parquet
from reindex_adapters.files.records import file_errors


def survey_jsonl(section: dict[str, Any], given: Overrides) -> Survey:
    """Count the non-blank lines (documents, as the source reads them) and sample the first objects."""
    config = validate("source", JsonlSource.Config, section)
    JsonlSource(config.path)  # refuses a missing file the way a run would
    rows: list[dict[str, Any]] = []
    documents = 0
    with file_errors(config.path), config.path.open("rb") as stream:
        for raw in stream:
            if not raw.strip():
                continue
            documents += 1
            if len(rows) < SAMPLE_ROWS:
                row = _loads(raw.removeprefix(BOM).decode("utf-8", errors="replace"))
                rows += [row] if row is not None else []
    return _survey("jsonl", config.path, "JSONL file", rows, documents, given)


def survey_parquet(section: dict[str, Any], given: Overrides) -> Survey:
    """The row count from the footer, and the first rows as the source reads them."""
    config = validate("source", ParquetSource.Config, section)
    parquet = open_parquet(config.path)
    try:
        with file_errors(config.path):
            batch = next(parquet.iter_batches(batch_size=SAMPLE_ROWS), None)
            rows = [] if batch is None else batch.to_pylist()
            documents = int(parquet.metadata.num_rows)
    finally:
        parquet.close()
    return _survey("parquet", config.path, "Parquet file", rows, documents, given)


def _survey(
    kind: str, path: Path, relation: str, rows: Sequence[Mapping[str, Any]], documents: int, given: Overrides
) -> Survey:
    if given.vector_field is not None:
        raise ConfigError(f"a {relation} source has no vector option", hint="leave out --vector-column")
    fields = {name for row in rows for name in row}
    key = choose_by_name([name for name in ID_NAMES if name in fields], ID_NAMES, given.id_field)
    lengths = {name: length for name, length in text_lengths(rows).items() if name != key.field}
    sizes = vector_sizes(rows)
    vector = choose_by_name(list(sizes), VECTOR_NAMES, None)
    dim = sizes.get(vector.field or "")
    notes = []
    if vector.field is not None:
        notes.append(f"{vector.field} looks like old vectors ({dim} floats): file sources read no vectors")
    return Survey(
        kind=kind,
        name=str(path),
        relation=relation,
        documents=documents,
        units="documents" if kind == "jsonl" else "rows",
        id=key,
        text=choose_text(lengths, given.text_field),
        vector=vector,
        vector_type=None if dim is None else f"({dim} floats)",
        dim=dim,
        text_lengths=lengths,
        notes=tuple(notes),
    )
