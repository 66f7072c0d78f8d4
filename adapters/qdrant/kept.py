"""Points kept without the migration's vector: a document that cannot be embedded (a blank text, a text that
is not a string) keeps its point in the target, payload and carried vectors, so that after the flip the
alias still serves every point the application had, and a dead letter is judged by the point the
application can change or delete (`reindex.ports.KeepsDocuments`).

What the application sees: the point, found by id, scroll and filter as before, with no vector of the new
model (a vector search does not return it). A server keeps such a point as local mode does: Qdrant's
points may lack any of their named vectors, the unnamed one ("") included, and `delete_vectors` removes
some and keeps the rest (https://api.qdrant.tech/api-reference/points/delete-vectors).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from reindex.fingerprint import text_hash
from reindex.ports import Record
from reindex_adapters.qdrant.bookkeeping import INDEX_KEYS, hash_is
from reindex_adapters.qdrant.carried import of_payload
from reindex_adapters.qdrant.connection import translated
from reindex_adapters.qdrant.points import document_id, json_safe

if TYPE_CHECKING:
    from qdrant_client import models

    from reindex_adapters.qdrant.targets import Collections


class KeptPoints:
    """QdrantSink's points without the migration's vector, written `batch` at a time."""

    def __init__(self, collections: Collections, batch: int) -> None:
        self.collections = collections
        self.batch = batch

    def keep(self, target: str, records: Sequence[Record], expected: Mapping[str, str] | None = None) -> None:
        """Each document's point as its source holds it (payload, carried vectors), without the migration's
        vector: inserted, or written over a point that has no such vector; for the ids `expected` names,
        written only over a point that still stores that content hash (a newer write stands)."""
        from qdrant_client import models

        expected = expected or {}
        ids_of = self.collections.point_ids(target)
        groups: dict[str | None, list[models.PointStruct]] = {}
        for record in records:
            (point,) = ids_of([record.id])
            payload = {k: v for k, v in json_safe(dict(record.payload)).items() if k not in INDEX_KEYS}
            payload["reindex_id"] = record.id  # names the document where the point id is derived from it
            if (digest := text_hash(record)) is not None:  # what a guarded write or delete matches on
                payload["reindex_content_hash"] = digest
            struct = models.PointStruct(
                id=point, vector=dict(of_payload(record.payload) or {}), payload=payload
            )
            groups.setdefault(expected.get(record.id), []).append(struct)
        for digest, points in groups.items():
            for start in range(0, len(points), self.batch):
                part = points[start : start + self.batch]
                if digest is not None:
                    self._upsert_where(target, part, hash_is(digest))
                    continue
                self._upsert_where(target, part, self.without_vector(target))
                with translated():
                    self.collections.client.upsert(
                        target, part, wait=True, update_mode=models.UpdateMode.INSERT_ONLY
                    )

    def unserve(self, target: str, ids: Sequence[str], expected: Mapping[str, str] | None = None) -> None:
        """Remove the migration's vector of these documents' points, which keep their payload and carried
        vectors; for the ids `expected` names, only where the point still stores that content hash."""
        from qdrant_client import models

        expected = expected or {}
        ids_of = self.collections.point_ids(target)
        name = self.collections.vector_name(target) or ""
        groups: dict[str | None, list[Any]] = {}
        for doc_id in ids:
            groups.setdefault(expected.get(doc_id), []).append(ids_of([doc_id])[0])
        for digest, points in groups.items():
            # by filter: a point deleted meanwhile is no error (a server refuses ids it does not hold)
            selector = models.FilterSelector(
                filter=models.Filter(must=[models.HasIdCondition(has_id=points)])
                if digest is None
                else hash_is(digest, points)
            )
            with translated():
                self.collections.client.delete_vectors(target, vectors=[name], points=selector, wait=True)

    def kept(self, target: str) -> list[str]:
        """The documents whose points the target holds without the migration's vector, sorted."""
        offset: Any = None
        found: list[str] = []
        while True:
            with translated():
                points, offset = self.collections.client.scroll(
                    target,
                    scroll_filter=self.without_vector(target),
                    limit=self.batch,
                    offset=offset,
                    with_payload=["reindex_id"],
                    with_vectors=False,
                )
            found += [document_id(p) for p in points]
            if offset is None:
                return sorted(found)

    def without_vector(self, target: str) -> models.Filter:
        from qdrant_client import models

        return models.Filter(
            must_not=[models.HasVectorCondition(has_vector=self.collections.vector_name(target) or "")]
        )

    def _upsert_where(self, target: str, points: list[models.PointStruct], only: models.Filter) -> None:
        from qdrant_client import models

        with translated():
            self.collections.client.upsert(
                target, points, wait=True, update_mode=models.UpdateMode.UPDATE_ONLY, update_filter=only
            )
