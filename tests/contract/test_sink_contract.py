"""One suite for every Sink: idempotent prepare and upsert, index scan, guarded atomic alias moves,
identity, hash-checked fetches and whole-batch refusals."""

from __future__ import annotations

import numpy as np
import pytest

from reindex import registry
from reindex.errors import ConfigError, CutoverRefused, RowsRejected
from reindex.fingerprint import content_hash
from reindex.ports import MakesScratchTargets, Record, Rows, Sink, SourceSchema, TargetSpec

DIM = 8


def spec(
    name: str,
    fingerprint: str = "f" * 16,
    dim: int = DIM,
    alias: str = "docs",
    plan_id: str = "",
    nonce: str = "",
) -> TargetSpec:
    return TargetSpec(
        name=name,
        alias=alias,
        dim=dim,
        fingerprint=fingerprint,
        model={"model": "test", "fingerprint": fingerprint},
        source=SourceSchema(id_field="id", text_field="text"),
        plan_id=plan_id,
        nonce=nonce,
    )


def rows(ids: list[str], seed: int = 0, fingerprint: str = "f" * 16) -> Rows:
    records = [Record(i, f"text of {i}", {"id": i, "text": f"text of {i}", "lang": "en"}) for i in ids]
    vectors = np.random.default_rng(seed).standard_normal((len(ids), DIM)).astype(np.float32)
    return Rows(records, vectors, [content_hash(r.text) for r in records], fingerprint)


def test_prepare_is_idempotent_and_describe_reports_the_target(sink: Sink) -> None:
    sink.prepare(spec("docs__aaaa0001"))
    sink.prepare(spec("docs__aaaa0001"))
    info = sink.describe("docs__aaaa0001")
    assert info is not None
    assert (info.count, info.dim, info.fingerprint) == (0, DIM, "f" * 16)
    assert sink.describe("docs__missing0") is None


def test_prepare_refuses_an_existing_target_of_another_fingerprint(sink: Sink) -> None:
    sink.prepare(spec("docs__aaaa0001"))
    with pytest.raises(ConfigError):
        sink.prepare(spec("docs__aaaa0001", fingerprint="0" * 16))


def test_replaying_a_write_changes_nothing_but_the_values(sink: Sink) -> None:
    sink.prepare(spec("docs__aaaa0001"))
    sink.write("docs__aaaa0001", rows(["a", "b", "c"], seed=1))
    sink.write("docs__aaaa0001", rows(["b", "c", "d"], seed=2))
    info = sink.describe("docs__aaaa0001")
    assert info is not None and info.count == 4
    expected = rows(["b", "c", "d"], seed=2).vectors[0]
    got = sink.fetch("docs__aaaa0001", ["b"])["b"]
    # Qdrant normalises vectors of cosine collections on write: compare directions.
    np.testing.assert_allclose(
        got / np.linalg.norm(got), expected / np.linalg.norm(expected), rtol=1e-5, atol=1e-6
    )


def test_scan_index_reports_every_id_with_hash_and_fingerprint(sink: Sink) -> None:
    sink.prepare(spec("docs__aaaa0001"))
    ids = [str(i) for i in range(300)]
    for start in range(0, 300, 128):
        sink.write("docs__aaaa0001", rows(ids[start : start + 128], seed=start))
    entries = {e.id: e for e in sink.scan_index("docs__aaaa0001", DIM)}
    assert set(entries) == set(ids)
    assert entries["7"].content_hash == content_hash("text of 7")
    assert {e.fingerprint for e in entries.values()} == {"f" * 16}
    assert all(e.problem is None for e in entries.values())


def test_scan_index_flags_zero_vectors(sink: Sink) -> None:
    sink.prepare(spec("docs__aaaa0001"))
    batch = rows(["a", "b"])
    batch.vectors[1] = 0.0
    sink.write("docs__aaaa0001", batch)
    problems = {e.id: e.problem for e in sink.scan_index("docs__aaaa0001", DIM)}
    assert problems == {"a": None, "b": "zero"}


def test_delete_removes_only_the_given_ids(sink: Sink) -> None:
    sink.prepare(spec("docs__aaaa0001"))
    sink.write("docs__aaaa0001", rows(["a", "b", "c"]))
    sink.delete("docs__aaaa0001", ["b", "zzz"])
    assert {e.id for e in sink.scan_index("docs__aaaa0001", DIM)} == {"a", "c"}


def test_fetch_returns_only_existing_ids(sink: Sink) -> None:
    sink.prepare(spec("docs__aaaa0001"))
    sink.write("docs__aaaa0001", rows(["a"]))
    assert set(sink.fetch("docs__aaaa0001", ["a", "nope"])) == {"a"}


def test_move_alias_is_atomic_guarded_and_reversible(sink: Sink) -> None:
    for name in ("docs__aaaa0001", "docs__bbbb0002"):
        sink.prepare(spec(name))
        sink.write(name, rows(["a"]))
        sink.finalize(spec(name))
    assert sink.alias("docs").target is None
    sink.move_alias("docs", "docs__aaaa0001", expected=None, meta={"fingerprint": "f" * 16})
    sink.move_alias("docs", "docs__bbbb0002", expected="docs__aaaa0001", meta={"fingerprint": "f" * 16})
    info = sink.alias("docs")
    assert (info.target, info.fingerprint) == ("docs__bbbb0002", "f" * 16)
    with pytest.raises(CutoverRefused):
        sink.move_alias("docs", "docs__aaaa0001", expected="docs__aaaa0001", meta={})
    sink.move_alias("docs", "docs__aaaa0001", expected="docs__bbbb0002", meta={"fingerprint": "f" * 16})
    assert sink.alias("docs").target == "docs__aaaa0001"


def test_targets_lists_this_alias_only_and_drop_removes(sink: Sink) -> None:
    sink.prepare(spec("docs__aaaa0001"))
    sink.prepare(spec("docs__bbbb0002"))
    sink.prepare(spec("other__cccc0003", alias="other"))
    assert sorted(sink.targets("docs")) == ["docs__aaaa0001", "docs__bbbb0002"]
    sink.drop("docs__aaaa0001")
    assert sink.targets("docs") == ["docs__bbbb0002"]
    assert sink.describe("docs__aaaa0001") is None


def test_identity_is_stable_and_names_the_backend(sink: Sink) -> None:
    identity = sink.identity()
    assert identity and identity == sink.identity()
    assert identity.split(":", 1)[0] in registry.kinds("target")  # a kind registered as a [target]


def test_prepare_records_plan_and_nonce_and_never_restamps_an_existing_target(sink: Sink) -> None:
    sink.prepare(spec("docs__aaaa0001", plan_id="plan-1", nonce="nonce-1"))
    sink.prepare(spec("docs__aaaa0001", plan_id="plan-1", nonce="nonce-2"))
    info = sink.describe("docs__aaaa0001")
    assert info is not None and (info.plan_id, info.nonce) == ("plan-1", "nonce-1")


def test_fetch_matching_returns_only_vectors_whose_stored_hash_is_expected(sink: Sink) -> None:
    sink.prepare(spec("docs__aaaa0001"))
    sink.write("docs__aaaa0001", rows(["a", "b", "c"], seed=3))
    expected = {
        "a": content_hash("text of a"),
        "b": content_hash("an edited text of b"),
        "zzz": content_hash("text of zzz"),
    }
    matched = sink.fetch_matching("docs__aaaa0001", expected)
    assert set(matched) == {"a"}
    np.testing.assert_allclose(matched["a"], sink.fetch("docs__aaaa0001", ["a"])["a"], rtol=1e-6)
    assert sink.fetch_matching("docs__aaaa0001", {}) == {}


def test_a_batch_with_a_nul_byte_is_stored_exactly_or_refused_whole(sink: Sink) -> None:
    sink.prepare(spec("docs__aaaa0001"))
    batch = rows(["good", "poison"])
    poisoned = Record("poison", "bad\x00text", {"id": "poison", "note": "nul \x00 inside"})
    batch = Rows([batch.records[0], poisoned], batch.vectors, batch.content_hashes, batch.fingerprint)
    try:
        sink.write("docs__aaaa0001", batch)
    except RowsRejected as refused:
        assert refused.reason.startswith("sink_rejected:")
        assert list(sink.scan_index("docs__aaaa0001", DIM)) == []
    else:
        assert {e.id for e in sink.scan_index("docs__aaaa0001", DIM)} == {"good", "poison"}


def test_scan_vectors_search_and_distance_serve_the_quality_comparison(sink: Sink) -> None:
    sink.prepare(spec("docs__aaaa0001"))
    ids = [f"d{i:02d}" for i in range(40)]
    written = rows(ids, seed=3)
    sink.write("docs__aaaa0001", written)
    sink.finalize(spec("docs__aaaa0001"))
    assert sink.distance("docs__aaaa0001") == "cosine"
    batches = list(sink.scan_vectors("docs__aaaa0001", batch=16))
    assert sorted(i for part, _ in batches for i in part) == ids
    assert max(len(part) for part, _ in batches) <= 16 and all(len(p) == len(v) for p, v in batches)
    by_id = {i: v for part, vectors in batches for i, v in zip(part, vectors, strict=True)}
    unit = written.vectors / np.linalg.norm(written.vectors, axis=1, keepdims=True)
    np.testing.assert_allclose(by_id["d07"] / np.linalg.norm(by_id["d07"]), unit[7], atol=1e-5)
    found = sink.search("docs__aaaa0001", written.vectors[[7, 21]], 3)
    nearest = np.argsort(-(unit[[7, 21]] @ unit.T), axis=1)[:, :3]
    assert found == [[ids[j] for j in row] for row in nearest]  # 40 points: any ANN index is exact here


def test_a_scratch_target_stands_apart_lists_and_drops(sink: Sink) -> None:
    """plan's rehearsal (`ports.MakesScratchTargets`): a scratch target takes writes like the target it
    stands for, is listed by `scratches` and is gone after `drop`; it is none of the alias's targets."""
    # every sink says whether it can (`scratch` returns None where it cannot): plan asks each one
    assert isinstance(sink, MakesScratchTargets)
    scratch = sink.scratch(spec("docs__aaaa0001"), "1700000000_0abc")
    if scratch is None:  # a column mode: nothing apart from the application's table
        assert sink.scratches() == []
        return
    assert scratch.name.rsplit(".", 1)[-1] == "reindex_rehearsal_1700000000_0abc"
    sink.prepare(scratch)
    sink.write(scratch.name, rows(["a", "b"]))
    described = sink.describe(scratch.name)
    assert described is not None and described.count == 2
    assert scratch.name in sink.scratches() and scratch.name not in sink.targets("docs")
    sink.drop(scratch.name)
    assert sink.describe(scratch.name) is None and scratch.name not in sink.scratches()


def test_a_sink_declares_its_traits(sink: Sink) -> None:
    """What the core reads of every sink is declared (`ports.Sink`), not probed: whether processes may
    share it and whether its alias move holds the writers back."""
    for trait in ("shareable", "holds_writers"):
        declared = next((vars(c)[trait] for c in type(sink).__mro__ if trait in vars(c)), None)
        assert isinstance(vars(sink).get(trait, declared), bool), trait
