"""scripts/bench rollback measures a table-mode rollback's kept writes (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_rollback_measures_the_step_that_holds_writers(tmp_path: Path) -> None:
    out = tmp_path / "rollback.json"
    command = [
        sys.executable,
        "scripts/bench_rollback.py",
        "--rows",
        "3000",
        "--repeats",
        "2",
        "--json",
        str(out),
    ]
    done = subprocess.run(command, cwd=ROOT, timeout=240, capture_output=True, text=True, check=False)

    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())["3000"]
    assert (result["deleted"], result["changed"], result["added"]) == (10, 20, 10)
    assert len(result["held_seconds"]) == 2 and result["update_seconds_with_log"] > 0
