"""The bookkeeping reindex keeps in Qdrant: collection metadata, the index keys on each point, how a point
the application wrote is read and adopted, and filters on a point's stored content hash."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reindex.fingerprint import text_hash
from reindex.ports import Record
from reindex_adapters.qdrant.points import dotted, parse_point_id, uuid_point_id

if TYPE_CHECKING:
    from qdrant_client import models

META_KEY = "reindex"  # collection metadata key holding fingerprint, dim, alias, model, created_at
INDEX_KEYS = ["reindex_id", "reindex_fingerprint", "reindex_content_hash", "reindex_origin"]
ADOPTED = "application"  # `reindex_origin` of a point the application wrote and `adopt` gave the other keys


def reindex_meta(config: Any) -> dict[str, Any]:
    """What prepare() recorded in the collection metadata; {} for collections reindex did not build."""
    recorded = (config.metadata or {}).get(META_KEY)
    return dict(recorded) if isinstance(recorded, Mapping) else {}


@dataclass(frozen=True)
class Bookkeeping:
    """How `scan_index` reads a point's content hash and fingerprint.

    The tool writes both on every point. A point without `reindex_content_hash` was upserted whole by the
    application through the alias, vector and text together with the model the alias serves (as the
    pgvector trigger assumes of a row written without one): its hash is its text's, computed as the tool
    computes it (`text_hash`), and its fingerprint the collection's own. Collections reindex did not build
    (no recorded fingerprint or text field) derive nothing: their points stay unhashed.
    """

    fingerprint: str | None
    text_field: str | None

    @classmethod
    def of(cls, meta: Mapping[str, Any]) -> Bookkeeping:
        fingerprint, text_field = meta.get("fingerprint"), meta.get("text_field")
        if not isinstance(fingerprint, str) or not isinstance(text_field, str):
            return cls(None, None)
        return cls(fingerprint, text_field)

    def read(self, payload: Mapping[str, Any]) -> tuple[str | None, str | None, bool]:
        """(content hash, fingerprint, written by the application) of one point's payload."""
        if "reindex_content_hash" in payload:
            adopted = payload.get("reindex_origin") == ADOPTED
            return payload["reindex_content_hash"], payload.get("reindex_fingerprint"), adopted
        if self.text_field is None:
            return None, payload.get("reindex_fingerprint"), True
        text = dotted(payload, self.text_field)
        digest = text_hash(Record("", text)) if isinstance(text, str) else None
        return digest, self.fingerprint, True


def unhashed(doc_id: str) -> Any:
    """A filter for the application's point of this id (its own point id: it has no `reindex_id`), while
    it still carries no content hash."""
    from qdrant_client import models

    parsed = parse_point_id(doc_id)
    return models.Filter(
        must=[
            models.HasIdCondition(has_id=[uuid_point_id(doc_id) if parsed is None else parsed]),
            models.IsEmptyCondition(is_empty=models.PayloadField(key="reindex_content_hash")),
        ]
    )


def hash_is(digest: str, points: Sequence[Any] = ()) -> models.Filter:
    """Points storing this content hash (among `points`, when given)."""
    from qdrant_client import models

    stored: list[Any] = [
        models.FieldCondition(key="reindex_content_hash", match=models.MatchValue(value=digest))
    ]
    return models.Filter(must=[models.HasIdCondition(has_id=list(points)), *stored] if points else stored)
