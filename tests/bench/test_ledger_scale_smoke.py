"""scripts/ledger_scale.py records its shards in a real ledger and reports a step per 100,000 texts (no
timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_ledger_scale_records_every_shard_and_reports_each_step(kind: str) -> None:
    command = [sys.executable, "scripts/ledger_scale.py", "--texts", "200000", "--shard", "20000"]
    done = subprocess.run(
        [*command, "--ledger", kind], cwd=ROOT, timeout=240, capture_output=True, text=True, check=False
    )

    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout)
    assert figures["ledger"] == kind and figures["texts"] == 200_000
    assert len(figures["wall_per_100k"]) == 2 and figures["wall_seconds"] > 0
