"""The benchmark script runs end to end on a small corpus and reports every figure (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = (
    "raw",
    "naive",
    "reindex_pgvector",
    "reindex_qdrant",
    "zero_cost",
    "copy",
    "endpoint",
    "reindex_online",
)
TOKENIZER_CASES = ("tokenizer", "encode_batch")  # measured once the hash embedder takes a tokenizer
RATES = ("docs_per_second", "tokens_per_second", "seconds")
RATIOS = (
    "pgvector_vs_raw",
    "pgvector_vs_naive",
    "qdrant_vs_raw",
    "qdrant_vs_naive",
    "zero_cost_vs_copy",
    "online_vs_endpoint",
)
REMOTE = ("endpoint", "reindex_online")  # a remote model: no padding or model-busy figure


def test_quick_bench_reports_every_case_ratio_and_memory_figure_as_positive_numbers(tmp_path):
    results = tmp_path / "results.json"
    command = [sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--skip-million"]
    command += ["--documents", "60", "--zero-documents", "1000", "--workdir", str(tmp_path / "bench")]
    done = subprocess.run(
        [*command, "--json", str(results)], cwd=ROOT, check=True, timeout=120, capture_output=True, text=True
    )

    data = json.loads(results.read_text())
    assert (tmp_path / "bench" / "results.json").read_text() == results.read_text()
    measured = CASES + (TOKENIZER_CASES if "tokenizer" in data["cases"] else ())
    for case in measured:
        figures = data["cases"][case]
        assert all(_positive(figures[name]) for name in RATES), (case, figures)
        if case in REMOTE:
            assert figures["padding_fraction"] is None and figures["model_busy_fraction"] is None
        else:
            assert 0 <= figures["padding_fraction"] < 1, (case, figures)
    assert _positive(data["cases"]["zero_cost"]["model_busy_fraction"])
    assert data["cases"]["raw"]["documents"] == 60
    assert data["cases"]["copy"]["documents"] == data["cases"]["zero_cost"]["documents"] == 1000
    assert data["cases"]["batch_local"]["documents"] == data["cases"]["batch_local"]["written"] == 1000
    assert all(_positive(data["ratios"][name]) for name in RATIOS), data["ratios"]
    pgvector = data["cases"]["reindex_pgvector"]
    assert _positive(pgvector["index_seconds"]) and _positive(pgvector["plain_index_seconds"])
    assert _positive(data["ratios"]["index_vs_plain"])
    online = data["cases"]["reindex_online"]
    assert (
        online["requests"] >= 1 and online["rate_limited"] == 0 and _positive(online["requests_per_second"])
    )
    assert online["documents"] == data["cases"]["endpoint"]["documents"] == 60
    zero = data["zero_cost"]
    assert zero["documents"] == 1000
    assert _positive(zero["docs_per_second"]) and _positive(zero["peak_rss_mb"])
    assert zero["large_documents"] is None and zero["rss_ratio"] is None
    judged = {name: met for name, met in data["targets"].items() if "rss" not in name}
    assert any(name.startswith("zero_cost_vs_copy >=") for name in judged)
    assert any(name.startswith("index_vs_plain <=") for name in judged)
    assert any(name.startswith("online_vs_endpoint >=") for name in judged)
    assert all(isinstance(met, bool) for name, met in judged.items() if "tokenizer" not in name)
    for name in (*RATIOS, "index_vs_plain", "tokenizer_vs_encode_batch"):
        assert f"ratio {name}" in done.stdout


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0
