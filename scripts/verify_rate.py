"""Measure verify's id comparison rate on pgvector: `python scripts/verify_rate.py [documents]`.

Builds a source table and a complete target of the given size in an embedded Postgres, then times
`reindex.prove.verify.coverage` (streams both id sets through a scratch SQLite join). Prints JSON.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def main(documents: int) -> dict[str, float]:
    import pgserver
    import psycopg
    from pgvector.psycopg import register_vector

    from reindex.batching import chunks
    from reindex.fingerprint import content_hash
    from reindex.ports import Rows, TargetSpec
    from reindex.prove.verify import coverage
    from reindex_adapters.postgres.sink import PgvectorSink
    from reindex_adapters.postgres.source import PostgresSource

    data = Path(tempfile.mkdtemp(prefix="reindex-rate-"))
    data.chmod(0o755)
    server = pgserver.get_server(data, cleanup_mode="stop")
    dsn = server.get_uri()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute("DROP TABLE IF EXISTS docs")
        conn.execute("CREATE TABLE docs (id text PRIMARY KEY, body text)")
        conn.execute(
            "INSERT INTO docs SELECT 'doc-' || i, 'text number ' || i FROM generate_series(1, %s) i",
            [documents],
        )
        register_vector(conn)
    source = PostgresSource(dsn, table="docs", id_column="id", text_column="body", page_size=5000)
    sink = PgvectorSink(dsn, build_index=False)
    spec = TargetSpec("docs__rate0001", "docs_alias", 8, "f" * 16, {}, source.schema())
    sink.prepare(spec)
    rng = np.random.default_rng(0)
    for batch in chunks(source.scan(), 5000):
        vectors = rng.standard_normal((len(batch), 8)).astype(np.float32)
        sink.write(spec.name, Rows(batch, vectors, [content_hash(r.text) for r in batch], spec.fingerprint))
    started = time.perf_counter()
    report = coverage(source, sink, spec.name, dim=8, fingerprint=spec.fingerprint)
    seconds = time.perf_counter() - started
    source.close()
    sink.close()
    server.cleanup()
    assert report.complete
    return {
        "documents": documents,
        "seconds": round(seconds, 2),
        "ids_per_second": round(2 * documents / seconds),
        "peak_rss_mb": _rss_mb(),
    }


def _rss_mb() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


if __name__ == "__main__":
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp())
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000)))
