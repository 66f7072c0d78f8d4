"""scripts/bench modes fills both pgvector target modes through the sink and flips each (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_modes_measures_both_modes_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "modes.json"
    command = [
        sys.executable,
        "scripts/bench_modes.py",
        "--rows",
        "2000",
        "--repeats",
        "1",
        "--json",
        str(out),
    ]
    done = subprocess.run(command, cwd=ROOT, timeout=240, capture_output=True, text=True, check=False)

    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())["sizes"]["2000"]
    for mode in ("table", "column"):
        medians = result["medians"][mode]
        assert medians["rows_per_second"] > 0 and medians["wal_bytes"] > 0 and medians["flip_ms"] > 0
    assert result["medians"]["column"]["table_growth"] > 1  # each row the fill wrote, once more
    assert set(result["column_over_table"]) == {"seconds", "wal_bytes", "added_bytes"}
