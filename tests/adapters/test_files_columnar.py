"""The columnar scans (`scan_documents`) read exactly what the per-record scan reads, shard by shard."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reindex.columns import Documents
from reindex_adapters.files import jsonl as files
from reindex_adapters.files.jsonl import JsonlSource
from reindex_adapters.files.parquet import ParquetSource

LINES = st.one_of(
    st.builds(lambda i, t: json.dumps({"id": i, "text": t}), st.text(max_size=6), st.text(max_size=20)),
    st.builds(
        lambda i, t: json.dumps({"id": i, "text": t, "lang": "en"}), st.integers(0, 9), st.text(max_size=9)
    ),
    st.builds(lambda i: json.dumps({"id": i}), st.text(max_size=4)),  # missing text
    st.builds(lambda t: json.dumps({"text": t}), st.text(max_size=4)),  # missing id
    st.builds(lambda i: json.dumps({"id": i, "text": None}), st.text(max_size=4)),
    st.builds(lambda i: json.dumps({"id": i, "text": 5}), st.text(max_size=4)),
    st.builds(lambda i: f'{{"id": "{i}", "text": "a\\ud800b"}}', st.integers(0, 9)),  # lone surrogate
    st.just("not json"),
    st.just("[1, 2]"),
    st.just("   "),
    st.just('{"id": null, "text": "x"}'),
)


def records_of(docs: list[Documents]) -> list[tuple[object, ...]]:
    merged = Documents.concat(docs) if docs else Documents([], [])
    return [(r.id, r.text, dict(r.payload), r.defect) for r in merged]


def expected(source: JsonlSource | ParquetSource, after: str | None = None) -> list[tuple[object, ...]]:
    return [(r.id, r.text, dict(r.payload), r.defect) for r in source.scan(after)]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(LINES, max_size=25),
    size=st.integers(1, 7),
    bom=st.booleans(),
    raw=st.binary(max_size=3),
    block=st.sampled_from([1, 7, 40, 120, 1 << 21]),
    newline=st.sampled_from(["\n", "\r\n"]),
    last_newline=st.booleans(),
)
def test_jsonl_columns_equal_the_record_scan_and_resume_at_every_shard_end(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    lines: list[str],
    size: int,
    bom: bool,
    raw: bytes,
    block: int,
    newline: str,
    last_newline: bool,
) -> None:
    """Whatever the reader's block size (blocks of plain lines are parsed whole, the others line by line),
    the lines, their line endings and a last line without its newline."""
    monkeypatch.setattr(files, "BLOCK_BYTES", block)
    path = tmp_path / "docs.jsonl"
    body = newline.join(lines).encode() + newline.encode() + raw + b"\n" + b'{"id": "z", "text": "end"}'
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + body + (newline.encode() if last_newline else b""))
    source = JsonlSource(path)
    shards = list(source.scan_documents(None, size))
    assert records_of(shards) == expected(source)
    assert all(len(shard) == size for shard in shards[:-1])
    for shard in shards:
        assert records_of(list(source.scan_documents(shard.last_position, size))) == expected(
            source, shard.last_position
        )
    positions = [r.position for r in source.scan()]
    ends = [positions[sum(len(s) for s in shards[: i + 1]) - 1] for i in range(len(shards))]
    assert [shard.last_position for shard in shards] == ends


def test_jsonl_plain_blocks_are_parsed_whole_and_keep_the_payload_of_odd_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks of plain lines take the one-`json.loads` path; an integer id or another field makes the row's
    payload travel (and only its shard's), as the line-by-line path does."""
    parsed: list[int] = []
    whole = files._plain_rows
    monkeypatch.setattr(files, "_plain_rows", lambda *a: parsed.append(1) or whole(*a))  # type: ignore[func-returns-value]
    monkeypatch.setattr(files, "BLOCK_BYTES", 64)
    rows: list[dict[str, object]] = [{"id": f"d{i}", "text": f"t {i}"} for i in range(15)]
    rows[7]["lang"] = "en"
    rows[14]["id"] = 14
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    shards = list(JsonlSource(path).scan_documents(None, 5))
    assert len(parsed) >= 5
    ids = [f"d{i}" for i in range(15)]
    assert [s.ids for s in shards] == [ids[:5], ids[5:10], [*ids[10:14], "14"]]
    assert [s.has_payload for s in shards] == [False, True, True]
    assert shards[1][2].payload == {"id": "d7", "text": "t 7", "lang": "en"}
    assert shards[2][4].payload == {"id": 14, "text": "t 14"}


def test_jsonl_rows_with_only_id_and_text_carry_no_payload_column(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": f"t {i}"}) + "\n" for i in range(10)))
    shards = list(JsonlSource(path).scan_documents(None, 4))
    assert [len(s) for s in shards] == [4, 4, 2]
    assert not any(s.has_payload for s in shards)
    assert shards[0][1].payload == {"id": "d1", "text": "t 1"}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(st.tuples(st.integers(0, 50), st.one_of(st.none(), st.text(max_size=8))), max_size=30),
    size=st.integers(1, 9),
    batch=st.integers(1, 7),
    extra=st.booleans(),
)
def test_parquet_columns_equal_the_record_scan_and_resume_at_every_shard_end(
    tmp_path: Path, rows: list[tuple[int, str | None]], size: int, batch: int, extra: bool
) -> None:
    path = tmp_path / "docs.parquet"
    table = {"id": [r[0] for r in rows], "text": [r[1] for r in rows]}
    if extra:
        table["lang"] = ["en"] * len(rows)
    pq.write_table(pa.table(table, schema=None), path, row_group_size=max(1, batch + 1))
    source = ParquetSource(path, batch_rows=batch)
    shards = list(source.scan_documents(None, size))
    assert records_of(shards) == expected(source)
    for shard in shards:
        assert records_of(list(source.scan_documents(shard.last_position, size))) == expected(
            source, shard.last_position
        )
