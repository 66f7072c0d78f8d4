"""plan's ETA against the run that follows it, on three kinds of run (issue 44, target 3: within 25%).

    free     the `hash` embedder (384 dims), JSONL -> pgvector without an ANN index, shards of 5,000, defaults
    paced    the `paced` device at --busy-fraction of the free run's documents/s, the same corpus and target
    online   `kind = "openai"` through the emulator in its own process, which enforces a tokens-per-minute
             limit as the service does; [embedder] tokens_per_minute says the same limit
    minilm   all-MiniLM-L6-v2 on the CPU into Qdrant local mode, 4,000 documents whose first 400 texts are
             3-8 words and the rest 20-90 (a corpus whose first texts are not like the rest)

Each repetition plans (`commands.plan`, in this process, as `reindex plan` does) and then runs in a child
process (`reindex run`); the figure is the plan's headline ETA over the run's own `seconds` (the load: the
finalize, ANALYZE or an index build, is timed apart by the run and estimated apart by plan). Medians and
ranges over --repeats interleaved repetitions.

Usage: scripts/bench eta [--repeats 3] [--documents 200000] [--online-documents 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench
from bench_engine import _mean_words

DIM = 384
SHARD = 5000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--documents", type=int, default=200_000)
    parser.add_argument("--online-documents", type=int, default=20_000)
    parser.add_argument(
        "--tokens-per-minute", type=int, default=6_000_000, help="the emulator's limit, and the config's"
    )
    parser.add_argument("--busy-fraction", type=float, default=0.75, help="the paced device's rate")
    parser.add_argument("--cases", default="free,paced,online,minilm")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "reindex-bench-eta")
    parser.add_argument("--json", type=Path, help="write every run and the figures here too")
    args = parser.parse_args(argv)
    cases = args.cases.split(",")
    args.workdir.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    with bench.postgres(args.workdir) as dsn, emulator(args.tokens_per_minute) as endpoint:
        corpus = bench.synthetic_corpus(args.workdir, args.documents)
        online_corpus = bench.synthetic_corpus(args.workdir, args.online_documents)
        words = _mean_words(corpus)
        for repeat in range(args.repeats):
            free_rate = None
            if "free" in cases or "paced" in cases:
                row = _case(args, dsn, corpus, "free", repeat, {"kind": "hash", "dim": DIM})
                free_rate = row["run_documents"] / row["run_seconds"]
                runs.append(row)
            if "paced" in cases and free_rate:
                rate = args.busy_fraction * free_rate * words
                paced = {"kind": "paced", "dim": DIM, "rate": rate, "batch_tokens": 65536}
                runs.append(_case(args, dsn, corpus, "paced", repeat, paced))
            if "online" in cases:
                embedder = {
                    "kind": "openai",
                    "model": bench.ONLINE_MODEL,
                    "base_url": endpoint,
                    "api_key_env": bench.ONLINE_KEY_ENV,
                    "tokens_per_minute": args.tokens_per_minute,
                }
                runs.append(_case(args, dsn, online_corpus, "online", repeat, embedder))
            if "minilm" in cases:
                model = {"kind": "sentence-transformers", "model": str(bench.minilm_path()), "device": "cpu"}
                runs.append(_case(args, dsn, short_first(args.workdir), "minilm", repeat, model, qdrant=True))
    figures = {
        case: _summary([r["eta_over_run"] for r in runs if r["case"] == case])
        for case in cases
        if any(r["case"] == case for r in runs)
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "figures": figures}, indent=2))
    return 0


def _case(
    args: argparse.Namespace,
    dsn: str,
    corpus: Path,
    case: str,
    repeat: int,
    embedder: dict[str, Any],
    *,
    qdrant: bool = False,
) -> dict[str, Any]:
    from reindex import commands
    from reindex.config import load

    label = f"eta_{case}_{repeat}"
    target = {"kind": "pgvector", "dsn": dsn, "alias": label, "index": "none"}
    if qdrant:
        storage = args.workdir / f"qdrant-{label}"
        shutil.rmtree(storage, ignore_errors=True)
        target = {"kind": "qdrant", "path": str(storage), "alias": label}
    path = bench.write_config(
        args.workdir, label, bench.source(corpus), embedder, target, {"shard_size": SHARD}
    )
    started = time.perf_counter()
    plan = commands.plan(load(path))
    plan_seconds = time.perf_counter() - started
    outcome = bench.run_in_child(path, dsn)
    report = outcome["report"]
    row = {
        "case": case,
        "repeat": repeat,
        "plan_eta_seconds": plan.eta_headline_seconds,
        "eta_basis": plan.eta_basis,
        "plan_seconds": round(plan_seconds, 2),
        "run_seconds": report["seconds"],
        "run_documents": report["documents"],
        "eta_over_run": round((plan.eta_headline_seconds or 0.0) / report["seconds"], 3),
    }
    print(json.dumps(row), flush=True)
    return row


def short_first(workdir: Path, documents: int = 4000, short: int = 400) -> Path:
    """`documents` texts, the first `short` of 3-8 words and the rest of 20-90, from a fixed vocabulary."""
    path = workdir / f"short-first-{documents}.jsonl"
    if not path.exists():
        rng = random.Random(documents)
        words = [f"word{i}" for i in range(3000)]
        with path.open("w") as out:
            for i in range(documents):
                size = rng.randint(3, 8) if i < short else rng.randint(20, 90)
                text = " ".join(rng.choice(words) for _ in range(size))
                out.write(json.dumps({"id": f"d{i}", "text": text}) + "\n")
    return path


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": min(values), "max": max(values)}


@contextmanager
def emulator(tokens_per_minute: int) -> Iterator[str]:
    """The OpenAI emulator (`hash` at 1,536 dimensions) in its own process, enforcing `tokens_per_minute`
    over any 10 s window (its share of the minute), as the service enforces a per-minute limit."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    module = "reindex_adapters.testing.emulators.openai"
    command = [sys.executable, "-m", module, "--port", str(port), "--model", "hash"]
    server = subprocess.Popen(command, cwd=bench.ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ.setdefault(bench.ONLINE_KEY_ENV, "sk-bench-local")
    url = f"http://127.0.0.1:{port}/v1"
    try:
        bench.ready(url)
        faults = {"tokens_per_minute": tokens_per_minute, "limit_window_s": 10.0}
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/_emulator/faults",
            data=json.dumps(faults).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=10).read()
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    raise SystemExit(main())
