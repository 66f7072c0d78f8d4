"""Parquet and JSONL sources: exact resume from any position, and poison rows that become defects."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reindex.errors import ConfigError
from reindex.registry import build
from reindex_adapters.files.jsonl import JsonlSource
from reindex_adapters.files.parquet import ParquetSource


def write_parquet(path: Path, table: pa.Table, row_group_size: int = 7) -> Path:
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(lines))
    return path


def docs_table(n: int) -> pa.Table:
    return pa.table({"id": list(range(n)), "text": [f"text {i}" for i in range(n)], "lang": ["en"] * n})


def test_parquet_resumes_exactly_after_every_row_including_mid_row_group(tmp_path: Path) -> None:
    source = ParquetSource(write_parquet(tmp_path / "d.parquet", docs_table(40)), batch_rows=3)
    first = list(source.scan())
    assert [r.id for r in first] == [str(i) for i in range(40)]
    for k, record in enumerate(first):
        assert [r.id for r in source.scan(after=record.position)] == [r.id for r in first[k + 1 :]]


def test_parquet_count_payload_and_schema_come_from_the_file(tmp_path: Path) -> None:
    source = ParquetSource(write_parquet(tmp_path / "d.parquet", docs_table(10)))
    record = next(iter(source.scan()))
    assert source.count() == 10
    assert dict(record.payload) == {"id": 0, "text": "text 0", "lang": "en"}
    assert (source.schema().id_field, source.schema().text_field) == ("id", "text")


def test_parquet_rows_that_cannot_be_embedded_carry_a_defect(tmp_path: Path) -> None:
    table = pa.table({"id": ["a", None, "c"], "text": ["fine", "no id", None]})
    records = list(ParquetSource(write_parquet(tmp_path / "d.parquet", table)).scan())
    assert [(r.id, r.text, r.defect) for r in records] == [
        ("a", "fine", None),
        ("row:1", "", "missing_id"),
        ("c", "", None),
    ]


def test_parquet_non_string_text_column_is_invalid_text_type(tmp_path: Path) -> None:
    table = pa.table({"id": ["a"], "text": [42]})
    (record,) = ParquetSource(write_parquet(tmp_path / "d.parquet", table)).scan()
    assert record.defect == "invalid_text_type"


def test_parquet_dotted_text_field_reads_a_struct_column(tmp_path: Path) -> None:
    table = pa.table({"id": [1], "metadata": [{"text": "nested", "source": "web"}]})
    source = ParquetSource(write_parquet(tmp_path / "d.parquet", table), text_field="metadata.text")
    assert [r.text for r in source.scan()] == ["nested"]


def test_parquet_missing_file_or_column_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no\.parquet"):
        ParquetSource(tmp_path / "no.parquet")
    with pytest.raises(ConfigError, match="'body'"):
        ParquetSource(write_parquet(tmp_path / "d.parquet", docs_table(3)), text_field="body")


def test_jsonl_resumes_exactly_after_every_line_offset(tmp_path: Path) -> None:
    lines = [json.dumps({"id": i, "text": f"text é {i}" * (i % 4)}).encode() + b"\n" for i in range(30)]
    source = JsonlSource(write_lines(tmp_path / "d.jsonl", lines))
    first = list(source.scan())
    assert [r.position for r in first[:3]] == ["0", str(len(lines[0])), str(len(lines[0]) + len(lines[1]))]
    for k, record in enumerate(first):
        assert [r.id for r in source.scan(after=record.position)] == [r.id for r in first[k + 1 :]]
    assert source.count() is None


POISON = [
    b'{"id": "ok1", "text": "fine"}\n',
    b'{"id": "broken", "text": \n',
    b'{"id": "latin", "text": "caf\xe9"}\n',
    b"\xff\xfe not json at all\n",
    b'{"text": "who am i"}\n',
    b'{"id": "silent"}\n',
    b'{"id": "number", "text": 42}\n',
    b'{"id": "nothing", "text": null}\n',
    b'{"id": "surrogate", "text": "\\ud800"}\n',
    b"[1, 2, 3]\n",
    b"\n",
    b'{"id": "ok2", "text": "last line without newline"}',
]
EXPECTED = [
    ("ok1", None),
    ("line:2", "invalid_json"),
    ("latin", "invalid_encoding"),
    ("line:4", "invalid_encoding"),
    ("line:5", "missing_id"),
    ("silent", "missing_text"),
    ("number", "invalid_text_type"),
    ("nothing", None),
    ("surrogate", "invalid_encoding"),
    ("line:10", "invalid_json"),
    ("ok2", None),
]


def test_jsonl_poison_lines_each_get_their_defect_and_never_stop_the_scan(tmp_path: Path) -> None:
    records = list(JsonlSource(write_lines(tmp_path / "d.jsonl", POISON)).scan())
    assert [(r.id, r.defect) for r in records] == EXPECTED
    assert all(r.text == "" for r in records if r.defect)
    assert records[-1].text == "last line without newline"


def test_jsonl_defect_ids_are_the_same_after_a_resume(tmp_path: Path) -> None:
    source = JsonlSource(write_lines(tmp_path / "d.jsonl", POISON))
    first = list(source.scan())
    for k, record in enumerate(first):
        resumed = [(r.id, r.defect, r.position) for r in source.scan(after=record.position)]
        assert resumed == [(r.id, r.defect, r.position) for r in first[k + 1 :]]


def test_jsonl_dotted_text_field_and_byte_order_mark(tmp_path: Path) -> None:
    lines = [b"\xef\xbb\xbf" + json.dumps({"id": "a", "metadata": {"text": "nested"}}).encode() + b"\n"]
    (record,) = JsonlSource(write_lines(tmp_path / "d.jsonl", lines), text_field="metadata.text").scan()
    assert (record.id, record.text, record.defect) == ("a", "nested", None)
    assert record.payload["metadata"] == {"text": "nested"}


def test_jsonl_fetch_returns_existing_ids(tmp_path: Path) -> None:
    source = JsonlSource(write_lines(tmp_path / "d.jsonl", POISON))
    assert sorted(r.id for r in source.fetch(["ok2", "number", "missing"])) == ["number", "ok2"]


def test_jsonl_missing_file_and_bad_cursor_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.jsonl"):
        JsonlSource(tmp_path / "nope.jsonl")
    source = JsonlSource(write_lines(tmp_path / "d.jsonl", POISON))
    with pytest.raises(ConfigError, match="cursor"):
        list(source.scan(after="ok1"))


def test_registry_builds_file_sources_from_config_sections(tmp_path: Path) -> None:
    parquet = build(
        "source", {"kind": "parquet", "path": str(write_parquet(tmp_path / "d.parquet", docs_table(5)))}
    )
    jsonl = build(
        "source",
        {"kind": "jsonl", "path": str(write_lines(tmp_path / "d.jsonl", POISON)), "text_field": "text"},
    )
    assert parquet.count() == 5
    assert isinstance(jsonl, JsonlSource)
    with pytest.raises(ConfigError, match="unknown key"):
        build("source", {"kind": "jsonl", "path": "x", "txt_field": "text"})
