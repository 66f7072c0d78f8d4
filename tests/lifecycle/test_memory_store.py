"""The shipped memory fakes the lifecycle model stands on: named stores, keyset scans, NUL refusal, stamps."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from reindex.errors import BackendError, RowsRejected
from reindex.ports import Record, Rows, SourceSchema, TargetSpec
from reindex_adapters.testing import memory
from reindex_adapters.testing.memory import MemorySink, MemorySource


@pytest.fixture
def shared() -> Iterator[memory.MemoryStore]:
    yield memory.store("test-memory-store")
    memory.forget_store("test-memory-store")


def spec(name: str = "docs__t", plan_id: str = "p1", nonce: str = "n1") -> TargetSpec:
    return TargetSpec(name, "docs", 2, "fp", {}, SourceSchema("id", "text"), plan_id=plan_id, nonce=nonce)


def rows(*pairs: tuple[str, str]) -> Rows:
    records = [Record(i, t, {"id": i, "text": t}) for i, t in pairs]
    return Rows(records, np.ones((len(records), 2), dtype=np.float32), [f"h-{t}" for _, t in pairs], "fp")


def test_adapters_opened_from_config_on_one_store_name_share_documents_and_targets(shared) -> None:
    source = MemorySource.from_config(MemorySource.Config(kind="memory", store="test-memory-store"))
    sink = MemorySink.from_config(MemorySink.Config(kind="memory", alias="docs", store="test-memory-store"))
    shared.put("a", "alpha")
    sink.prepare(spec())
    again = MemorySink.from_config(MemorySink.Config(kind="memory", alias="docs", store="test-memory-store"))
    assert [r.id for r in source.scan()] == ["a"]
    assert again.describe("docs__t") is not None
    assert source.identity() == sink.identity() == "memory:test-memory-store"


def test_an_empty_named_store_is_still_the_shared_one(shared) -> None:
    source = MemorySource(store=shared)
    shared.put("a", "alpha")
    assert source.count() == 1 and MemorySink(shared).state is shared


def test_scan_is_a_keyset_by_id_so_an_insert_behind_the_cursor_is_not_seen(shared) -> None:
    for doc_id in ("b", "d", "f"):
        shared.put(doc_id, doc_id)
    scan = shared.scan()
    assert next(scan).id == "b"
    assert next(scan).id == "d"
    shared.put("a", "behind")
    shared.put("e", "ahead")
    shared.delete("f")
    assert [r.id for r in scan] == ["e"]
    assert [r.id for r in shared.scan(after="d")] == ["e"]


def test_records_sharing_an_id_resume_between_them(shared) -> None:
    shared.put("a", "one")
    shared.append("a", "two")
    shared.put("b", "three")
    first = list(shared.scan())
    assert [(r.id, r.text) for r in first] == [("a", "one"), ("a", "two"), ("b", "three")]
    assert [r.text for r in shared.scan(after=first[0].position)] == ["two", "three"]
    assert [r.text for r in shared.scan(after=first[1].position)] == ["three"]


def test_prepare_stamps_plan_and_nonce_once_and_describe_returns_them() -> None:
    sink = MemorySink()
    sink.prepare(spec(plan_id="p1", nonce="n1"))
    sink.prepare(spec(plan_id="p2", nonce="n2"))
    info = sink.describe("docs__t")
    assert info is not None and (info.plan_id, info.nonce) == ("p1", "n1")


def test_fetch_matching_returns_only_vectors_stored_for_the_expected_text() -> None:
    sink = MemorySink()
    sink.prepare(spec())
    sink.write("docs__t", rows(("a", "alpha"), ("b", "beta")))
    assert set(sink.fetch_matching("docs__t", {"a": "h-alpha", "b": "h-old", "c": "h-alpha"})) == {"a"}


def test_reject_nul_refuses_the_whole_batch_with_the_pgvector_reason() -> None:
    sink = MemorySink(reject_nul=True)
    sink.prepare(spec())
    with pytest.raises(RowsRejected) as refused:
        sink.write("docs__t", rows(("a", "alpha"), ("b", "be\x00ta")))
    assert refused.value.reason == "sink_rejected:22021"
    assert sink.targets_["docs__t"] == {}


def test_an_injected_write_failure_fires_once_before_or_after_landing(shared) -> None:
    sink = MemorySink(shared)
    sink.prepare(spec())
    shared.fail_write(2, landed=True)
    sink.write("docs__t", rows(("a", "alpha")))
    with pytest.raises(BackendError):
        sink.write("docs__t", rows(("b", "beta")))
    assert set(sink.targets_["docs__t"]) == {"a", "b"}
    shared.fail_write(1)
    with pytest.raises(BackendError):
        sink.write("docs__t", rows(("c", "gamma")))
    sink.write("docs__t", rows(("d", "delta")))
    assert set(sink.targets_["docs__t"]) == {"a", "b", "d"}
