"""The HNSW index of a column target, built while the application writes on.

`CREATE INDEX CONCURRENTLY` on the table; a partitioned table takes none, so its index is created `ON ONLY`
the parent (invalid, nothing held), each partition's concurrently, then attached: the parent's becomes valid
once all are, and a partition the application creates later gets its own from it. A build a kill
interrupted leaves an invalid index behind, which the next `finalize` drops and builds again.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from psycopg import sql

    from reindex_adapters.postgres.catalog import Layout
    from reindex_adapters.postgres.connection import Connection


# The partitions of a partitioned table (one level: fidelity.py names deeper ones), regclass-quoted.
_PARTITIONS_SQL = """
SELECT c.oid::int8, c.oid::regclass::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = %s::oid AND c.relispartition ORDER BY 1"""
_INDEX_SQL = """
SELECT i.indisvalid FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
WHERE c.relname = %s AND i.indrelid = %s::oid"""
_CHILD_INDEX_SQL = """
SELECT i.indisvalid, EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = c.oid)
FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid WHERE c.oid = to_regclass(%s)"""
_SESSION_INDEX_SETTINGS_SQL = """
SELECT set_config('maintenance_work_mem', %s, false),
  set_config('max_parallel_maintenance_workers',
             greatest(current_setting('max_parallel_maintenance_workers')::int, %s::int)::text, false)"""


def build_concurrently(
    conn: Connection, layout: Layout, index: str, method: sql.Composable, maintenance_work_mem: str
) -> float | None:
    """Build `index` over the layout's vector column (`method`: `USING hnsw (...) WITH (...)`); its wall
    seconds, or None when it was there and valid already (a resumed finalize)."""
    from psycopg import sql

    valid = conn.execute(_INDEX_SQL, [index, layout.oid]).fetchone()
    if valid is not None and valid[0]:
        return None
    partitions = [(int(o), str(n)) for o, n in conn.execute(_PARTITIONS_SQL, [layout.oid]).fetchall()]
    if valid is not None and not partitions:  # an interrupted CONCURRENTLY build: build it anew
        conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(index)))
    # CONCURRENTLY runs outside a transaction: the settings are the session's, reset after
    conn.execute(_SESSION_INDEX_SETTINGS_SQL, [maintenance_work_mem, max(0, (os.cpu_count() or 1) - 1)])
    started = time.perf_counter()
    if partitions:
        _index_partitions(conn, index, layout.ident, method, partitions)
    else:
        conn.execute(
            sql.SQL("CREATE INDEX CONCURRENTLY {} ON {} {}").format(
                sql.Identifier(index), layout.ident, method
            )
        )
    seconds = time.perf_counter() - started
    conn.execute("RESET maintenance_work_mem; RESET max_parallel_maintenance_workers")
    return seconds


def _index_partitions(
    conn: Connection,
    index: str,
    parent: sql.Composable,
    method: sql.Composable,
    partitions: list[tuple[int, str]],
) -> None:
    """The parent's index created ON ONLY it (invalid, writers pass), each partition's CONCURRENTLY, each
    attached: the parent's becomes valid once all are, and new partitions get theirs from it."""
    from psycopg import sql

    conn.execute(
        sql.SQL("CREATE INDEX IF NOT EXISTS {} ON ONLY {} {}").format(sql.Identifier(index), parent, method)
    )
    for oid, name in partitions:
        child = f"{index[:50]}_{oid}"
        state = conn.execute(_CHILD_INDEX_SQL, [child]).fetchone()
        if state is not None and state[1]:
            continue  # built and attached by an earlier finalize
        if state is not None and not state[0]:  # an interrupted CONCURRENTLY build leaves it invalid
            conn.execute(sql.SQL("DROP INDEX CONCURRENTLY {}").format(sql.Identifier(child)))
        if state is None or not state[0]:
            conn.execute(
                sql.SQL("CREATE INDEX CONCURRENTLY {} ON {} {}").format(
                    sql.Identifier(child), sql.SQL(name), method
                )
            )
        conn.execute(
            sql.SQL("ALTER INDEX {} ATTACH PARTITION {}").format(sql.Identifier(index), sql.Identifier(child))
        )
