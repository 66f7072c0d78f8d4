"""The processes engine measured by CPU accounting, which a noisy machine moves little.

Each run is `reindex run` (hash embedder, JSONL -> pgvector, no ANN index) in a child process that reports
its own CPU seconds (the coordinator: what `/proc/<pid>/stat` says of it) and those of its ended children
(the workers and model processes; the database server is not a child). Figures per document are marginal:
(CPU at the large size - CPU at the small size) / (the documents between), so start-up and imports, paid
once per run, do not count.

    1  coordinator CPU per document, processes engine                       target <= 5 us
    2  all the tool's processes per document / one process per document      target <= 1.2
    6  tool CPU per document at --large-million against --large              target <= 1.2  (--million)
    7  a paced device at 0.75 x the free run's documents/s: busy fraction    target >= 0.9

Usage: scripts/bench-engine [--repeats 3] [--small 10000] [--large 200000] [--million]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench

DIM = 384
SHARD = 5000
# `workers` values: RAY stands for engine = "ray" (a local Ray started by the run, its actors sized to it);
# PROCESSES for the processes engine on every core
RAY = 0
PROCESSES = max(2, len(os.sched_getaffinity(0)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--small", type=int, default=50_000)  # 10 shards: the workers start
    parser.add_argument("--large", type=int, default=200_000)
    parser.add_argument("--million", action="store_true", help="also 1,000,000 documents (target 6)")
    parser.add_argument("--ledger", choices=("sqlite", "postgres"), default="sqlite", help="the run's ledger")
    parser.add_argument(
        "--ray", action="store_true", help='also engine = "ray" on a local Ray (the alternative)'
    )
    parser.add_argument(
        "--busy-fraction", type=float, default=0.75, help="the paced device's R over the free rate"
    )
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "reindex-bench-engine")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"runs": []}
    with bench.postgres(args.workdir) as dsn:
        sizes = [args.small, args.large] + ([1_000_000] if args.million else [])
        corpora = {n: bench.synthetic_corpus(args.workdir, n) for n in sizes}
        words = _mean_words(corpora[args.small])
        for repeat in range(args.repeats):
            for n in sizes:
                for workers in (1, PROCESSES):
                    results["runs"].append(
                        _run(args.workdir, dsn, corpora[n], n, workers, repeat, ledger=args.ledger)
                    )
                if args.ray:
                    results["runs"].append(
                        _run(args.workdir, dsn, corpora[n], n, RAY, repeat, ledger=args.ledger)
                    )
            # case 4's rate in this repetition: the faster of one process and the processes engine
            free = max(r["docs_per_second"] for r in results["runs"][-4:] if r["documents"] == args.large)
            rate = args.busy_fraction * free * words
            paced = {"kind": "paced", "dim": DIM, "rate": rate, "batch_tokens": 65536}
            results["runs"].append(
                _run(
                    args.workdir,
                    dsn,
                    corpora[args.large],
                    args.large,
                    None,
                    repeat,
                    paced,
                    ledger=args.ledger,
                )
            )
    results["figures"] = _figures(results["runs"], args)
    print(json.dumps(results["figures"], indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _mean_words(corpus: Path) -> float:
    lines = corpus.read_text().splitlines()
    return statistics.fmean(len(json.loads(line)["text"].split()) for line in lines)


def _run(
    work: Path,
    dsn: str,
    corpus: Path,
    n: int,
    workers: int | None,
    repeat: int,
    embedder: dict[str, Any] | None = None,
    *,
    ledger: str = "sqlite",
) -> dict[str, Any]:
    name = "ray" if workers == RAY else workers or "all"
    label = f"e_{n}_{name}_{repeat}{'_paced' if embedder else ''}"
    run: dict[str, Any] = {"shard_size": SHARD} | ({"workers": workers} if workers else {})
    if workers == RAY:
        run = {"shard_size": SHARD, "engine": "ray"}
    target = {"kind": "pgvector", "dsn": dsn, "alias": label, "index": "none"}
    if ledger == "postgres":  # the ledger on the same (embedded) server: its work is the server's CPU
        run["state"] = dsn
    path = bench.write_config(
        work, label, bench.source(corpus), embedder or {"kind": "hash", "dim": DIM}, target, run
    )
    eta = None
    if workers != 1 and workers != RAY and n >= 100_000:  # plan's ETA, against the run that follows
        from reindex import commands
        from reindex.config import load

        eta = commands.plan(load(path)).eta_seconds_workers
    outcome = bench.run_in_child(path, dsn)
    report = outcome["report"]
    row = {
        "label": label,
        "documents": report["documents"],
        "workers": workers,
        "processes": report["processes"],
        "paced": embedder is not None,
        "seconds": outcome["seconds"],
        "docs_per_second": report["documents"] / outcome["seconds"],
        "coordinator_cpu": outcome["coordinator_cpu"],
        "tool_cpu": outcome["tool_cpu"],
        "coordinator_rss_mb": outcome["peak_rss_kb"] / 1024,
        "largest_child_rss_mb": outcome["children_maxrss_kb"] / 1024,
        "device_busy_fraction": report["device_busy_fraction"],
        "plan_eta_seconds": eta,
        "run_load_seconds": report["seconds"],
    }
    print(json.dumps(row), flush=True)
    return row


def _figures(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    def median(n: int, workers: int | None, key: str, paced: bool = False) -> float:
        values = [
            r[key] for r in runs if r["documents"] == n and r["workers"] == workers and r["paced"] == paced
        ]
        return float(statistics.median(values))

    def marginal(key: str, workers: int | None, large: int) -> float:
        return float(
            (median(large, workers, key) - median(args.small, workers, key)) / (large - args.small) * 1e6
        )

    one = marginal("tool_cpu", 1, args.large)
    figures: dict[str, Any] = {
        "1 coordinator us/doc (processes)": round(marginal("coordinator_cpu", PROCESSES, args.large), 2),
        "  one process us/doc (before)": round(one, 2),
        "2 all processes us/doc (processes)": round(marginal("tool_cpu", PROCESSES, args.large), 2),
        "2 ratio to one process": round(marginal("tool_cpu", PROCESSES, args.large) / one, 3),
        "docs/s processes": round(median(args.large, PROCESSES, "docs_per_second")),
        "docs/s one process": round(median(args.large, 1, "docs_per_second")),
        "7 paced device busy fraction": median(args.large, None, "device_busy_fraction", paced=True),
        "7 paced docs/s": round(median(args.large, None, "docs_per_second", paced=True)),
        "plan ETA / run (free)": round(
            median(args.large, PROCESSES, "plan_eta_seconds")
            / median(args.large, PROCESSES, "run_load_seconds"),
            2,
        ),
        "plan ETA / run (paced)": round(
            median(args.large, None, "plan_eta_seconds", paced=True)
            / median(args.large, None, "run_load_seconds", paced=True),
            2,
        ),
    }
    if args.ray:
        figures["ray: coordinator us/doc"] = round(marginal("coordinator_cpu", RAY, args.large), 2)
        figures["ray: all processes us/doc"] = round(marginal("tool_cpu", RAY, args.large), 2)
        figures["ray: docs/s"] = round(median(args.large, RAY, "docs_per_second"))
    if args.million:
        at_large = marginal("tool_cpu", PROCESSES, args.large)
        at_million = marginal("tool_cpu", PROCESSES, 1_000_000)
        figures["6 all processes us/doc to 1M"] = round(at_million, 2)
        figures["6 ratio 1M / large"] = round(at_million / at_large, 3)
        figures["6 one process ratio 1M / large"] = round(marginal("tool_cpu", 1, 1_000_000) / one, 3)
        figures["rss largest child MB large -> 1M"] = (
            median(args.large, PROCESSES, "largest_child_rss_mb"),
            median(1_000_000, PROCESSES, "largest_child_rss_mb"),
        )
    return figures


if __name__ == "__main__":
    raise SystemExit(main())
