"""How long a `mode = "table"` rollback holds writers to keep what the application wrote meanwhile.

While a target is live, a trigger logs the key of each row written to it (change_log.py); a rollback makes the
older target table's rows with those keys the newer one's, in the move's transaction with the alias held
(kept_writes.py). Measured here on two target-shaped tables (id, a 300-character body, a tag, jsonb, a 256-d
older and a 384-d newer vector, the bookkeeping columns) where the application changed 1% of the rows while
the newer was live (a third each: texts edited, other columns edited, rows deleted, plus as many rows
added): the seconds writers are held for it, each repeat rolled back so every one does the same work; and
what the log costs a write, the same 1% UPDATE timed without and with the trigger. The column mode has
neither.

`scripts/bench rollback [--rows 100000,1000000] [--repeats 3]`: medians, and JSON in .bench/rollback.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_modes import postgres  # noqa: E402  (scripts/ is no package)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="100000,1000000", help="comma-separated table sizes")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions per size (median shown)")
    parser.add_argument("--json", type=Path, default=ROOT / ".bench" / "rollback.json")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    with postgres() as dsn:
        for rows in (int(n) for n in args.rows.split(",") if n):
            results[str(rows)] = measure(dsn, rows, args.repeats)
            found = results[str(rows)]
            print(
                f"{rows:>9,} rows, {found['changed_rows']:,} written meanwhile: writers held"
                f" {found['median_held_seconds']:.3f} s (median of {args.repeats}); a 1% UPDATE"
                f" {found['update_seconds_without_log']:.3f} s without the log,"
                f" {found['update_seconds_with_log']:.3f} s with it",
                flush=True,
            )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    return 0


def measure(dsn: str, rows: int, repeats: int) -> dict[str, Any]:
    import psycopg

    from reindex_adapters.postgres.catalog import read_layout
    from reindex_adapters.postgres.kept_writes import keep_writes, writes_of

    held: list[float] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        build(conn, rows)
        touch = "UPDATE newer SET tag = tag WHERE mod(id, 100) = 5"
        plain = _timed(lambda: conn.execute(touch))
        oid = int(conn.execute("SELECT 'newer'::regclass::oid::int8").fetchone()[0])  # type: ignore[index]
        live = writes_of(conn, "bench", oid)
        with conn.transaction():
            live.start(conn)
        logged = _timed(lambda: conn.execute(touch))
        conn.execute("TRUNCATE public.bench_reindex_writes")
        written_meanwhile(conn, rows)
        counts = (0, 0, 0)
        for _ in range(repeats):
            with conn.transaction(force_rollback=True):
                started = time.perf_counter()
                counts = keep_writes(conn, live, read_layout(conn, "older"))
                live.stop(conn)
                held.append(time.perf_counter() - started)
    deleted, changed, added = counts
    return {
        "held_seconds": held,
        "median_held_seconds": statistics.median(held),
        "deleted": deleted,
        "changed": changed,
        "added": added,
        "changed_rows": deleted + changed + added,
        "update_seconds_without_log": plain,
        "update_seconds_with_log": logged,
    }


def _timed(step: Any) -> float:
    started = time.perf_counter()
    step()
    return time.perf_counter() - started


def build(conn: Any, rows: int) -> None:
    from psycopg import sql

    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    for name, dim in (("older", 256), ("newer", 384)):
        table, size = sql.Identifier(name), sql.Literal(dim)
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint PRIMARY KEY, body text, tag text, meta jsonb, embedding vector({}),"
                " reindex_fingerprint text NOT NULL DEFAULT 'f', reindex_content_hash text NOT NULL DEFAULT 'h',"
                " reindex_origin text)"
            ).format(table, size)
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (id, body, tag, meta, embedding) SELECT i, 'document ' || i || repeat(' words', 48),"
                " 't' || mod(i, 50), jsonb_build_object('n', i), array_fill(0.5, ARRAY[{}])::vector"
                " FROM generate_series(1, %s) AS i"
            ).format(table, size),
            [rows],
        )
        conn.execute(
            sql.SQL("COMMENT ON TABLE {} IS {}").format(table, sql.Literal('{"text_field": "body"}'))
        )
    conn.execute("VACUUM ANALYZE older")
    conn.execute("VACUUM ANALYZE newer")


def written_meanwhile(conn: Any, rows: int) -> None:
    """The application's writes through the alias while the newer target is live: 1% of the rows."""
    conn.execute("UPDATE newer SET body = body || ' edited' WHERE id % 300 = 0")
    conn.execute("UPDATE newer SET tag = 'retagged' WHERE id % 300 = 1")
    conn.execute("DELETE FROM newer WHERE id % 300 = 2")
    conn.execute(
        "INSERT INTO newer (id, body, tag, meta) SELECT %s + i, 'added ' || i, 'n', '{}'"
        " FROM generate_series(1, %s) AS i",
        [rows, rows // 300],
    )


if __name__ == "__main__":
    raise SystemExit(main())
