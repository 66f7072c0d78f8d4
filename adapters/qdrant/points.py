"""Qdrant point ids and payloads: `point_id` and the layouts of older targets, the one document id of a point,
payloads as JSON, stored vectors and distances."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import uuid
from collections.abc import Mapping, Sequence
from datetime import date, datetime, time
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import numpy as np

from reindex.columns import Documents
from reindex.errors import ConfigError
from reindex.ports import Distance, Vectors

if TYPE_CHECKING:
    from qdrant_client import models

# uuid5(NAMESPACE_URL, "reindex-embeddings:point-id"); fixed forever: it derives every stored point id
POINT_NAMESPACE = uuid.UUID("2e3bcf89-fa2e-52a1-bf7e-fc2a1fb506f9")
NATIVE_IDS = (
    "native"  # collection metadata `point_ids`: integer document ids stay integer point ids (point_id)
)
_DISTANCES: dict[str, Distance] = {"Cosine": "cosine", "Dot": "dot", "Euclid": "euclid"}


def point_id(doc_id: str) -> int | str:
    """Map a document id to its Qdrant point id: the id the application already uses where it is one.

    A canonical unsigned integer ("7", not "007" or "+7") is kept as that integer point id, and a canonical
    UUID string as itself, so the application addresses its points through the alias by the ids it has
    always used (a Qdrant source names each document by its point id). Every other id becomes
    uuid5(POINT_NAMESPACE, id), so "007" never folds into point 7. The map is one to one: an integer and
    a UUID are never the same point id.
    """
    if _is_point_number(doc_id):
        return int(doc_id)
    return uuid_point_id(doc_id)


def uuid_point_id(doc_id: str) -> str:
    """The point id of targets built before integer ids were kept: a canonical UUID as itself, else uuid5."""
    if len(doc_id) == 36:
        try:
            if str(uuid.UUID(doc_id)) == doc_id:
                return doc_id
        except ValueError:
            pass
    return _uuid5(doc_id)


def _is_point_number(doc_id: str) -> bool:
    """A canonical decimal unsigned 64-bit integer: what str() of an integer point id gives."""
    return (
        doc_id.isascii()
        and doc_id.isdigit()
        and (doc_id == "0" or doc_id[0] != "0")
        and len(doc_id) <= 20
        and int(doc_id) < 2**64
    )


def dotted(payload: Mapping[str, Any], path: str) -> Any:
    """Follow `a.b.c`; a step into a string holding a JSON object reads inside it (`_node_content`)."""
    value: Any = payload
    for step in path.split("."):
        if isinstance(value, str):
            value = _json_object(value)
        if not isinstance(value, Mapping) or step not in value:
            return None
        value = value[step]
    return value


def _json_object(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def parse_point_id(value: str, *, strict: bool = False) -> int | str | None:
    """Turn str(point id) back into the id Qdrant takes: an unsigned int or a UUID string."""
    if value.isascii() and value.isdigit():
        return int(value)
    try:
        return str(uuid.UUID(value))
    except ValueError:
        if strict:
            raise ConfigError(f"resume position {value!r} is not a Qdrant point id") from None
        return None


def _point_ids(doc_ids: Sequence[str]) -> list[Any]:
    """`point_id` of every id."""
    return [point_id(i) for i in doc_ids]


def uuid_point_ids(doc_ids: Sequence[str]) -> list[Any]:
    """`uuid_point_id` of every id: a target built before integer ids were kept."""
    return [uuid_point_id(i) for i in doc_ids]


def candidate_points(doc_id: str) -> set[int | str]:
    """The point ids a document may be stored under: its own id as a point id, `point_id`, or the UUID
    an older target derived."""
    parsed = parse_point_id(doc_id)
    found: set[int | str] = {point_id(doc_id), uuid_point_id(doc_id)}
    return found if parsed is None else found | {parsed}


_NAMESPACE_BYTES = POINT_NAMESPACE.bytes


def _uuid5(doc_id: str) -> str:
    """str(uuid.uuid5(POINT_NAMESPACE, doc_id)) without building a UUID object (RFC 4122 section 4.3)."""
    digest = bytearray(hashlib.sha1(_NAMESPACE_BYTES + doc_id.encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    text = digest.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def point_payloads(docs: Documents, content_hashes: Sequence[str], fingerprint: str) -> list[dict[str, Any]]:
    """Each document's payload as JSON plus the reindex keys (which win over the document's own)."""
    if not docs.has_payload:  # just id and text: strings, already JSON
        id_field, text_field = docs.fields
        return [
            {
                id_field: doc_id,
                text_field: text,
                "reindex_id": doc_id,
                "reindex_fingerprint": fingerprint,
                "reindex_content_hash": content_hash,
            }
            for doc_id, text, content_hash in zip(docs.ids, docs.texts, content_hashes, strict=True)
        ]
    payloads = [json_safe(docs.payload(i)) for i in range(len(docs))]
    for payload, doc_id, content_hash in zip(payloads, docs.ids, content_hashes, strict=True):
        payload.pop("reindex_origin", None)  # read from an adopted point: this vector is the tool's now
        payload.update(reindex_id=doc_id, reindex_fingerprint=fingerprint, reindex_content_hash=content_hash)
    return payloads


_JSON_SCALARS = frozenset({str, int, bool, type(None)})  # exact types kept as they are


def json_safe(value: Any) -> Any:
    """Copy `value` as JSON: datetimes as ISO text, Decimal as float, UUID as text, bytes as base64."""
    if type(value) in _JSON_SCALARS:
        return value
    if isinstance(value, Mapping):
        return {
            k if type(k) is str else str(k): v if type(v) in _JSON_SCALARS else json_safe(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        return [json_safe(v) for v in value]
    if isinstance(value, np.ndarray | np.generic):
        return json_safe(value.tolist())
    if isinstance(value, float | Decimal):
        return float(value) if math.isfinite(value) else None
    if value is None or isinstance(value, str | int | bool):
        return value
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    return str(value)


def document_id(point: Any) -> str:
    """The one name of a point's document, for every read (source scans, verify, sync, search): the
    `reindex_id` the tool stored, where the point's id is the one the tool derives from it (`point_id`, or
    an older target's UUID); else the point id itself (a point the application wrote, or one whose
    payload it copied from another point)."""
    own = str(point.id)
    stored = (point.payload or {}).get("reindex_id")
    if not isinstance(stored, str) or stored == own:
        return own
    return stored if own in (str(point_id(stored)), uuid_point_id(stored)) else own


def with_vector(name: str | None) -> bool | list[str]:
    return True if name is None else [name]


def stored_vector(point: models.Record, name: str | None) -> Vectors:
    raw: Any = point.vector
    if isinstance(raw, Mapping):
        raw = raw.get(name if name is not None else "", [])
    return np.asarray(raw if raw is not None else [], dtype=np.float32)


def vector_params(vectors: Any, name: str | None) -> Any:
    if not isinstance(vectors, Mapping):
        return vectors
    if name is not None:
        return vectors.get(name)
    return next(iter(vectors.values())) if len(vectors) == 1 else None


def _distance(params: Any, collection: str, name: str | None = None) -> Distance:
    """The distance of the vector the tool re-embeds; one it cannot embed for is refused (a vector it
    carries keeps whatever distance it has: `is_cosine`)."""
    if params is None:
        return "cosine"
    reported = str(getattr(params.distance, "value", params.distance))
    distance = _DISTANCES.get(reported)
    if distance is None:
        vector = (
            f"vector {name!r} of collection {collection!r}"
            if name
            else f"the vector of collection {collection!r}"
        )
        raise ConfigError(
            f"{vector} uses distance {reported}: the re-embedded vector must use Cosine, Dot or Euclid",
            hint="re-embed another vector ([source] vector_name); this one can be carried unchanged",
        )
    return distance


def is_cosine(params: Any) -> bool:
    return str(getattr(params.distance, "value", params.distance)) == "Cosine"


def qdrant_distance(distance: Distance) -> Any:
    from qdrant_client import models

    return models.Distance(distance.capitalize())  # "cosine" -> Distance.COSINE ("Cosine")
