"""What the pgvector sink reads back: the index verify scans, vectors by id, every vector, and searches
through the target's own ANN index, each in the target's storage type (storage.py). The sink holds a
`TargetReads` and hands these calls to it."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from reindex.ports import Distance, IndexEntry, Vectors
from reindex_adapters.postgres.catalog import ORIGIN, RESERVED, Layout, detect_distance

if TYPE_CHECKING:
    from psycopg import sql

    from reindex_adapters.postgres.connection import Database


_OPERATORS: dict[Distance, str] = {"cosine": "<=>", "dot": "<#>", "euclid": "<->"}
cursor_names = itertools.count()


class TargetReads:
    """What the sink reads back, given its connection and how to find a target's layout (the sink's own, so
    the column-mode sink's finds a column of the application's table)."""

    def __init__(self, db: Database, layout: Callable[[str], Layout]) -> None:
        self._db = db
        self._layout = layout

    def scan_index(self, target: str, dim: int) -> Iterator[IndexEntry]:
        layout = self._layout(target)
        name = f"reindex_scan_{next(cursor_names)}"
        with self._db.transaction() as conn, conn.cursor(name=name) as cursor:
            cursor.itersize = 5000
            cursor.execute(*_index_query(layout, dim))
            for key, digest, fingerprint, problem, application in cursor:
                yield IndexEntry(key, digest, fingerprint, problem, application)

    def fetch(self, target: str, ids: Sequence[str]) -> dict[str, Vectors]:
        from psycopg import sql

        layout = self._layout(target)
        if layout.vector is None:
            return {}
        query = sql.SQL("SELECT {}::text, {} FROM {} WHERE {} = ANY(%s::{}[])").format(
            layout.key.ident, layout.vector.ident, layout.ident, layout.key.ident, layout.key.cast
        )
        with self._db.errors():
            rows = self._db.connection().execute(query, [list(ids)], binary=True).fetchall()
        return {key: layout.storage.read(value) for key, value in rows if value is not None}

    def fetch_matching(self, target: str, expected: Mapping[str, str]) -> dict[str, Vectors]:
        """One query: the vectors of the ids whose stored content hash is still the expected one."""
        from psycopg import sql

        layout = self._layout(target)
        has_hash = any(a.name == "reindex_content_hash" for a in layout.columns)
        if layout.vector is None or not has_hash or not expected:
            return {}
        query = sql.SQL(
            "SELECT t.{k}::text, t.{v} FROM {t} AS t"
            " JOIN unnest(%s::{cast}[], %s::text[]) AS e(id, content_hash)"
            " ON t.{k} = e.id AND t.reindex_content_hash = e.content_hash"
        ).format(k=layout.key.ident, v=layout.vector.ident, t=layout.ident, cast=layout.key.cast)
        with self._db.errors():
            conn = self._db.connection()
            rows = conn.execute(query, [list(expected), list(expected.values())], binary=True).fetchall()
        return {key: layout.storage.read(value) for key, value in rows if value is not None}

    def scan_vectors(self, target: str, batch: int = 5000) -> Iterator[tuple[list[str], Vectors]]:
        from psycopg import sql

        layout = self._layout(target)
        if layout.vector is None:
            return
        query = sql.SQL("SELECT {k}::text, {v} FROM {t} WHERE {v} IS NOT NULL").format(
            k=layout.key.ident, v=layout.vector.ident, t=layout.ident
        )
        name = f"reindex_vectors_{next(cursor_names)}"
        with self._db.transaction() as conn, conn.cursor(name=name, binary=True) as cursor:
            cursor.itersize = batch
            cursor.execute(query)
            while rows := cursor.fetchmany(batch):
                yield [row[0] for row in rows], np.stack([layout.storage.read(row[1]) for row in rows])

    def search(self, target: str, vectors: Vectors, k: int) -> list[list[str]]:
        """One `ORDER BY vector <op> query LIMIT k` per vector, through the ANN index (ef_search >= k): its
        recall is what `reindex compare` measures, so the planner is not let fall back to an exact scan."""
        from psycopg import sql

        layout = self._layout(target)
        if layout.vector is None:
            return [[] for _ in vectors]
        storage, operator = layout.storage, _OPERATORS[self.distance(target)]
        candidates = (
            _candidates(k, int(layout.meta.get("dim") or layout.vector.typmod)) if storage.full_vector else k
        )
        query = _search_query(layout, operator)
        found: list[list[str]] = []
        with self._db.transaction() as conn:
            ef_search = sql.Literal(max(40, min(candidates, 1000)))
            conn.execute(sql.SQL("SET LOCAL hnsw.ef_search = {}").format(ef_search))
            conn.execute("SET LOCAL enable_seqscan = off")  # the index's answer, even where a scan is cheaper
            for vector in vectors:
                value = storage.query_value(vector)
                parameters = [value, candidates, value, k] if storage.full_vector else [value, k]
                rows = conn.execute(query, parameters).fetchall()
                found.append([row[0] for row in rows])
        return found

    def distance(self, target: str) -> Distance:
        layout = self._layout(target)
        if layout.vector is None:
            return "cosine"
        if layout.storage.kind == "bit" and layout.meta.get("distance") in _OPERATORS:
            return layout.meta["distance"]  # type: ignore[no-any-return]  # a Hamming index names no metric
        with self._db.errors():
            return detect_distance(self._db.connection(), layout.oid, layout.vector.name)


def _index_query(layout: Layout, dim: int) -> tuple[sql.Composed, list[int]]:
    """Vector sanity computed by the server: pgvector stores no NaN, so wrong dims and zeros remain."""
    from psycopg import sql

    present = {a.name for a in layout.columns}
    digest, fingerprint = (sql.Identifier(n) if n in present else sql.NULL for n in RESERVED[::-1])
    origin: sql.Composable = sql.NULL  # a target older than the column cannot tell: no count, not 0
    if ORIGIN in present:
        origin = sql.SQL("{} IS NOT DISTINCT FROM 'application'").format(sql.Identifier(ORIGIN))
    problem: sql.Composable = sql.SQL("'dimension'")
    if layout.vector is not None:
        storage, vector = layout.storage, layout.vector.ident
        problem = sql.SQL(
            "CASE WHEN {v} IS NULL OR {dims} <> %s THEN 'dimension' WHEN {zero} THEN 'zero' END"
        ).format(v=vector, dims=storage.dims_sql(vector), zero=storage.zero_sql(vector))
    query = sql.SQL("SELECT {}::text, {}, {}, {}, {} FROM {}").format(
        layout.key.ident, digest, fingerprint, problem, origin, layout.ident
    )
    return query, [dim] if layout.vector is not None else []


def _candidates(k: int, dim: int) -> int:
    """How many nearest by bits are re-ranked exactly: fewer bits tie more often, so a short vector needs
    more (96 bits at 4k found 0.95 of the exact top 5 before the index's own loss, at 11k 0.98)."""
    return max(k * max(4, -(-1024 // max(dim, 1))), 40)


def _search_query(layout: Layout, operator: str) -> sql.Composed:
    """The k nearest by the target's index: by distance on vector and halfvec, by Hamming distance on bits,
    and with the full vector kept, the index's candidates re-ranked by the exact distance."""
    from psycopg import sql

    assert layout.vector is not None
    storage = layout.storage
    key, table, vector = layout.key.ident, layout.ident, layout.vector.ident
    if not storage.full_vector:
        cast = sql.SQL("" if storage.kind == "bit" else f"::{storage.column}")
        op = sql.SQL("<~>" if storage.kind == "bit" else operator)
        return sql.SQL("SELECT {k}::text FROM {t} ORDER BY {v} {op} %s{cast} LIMIT %s").format(
            k=key, t=table, v=vector, op=op, cast=cast
        )
    dim = sql.Literal(int(layout.meta.get("dim") or layout.vector.typmod))
    return sql.SQL(
        "SELECT c.k FROM (SELECT {k}::text AS k, {v} AS v FROM {t}"
        " ORDER BY binary_quantize({v})::bit({d}) <~> binary_quantize(%s::vector)::bit({d}) LIMIT %s) AS c"
        " ORDER BY c.v {op} %s::vector LIMIT %s"
    ).format(k=key, v=vector, t=table, d=dim, op=sql.SQL(operator))
