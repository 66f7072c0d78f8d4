"""The quality metrics on hand-made inputs: exact neighbours, overlap, RBO, nDCG, recall, the gate."""

from __future__ import annotations

import numpy as np
import pytest

from reindex.config import GateConfig
from reindex.prove.quality import evaluate, ndcg, overlap, rbo, recall
from reindex.vectors import exact_neighbours


def brute(
    stored: np.ndarray, ids: list[str], queries: np.ndarray, query_ids: list[str], k: int, distance: str
):
    out = []
    for q, own in zip(queries, query_ids, strict=True):
        if distance == "cosine":
            scores = stored @ q / (np.linalg.norm(stored, axis=1) * np.linalg.norm(q))
        elif distance == "dot":
            scores = stored @ q
        else:
            scores = -((stored - q) ** 2).sum(axis=1)
        order = [i for i in np.argsort(-scores, kind="stable") if ids[i] != own]
        out.append([ids[i] for i in order[:k]])
    return out


@pytest.mark.parametrize("distance", ["cosine", "dot", "euclid"])
def test_streamed_exact_neighbours_equal_a_brute_force_search_without_the_query_itself(distance: str) -> None:
    rng = np.random.default_rng(7)
    stored = rng.normal(size=(500, 12)).astype(np.float32)
    ids = [f"d{i}" for i in range(500)]
    picked = [3, 77, 250, 499]
    queries = stored[picked]
    query_ids = [ids[i] for i in picked]
    batches = [(ids[i : i + 64], stored[i : i + 64]) for i in range(0, 500, 64)]
    found = exact_neighbours(batches, queries, query_ids, 10, distance)  # type: ignore[arg-type]
    assert [f[0] for f in found] == brute(stored, ids, queries, query_ids, 10, distance)
    assert all(len(f[0]) == 10 and f[1] == sorted(f[1], reverse=True) for f in found)


def test_fewer_stored_vectors_than_k_give_what_there_is() -> None:
    stored = np.eye(3, dtype=np.float32)
    found = exact_neighbours([(["a", "b", "c"], stored)], stored[:1], ["a"], 10, "cosine")
    assert found[0][0][0] in {"b", "c"} and len(found[0][0]) == 2


def test_overlap_and_rank_biased_overlap() -> None:
    a = [f"d{i}" for i in range(10)]
    assert overlap(a, a, 10) == 1.0 and rbo(a, a) == pytest.approx(1.0)
    assert overlap(a, [f"x{i}" for i in range(10)], 10) == 0.0 and rbo(a, [f"x{i}" for i in range(10)]) == 0.0
    swapped_top = [a[1], a[0], *a[2:]]
    swapped_bottom = [*a[:8], a[9], a[8]]
    assert overlap(a, swapped_top, 10) == 1.0
    assert rbo(a, swapped_bottom) > rbo(a, swapped_top) == pytest.approx(0.9)  # the top weighs most
    assert rbo(a, [*a[:5], *[f"x{i}" for i in range(5)]]) == pytest.approx(
        0.1 / 0.9 * sum(min(d, 5) / d * 0.9**d for d in range(1, 11)) + 0.5 * 0.9**10
    )


def test_ndcg_and_recall_as_trec_eval_computes_them() -> None:
    relevance = {"a": 2, "b": 1, "z": 1}
    assert ndcg(["a", "b", "z"], relevance) == pytest.approx(1.0)
    dcg = 1 / np.log2(3) + 2 / np.log2(4)  # b at rank 2, a at rank 3
    ideal = 2 + 1 / np.log2(3) + 1 / np.log2(4)
    assert ndcg(["x", "b", "a"], relevance) == pytest.approx(dcg / ideal)
    assert recall(["x", "b", "a"], relevance, 2) == pytest.approx(1 / 3)
    assert ndcg(["x"], {}) == 0.0 and recall(["x"], {"q": 0}, 5) == 0.0


def test_the_gate_names_each_metric_short_of_its_threshold_and_fails_what_it_cannot_measure() -> None:
    report = {
        "neighbours": {"overlap_at_k": 0.4, "rbo": 0.7},
        "ann": {"recall_at_k": 0.99},
        "judged": {"new": {"ndcg_at_10": 0.5, "recall_at_k": 0.8}, "live": None},
    }
    gate = GateConfig(min_overlap_at_k=0.5, min_ann_recall=0.95, min_ndcg_at_10=0.4, max_ndcg_drop=0.05)
    verdict = evaluate(report, gate)
    assert not verdict["passed"]
    assert verdict["failures"][0] == "overlap_at_k 0.4000 < min_overlap_at_k 0.5"
    assert "max_ndcg_drop: needs judged queries" in verdict["failures"][1] and len(verdict["failures"]) == 2
    assert evaluate(report, GateConfig()) == {"passed": True, "failures": [], "thresholds": {}}
    report["judged"]["live"] = {"ndcg_at_10": 0.6}  # type: ignore[index]
    assert "nDCG@10 dropped by 0.1000" in evaluate(report, GateConfig(max_ndcg_drop=0.05))["failures"][0]
