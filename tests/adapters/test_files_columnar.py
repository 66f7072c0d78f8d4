"""The columnar scans (`scan_documents`) read exactly what the per-record scan reads, shard by shard."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.files import JsonlSource, ParquetSource
from reindex.columns import Documents

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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(LINES, max_size=25), size=st.integers(1, 7), bom=st.booleans(), raw=st.binary(max_size=3)
)
def test_jsonl_columns_equal_the_record_scan_and_resume_at_every_shard_end(
    tmp_path: Path, lines: list[str], size: int, bom: bool, raw: bytes
) -> None:
    path = tmp_path / "docs.jsonl"
    body = "\n".join(lines).encode() + b"\n" + raw + b"\n" + b'{"id": "z", "text": "end"}\n'
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + body)
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
