"""How long a Qdrant rollback takes to carry back what the application wrote through the alias.

Qdrant has no trigger to log writes, so a rollback compares the collection it leaves with the older one
point by point (adapters/qdrant/rollback.py), before the alias moves and again after. Measured here in local
mode on two collections of N points (a 64-d vector, a text, a number) where the application changed 1% of the
newer one while it was live (a third each: texts edited, a field set, points deleted, plus as many added): the
seconds of each pass. Neither pass holds the application's writers (nothing can, on Qdrant).

`scripts/bench qdrant-rollback [--points 10000,100000] [--repeats 3]`: medians, and JSON in
.bench/qdrant-rollback.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DIM = 64


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", default="10000,100000", help="comma-separated collection sizes")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions per size (median shown)")
    parser.add_argument("--json", type=Path, default=ROOT / ".bench" / "qdrant-rollback.json")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    for points in (int(n) for n in args.points.split(",") if n):
        runs = [measure(points, seed) for seed in range(args.repeats)]
        found = {
            "first_pass_seconds": [r[0] for r in runs],
            "second_pass_seconds": [r[1] for r in runs],
            "median_first_pass_seconds": statistics.median(r[0] for r in runs),
            "median_second_pass_seconds": statistics.median(r[1] for r in runs),
            "written_meanwhile": runs[0][2],
        }
        results[str(points)] = found
        print(
            f"{points:>9,} points, {found['written_meanwhile']:,} written meanwhile: first pass"
            f" {found['median_first_pass_seconds']:.2f} s, second {found['median_second_pass_seconds']:.2f} s"
            f" (medians of {args.repeats}, local mode)",
            flush=True,
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    return 0


def measure(points: int, seed: int) -> tuple[float, float, int]:
    from qdrant_client import QdrantClient, models

    from reindex_adapters.qdrant.sink import QdrantSink

    client = QdrantClient(":memory:")
    params = models.VectorParams(size=DIM, distance=models.Distance.COSINE)
    client.create_collection("older", params)
    client.create_collection("newer", params, metadata={"reindex": {"text_field": "text"}})
    rng = np.random.default_rng(seed)
    for start in range(0, points, 1000):
        ids = list(range(start, min(points, start + 1000)))
        vectors = rng.standard_normal((len(ids), DIM)).astype(np.float32).tolist()
        payloads = [{"text": f"note {i}", "n": i} for i in ids]
        for name in ("older", "newer"):
            client.upsert(name, models.Batch(ids=ids, vectors=vectors, payloads=payloads))
    changed = rng.choice(points, max(3, points // 100), replace=False).tolist()
    edited, tagged, deleted = changed[0::3], changed[1::3], changed[2::3]
    for i in edited:
        client.set_payload("newer", {"text": f"note {i}, edited"}, points=[i])
    client.set_payload("newer", {"acl": ["ops"]}, points=tagged)
    client.delete("newer", models.PointIdsList(points=deleted))
    added = list(range(points, points + len(changed) // 3))
    vectors = rng.standard_normal((len(added), DIM)).astype(np.float32).tolist()
    client.upsert("newer", models.Batch(ids=added, vectors=vectors, payloads=[{"text": "new"}] * len(added)))
    sink = QdrantSink(client)
    started = time.perf_counter()
    state = sink.carry_back("newer", "older")
    first = time.perf_counter() - started
    started = time.perf_counter()
    sink.carry_back("newer", "older", since=state)
    second = time.perf_counter() - started
    assert not client.retrieve("older", deleted[:5]) and len(client.retrieve("older", added[:5])) == min(
        5, len(added)
    )
    assert all((p.payload or {}).get("acl") == ["ops"] for p in client.retrieve("older", tagged[:5]))
    client.close()
    return first, second, len(changed) + len(added)


if __name__ == "__main__":
    raise SystemExit(main())
