"""Linear cost to ten million documents (issue 44, target 1): the tool's own CPU per document, marginal
between corpus sizes, in one process on the default SQLite ledger.

Each run is `reindex run` (the free hash embedder at 8 dimensions, so the vectors' bytes do not dominate;
JSONL -> pgvector, no ANN index) in a child process that reports its CPU seconds and those of its ended
children, and its peak RSS (`bench.py --child`); the embedded database server is not a child. The marginal
CPU per document between two sizes is (CPU at the larger - CPU at the smaller) / (the documents between),
so start-up and imports do not count. Corpora: 20-80 words a text, generated once and cached.

    1  marginal 1M -> 10M over marginal 30k -> 300k    target <= 1.15  (--ten-million)
       marginal 300k -> 1M over marginal 30k -> 300k   (without --ten-million)
       peak RSS at the largest size over 1M              target <= 1.15

Each run also notes its CPU as it passes 30k, 300k, 1M, 3M and 10M documents: the marginal cost between
those marks inside one run, where the machine's minute-to-minute speed moves every step alike.

Usage: scripts/bench-scale [--repeats 3] [--ten-million] [--dedupe auto|run|window] [--json FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench

SHARD = 5000
SIZES = (30_000, 300_000, 1_000_000)
TEN_MILLION = 10_000_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each size below 10M")
    parser.add_argument("--ten-million", action="store_true", help="also 10,000,000 documents, once")
    parser.add_argument("--dedupe", choices=("auto", "run", "window"), default="auto")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "reindex-bench-scale")
    parser.add_argument("--json", type=Path, help="write the runs and figures here too")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    with bench.postgres(args.workdir) as dsn:
        for repeat in range(args.repeats):
            for n in SIZES:
                runs.append(_run(args.workdir, dsn, n, repeat, args.dedupe))
        if args.ten_million:
            runs.append(_run(args.workdir, dsn, TEN_MILLION, 0, args.dedupe))
    figures = _figures(runs, args.ten_million)
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "figures": figures}, indent=2))
    return 0


def _run(work: Path, dsn: str, n: int, repeat: int, dedupe: str) -> dict[str, Any]:
    corpus = bench.synthetic_corpus(work, n)
    label = f"s_{n}_{repeat}"
    target = {"kind": "pgvector", "dsn": dsn, "alias": label, "index": "none"}
    run = {"shard_size": SHARD, "workers": 1, "dedupe": dedupe}
    path = bench.write_config(work, label, bench.source(corpus), {"kind": "hash", "dim": 8}, target, run)
    outcome = bench.run_in_child(path, dsn)
    report = outcome["report"]
    (work / f"state-{label}.db").unlink(missing_ok=True)
    row = {
        "documents": report["documents"],
        "repeat": repeat,
        "dedupe": dedupe,
        "seconds": outcome["seconds"],
        "docs_per_second": round(report["documents"] / outcome["seconds"], 1),
        "tool_cpu": outcome["tool_cpu"],
        "peak_rss_mb": round(outcome["peak_rss_kb"] / 1024, 1),
        "cpu_marks": outcome["cpu_marks"],  # [documents, tool CPU seconds] as this run passed each mark
    }
    print(json.dumps(row), flush=True)
    return row


def _figures(runs: list[dict[str, Any]], ten_million: bool) -> dict[str, Any]:
    def median(n: int, key: str) -> float:
        return float(statistics.median(r[key] for r in runs if r["documents"] == n))

    def marginal(small: int, large: int) -> float:
        return (median(large, "tool_cpu") - median(small, "tool_cpu")) / (large - small) * 1e6  # us/doc

    base = marginal(30_000, 300_000)
    largest = TEN_MILLION if ten_million else 1_000_000
    top = marginal(1_000_000, TEN_MILLION) if ten_million else marginal(300_000, 1_000_000)
    spread = {
        n: [round(r["tool_cpu"], 2) for r in runs if r["documents"] == n]
        for n in sorted({r["documents"] for r in runs})
    }
    return {
        "marginal us/doc 30k -> 300k": round(base, 2),
        "marginal us/doc 300k -> 1M": round(marginal(300_000, 1_000_000), 2),
        **({"marginal us/doc 1M -> 10M": round(top, 2)} if ten_million else {}),
        "1 ratio largest step / 30k -> 300k": round(top / base, 3),
        "1 peak RSS MB at the largest size / at 1M": round(
            median(largest, "peak_rss_mb") / median(1_000_000, "peak_rss_mb"), 3
        ),
        "in-run marginal us/doc, each step, by size": {
            n: [_in_run(r["cpu_marks"]) for r in runs if r["documents"] == n] for n in sorted(spread)
        },
        "docs/s by size (median)": {n: median(n, "docs_per_second") for n in sorted(spread)},
        "tool CPU s by size (each run)": spread,
    }


def _in_run(marks: list[list[float]]) -> list[float]:
    """The marginal CPU per document between consecutive marks of one run (us): the same machine minute
    for every step, start-up and the final drain left out."""
    return [
        round((cpu - before_cpu) / (docs - before_docs) * 1e6, 2)
        for (before_docs, before_cpu), (docs, cpu) in itertools.pairwise(marks)
    ]


if __name__ == "__main__":
    raise SystemExit(main())
