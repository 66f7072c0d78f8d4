"""How a ledger's text bookkeeping grows with the run: shards of fresh texts looked up and recorded as a run
does them (`text_states` for the shard's hashes, then `record_shard` settling them), timed per 100,000.

    python scripts/ledger_scale.py [--texts 1000000] [--shard 5000] [--ledger sqlite|postgres]

Prints one JSON line: wall and CPU seconds in all (this process; an embedded Postgres works in its own) and
the wall seconds each successive 100,000 texts took. A ledger whose per-text cost is flat shows equal steps.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reindex.state.ledger import Ledger
from reindex.state.records import ShardResult
from reindex.state.sqlite import SqliteLedger

PLAN = "0123456789abcdef"
STEP = 100_000


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--texts", type=int, default=1_000_000)
    parser.add_argument("--shard", type=int, default=5_000)
    parser.add_argument("--ledger", choices=("sqlite", "postgres"), default="sqlite")
    args = parser.parse_args()
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ledger-scale-")))
        ledger = stack.enter_context(_ledger(args.ledger, work))
        print(
            json.dumps({"ledger": args.ledger, "shard": args.shard, **record(ledger, args.texts, args.shard)})
        )
    return 0


def record(ledger: Ledger, texts: int, size: int) -> dict[str, object]:
    ledger.begin(PLAN, alias="scale", target="scale__00000000", fingerprint="f" * 16, model={"model": "m"})
    steps: list[float] = []
    started, cpu = time.perf_counter(), time.process_time()
    mark = started
    for seq in range(texts // size):
        hashes = [hashlib.sha256(f"{seq}/{row}".encode()).hexdigest()[:32] for row in range(size)]
        owners = {digest: f"doc-{seq * size + row}" for row, digest in enumerate(hashes)}
        ledger.text_states(PLAN, sorted(owners))
        shard = ShardResult(
            seq=seq,
            after_cursor=None if seq == 0 else f"c{seq - 1}",
            last_cursor=f"c{seq}",
            documents=size,
            written=size,
            dead_letters=(),
            duplicates=0,
            reused=0,
            tokens=size,
            truncated=0,
            seconds=0.1,
            texts=sorted((digest, "written") for digest in owners),
            owners=owners,
        )
        ledger.record_shard(PLAN, shard)
        if (seq + 1) * size % STEP == 0:
            now = time.perf_counter()
            steps.append(round(now - mark, 2))
            mark = now
    return {
        "texts": texts,
        "wall_seconds": round(time.perf_counter() - started, 2),
        "cpu_seconds": round(time.process_time() - cpu, 2),
        "wall_per_100k": steps,
    }


@contextmanager
def _ledger(kind: str, work: Path) -> Iterator[Ledger]:
    """A fresh ledger: a SQLite file in `work`, or a Postgres ledger on an embedded server (`scripts/bench`'s)."""
    with ExitStack() as stack:
        if kind == "sqlite":
            ledger: Ledger = SqliteLedger(work / "state.db")
        else:
            from bench import postgres

            from reindex_adapters.postgres.ledger import PostgresLedger

            ledger = PostgresLedger(stack.enter_context(postgres(work)))
        stack.callback(ledger.close)
        yield ledger


if __name__ == "__main__":
    raise SystemExit(main())
