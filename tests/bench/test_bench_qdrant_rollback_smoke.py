"""scripts/bench qdrant-rollback measures a Qdrant rollback's two comparison passes (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_qdrant_rollback_measures_both_passes(tmp_path: Path) -> None:
    out = tmp_path / "qdrant-rollback.json"
    command = [sys.executable, "scripts/bench_qdrant_rollback.py", "--points", "600", "--repeats", "1"]
    done = subprocess.run(
        [*command, "--json", str(out)], cwd=ROOT, timeout=240, capture_output=True, text=True, check=False
    )

    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())["600"]
    assert result["written_meanwhile"] == 8 and len(result["first_pass_seconds"]) == 1
