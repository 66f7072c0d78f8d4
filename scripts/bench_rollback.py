"""How long a `mode = "table"` rollback holds writers to keep what the application wrote meanwhile.

A rollback makes the older target table's rows the newer one's (kept_writes.py): a first pass with writers
running, then a second in the move's transaction, with the alias held, over the keys a trigger logged since
the first began (change_log.py). Measured here on two target-shaped tables (id, a 300-character body, a tag,
jsonb, a 256-d older and a 384-d newer vector, the bookkeeping columns) where the application changed 1% of
the rows while the newer was live (a third each: texts edited, other columns edited, rows deleted, plus as
many rows added), and 20 more rows between the passes: the first pass's wall seconds, once, and the
second's (what writers wait for), each repeat rolled back so every one does the same work. The column mode
has neither.

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
                f"{rows:>9,} rows, {found['changed_rows']:,} written meanwhile: first pass"
                f" {found['first_pass_seconds']:.3f} s (writers run), writers held"
                f" {found['median_held_seconds']:.3f} s (median of {args.repeats})",
                flush=True,
            )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    return 0


def measure(dsn: str, rows: int, repeats: int) -> dict[str, Any]:
    import psycopg
    from psycopg import sql

    from reindex_adapters.postgres.catalog import _read_layout
    from reindex_adapters.postgres.change_log import ChangeLog
    from reindex_adapters.postgres.kept_writes import keep_writes

    held: list[float] = []
    log = ChangeLog(
        sql.Identifier("newer"),
        "id",
        sql.Identifier("public", "log"),
        sql.Identifier("public", "note"),
        "note",
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        build(conn, rows)
        with conn.transaction():
            log.start(conn, "bigint")
        with conn.transaction():
            served, older = _read_layout(conn, "newer"), _read_layout(conn, "older")
            assert served is not None and older is not None
            started = time.perf_counter()
            deleted, changed, added = keep_writes(conn, served, older)
            first = time.perf_counter() - started
        conn.execute("UPDATE newer SET tag = 'meanwhile' WHERE id <= 20")  # written between the passes
        second = (0, 0, 0)
        for _ in range(repeats):
            with conn.transaction(force_rollback=True):
                started = time.perf_counter()
                second = keep_writes(conn, served, older, only=log)
                log.stop(conn)
                held.append(time.perf_counter() - started)
    return {
        "first_pass_seconds": first,
        "held_seconds": held,
        "median_held_seconds": statistics.median(held),
        "deleted": deleted,
        "changed": changed,
        "added": added,
        "changed_rows": deleted + changed + added,
        "second_pass_changed": second[1],
    }


def build(conn: Any, rows: int) -> None:
    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    for table, dim in (("older", 256), ("newer", 384)):
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(
            f"CREATE TABLE {table} (id bigint PRIMARY KEY, body text, tag text, meta jsonb, embedding vector({dim}),"
            " reindex_fingerprint text NOT NULL DEFAULT 'f', reindex_content_hash text NOT NULL DEFAULT 'h',"
            " reindex_origin text)"
        )
        conn.execute(
            f"INSERT INTO {table} (id, body, tag, meta, embedding) SELECT i, 'document ' || i || repeat(' words', 48),"
            f" 't' || (i %% 50), jsonb_build_object('n', i), array_fill(0.5, ARRAY[{dim}])::vector"
            " FROM generate_series(1, %s) AS i",
            [rows],
        )
        conn.execute(f"""COMMENT ON TABLE {table} IS '{{"text_field": "body"}}'""")
    conn.execute("UPDATE newer SET body = body || ' edited' WHERE id % 300 = 0")
    conn.execute("UPDATE newer SET tag = 'retagged' WHERE id % 300 = 1")
    conn.execute("DELETE FROM newer WHERE id % 300 = 2")
    conn.execute(
        "INSERT INTO newer (id, body, tag, meta) SELECT %s + i, 'added ' || i, 'n', '{}'"
        " FROM generate_series(1, %s) AS i",
        [rows, rows // 300],
    )
    conn.execute("VACUUM ANALYZE older")
    conn.execute("VACUUM ANALYZE newer")


if __name__ == "__main__":
    raise SystemExit(main())
