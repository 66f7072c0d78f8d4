"""Quality: is the new target as good as the live index for this corpus, before the alias moves?

Coverage (verify) proves every document is there; this measures what the vectors do, in three ways:

    neighbours  documents as their own queries (a sample chosen by a hash of the id, so the same every
                time): their k exact nearest neighbours among the live index's stored vectors against
                those among the new target's; overlap@k and rank-biased overlap, and the most changed
                neighbourhoods as examples. Neither model is needed: both sides use stored vectors.
    ann         the new target's own ANN index (`Sink.search`) against the exact neighbours computed
                here: recall@k, so a badly built HNSW index is caught too.
    judged      with BEIR queries and relevance judgements: nDCG@10 and Recall@k of the new target
                (queries embedded by the new model), and of the live index when `[compare] embedder`
                names its model.

Exact neighbours (`reindex.vectors.exact_neighbours`) stream the stored vectors in batches against all
queries at once, keeping each query's best k: memory is O(queries x k + batch), whatever the corpus size.
`[gate]` thresholds turn the report into a pass or a refusal (cutover exit 3, naming the metric).
"""

from __future__ import annotations

import csv
import hashlib
import heapq
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reindex.config import CompareConfig, GateConfig
from reindex.errors import ConfigError
from reindex.ports import Embedder, Sink, Source, Vectors
from reindex.vectors import Neighbours, exact_neighbours

RBO_PERSISTENCE = 0.9  # weight of rank d+1 relative to rank d: the top 10 carry about 86% of the score
NDCG_AT = 10


@dataclass(frozen=True)
class Sides:
    """What is compared: the new target, and the index the alias serves now (None before the first)."""

    target: str
    live: str | None


def compare(
    source: Source,
    sink: Sink,
    embedder: Embedder,
    sides: Sides,
    settings: CompareConfig,
    gate: GateConfig,
    live_embedder: Embedder | None = None,
) -> dict[str, Any]:
    """The quality report (JSON-ready) of `sides.target` against `sides.live`, with the gate's verdict."""
    k = settings.k
    queries = _sample(sink, sides, settings)
    new_vectors = sink.fetch(sides.target, queries)
    queries = [doc_id for doc_id in queries if doc_id in new_vectors]
    report: dict[str, Any] = {
        "k": k,
        "sample": len(queries),
        "target": sides.target,
        "live": sides.live,
        "distance": sink.distance(sides.target),
        "neighbours": None,
        "ann": None,
        "judged": None,
    }
    exact_new: Neighbours = []
    if queries:
        matrix = np.stack([new_vectors[q] for q in queries]).astype(np.float32)
        exact_new = exact_neighbours(sink.scan_vectors(sides.target), matrix, queries, k, report["distance"])
        report["ann"] = ann_recall(sink, sides.target, matrix, queries, exact_new, k)
        if sides.live is not None:
            report["neighbours"] = _neighbourhoods(source, sink, sides.live, queries, exact_new, settings)
    if settings.queries is not None and settings.qrels is not None:
        report["judged"] = _judged(sink, sides, settings, embedder, live_embedder)
    report["gate"] = evaluate(report, gate)
    return report


# the sample ---------------------------------------------------------------------------------------------


def _sample(sink: Sink, sides: Sides, settings: CompareConfig) -> list[str]:
    """Up to `sample` ids of the new target (also in the live index when there is one): those with the
    smallest hash of seed + id, so the sample is the same on every run and spread over the whole corpus."""
    want = settings.sample * 2 if sides.live is not None else settings.sample  # some may be absent live
    ids = (entry.id for entry in sink.scan_index(sides.target, 0))
    picked = heapq.nsmallest(want, ids, key=lambda doc_id: _rank(settings.seed, doc_id))
    if sides.live is not None:
        present = sink.fetch(sides.live, picked)
        picked = [doc_id for doc_id in picked if doc_id in present]
    return picked[: settings.sample]


def _rank(seed: str, doc_id: str) -> bytes:
    return hashlib.sha256(f"{seed}\0{doc_id}".encode("utf-8", "surrogatepass")).digest()[:8]


# neighbourhoods, ANN recall -----------------------------------------------------------------------------


def _neighbourhoods(
    source: Source,
    sink: Sink,
    live: str,
    queries: list[str],
    exact_new: Neighbours,
    settings: CompareConfig,
) -> dict[str, Any]:
    stored = sink.fetch(live, queries)
    matrix = np.stack([stored[q] for q in queries]).astype(np.float32)
    exact_live = exact_neighbours(sink.scan_vectors(live), matrix, queries, settings.k, sink.distance(live))
    overlaps = [overlap(a[0], b[0], settings.k) for a, b in zip(exact_live, exact_new, strict=True)]
    rbos = [rbo(a[0], b[0]) for a, b in zip(exact_live, exact_new, strict=True)]
    changed = sorted(range(len(queries)), key=lambda row: (overlaps[row], queries[row]))[: settings.examples]
    texts = {record.id: record.text for record in source.fetch([queries[row] for row in changed])}
    examples = [
        {
            "id": queries[row],
            "text": texts.get(queries[row], "")[:300],
            "overlap": round(overlaps[row], 4),
            "live": exact_live[row][0],
            "new": exact_new[row][0],
        }
        for row in changed
    ]
    return {
        "overlap_at_k": round(float(np.mean(overlaps)), 4),
        "rbo": round(float(np.mean(rbos)), 4),
        "examples": examples,
    }


def ann_recall(
    sink: Sink, target: str, queries: Vectors, query_ids: Sequence[str], exact: Neighbours, k: int
) -> dict[str, Any]:
    """Recall@k of the target's own index against the exact neighbours (the query itself left out)."""
    found = sink.search(target, queries, k + 1)
    recalls = []
    for doc_id, approximate, (truth, _) in zip(query_ids, found, exact, strict=True):
        if truth:
            kept = [i for i in approximate if i != doc_id][:k]
            recalls.append(len(set(kept) & set(truth)) / len(truth))
    return {"recall_at_k": round(float(np.mean(recalls)), 4) if recalls else None, "queries": len(recalls)}


def overlap(a: Sequence[str], b: Sequence[str], k: int) -> float:
    """|A ∩ B| / k of two top-k lists."""
    return len(set(a[:k]) & set(b[:k])) / k if k else 0.0


def rbo(a: Sequence[str], b: Sequence[str], p: float = RBO_PERSISTENCE) -> float:
    """Extrapolated rank-biased overlap (Webber, Moffat and Zobel 2010) of two rankings of equal depth:
    1 for the same ranking, 0 for disjoint ones; agreement near the top weighs most."""
    depth = min(len(a), len(b))
    if depth == 0:
        return 1.0 if len(a) == len(b) else 0.0
    seen_a: set[str] = set()
    seen_b: set[str] = set()
    shared, total = 0, 0.0
    for d in range(1, depth + 1):
        x, y = a[d - 1], b[d - 1]
        if x == y:
            shared += 1
        else:
            shared += (x in seen_b) + (y in seen_a)
        seen_a.add(x)
        seen_b.add(y)
        total += shared / d * p**d
    return (1 - p) / p * total + shared / depth * p**depth


# judged queries (BEIR) ----------------------------------------------------------------------------------


def _judged(
    sink: Sink,
    sides: Sides,
    settings: CompareConfig,
    embedder: Embedder,
    live_embedder: Embedder | None,
) -> dict[str, Any]:
    assert settings.queries is not None and settings.qrels is not None
    judgements = read_qrels(settings.qrels)
    texts = {q: t for q, t in read_queries(settings.queries).items() if q in judgements}
    if not texts:
        raise ConfigError(
            f"no query of {str(settings.queries)!r} has a judgement in {str(settings.qrels)!r}",
            hint="check that query ids match the first column of qrels",
        )
    depth = max(settings.k, NDCG_AT)
    judged: dict[str, Any] = {"queries": len(texts), "k": settings.k, "new": None, "live": None}
    judged["new"] = _ranking_metrics(sink, sides.target, embedder, texts, judgements, depth, settings.k)
    if live_embedder is not None and sides.live is not None:
        judged["live"] = _ranking_metrics(
            sink, sides.live, live_embedder, texts, judgements, depth, settings.k
        )
    return judged


def _ranking_metrics(
    sink: Sink,
    target: str,
    embedder: Embedder,
    texts: Mapping[str, str],
    judgements: Mapping[str, Mapping[str, int]],
    depth: int,
    k: int,
) -> dict[str, float]:
    ids = list(texts)
    vectors = np.asarray(embedder.embed(embedder.tokenize([texts[q] for q in ids])), dtype=np.float32)
    ranked = exact_neighbours(
        sink.scan_vectors(target), vectors, [None] * len(ids), depth, sink.distance(target)
    )
    ndcgs = [ndcg(found, judgements[q], NDCG_AT) for q, (found, _) in zip(ids, ranked, strict=True)]
    recalls = [recall(found, judgements[q], k) for q, (found, _) in zip(ids, ranked, strict=True)]
    return {"ndcg_at_10": round(float(np.mean(ndcgs)), 4), "recall_at_k": round(float(np.mean(recalls)), 4)}


def ndcg(ranking: Sequence[str], relevance: Mapping[str, int], at: int = NDCG_AT) -> float:
    """nDCG@at with linear gains, as trec_eval (and so BEIR) computes it."""
    gains = [relevance.get(doc_id, 0) for doc_id in ranking[:at]]
    dcg = sum(gain / math.log2(rank + 2) for rank, gain in enumerate(gains) if gain > 0)
    ideal = sorted((g for g in relevance.values() if g > 0), reverse=True)[:at]
    best = sum(gain / math.log2(rank + 2) for rank, gain in enumerate(ideal))
    return dcg / best if best else 0.0


def recall(ranking: Sequence[str], relevance: Mapping[str, int], k: int) -> float:
    relevant = {doc_id for doc_id, gain in relevance.items() if gain > 0}
    return len(relevant & set(ranking[:k])) / len(relevant) if relevant else 0.0


def read_queries(path: Path) -> dict[str, str]:
    """BEIR queries.jsonl: one {"_id", "text"} object per line."""
    queries: dict[str, str] = {}
    for number, line in _lines(path):
        try:
            row = json.loads(line)
            queries[str(row["_id"])] = str(row["text"])
        except (ValueError, KeyError, TypeError):
            raise ConfigError(
                f"{path}:{number}: not a BEIR query line", hint='each line: {"_id": "...", "text": "..."}'
            ) from None
    return queries


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """BEIR qrels: tab-separated query-id, corpus-id, score, after a header line."""
    judgements: dict[str, dict[str, int]] = {}
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle, delimiter="\t"))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", hint="check [compare] qrels") from None
    for number, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        try:
            judgements.setdefault(row[0], {})[row[1]] = int(float(row[2]))
        except (IndexError, ValueError):
            raise ConfigError(
                f"{path}:{number}: not a qrels line", hint="query-id<TAB>corpus-id<TAB>score, after a header"
            ) from None
    return judgements


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    yield number, line
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", hint="check [compare] queries") from None


# the gate -----------------------------------------------------------------------------------------------


_METRICS: dict[str, tuple[str, ...]] = {  # threshold -> where its value is in the report
    "min_overlap_at_k": ("neighbours", "overlap_at_k"),
    "min_rbo": ("neighbours", "rbo"),
    "min_ann_recall": ("ann", "recall_at_k"),
    "min_ndcg_at_10": ("judged", "new", "ndcg_at_10"),
    "min_recall_at_k": ("judged", "new", "recall_at_k"),
}


def evaluate(report: Mapping[str, Any], gate: GateConfig) -> dict[str, Any]:
    """Each threshold against its metric: a failure names both; a metric not measured fails its threshold
    (a gate that cannot be checked does not pass)."""
    failures: list[str] = []
    for name, threshold in gate.thresholds.items():
        if name == "max_ndcg_drop":
            new, live = (
                _metric(report, ("judged", "new", "ndcg_at_10")),
                _metric(report, ("judged", "live", "ndcg_at_10")),
            )
            if new is None or live is None:
                failures.append("max_ndcg_drop: needs judged queries and [compare] embedder (the live model)")
            elif live - new > threshold:
                failures.append(
                    f"nDCG@10 dropped by {live - new:.4f} (live {live:.4f}, new {new:.4f}) > {threshold}"
                )
            continue
        value = _metric(report, _METRICS[name])
        label = name.removeprefix("min_")
        if value is None:
            failures.append(f"{label}: not measured (see [compare]), gate {name} = {threshold}")
        elif value < threshold:
            failures.append(f"{label} {value:.4f} < {name} {threshold}")
    return {"passed": not failures, "failures": failures, "thresholds": gate.thresholds}


def _metric(report: Mapping[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = report
    for key in path:
        if not isinstance(value, Mapping) or value.get(key) is None:
            return None
        value = value[key]
    return float(value)
