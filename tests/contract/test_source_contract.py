"""One suite for every Source: stable order, keyset resume, fetch by id, payload carried."""

from __future__ import annotations

from reindex.ports import Record
from reindex.run.io import scan_documents
from tests.contract.conftest import SourceFactory


def corpus(n: int) -> list[Record]:
    return [
        Record(str(i), f"document {i} about topic {i % 13}", {"category": f"c{i % 3}"})
        for i in range(1, n + 1)
    ]


def test_scan_yields_every_record_once_with_its_text(make_source: SourceFactory) -> None:
    records = corpus(345)
    source = make_source(records)
    seen = [(r.id, r.text) for r in source.scan()]
    assert sorted(seen) == sorted((r.id, r.text) for r in records)
    assert source.count() in (None, 345)


def test_scan_after_a_position_resumes_exactly_after_it(make_source: SourceFactory) -> None:
    source = make_source(corpus(250))
    first = list(source.scan())
    for k in (0, 99, 100, 101, 248):
        rest = list(source.scan(after=first[k].position))
        assert [r.id for r in rest] == [r.id for r in first[k + 1 :]]
    assert list(source.scan(after=first[-1].position)) == []


def test_scan_order_is_stable_across_calls(make_source: SourceFactory) -> None:
    source = make_source(corpus(120))
    assert [r.id for r in source.scan()] == [r.id for r in source.scan()]


def test_fetch_returns_existing_ids_and_ignores_missing(make_source: SourceFactory) -> None:
    source = make_source(corpus(50))
    fetched = {r.id: r.text for r in source.fetch(["3", "17", "9999"])}
    assert fetched == {"3": "document 3 about topic 3", "17": "document 17 about topic 4"}


def test_payload_carries_the_other_fields(make_source: SourceFactory) -> None:
    source = make_source(corpus(5))
    record = next(r for r in source.scan() if r.id == "4")
    flat = {**record.payload, **record.payload.get("metadata", {})}
    assert flat["category"] == "c1"


def test_schema_names_the_text_field(make_source: SourceFactory) -> None:
    schema = make_source(corpus(3)).schema()
    assert schema.text_field in {"text", "body", "page_content"}


def test_identity_is_stable_and_names_the_backend(make_source: SourceFactory) -> None:
    source = make_source(corpus(3))
    identity = source.identity()
    assert identity and identity == source.identity()
    assert ":" in identity  # `<kind>:<where>`; the adapter tests check what each kind leaves out


def test_the_pipelines_shards_hold_what_scan_yields_and_resume_after_a_position(
    make_source: SourceFactory,
) -> None:
    """`scan_documents`: the source's own columnar scan where it has one (files, Postgres), else `scan`
    in chunks; either way the same documents as `scan`."""
    source = make_source(corpus(250))
    records = list(source.scan())
    shards = list(scan_documents(source, None, 100))
    assert [len(shard) for shard in shards] == [100, 100, 50]
    flat = [record for shard in shards for record in shard]
    assert [(r.id, r.text, dict(r.payload)) for r in flat] == [
        (r.id, r.text, dict(r.payload)) for r in records
    ]
    assert [shard.last_position for shard in shards] == [records[k].position for k in (99, 199, 249)]
    rest = [record.id for shard in scan_documents(source, records[149].position, 100) for record in shard]
    assert rest == [r.id for r in records[150:]]
    assert list(scan_documents(source, records[-1].position, 100)) == []


def test_a_source_declares_whether_processes_may_share_it(make_source: SourceFactory) -> None:
    """`shareable` is declared by every source (`ports.Source`): the processes engine reads it, and a
    source that says nothing is not guessed at."""
    source = make_source(corpus(3))
    declared = next((vars(c)["shareable"] for c in type(source).__mro__ if "shareable" in vars(c)), None)
    assert isinstance(vars(source).get("shareable", declared), bool)
