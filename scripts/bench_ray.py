"""What the `ray` engine costs against the local engine, and how far the ledger carries concurrent writers.

1. Engine overhead: the same migration (free `hash` embedder, JSONL -> pgvector without an ANN index,
   shard_size 2,000, SQLite ledger) with `engine = "local"` and `engine = "ray"` on a local Ray (num_cpus 2;
   1 actor, or 2 actors of 0.5 CPU each), every run in a fresh child process, cases interleaved per
   repetition. "cold": the engine starts and stops Ray inside the run, as `reindex run` does; "warm": the
   child starts Ray first (the engine then uses it and leaves it running). The warm children time Ray's
   start-up (ray.init, then a first task returned) and shut-down apart: the fixed cost a cold run pays.
   Every run also notes when each shard's result reached the driver: the rate between the first and the
   last result is the steady per-document cost, and seconds - documents / that rate the per-run cost, from
   which the corpus size where the ray run would come within 15% of the local one is extrapolated.
2. The ledger as the cluster's coordinator: N writer processes (spawned), fenced by one lease as the
   engine's actors are, each claiming 1,000 fresh texts and then recording the shard that settles them,
   on seqs of its own that join their neighbours; Postgres (one fresh database per case) and, for
   comparison, SQLite (one fresh file per case), which serialises its writers.

`python scripts/bench_ray.py [--documents 20000] [--repeats 3] [--writers 1,4,8]`: a rich table, and JSON in
.bench/ray.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import (  # the throughput bench's helpers: one way to start Postgres and build corpora
    ENVIRONMENT,
    ROOT,
    ZERO_DIM,
    console,
    drop_table,
    minilm_path,
    postgres,
    private_runtime_dir,
    source,
    synthetic_corpus,
    write_config,
)

OVERHEAD_TARGET = 0.15  # the target: a ray run at most 15% slower than the local engine
RAY_CPUS = 2
LEASE_KEY = "bench-ray-ledger"
BARRIER_SECONDS = 120.0
# ray.init() without an address joins the newest Ray already running on this machine (another process's,
# found through /tmp/ray/ray_current_cluster) and then refuses num_cpus: "local" always starts one of its own.
LOCAL_RAY = {"RAY_ADDRESS": "local"}


@dataclass(frozen=True)
class EngineCase:
    """One way to run the migration: the engine, its [ray] section, and whether Ray is up beforehand."""

    name: str
    engine: str
    ray: dict[str, Any] = field(default_factory=dict)
    warm: bool = False

    @property
    def label(self) -> str:
        if self.engine == "local":
            return "local"
        actors = self.ray["actors"]
        share = f" × {self.ray['cpus_per_actor']:g} CPU" if "cpus_per_actor" in self.ray else ""
        return f"ray, {actors} actor{'s' if actors > 1 else ''}{share}, {'warm' if self.warm else 'cold'}"


@dataclass
class EngineRun:
    """One timed migration in a child process."""

    seconds: float  # commands.run, wall
    documents: int
    report_seconds: float  # RunReport.seconds (the load, without finalize)
    results: list[tuple[float, int]]  # (seconds since commands.run began, documents done) per shard result
    ray_init_seconds: float | None = None  # warm children: ray.init returning
    ray_ready_seconds: float | None = None  # ... and a first task's result back (from the same start)
    ray_shutdown_seconds: float | None = None

    @property
    def docs_per_second(self) -> float:
        return self.documents / self.seconds

    def steady(self) -> tuple[float, float] | None:
        """(documents per second between the first and the last shard result, the per-run seconds left
        once every document is charged at that rate): seconds = per-run + documents / rate."""
        if len(self.results) < 2 or self.results[-1][0] <= self.results[0][0]:
            return None
        (first, done_first), (last, done_last) = self.results[0], self.results[-1]
        rate = (done_last - done_first) / (last - first)
        return rate, self.seconds - self.documents / rate


@dataclass
class LedgerRun:
    """N writers through one ledger for one case: every writer's shards, span and call latencies."""

    backend: str
    writers: int
    texts: int  # per shard
    shards: list[int]  # per writer
    wall_seconds: float  # first writer's start to last writer's end
    claim_seconds: list[float]
    record_seconds: list[float]

    @property
    def shards_per_second(self) -> float:
        return sum(self.shards) / self.wall_seconds

    @property
    def texts_per_second(self) -> float:
        return self.shards_per_second * self.texts


# ---- entry points ----


def main(argv: Sequence[str] | None = None) -> int:
    """Run both parts (or, with --child, one migration whose timings go to a file)."""
    args = parse_args(argv)
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    if args.child:
        return run_child(Path(args.child))
    os.environ.setdefault("XDG_RUNTIME_DIR", private_runtime_dir())
    results = benchmark(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    for table in render(results):
        console.print(table)
    console.print(f"JSON: {args.json}")
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--documents", type=int, default=20_000, help="synthetic corpus size (part 1)")
    parser.add_argument("--shard-size", type=int, default=2000, help="[run] shard_size (part 1)")
    parser.add_argument(
        "--embedder",
        choices=("hash", "minilm"),
        default="hash",
        help="part 1: the free hash embedder (plumbing only), or all-MiniLM-L6-v2 fp32 on CPU (real work)",
    )
    parser.add_argument(
        "--model-ms",
        type=float,
        default=0.0,
        help="hash: every model call also takes this long off the CPU (a sleep), standing for a GPU-bound"
        " model on this CPU-only machine: the model's time does not compete for the cores",
    )
    parser.add_argument(
        "--shards-per-actor", type=int, default=None, help="[ray] shards_per_actor (default: the config's)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="minilm: [embedder] threads for both engines (default: every core, what the local engine's torch"
        " takes; Ray would give an actor of one CPU one thread, which is other work)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="interleaved repetitions, both parts (medians)"
    )
    parser.add_argument(
        "--actors", type=_counts, default=(1, 2), help="ray actor counts (default 1,2; 2+ share the CPUs)"
    )
    parser.add_argument(
        "--cpus-per-actor", type=float, default=None, help="[ray] cpus_per_actor (default 1, or 1/actors)"
    )
    parser.add_argument("--writers", type=_counts, default=(1, 4, 8), help="Postgres ledger writer processes")
    parser.add_argument(
        "--sqlite-writers", type=_counts, default=(1, 4), help="SQLite ledger writer processes"
    )
    parser.add_argument("--ledger-seconds", type=float, default=5.0, help="how long each writer records")
    parser.add_argument(
        "--ledger-shards", type=int, default=None, help="instead: this many shards per writer (fixed work)"
    )
    parser.add_argument("--texts", type=int, default=1000, help="texts claimed and settled per shard")
    parser.add_argument("--skip-engine", action="store_true", help="only part 2 (the ledger)")
    parser.add_argument("--skip-ledger", action="store_true", help="only part 1 (the engines)")
    parser.add_argument("--workdir", type=Path, default=ROOT / ".bench", help="cache and scratch folder")
    parser.add_argument(
        "--json", type=Path, default=None, help="where the JSON goes (default WORKDIR/ray.json)"
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.workdir = args.workdir.resolve()
    args.json = (args.json or args.workdir / "ray.json").resolve()
    args.threads = args.threads or os.cpu_count() or 1
    return args


def _counts(text: str) -> tuple[int, ...]:
    counts = tuple(int(part) for part in text.split(",") if part.strip())
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"a comma-separated list of positive counts, not {text!r}")
    return counts


def engine_cases(
    actors: Sequence[int], cpus_per_actor: float | None = None, shards_per_actor: int | None = None
) -> list[EngineCase]:
    """local, then per actor count a cold and a warm ray case. Two actors or more share the 2 CPUs
    (cpus_per_actor 1/actors), so the read tasks still get a CPU."""
    cases = [EngineCase("local", "local")]
    for count in actors:
        ray: dict[str, Any] = {"num_cpus": RAY_CPUS, "actors": count}
        if shards_per_actor is not None:
            ray["shards_per_actor"] = shards_per_actor
        if cpus_per_actor is not None:
            ray["cpus_per_actor"] = cpus_per_actor
        elif count > 1:
            ray["cpus_per_actor"] = round(1 / count, 3)
        cases.append(EngineCase(f"ray_{count}", "ray", ray))
        cases.append(EngineCase(f"ray_{count}_warm", "ray", ray, warm=True))
    return cases


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Start Postgres once; run the engine cases, then the ledger cases, each interleaved per repetition."""
    args.workdir.mkdir(parents=True, exist_ok=True)
    work = args.workdir / "ray-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    load_before = os.getloadavg()
    started = time.perf_counter()
    cases = engine_cases(args.actors, args.cpus_per_actor, args.shards_per_actor)
    with postgres(args.workdir) as dsn:
        engine = None if args.skip_engine else engine_part(args, work, dsn, cases)
        ledger = None if args.skip_ledger else ledger_part(args, work, dsn)
    shutil.rmtree(work, ignore_errors=True)
    return {
        "machine": machine(load_before, time.perf_counter() - started),
        "settings": settings(args, cases),
        "engine": engine,
        "ledger": ledger,
    }


def engine_part(
    args: argparse.Namespace, work: Path, dsn: str, cases: Sequence[EngineCase]
) -> dict[str, Any]:
    corpus = synthetic_corpus(args.workdir, args.documents)
    runs: dict[str, list[EngineRun]] = {case.name: [] for case in cases}
    for repeat in range(args.repeats):
        for case in cases:
            console.print(f"[dim]repeat {repeat + 1}/{args.repeats}: {case.label}[/]")
            run = engine_case(args, work, dsn, corpus, case, repeat)
            runs[case.name].append(run)
            console.print(f"  {run.documents:,} documents in {run.seconds:.2f} s")
    embedder = f"{args.embedder}, {args.model_ms:g} ms per model call" if args.model_ms else args.embedder
    return {**engine_results(cases, runs), "embedder": embedder}


def ledger_part(args: argparse.Namespace, work: Path, dsn: str) -> dict[str, Any]:
    plan = [("postgres", n) for n in args.writers] + [("sqlite", n) for n in args.sqlite_writers]
    runs: dict[tuple[str, int], list[LedgerRun]] = {}
    for repeat in range(args.repeats):
        for backend, writers in plan:
            console.print(f"[dim]repeat {repeat + 1}/{args.repeats}: {backend} ledger, {writers} writers[/]")
            run = ledger_case(args, work, dsn, backend, writers, repeat)
            runs.setdefault((backend, writers), []).append(run)
            console.print(
                f"  {sum(run.shards):,} shards in {run.wall_seconds:.2f} s:"
                f" {run.shards_per_second:,.1f} shards/s, {run.texts_per_second:,.0f} texts/s"
            )
    return ledger_results(runs)


def machine(load_before: tuple[float, float, float], seconds: float) -> dict[str, Any]:
    import ray

    return {
        "cpus": os.cpu_count(),
        "ray": ray.__version__,
        "python": sys.version.split()[0],
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "bench_seconds": round(seconds, 1),
    }


def settings(args: argparse.Namespace, cases: Sequence[EngineCase]) -> dict[str, Any]:
    return {
        "repeats": args.repeats,
        "engine": {
            "documents": args.documents,
            "shard_size": args.shard_size,
            "source": "synthetic JSONL, 20-80 words per document (scripts/bench.py synthetic_corpus)",
            "embedder": embedder_section(args),
            "target": "pgvector, index none (embedded Postgres)",
            "ledger": "SQLite, a fresh file per run",
            "cases": {
                case.name: {"engine": case.engine, "ray": case.ray, "warm": case.warm} for case in cases
            },
            "timed": "commands.run in a fresh child process (imports not timed); cold ray cases include"
            " ray.init and ray.shutdown, warm ones neither (timed apart as ray_startup)",
        },
        "ledger": {
            "postgres_writers": list(args.writers),
            "sqlite_writers": list(args.sqlite_writers),
            "seconds_per_case": None if args.ledger_shards else args.ledger_seconds,
            "shards_per_writer": args.ledger_shards,
            "texts_per_shard": args.texts,
            "shard": "claim_texts({hash: owner} of fresh random hashes), then record_shard settling them"
            " (texts 'written', owners as the pipeline's _record passes them); writer w of N records seqs"
            " w, w+N, ... of one plan with cursors c{seq-1} -> c{seq}, so neighbours join",
            "fenced": "every write checks the lease token the parent holds, as the ray engine's actors do",
            "processes": "multiprocessing spawn; each writer opens its ledger, then all start at a barrier",
        },
    }


# ---- part 1: the engines ----


def embedder_section(args: argparse.Namespace) -> dict[str, Any]:
    if args.embedder == "minilm":
        return {"kind": "sentence-transformers", "model": str(minilm_path()), "threads": args.threads}
    if args.model_ms:
        return {"kind": "hash", "dim": ZERO_DIM, "latency_ms": args.model_ms}
    return {"kind": "hash", "dim": ZERO_DIM}


def engine_case(
    args: argparse.Namespace, work: Path, dsn: str, corpus: Path, case: EngineCase, repeat: int
) -> EngineRun:
    """One migration into a fresh target with a fresh ledger, in a child; the target is dropped after."""
    label = f"{case.name}-{repeat}"
    embedder = embedder_section(args)
    target = {"kind": "pgvector", "dsn": dsn, "alias": f"bench_ray_{case.name}_{repeat}", "index": "none"}
    run = {"shard_size": args.shard_size, "engine": case.engine}
    path = write_config(work, label, source(corpus), embedder, target, run)
    if case.ray:
        with path.open("a", encoding="utf-8") as handle:
            handle.write(
                "[ray]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in case.ray.items())
            )
    spec = work / f"{label}.child.json"
    spec.write_text(json.dumps({"config": str(path), "warm": case.warm, "ray": case.ray}))
    child = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", str(spec)],
        env={**os.environ, **LOCAL_RAY},
        capture_output=True,
        text=True,
        check=False,
    )
    if child.returncode != 0:
        sys.stderr.write(child.stderr[-6000:])
        raise SystemExit(f"{case.name} (repeat {repeat + 1}) failed with exit {child.returncode}")
    outcome = json.loads(spec.with_suffix(".out").read_text())
    drop_table(dsn, outcome.pop("target"))
    outcome["results"] = [tuple(pair) for pair in outcome["results"]]
    return EngineRun(**outcome)


def run_child(spec_path: Path) -> int:
    """Only the migration (Ray started first when warm): its timings, written beside the spec."""
    from reindex import commands
    from reindex.config import load
    from reindex.run.pipeline import Progress

    spec = json.loads(spec_path.read_text())
    config = load(Path(spec["config"]))
    ray_times: dict[str, float] = {}
    if spec["warm"]:
        ray_times = start_ray(spec["ray"])
    results: list[tuple[float, int]] = []

    def noted(progress: Progress) -> None:
        if not results or results[-1][1] != progress.documents:
            results.append((time.perf_counter() - started, progress.documents))

    started = time.perf_counter()
    report = commands.run(config, on_progress=noted)
    seconds = time.perf_counter() - started
    if spec["warm"]:
        import ray

        stopping = time.perf_counter()
        ray.shutdown()
        ray_times["ray_shutdown_seconds"] = time.perf_counter() - stopping
    outcome = {
        "seconds": seconds,
        "documents": report.documents,
        "report_seconds": report.seconds,
        "results": results,
        "target": report.target,
        **ray_times,
    }
    spec_path.with_suffix(".out").write_text(json.dumps(outcome))
    return 0


def start_ray(settings: dict[str, Any]) -> dict[str, float]:
    """A local Ray as the engine starts one (same options), timed to ray.init and to a first task's result."""
    import ray
    import ray.data

    started = time.perf_counter()
    ray.init(
        address="local",
        num_cpus=settings.get("num_cpus"),
        namespace=settings.get("namespace"),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    initialized = time.perf_counter() - started
    ray.get(ray.remote(_ready).remote())
    ready = time.perf_counter() - started
    ray.data.DataContext.get_current().enable_progress_bars = False
    return {"ray_init_seconds": initialized, "ray_ready_seconds": ready}


def _ready() -> bool:
    return True


def engine_results(cases: Sequence[EngineCase], runs: dict[str, list[EngineRun]]) -> dict[str, Any]:
    """Medians per case; per-repetition ray/local ratios (paired, then the median); the fixed and the
    per-document parts of the overhead; the 15% target judged per ray case."""
    local = runs["local"]
    summary: dict[str, Any] = {}
    for case in cases:
        summary[case.name] = case_summary(runs[case.name], local if case.engine == "ray" else None)
        summary[case.name]["label"] = case.label
    warm = [run for case in cases if case.warm for run in runs[case.name]]
    startup = {
        key: _median([getattr(run, key) for run in warm], 3)
        for key in ("ray_init_seconds", "ray_ready_seconds", "ray_shutdown_seconds")
        if warm
    }
    targets = {
        f"{name} overhead <= {OVERHEAD_TARGET:.0%}": row["overhead"] <= OVERHEAD_TARGET
        for name, row in summary.items()
        if "overhead" in row
    }
    return {"documents": local[0].documents, "cases": summary, "ray_startup": startup, "targets": targets}


def case_summary(runs: Sequence[EngineRun], local: Sequence[EngineRun] | None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "seconds": _median([run.seconds for run in runs], 3),
        "docs_per_second": _median([run.docs_per_second for run in runs], 1),
        "report_seconds": _median([run.report_seconds for run in runs], 3),
    }
    steady = [run.steady() for run in runs]
    if all(s is not None for s in steady):
        row["steady_docs_per_second"] = _median([s[0] for s in steady if s], 1)
        row["per_run_seconds"] = _median([s[1] for s in steady if s], 3)
        row["first_result_seconds"] = _median([run.results[0][0] for run in runs], 3)
    if local is not None:
        ratios = [run.seconds / base.seconds for run, base in zip(runs, local, strict=True)]
        row["ratio"] = _median(ratios, 3)
        row["overhead"] = round(row["ratio"] - 1, 3)
        row["extra_seconds"] = _median(
            [run.seconds - base.seconds for run, base in zip(runs, local, strict=True)], 3
        )
        pairs = [(run.steady(), base.steady()) for run, base in zip(runs, local, strict=True)]
        if all(r is not None and b is not None for r, b in pairs):
            # per document: how much slower the steady stream is than the local engine's
            row["steady_ratio"] = _median([b[0] / r[0] for r, b in pairs if r and b], 3)
            row["break_even_documents"] = break_even(row, case_summary(local, None))
    row["runs"] = [
        {**asdict(run), "docs_per_second": round(run.docs_per_second, 1), "steady": run.steady()}
        for run in runs
    ]
    return row


def break_even(ray: dict[str, Any], local: dict[str, Any]) -> int | None:
    """The corpus size from which this case would stay within the target, extrapolated linearly from both
    engines' per-run seconds and steady rates (None: its steady rate alone is over the target)."""
    margin = 1 + OVERHEAD_TARGET
    per_doc = margin / float(local["steady_docs_per_second"]) - 1 / float(ray["steady_docs_per_second"])
    if per_doc <= 0:
        return None
    fixed = float(ray["per_run_seconds"]) - margin * float(local["per_run_seconds"])
    return max(0, round(fixed / per_doc))


# ---- part 2: the ledger ----


def ledger_case(
    args: argparse.Namespace, work: Path, dsn: str, backend: str, writers: int, repeat: int
) -> LedgerRun:
    """`writers` processes recording through one fresh ledger (database or file) under one held lease."""
    with fresh_ledger(work, dsn, backend, f"{writers}w_{repeat}") as location:
        ledger = open_ledger(backend, location)
        try:
            with ledger.lease(LEASE_KEY) as lease:
                plan_id = f"bench-{backend}-{writers}-{repeat}"
                ledger.begin(plan_id, alias="bench", target="bench__t", fingerprint="f" * 16, model={})
                outcomes = spawn_writers(args, backend, location, plan_id, (lease.key, lease.token), writers)
        finally:
            ledger.close()
    starts, ends = [o["started"] for o in outcomes], [o["ended"] for o in outcomes]
    return LedgerRun(
        backend,
        writers,
        args.texts,
        [o["shards"] for o in outcomes],
        max(ends) - min(starts),
        [s for o in outcomes for s in o["claim_seconds"]],
        [s for o in outcomes for s in o["record_seconds"]],
    )


@contextmanager
def fresh_ledger(work: Path, dsn: str, backend: str, name: str) -> Iterator[str]:
    """A Postgres database or a SQLite file of its own, so every case starts from empty tables."""
    if backend == "sqlite":
        folder = Path(tempfile.mkdtemp(prefix=f"ledger-{name}-", dir=work))
        try:
            yield str(folder / "state.db")
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    import psycopg
    from psycopg import sql

    database = f"bench_ledger_{name}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(database)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    try:
        yield psycopg.conninfo.make_conninfo(dsn, dbname=database)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))


def open_ledger(backend: str, location: str) -> Any:
    if backend == "sqlite":
        from reindex.state.sqlite import SqliteLedger

        return SqliteLedger(location)
    from reindex_adapters.postgres.ledger import PostgresLedger

    return PostgresLedger(location)


def spawn_writers(
    args: argparse.Namespace, backend: str, location: str, plan_id: str, lease: tuple[str, int], writers: int
) -> list[dict[str, Any]]:
    """Start the writers (spawn: nothing inherited), wait for all of them, and return their outcomes."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(writers)
    outcomes = context.Queue()
    budget = {"seconds": args.ledger_seconds, "shards": args.ledger_shards, "texts": args.texts}
    processes = [
        context.Process(
            target=ledger_writer,
            args=(backend, location, plan_id, lease, writer, writers, budget, barrier, outcomes),
            name=f"ledger-writer-{writer}",
        )
        for writer in range(writers)
    ]
    for process in processes:
        process.start()
    collected: list[dict[str, Any]] = []
    deadline = time.monotonic() + BARRIER_SECONDS + (args.ledger_seconds or 0) * 4 + 60
    try:
        while len(collected) < writers:
            try:
                collected.append(outcomes.get(timeout=max(1.0, deadline - time.monotonic())))
            except queue.Empty:
                raise SystemExit(f"{backend} ledger writers did not finish in time") from None
    finally:
        for process in processes:
            process.join(timeout=30)
    failed = [o["error"] for o in collected if "error" in o]
    if failed:
        sys.stderr.write(failed[0])
        raise SystemExit(f"{len(failed)} of {writers} {backend} ledger writers failed")
    return collected


def ledger_writer(
    backend: str,
    location: str,
    plan_id: str,
    lease: tuple[str, int],
    writer: int,
    writers: int,
    budget: dict[str, Any],
    barrier: Any,
    outcomes: Any,
) -> None:
    """One writer process: open the ledger, fence it with the parent's lease, wait for the others, then
    claim and record shards w, w+N, ... until the time or the shard budget is spent."""
    try:
        outcomes.put(write_shards(backend, location, plan_id, lease, writer, writers, budget, barrier))
    except BaseException:
        outcomes.put({"error": traceback.format_exc()})
        barrier.abort()


def write_shards(
    backend: str,
    location: str,
    plan_id: str,
    lease: tuple[str, int],
    writer: int,
    writers: int,
    budget: dict[str, Any],
    barrier: Any,
) -> dict[str, Any]:
    from reindex.state.records import Lease, ShardResult

    ledger = open_ledger(backend, location)
    ledger.fence(Lease(*lease))
    texts, shards_budget = int(budget["texts"]), budget["shards"]
    claims: list[float] = []
    records: list[float] = []
    barrier.wait(timeout=BARRIER_SECONDS)
    started = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process on this machine
    deadline = started + float(budget["seconds"])
    done = 0
    while (done < shards_budget) if shards_budget else (time.monotonic() < deadline):
        seq = writer + done * writers
        owners = {secrets.token_hex(32): f"w{writer}-s{seq}-d{i}" for i in range(texts)}
        before = time.monotonic()
        held = ledger.claim_texts(plan_id, owners)
        claimed = time.monotonic()
        if held:
            raise RuntimeError(f"{len(held)} fresh texts were held by another document")
        ledger.record_shard(
            plan_id,
            ShardResult(
                seq,
                f"c{seq - 1}" if seq else None,
                f"c{seq}",
                documents=texts,
                written=texts,
                dead_letters=(),
                duplicates=0,
                reused=0,
                tokens=texts * 50,
                truncated=0,
                seconds=claimed - before,
                texts=[(digest, "written") for digest in owners],
                owners=owners,
            ),
        )
        recorded = time.monotonic()
        claims.append(claimed - before)
        records.append(recorded - claimed)
        done += 1
    ended = time.monotonic()
    ledger.close()
    return {
        "shards": done,
        "started": started,
        "ended": ended,
        "claim_seconds": claims,
        "record_seconds": records,
    }


def ledger_results(runs: dict[tuple[str, int], list[LedgerRun]]) -> dict[str, Any]:
    """Per backend and writer count: medians over repetitions, call latencies, and the scaling against one
    writer of the same backend (aggregate shards per second, paired per repetition)."""
    results: dict[str, Any] = {}
    for (backend, writers), cases in runs.items():
        claims = [s for run in cases for s in run.claim_seconds]
        records = [s for run in cases for s in run.record_seconds]
        row: dict[str, Any] = {
            "writers": writers,
            "shards_per_second": _median([run.shards_per_second for run in cases], 1),
            "texts_per_second": _median([run.texts_per_second for run in cases], 0),
            "shards": _median([sum(run.shards) for run in cases], 1),
            "wall_seconds": _median([run.wall_seconds for run in cases], 3),
            "claim_ms_p50": _quantile_ms(claims, 0.5),
            "claim_ms_p90": _quantile_ms(claims, 0.9),
            "record_ms_p50": _quantile_ms(records, 0.5),
            "record_ms_p90": _quantile_ms(records, 0.9),
        }
        single = runs.get((backend, 1))
        if single is not None:
            pairs = zip(cases, single, strict=True)
            row["vs_one_writer"] = _median(
                [run.shards_per_second / one.shards_per_second for run, one in pairs], 2
            )
        row["runs"] = [
            {
                "shards_per_writer": run.shards,
                "wall_seconds": round(run.wall_seconds, 3),
                "shards_per_second": round(run.shards_per_second, 1),
                "texts_per_second": round(run.texts_per_second),
            }
            for run in cases
        ]
        results.setdefault(backend, {})[str(writers)] = row
    return results


def _quantile_ms(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def _median(values: Sequence[float], digits: int = 2) -> float:
    return round(statistics.median(values), digits)


# ---- results ----


def render(results: dict[str, Any]) -> list[Table]:
    """The engines (time, ratio, overhead, steady rate, per-run cost) with Ray's start-up, then the ledger."""
    machine, repeats = results["machine"], results["settings"]["repeats"]
    caption = (
        f"medians of {repeats} interleaved repetitions; {machine['cpus']} CPUs, Ray {machine['ray']}; load average"
        f" before {machine['load_average_before']}, after {machine['load_average_after']};"
        f" {machine['bench_seconds']} s in all"
    )
    tables = []
    engine = results["engine"]
    if engine is not None:
        tables.append(engine_table(engine, caption))
    if results["ledger"] is not None:
        tables.append(ledger_table(results["ledger"], results["settings"]["ledger"], caption))
    return tables


def engine_table(engine: dict[str, Any], caption: str) -> Table:
    table = Table(
        title=f"1. engine overhead: {engine['documents']:,} documents, {engine.get('embedder', 'hash')} → pgvector"
        " (no index)",
        caption="cold: the run starts and stops Ray; warm: Ray was started before the run. steady: documents/s"
        " between the first and the last shard result; per-run: seconds - documents / steady. " + caption,
    )
    columns = (
        "case",
        "seconds",
        "docs/s",
        "× local",
        "overhead",
        "steady docs/s",
        "steady × local",
        "per-run s",
    )
    for column in (*columns, "break-even docs"):
        table.add_column(column, justify="left" if column == "case" else "right")
    for row in engine["cases"].values():
        table.add_row(
            row["label"],
            f"{row['seconds']:.2f}",
            f"{row['docs_per_second']:,.0f}",
            _fixed(row.get("ratio"), 2),
            "" if "overhead" not in row else f"{row['overhead']:+.0%}",
            _fixed(row.get("steady_docs_per_second"), 0, ","),
            _fixed(row.get("steady_ratio"), 2),
            _fixed(row.get("per_run_seconds"), 2),
            _break_even(row),
        )
    startup = engine["ray_startup"]
    if startup:
        table.add_section()
        table.add_row("Ray start-up: ray.init returned", f"{startup['ray_init_seconds']:.2f}")
        table.add_row("Ray start-up: a first task's result back", f"{startup['ray_ready_seconds']:.2f}")
        table.add_row("Ray shut-down", f"{startup['ray_shutdown_seconds']:.2f}")
    table.add_section()
    for name, met in engine["targets"].items():
        table.add_row(f"target {name}", "met" if met else "NOT MET")
    return table


def ledger_table(ledger: dict[str, Any], settings: dict[str, Any], caption: str) -> Table:
    budget = (
        f"{settings['shards_per_writer']} shards per writer"
        if settings["shards_per_writer"]
        else f"{settings['seconds_per_case']:g} s per case"
    )
    table = Table(
        title=f"2. ledger under concurrent writer processes: claim {settings['texts_per_shard']:,} texts, then"
        f" record the shard ({budget})",
        caption=caption,
    )
    columns = ("ledger", "shards/s", "texts/s", "× 1 writer", "claim ms p50", "p90", "record ms p50", "p90")
    for column in columns:
        table.add_column(column, justify="left" if column == "ledger" else "right")
    for backend, rows in ledger.items():
        for writers, row in rows.items():
            table.add_row(
                f"{backend}, {writers} writer{'s' if int(writers) > 1 else ''}",
                f"{row['shards_per_second']:,.1f}",
                f"{row['texts_per_second']:,.0f}",
                _fixed(row.get("vs_one_writer"), 2),
                _fixed(row["claim_ms_p50"], 1),
                _fixed(row["claim_ms_p90"], 1),
                _fixed(row["record_ms_p50"], 1),
                _fixed(row["record_ms_p90"], 1),
            )
    return table


def _fixed(value: float | None, digits: int, grouping: str = "") -> str:
    return "" if value is None else f"{value:{grouping}.{digits}f}"


def _break_even(row: dict[str, Any]) -> str:
    if "break_even_documents" not in row:
        return ""
    value = row["break_even_documents"]
    return "never: steady rate" if value is None else f"{value:,}"


if __name__ == "__main__":
    sys.exit(main())
