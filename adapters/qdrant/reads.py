"""What the Qdrant sink reads back: vectors by id, every vector a page at a time, Qdrant's own search, and
the metric, each of the vector the migration writes (a named one, or the unnamed)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from reindex.ports import Distance, Vectors
from reindex_adapters.qdrant.bookkeeping import INDEX_KEYS
from reindex_adapters.qdrant.connection import translated
from reindex_adapters.qdrant.points import (
    _distance,
    document_id,
    stored_vector,
    vector_params,
    with_vector,
)

if TYPE_CHECKING:
    from qdrant_client import models

    from reindex_adapters.qdrant.targets import Collections


class PointReads:
    """What the sink reads back, given its collections and its page size."""

    def __init__(self, collections: Collections, page: int) -> None:
        self.collections = collections
        self.page = page

    def fetch(self, target: str, ids: Sequence[str]) -> dict[str, Vectors]:
        point_ids = self.collections.point_ids(target)(ids)
        by_point = {str(p): i for p, i in zip(point_ids, ids, strict=True)}
        name = self.collections.vector_name(target)
        with translated():
            points = self.collections.client.retrieve(
                target, point_ids, with_payload=False, with_vectors=with_vector(name)
            )
        stored = ((by_point[str(p.id)], stored_vector(p, name)) for p in points)
        return {doc_id: vector for doc_id, vector in stored if vector.size}  # a kept point has none

    def fetch_matching(self, target: str, expected: Mapping[str, str]) -> dict[str, Vectors]:
        """Only ids whose stored content hash is the expected one: a copy never takes a stale vector."""
        name = self.collections.vector_name(target)
        ids = list(expected)
        found: dict[str, Vectors] = {}
        ids_of = self.collections.point_ids(target)
        for start in range(0, len(ids), self.page):
            part = ids[start : start + self.page]
            point_ids = ids_of(part)
            by_point = {str(p): i for p, i in zip(point_ids, part, strict=True)}
            with translated():
                points = self.collections.client.retrieve(
                    target, point_ids, with_payload=INDEX_KEYS, with_vectors=with_vector(name)
                )
            for point in points:
                doc_id = by_point[str(point.id)]
                vector = stored_vector(point, name)
                if (point.payload or {}).get("reindex_content_hash") == expected[doc_id] and vector.size:
                    found[doc_id] = vector
        return found

    def scan_vectors(self, target: str, batch: int = 5000) -> Iterator[tuple[list[str], Vectors]]:
        name = self.collections.vector_name(target)
        for points in self.pages(target, name, batch):
            kept = [(p, v) for p in points if (v := stored_vector(p, name)).size]
            if kept:
                yield [document_id(p) for p, _ in kept], np.stack([v for _, v in kept]).astype(np.float32)

    def search(self, target: str, vectors: Vectors, k: int) -> list[list[str]]:
        """Qdrant's own (HNSW) search, one query per vector."""
        name = self.collections.vector_name(target)
        found: list[list[str]] = []
        for vector in vectors:
            with translated():
                response = self.collections.client.query_points(
                    target,
                    query=np.asarray(vector, dtype=np.float32).tolist(),
                    using=name,
                    limit=k,
                    with_payload=INDEX_KEYS,
                )
            found.append([document_id(p) for p in response.points])
        return found

    def distance(self, target: str) -> Distance:
        with translated():
            config = self.collections.client.get_collection(target).config
        return _distance(vector_params(config.params.vectors, self.collections.vector_name(target)), target)

    def pages(
        self, target: str, name: str | None, limit: int, carried: Sequence[str] = (), *, whole: bool = False
    ) -> Iterator[list[models.Record]]:
        """Every point with its payload and its vector (and the carried ones), a scroll page at a time;
        `whole`: with every vector. The whole payload is read: verify compares it with the source's
        (`IndexEntry.fields`), and a point the application upserted needs its text for its hash."""
        offset: Any = None
        wanted: bool | list[str] = [name or "", *carried] if carried else with_vector(name)
        while True:
            with translated():
                points, offset = self.collections.client.scroll(
                    target,
                    limit=limit,
                    offset=offset,
                    with_payload=True,
                    with_vectors=True if whole else wanted,
                )
            yield points
            if offset is None:
                return
