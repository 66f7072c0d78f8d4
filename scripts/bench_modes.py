"""The two pgvector target modes side by side: filling the new vectors, what it costs the server, the flip.

`mode = "table"` writes a fresh table by binary COPY and flips by putting a view in the table's place;
`mode = "column"` fills a side-by-side column of the application's own table through a COPY stage and one
`UPDATE ... FROM` per batch, and flips by renaming two columns. For each size, both modes get the same
application table (id, body, tenant with a btree, a 256-d old vector) and the same new 384-d vectors, written
through the sink itself (`PgvectorSink.write`, 5,000 rows a batch, no ANN index: its build is the same in both
and reported apart by scripts/bench). Measured per mode: fill seconds and rows/s, WAL written
(`pg_current_wal_lsn` before and after), bytes added on disk (the new table, or the application table's growth
and the hash table beside it, before VACUUM), `finalize` (ANALYZE; the column mode's VACUUM ANALYZE), and
the flip's wall milliseconds.

`scripts/bench modes [--rows 100000,1000000] [--repeats 3]`: a table of medians, column over table ratios,
and JSON in .bench/modes.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
OLD_DIM, NEW_DIM, BATCH = 256, 384, 5_000
MODES = ("table", "column")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="100000,1000000", help="comma-separated table sizes")
    parser.add_argument(
        "--repeats", type=int, default=3, help="repetitions per size and mode (medians shown)"
    )
    parser.add_argument("--json", type=Path, default=ROOT / ".bench" / "modes.json")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.rows.split(",") if n]
    results: dict[str, Any] = {"sizes": {}}
    with postgres() as dsn:
        for rows in sizes:
            samples: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
            for repeat in range(args.repeats):
                for mode in MODES:  # interleaved: the machine's drift falls on both
                    samples[mode].append(measure(dsn, mode, rows, repeat))
            results["sizes"][str(rows)] = summarise(samples)
    show(results)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    return 0


@contextmanager
def postgres() -> Iterator[str]:
    """scripts/bench's embedded Postgres, with room for a million-row fill's WAL between checkpoints."""
    import psycopg
    from bench import postgres as embedded

    with embedded(ROOT / ".bench") as uri:
        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET max_wal_size = '8GB'")  # checkpoints do not time the fill
            conn.execute("SELECT pg_reload_conf()")
        yield uri


def application_table(dsn: str, table: str, rows: int) -> None:
    """The application's table as it is before a migration: old vectors, a tenant btree."""
    import psycopg
    from pgvector.psycopg import register_vector
    from psycopg import sql

    rng = np.random.default_rng(7)
    with psycopg.connect(dsn, autocommit=True) as conn:
        register_vector(conn)
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(table)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint PRIMARY KEY, body text NOT NULL, tenant text NOT NULL,"
                " embedding vector({}))"
            ).format(sql.Identifier(table), sql.Literal(OLD_DIM))
        )
        statement = sql.SQL("COPY {} FROM STDIN (FORMAT BINARY)").format(sql.Identifier(table))
        for start in range(0, rows, 50_000):
            stop = min(rows, start + 50_000)
            old = rng.standard_normal((stop - start, OLD_DIM), dtype=np.float32)
            with conn.cursor().copy(statement) as copy:
                copy.set_types(["int8", "text", "text", "vector"])
                for i, vector in zip(range(start, stop), old, strict=True):
                    copy.write_row((i, body(i), f"tenant{i % 50}", vector))
        conn.execute(sql.SQL("CREATE INDEX ON {} (tenant)").format(sql.Identifier(table)))
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))


def body(i: int) -> str:
    return f"document {i} about topic {i % 97} with some words to embed"


def measure(dsn: str, mode: str, rows: int, repeat: int) -> dict[str, float]:
    """One migration's fill and flip in `mode`, on a fresh application table of `rows` rows."""
    from reindex.fingerprint import content_hash
    from reindex.ports import Record, Rows, TargetSpec
    from reindex_adapters.postgres import PgvectorSink, PostgresSource

    table = f"app_{mode}_{rows}_{repeat}"
    application_table(dsn, table, rows)
    source = PostgresSource(dsn, table=table, id_column="id", text_column="body")
    accept = ["extra_column"] if mode == "column" else ["table_statements", "column_order", "indexes"]
    sink = PgvectorSink.from_config(
        PgvectorSink.Config(kind="pgvector", dsn=dsn, alias=table, mode=mode, index="none", accept=accept)
    )
    spec = TargetSpec(f"{table}__bench001", table, NEW_DIM, "f" * 16, {"model": "bench"}, source.schema())
    rng = np.random.default_rng(repeat)
    try:
        sink.prepare(spec)
        before = server_state(dsn, table, spec.name)
        started = time.perf_counter()
        for start in range(0, rows, BATCH):
            ids = range(start, min(rows, start + BATCH))
            records = [
                Record(str(i), body(i), {"id": i, "body": body(i), "tenant": f"tenant{i % 50}"}) for i in ids
            ]
            vectors = rng.standard_normal((len(records), NEW_DIM), dtype=np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            sink.write(spec.name, Rows(records, vectors, [content_hash(r.text) for r in records], "f" * 16))
        seconds = time.perf_counter() - started
        after = server_state(dsn, table, spec.name)
        finalized = time.perf_counter()
        sink.finalize(spec)  # table: ANALYZE and grants; column: VACUUM ANALYZE (no index: index = "none")
        finalize = time.perf_counter() - finalized
        flipped = time.perf_counter()
        sink.move_alias(table, spec.name, expected=None, meta={"fingerprint": "f" * 16})
        flip_ms = (time.perf_counter() - flipped) * 1000
    finally:
        sink.close()
        source.close()
        drop(dsn, table, spec.name, f"{table}__adopted")
    return {
        "seconds": seconds,
        "rows_per_second": rows / seconds,
        "wal_bytes": after["wal"] - before["wal"],
        "added_bytes": after["bytes"] - before["bytes"],
        "table_growth": after["table"] / before["table"],
        "finalize_seconds": finalize,
        "flip_ms": flip_ms,
    }


def drop(dsn: str, *tables: str) -> None:
    """Leave the disk as it was: a million-row table and its twin take gigabytes."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in tables:
            row = conn.execute(
                "SELECT relkind::text FROM pg_class WHERE oid = to_regclass(%s)", [name]
            ).fetchone()
            if row is not None:
                kind = sql.SQL("VIEW" if row[0] == "v" else "TABLE")
                conn.execute(sql.SQL("DROP {} {} CASCADE").format(kind, sql.Identifier(name)))
        conn.execute("CHECKPOINT")


def server_state(dsn: str, table: str, target: str) -> dict[str, float]:
    """WAL position, and the bytes of the application's table plus the target's table (with indexes)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0'), pg_total_relation_size(%s::regclass),"
            " coalesce(pg_total_relation_size(to_regclass(%s)), 0)",
            [table, target],
        ).fetchone()
    assert row is not None
    return {"wal": float(row[0]), "table": float(row[1]), "bytes": float(row[1]) + float(row[2])}


def summarise(samples: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    medians = {
        mode: {key: statistics.median(s[key] for s in runs) for key in runs[0]}
        for mode, runs in samples.items()
    }
    ratios = {
        key: medians["column"][key] / medians["table"][key]
        for key in ("seconds", "wal_bytes", "added_bytes")
        if medians["table"][key]
    }
    return {"medians": medians, "column_over_table": ratios, "runs": samples}


def show(results: dict[str, Any]) -> None:
    table = Table(title="pgvector target modes: fill, WAL, disk and flip (medians)")
    for header in (
        "rows",
        "mode",
        "fill s",
        "rows/s",
        "WAL",
        "added on disk",
        "app table ×",
        "finalize s",
        "flip ms",
    ):
        table.add_column(header, justify="right")
    for rows, result in results["sizes"].items():
        for mode, m in result["medians"].items():
            table.add_row(
                f"{int(rows):,}",
                mode,
                f"{m['seconds']:.1f}",
                f"{m['rows_per_second']:,.0f}",
                f"{m['wal_bytes'] / 2**20:,.0f} MiB",
                f"{m['added_bytes'] / 2**20:,.0f} MiB",
                f"{m['table_growth']:.2f}",
                f"{m['finalize_seconds']:.1f}",
                f"{m['flip_ms']:.1f}",
            )
        ratio = result["column_over_table"]
        table.add_row(
            "",
            "column ÷ table",
            f"{ratio.get('seconds', 0):.2f}",
            "",
            f"{ratio.get('wal_bytes', 0):.2f}",
            f"{ratio.get('added_bytes', 0):.2f}",
            "",
            "",
            "",
        )
    Console(width=160).print(table)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/bench.py's helpers
    sys.exit(main())
