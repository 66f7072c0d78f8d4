"""Drive the real `reindex` command as a subprocess and inspect what it left behind."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from reindex.ui.cli import app
from reindex_adapters.testing.memory import HashEmbedder

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "chi",
    "psi",
    "omega",
    "vector",
    "index",
    "alias",
    "shard",
    "ledger",
    "cursor",
]


def write_corpus(path: Path, n: int, *, poison: bool = False, seed: int = 7) -> dict[str, str]:
    """A JSONL corpus of mixed lengths and some repeated texts; returns id -> text of clean documents."""
    rng = np.random.default_rng(seed)
    texts: dict[str, str] = {}
    with path.open("w") as out:
        for i in range(n):
            words = rng.choice(WORDS, size=int(rng.integers(3, 60))).tolist()
            text = " ".join(words) if i % 23 else "a repeated text shared by many documents"
            texts[f"doc-{i:06d}"] = text
            out.write(json.dumps({"id": f"doc-{i:06d}", "text": text}) + "\n")
        if poison:
            for line in POISON_LINES:
                out.write(line + "\n")
    return texts


# Every dead-letter reason a JSONL source and the hash embedder can produce, mixed into clean documents.
POISON_LINES = [
    json.dumps({"id": "p-empty", "text": ""}),
    json.dumps({"id": "p-space", "text": "   \n\t"}),
    json.dumps({"id": "p-long", "text": "word " * 400}),
    json.dumps({"id": "p-surrogate", "text": "broken \ud800 text"}),
    json.dumps({"id": "p-notext"}),
    json.dumps({"id": "p-number", "text": 42}),
    json.dumps({"text": "no id at all"}),
    '{"id": "p-json", "text": "unterminated',
    json.dumps({"id": "p-dup", "text": "first version"}),
    json.dumps({"id": "p-dup", "text": "second version"}),
]
POISON_REASONS = {
    "p-empty": "empty_text",
    "p-space": "empty_text",
    "p-long": "too_long",
    "p-surrogate": "invalid_encoding",
    "p-notext": "missing_text",
    "p-number": "invalid_text_type",
    "p-dup": "duplicate_id_conflict",
}


@dataclass
class Tool:
    config: Path
    state: Path

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "reindex", *args, "-c", str(self.config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 300
    ) -> tuple[int, str, str]:
        process = self.start(*args, env=env)
        out, err = process.communicate(timeout=timeout)
        return process.returncode, out, err

    def json(self, *args: str) -> dict:
        """What a verb reports with --json. Runs are real processes (they are what gets killed); the other
        verbs only read, so they run in this process through the same CLI: no second or more of start-up and
        imports per read, and these tests read state after every crash."""
        if args[0] == "run":
            code, out, err = self.run(*args, "--json")
        else:
            result = CliRunner().invoke(app, [*args, "-c", str(self.config), "--json"])
            code, out, err = result.exit_code, result.stdout, result.stderr
        assert code in (0, 3), err
        return json.loads(out)

    def ledger_written(self) -> tuple[int, int]:
        """(shards, documents) the ledger has recorded as written, read while the tool may be running."""
        if not self.state.exists():
            return 0, 0
        with sqlite3.connect(f"file:{self.state}?mode=ro", uri=True, timeout=10) as db:
            try:
                row = db.execute("SELECT count(*), coalesce(sum(documents), 0) FROM shards").fetchone()
            except sqlite3.OperationalError:  # schema not created yet
                return 0, 0
        return int(row[0]), int(row[1])

    def kill_after_progress(
        self, process: subprocess.Popen[str], rng: np.random.Generator, deadline: float = 60
    ) -> bool:
        """SIGKILL once the ledger shows a new shard, after a random extra delay; False if it finished."""
        shards_before, _ = self.ledger_written()
        started = time.monotonic()
        while process.poll() is None and time.monotonic() - started < deadline:
            if self.ledger_written()[0] > shards_before:
                time.sleep(float(rng.uniform(0, 0.05)))
                break
            time.sleep(0.02)
        if process.poll() is not None:
            process.communicate()
            return False
        process.send_signal(signal.SIGKILL)
        process.communicate()
        return True


def assert_crashed(code: int, err: str) -> None:
    """A crash point fired: in the run's own process (SIGKILL: the one-process pipeline, or a run of a few
    shards) or in a worker process of the processes engine, which ends the run resumably (75) naming it."""
    if code == 75:
        assert re.search(r"worker \d+ \(pid \d+\) died \(killed by SIGKILL\)", err), err
    else:
        assert code == -signal.SIGKILL, err


def report_figure(name: str, value: object) -> None:
    """Append a measured figure to $REINDEX_FIGURES (JSON lines) when set; the closing notes quote them."""
    path = os.environ.get("REINDEX_FIGURES")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"figure": name, "value": value}) + "\n")


def fresh_vector(embedder: HashEmbedder, text: str) -> np.ndarray:
    return embedder.embed(embedder.tokenize([text]))[0]


def config_text(
    *,
    corpus: Path,
    state: Path,
    target: str,
    shard_size: int = 50,
    latency_ms: float = 2.0,
    too_long: str = "dead-letter",
) -> str:
    return (
        f'[source]\nkind = "jsonl"\npath = "{corpus}"\n\n'
        f'[embedder]\nkind = "hash"\ndim = 16\nmax_tokens = 128\nlatency_ms = {latency_ms}\n\n'
        f"[target]\n{target}\n\n"
        f'[run]\nstate = "{state}"\nshard_size = {shard_size}\nbatch_tokens = 2048\ntoo_long = "{too_long}"\n'
        "max_dead_letters = 50\n"  # the poison lines are dead letters on purpose
    )
