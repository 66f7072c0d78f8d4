"""scripts/bench-ray runs both parts on a tiny corpus and reports every figure (no timing asserted).

One actor count (2 actors of 0.5 CPU, cold and warm) keeps it to two Ray start-ups: under a minute on 2 cores.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS, SHARD, TEXTS, SHARDS_PER_WRITER = 600, 200, 200, 3
ENGINE_CASES = ("local", "ray_2", "ray_2_warm")
LEDGER_WRITERS = {"postgres": ("1", "2"), "sqlite": ("1", "2")}


def test_ray_bench_reports_engine_overhead_ray_startup_and_ledger_rates(tmp_path: Path) -> None:
    output = tmp_path / "ray.json"
    command = [str(ROOT / "scripts" / "bench-ray"), "--documents", str(DOCUMENTS), "--shard-size", str(SHARD)]
    command += ["--repeats", "1", "--actors", "2", "--writers", "1,2", "--sqlite-writers", "1,2"]
    command += ["--ledger-shards", str(SHARDS_PER_WRITER), "--texts", str(TEXTS)]
    command += ["--workdir", str(tmp_path / "bench"), "--json", str(output)]
    done = subprocess.run(command, cwd=ROOT, timeout=120, capture_output=True, text=True)

    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    report = json.loads(output.read_text())
    assert report["settings"]["repeats"] == 1 and report["machine"]["cpus"] >= 1

    engine = report["engine"]
    assert engine["documents"] == DOCUMENTS
    assert tuple(engine["cases"]) == ENGINE_CASES
    for name in ENGINE_CASES:
        case = engine["cases"][name]
        assert all(_positive(case[key]) for key in ("seconds", "docs_per_second", "steady_docs_per_second"))
        assert isinstance(case["per_run_seconds"], float)
        assert [run["documents"] for run in case["runs"]] == [DOCUMENTS]
        assert len(case["runs"][0]["results"]) >= 2  # shard results seen by the driver
    for name in ENGINE_CASES[1:]:
        case = engine["cases"][name]
        assert _positive(case["ratio"]) and _positive(case["steady_ratio"]), case
        assert abs(case["overhead"] - (case["ratio"] - 1)) < 0.002
        assert "break_even_documents" in case
        assert isinstance(engine["targets"][f"{name} overhead <= 15%"], bool)
    startup = engine["ray_startup"]
    assert all(
        _positive(startup[key]) for key in ("ray_init_seconds", "ray_ready_seconds", "ray_shutdown_seconds")
    )
    assert startup["ray_ready_seconds"] >= startup["ray_init_seconds"]
    warm = engine["cases"]["ray_2_warm"]["runs"][0]
    assert warm["ray_init_seconds"] is not None
    assert engine["cases"]["ray_2"]["runs"][0]["ray_init_seconds"] is None  # cold: inside the timed run

    ledger = report["ledger"]
    for backend, counts in LEDGER_WRITERS.items():
        assert tuple(ledger[backend]) == counts
        for writers in counts:
            row = ledger[backend][writers]
            assert row["shards"] == int(writers) * SHARDS_PER_WRITER
            assert _positive(row["shards_per_second"]) and _positive(row["texts_per_second"])
            assert abs(row["texts_per_second"] - row["shards_per_second"] * TEXTS) <= TEXTS
            assert all(_positive(row[key]) for key in ("claim_ms_p50", "claim_ms_p90", "record_ms_p50"))
            assert _positive(row["vs_one_writer"])

    for title in ("1. engine overhead", "2. ledger under concurrent writer processes", "Ray start-up"):
        assert title in done.stdout
    assert "target ray_2 overhead <= 15%" in done.stdout


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0
