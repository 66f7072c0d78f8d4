"""Qdrant source and sink, local mode or server through one client API. Cutover = collection alias.

Local mode allows one client per storage folder, so `from_config` shares one client per folder (or URL).
Each alias has a guard alias `<alias>__reindex_serves__<target>` that makes its moves compare-and-swap;
guards are the tool's own bookkeeping, never served aliases or targets.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from reindex import crashpoints
from reindex.columns import Documents, documents
from reindex.errors import (
    BackendError,
    ConfigError,
    CutoverRefused,
    MissingDependency,
    ReindexError,
    TransientError,
)
from reindex.fingerprint import text_hash
from reindex.ports import (
    AliasInfo,
    Distance,
    IndexEntry,
    Record,
    Rows,
    Sink,
    SourceSchema,
    TargetInfo,
    TargetSpec,
    Vectors,
)
from reindex.vectors import vector_problem

if TYPE_CHECKING:
    from qdrant_client import QdrantClient, models

# uuid5(NAMESPACE_URL, "reindex-embeddings:point-id"); fixed forever: it derives every stored point id
POINT_NAMESPACE = uuid.UUID("2e3bcf89-fa2e-52a1-bf7e-fc2a1fb506f9")
META_KEY = "reindex"  # collection metadata key holding fingerprint, dim, alias, model, created_at
NATIVE_IDS = (
    "native"  # collection metadata `point_ids`: integer document ids stay integer point ids (point_id)
)
INDEX_KEYS = ["reindex_id", "reindex_fingerprint", "reindex_content_hash", "reindex_origin"]
ADOPTED = "application"  # `reindex_origin` of a point the application wrote and `adopt` gave the other keys
# `<alias>__reindex_serves__<target>`: the guard alias that makes alias moves compare-and-swap (move_alias)
GUARD_MARK = "__reindex_serves__"
BOUNDS_PAGE = 10_000  # points per ids-only scroll page when a ray driver plans shards
_NAME_MAX = 255  # Qdrant's limit on collection and alias names
# What a Qdrant server refuses in a new collection's name (its `validate_collection_name`), as qdrant-client's
# local mode does: it keeps each collection in a folder named after it. An alias is read as a collection name.
_NAME_REFUSED = '<>:"/\\|?*\0\x1f'
_ALIAS_MAX = _NAME_MAX - len(GUARD_MARK) - 16  # its guard alias, `_guard` hashed past the limit, must fit
_DISTANCES: dict[str, Distance] = {"Cosine": "cosine", "Dot": "dot", "Euclid": "euclid"}


class _Connection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    url: str | None = None
    path: str | None = None  # a local storage folder, or ":memory:"
    api_key_env: str | None = None

    @model_validator(mode="after")
    def _one_location(self) -> _Connection:
        if (self.url is None) == (self.path is None):
            raise ValueError("set exactly one of url (a Qdrant server) or path (local storage)")
        return self


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
    return _uuid_point_id(doc_id)


def _uuid_point_id(doc_id: str) -> str:
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


class QdrantSource:
    """Reads a collection (or alias) in point-id order; the cursor is the last point id."""

    class Config(_Connection):
        kind: Literal["qdrant"]
        collection: str
        text_field: str = "page_content"  # dotted path into the payload, e.g. "metadata.text"
        vector_name: str | None = None
        page_size: int = Field(default=256, ge=1)

    def __init__(
        self,
        client: QdrantClient,
        *,
        collection: str,
        text_field: str = "page_content",
        vector_name: str | None = None,
        page_size: int = 256,
    ) -> None:
        self._client = client
        self.collection = collection
        self.text_field = text_field
        self.vector_name = vector_name
        self.page_size = page_size
        self._lease: str | None = None
        self._checked = False

    @classmethod
    def from_config(cls, config: Config) -> QdrantSource:
        client, key = _acquire(config)
        source = cls(
            client,
            collection=config.collection,
            text_field=config.text_field,
            vector_name=config.vector_name,
            page_size=config.page_size,
        )
        source._lease = key
        return source

    def identity(self) -> str:
        """`qdrant:<server url or absolute path>/<collection>#id,<text field>`: no key, no page size."""
        return f"qdrant:{_location(self._client)}/{self.collection}#id,{self.text_field}"

    def schema(self) -> SourceSchema:
        with _translated():
            vectors = self._client.get_collection(self._require()).config.params.vectors
        name, params = self._pick_vector(vectors)
        return SourceSchema(
            id_field="id",
            text_field=self.text_field,
            vector_field=name,
            distance=_distance(params, self.collection),
        )

    def count(self) -> int | None:
        with _translated():
            return self._client.count(self._require(), exact=True).count

    def scan(self, after: str | None = None) -> Iterator[Record]:
        offset: int | str | None = None if after is None else _parse_point_id(after, strict=True)
        while True:
            with _translated():
                points, next_offset = self._client.scroll(
                    self._require(),
                    limit=self.page_size,
                    offset=offset,
                    with_payload=True,
                    with_vectors=False,
                )
            for point in points:
                if str(point.id) != after:  # scroll's offset is inclusive
                    yield self._record(point)
            if next_offset is None:
                return
            offset = next_offset if isinstance(next_offset, int | str) else str(next_offset)

    def shard_bounds(self, after: str | None, size: int) -> Iterator[tuple[str, int]]:
        """(last point id, points) of each shard of `size` points after `after`, as `scan` would cut them:
        a scroll of ids alone (no payload, no vector), so a ray driver plans a big collection without
        reading its texts. A point without a text is a document too (a dead letter)."""
        offset: int | str | None = None if after is None else _parse_point_id(after, strict=True)
        count, last = 0, ""
        while True:
            with _translated():
                points, next_offset = self._client.scroll(
                    self._require(),
                    limit=max(self.page_size, BOUNDS_PAGE),
                    offset=offset,
                    with_payload=False,
                    with_vectors=False,
                )
            for point in points:
                if str(point.id) == after:  # scroll's offset is inclusive
                    continue
                count, last = count + 1, str(point.id)
                if count == size:
                    yield last, count
                    count = 0
            if next_offset is None:
                break
            offset = next_offset if isinstance(next_offset, int | str) else str(next_offset)
        if count:
            yield last, count

    def fetch(self, ids: Sequence[str]) -> Iterator[Record]:
        """The documents with these ids (`_document_id`): the point of that id, or the point a reindex
        target stored the document under."""
        wanted = set(ids)
        candidates = {str(p): p for i in wanted for p in _candidate_points(i)}
        with _translated():
            points = self._client.retrieve(
                self._require(), list(candidates.values()), with_payload=True, with_vectors=False
            )
        records = (self._record(point) for point in points)
        return (record for record in records if record.id in wanted)

    def reading(self, sink: Sink, alias: str, previous: str) -> QdrantSource | None:
        """This source over `previous` when it reads the alias or `previous` itself in the sink's storage:
        the live index the application wrote to until the flip. It shares this source's client."""
        if not isinstance(sink, QdrantSink) or self.collection not in (alias, previous):
            return None
        if _location(sink._client) != _location(self._client):
            return None
        return self.over(previous)

    def over(self, index: str) -> QdrantSource:
        """This source's settings over another collection of the same store, sharing this client."""
        return QdrantSource(
            self._client,
            collection=index,
            text_field=self.text_field,
            vector_name=self.vector_name,
            page_size=self.page_size,
        )

    def close(self) -> None:
        _release(self._lease)
        self._lease = None

    def _require(self) -> str:
        if not self._checked:
            with _translated():
                exists = self._client.collection_exists(self.collection)
            if not exists:
                raise ConfigError(
                    f"Qdrant collection or alias {self.collection!r} not found",
                    hint="check [source] collection",
                )
            self._checked = True
        return self.collection

    def _record(self, point: models.Record) -> Record:
        payload = point.payload or {}
        text = _dotted(payload, self.text_field)
        doc_id = _document_id(point)
        cursor = None if doc_id == str(point.id) else str(point.id)  # scans resume after a point id
        if text is None:
            return Record(doc_id, "", payload, cursor, defect="missing_text")
        if not isinstance(text, str):
            return Record(doc_id, "", payload, cursor, defect="invalid_text_type")
        return Record(doc_id, text, payload, cursor)

    def _pick_vector(self, vectors: Any) -> tuple[str | None, Any]:
        if not isinstance(vectors, Mapping):
            if self.vector_name is not None:
                raise ConfigError(
                    f"collection {self.collection!r} has one unnamed vector",
                    hint="remove [source] vector_name",
                )
            return None, vectors
        if self.vector_name is not None:
            if self.vector_name not in vectors:
                raise ConfigError(
                    f"collection {self.collection!r} has no vector {self.vector_name!r}",
                    hint=f"use one of: {', '.join(sorted(vectors))}",
                )
            return self.vector_name, vectors[self.vector_name]
        if len(vectors) > 1:
            raise ConfigError(
                f"collection {self.collection!r} has several named vectors",
                hint=f"set [source] vector_name to one of: {', '.join(sorted(vectors))}",
            )
        return next(iter(vectors.items()), (None, None))


class QdrantSink:
    """Targets are collections `<alias>__<fp8>` with their identity in the collection metadata."""

    holds_writers = False  # nothing holds a collection's writers: cutover --sync carries the window after

    class Config(_Connection):
        kind: Literal["qdrant"]
        alias: str
        name: str | None = None
        upsert_batch: int = Field(default=256, ge=1)

        @field_validator("alias")
        @classmethod
        def _alias_qdrant_accepts(cls, alias: str) -> str:
            """Refused here, at config time: Qdrant would refuse it only at cutover, after the whole run.
            Its target, `<alias>__<fp8>`, is then one Qdrant accepts too."""
            return _creatable(alias, _ALIAS_MAX, "for the guard alias the tool adds") if alias else alias

        @field_validator("name")
        @classmethod
        def _name_qdrant_accepts(cls, name: str | None) -> str | None:
            return _creatable(name, _NAME_MAX, "Qdrant's limit") if name else name

    def __init__(self, client: QdrantClient, *, upsert_batch: int = 256) -> None:
        self._client = client
        self.upsert_batch = upsert_batch
        self._lease: str | None = None
        self._vector_names: dict[str, str | None] = {}
        self._native: dict[str, bool] = {}

    @classmethod
    def from_config(cls, config: Config) -> QdrantSink:
        client, key = _acquire(config)
        sink = cls(client, upsert_batch=config.upsert_batch)
        sink._lease = key
        return sink

    def identity(self) -> str:
        """`qdrant:<server url or absolute path>`: where the collections live, never the api key."""
        return f"qdrant:{_location(self._client)}"

    def prepare(self, spec: TargetSpec) -> None:
        """Create the collection with its identity in the metadata; an existing one is never re-stamped."""
        existing = self.describe(spec.name)
        if existing is not None:
            _check_existing(existing, spec)
            return
        from qdrant_client import models

        params = models.VectorParams(size=spec.dim, distance=_qdrant_distance(spec.source.distance))
        name = spec.source.vector_field
        meta = {
            "fingerprint": spec.fingerprint,
            "dim": spec.dim,
            "alias": spec.alias,
            "vector": name,
            "text_field": spec.source.text_field,  # where an application's point holds its text
            "model": _json_safe(spec.model),
            "plan_id": spec.plan_id,
            "nonce": spec.nonce,
            "created_at": datetime.now(UTC).isoformat(),
            "point_ids": NATIVE_IDS,
        }
        with _translated():
            self._client.create_collection(
                spec.name,
                vectors_config=params if name is None else {name: params},
                metadata={META_KEY: meta},
            )

    def write(self, target: str, rows: Rows) -> None:
        """Upsert by point id, `upsert_batch` points per request, each a columnar `models.Batch`.

        One request per chunk (a server refuses bodies past 32 MB), the vectors as one `tolist` of the
        numpy rows, no `PointStruct` per row; wait=True on a server, and local mode stores every point
        before it returns, so a returned write is durable. The client's `upload_collection` is not used:
        on a server it opens its own connection, retries with warnings on its own and defaults to
        wait=False, while retries belong to the pipeline and errors to `_translated`.
        """
        self._upsert(target, rows)

    def write_guarded(self, target: str, rows: Rows, expected: Mapping[str, str | None]) -> None:
        """Upsert each row only while its point holds what `expected` says (by document id): a point whose
        stored content hash is that hash is updated, and one deleted meanwhile is not re-created; None
        (no point) inserts, and never over a point written meanwhile. One request per expected hash: meant
        for the few documents of a cutover's window (`reindex.flip.sync.after_flip`), not a bulk load."""
        from qdrant_client import models

        groups: dict[str | None, list[int]] = {}
        for row, record in enumerate(rows.records):
            groups.setdefault(expected.get(record.id), []).append(row)
        for digest, picked in groups.items():
            part = _rows_at(rows, picked)
            if digest is None:
                self._upsert(target, part, mode=models.UpdateMode.INSERT_ONLY)
            else:
                self._upsert(target, part, mode=models.UpdateMode.UPDATE_ONLY, only=_hash_is(digest))

    def delete_guarded(self, target: str, expected: Mapping[str, str]) -> None:
        """Delete each document's point only while it stores the content hash `expected` names for it."""
        from qdrant_client import models

        groups: dict[str, list[Any]] = {}
        ids_of = self._point_ids(target)
        for doc_id, digest in expected.items():
            groups.setdefault(digest, []).append(ids_of([doc_id])[0])
        for digest, points in groups.items():
            with _translated():
                self._client.delete(target, models.FilterSelector(filter=_hash_is(digest, points)), wait=True)

    def _upsert(
        self,
        target: str,
        rows: Rows,
        *,
        mode: models.UpdateMode | None = None,
        only: models.Filter | None = None,
    ) -> None:
        from qdrant_client import models

        docs = documents(rows.records)
        vectors = np.asarray(rows.vectors)
        if not len(vectors) == len(docs) == len(rows.content_hashes):
            raise ValueError(
                f"{len(docs)} records, {len(vectors)} vectors and {len(rows.content_hashes)} hashes differ"
            )
        name = self._vector_name(target)
        ids: list[Any] = self._point_ids(target)(docs.ids)
        payloads = _point_payloads(docs, rows.content_hashes, rows.fingerprint)
        guards: dict[str, Any] = {} if mode is None else {"update_mode": mode, "update_filter": only}
        for start in range(0, len(ids), self.upsert_batch):
            stop = start + self.upsert_batch
            chunk = vectors[start:stop].tolist()
            # built without validation: ids and payloads are ours, and local mode and the server both
            # check every vector again, so validating each float here too would only repeat that work
            batch = models.Batch.model_construct(
                ids=ids[start:stop],
                vectors=chunk if name is None else {name: chunk},
                payloads=payloads[start:stop],
            )
            with _translated():
                self._client.upsert(target, batch, wait=True, **guards)

    def delete(self, target: str, ids: Sequence[str]) -> None:
        from qdrant_client import models

        with _translated():
            self._client.delete(target, models.PointIdsList(points=self._point_ids(target)(ids)), wait=True)

    def finalize(self, spec: TargetSpec) -> None:
        """Index `reindex_id` on a server, for verify and sync; local mode has no payload indexes."""
        if _is_local(self._client):
            return
        from qdrant_client import models

        with _translated():
            self._client.create_payload_index(
                spec.name, "reindex_id", models.PayloadSchemaType.KEYWORD, wait=True
            )

    def describe(self, target: str) -> TargetInfo | None:
        with _translated():
            if not self._client.collection_exists(target):
                return None
            config = self._client.get_collection(target).config
            count = self._client.count(target, exact=True).count
        meta = _reindex_meta(config)
        params = _vector_params(config.params.vectors, meta.get("vector"))
        return TargetInfo(
            target,
            count,
            None if params is None else params.size,
            meta.get("fingerprint"),
            meta.get("model"),
            plan_id=meta.get("plan_id") or None,
            nonce=meta.get("nonce") or None,
        )

    def scan_index(self, target: str, dim: int) -> Iterator[IndexEntry]:
        """Points the application upserted through the alias lost the reindex keys (an upsert replaces the
        whole payload): their hash and fingerprint are derived (`_Bookkeeping`), and they are marked. Only
        their texts are read, one extra request per page that holds any: the tool's points cost no text."""
        name = self._vector_name(target)
        with _translated():
            bookkeeping = _Bookkeeping.of(_reindex_meta(self._client.get_collection(target).config))
        for points in self._pages(target, name, self.upsert_batch):
            texts = self._texts_of_unhashed(target, points, bookkeeping)
            for point in points:
                payload = texts.get(str(point.id), point.payload or {})
                digest, fingerprint, application = bookkeeping.read(payload)
                vector = _stored_vector(point, name)
                derived = "reindex_content_hash" not in payload
                problem = vector_problem(vector, dim)
                yield IndexEntry(_document_id(point), digest, fingerprint, problem, application, derived)

    def _texts_of_unhashed(
        self, target: str, points: Sequence[models.Record], bookkeeping: _Bookkeeping
    ) -> dict[str, Mapping[str, Any]]:
        """point id -> payload with the text, for the points of a page that carry no content hash."""
        unhashed = [p.id for p in points if "reindex_content_hash" not in (p.payload or {})]
        if not unhashed or bookkeeping.text_field is None:
            return {}
        with _translated():
            found = self._client.retrieve(target, unhashed, with_payload=bookkeeping.keys, with_vectors=False)
        return {str(p.id): p.payload or {} for p in found}

    def adopt(self, target: str, hashes: Mapping[str, str], fingerprint: str) -> int:
        """Store the bookkeeping `scan_index` derived for application points, in one request per
        `upsert_batch`: each a set_payload guarded by "still no content hash", so a point rewritten by
        the tool meanwhile keeps its own, and a point deleted meanwhile is not an error. The vectors are
        untouched; from now on a text changed with set_payload under the old vector is stale. The points
        keep `reindex_origin = "application"`, so verify still counts them as the application's."""
        from qdrant_client import models

        items = list(hashes.items())
        for start in range(0, len(items), self.upsert_batch):
            operations = [
                models.SetPayloadOperation(
                    set_payload=models.SetPayload(
                        payload={
                            "reindex_id": doc_id,
                            "reindex_fingerprint": fingerprint,
                            "reindex_content_hash": digest,
                            "reindex_origin": ADOPTED,
                        },
                        filter=_unhashed(doc_id),
                    )
                )
                for doc_id, digest in items[start : start + self.upsert_batch]
            ]
            with _translated():
                self._client.batch_update_points(target, operations, wait=True)
        return len(items)

    def _pages(self, target: str, name: str | None, limit: int) -> Iterator[list[models.Record]]:
        """Every point with the index keys and its vector, a scroll page at a time."""
        offset: Any = None
        while True:
            with _translated():
                points, offset = self._client.scroll(
                    target,
                    limit=limit,
                    offset=offset,
                    with_payload=INDEX_KEYS,
                    with_vectors=_with_vector(name),
                )
            yield points
            if offset is None:
                return

    def fetch(self, target: str, ids: Sequence[str]) -> dict[str, Vectors]:
        point_ids = self._point_ids(target)(ids)
        by_point = {str(p): i for p, i in zip(point_ids, ids, strict=True)}
        name = self._vector_name(target)
        with _translated():
            points = self._client.retrieve(
                target, point_ids, with_payload=False, with_vectors=_with_vector(name)
            )
        return {by_point[str(p.id)]: _stored_vector(p, name) for p in points}

    def fetch_matching(self, target: str, expected: Mapping[str, str]) -> dict[str, Vectors]:
        """Only ids whose stored content hash is the expected one: a copy never takes a stale vector."""
        name = self._vector_name(target)
        ids = list(expected)
        found: dict[str, Vectors] = {}
        ids_of = self._point_ids(target)
        for start in range(0, len(ids), self.upsert_batch):
            part = ids[start : start + self.upsert_batch]
            point_ids = ids_of(part)
            by_point = {str(p): i for p, i in zip(point_ids, part, strict=True)}
            with _translated():
                points = self._client.retrieve(
                    target, point_ids, with_payload=INDEX_KEYS, with_vectors=_with_vector(name)
                )
            for point in points:
                doc_id = by_point[str(point.id)]
                if (point.payload or {}).get("reindex_content_hash") == expected[doc_id]:
                    found[doc_id] = _stored_vector(point, name)
        return found

    def scan_vectors(self, target: str, batch: int = 5000) -> Iterator[tuple[list[str], Vectors]]:
        name = self._vector_name(target)
        for points in self._pages(target, name, batch):
            kept = [(p, v) for p in points if (v := _stored_vector(p, name)).size]
            if kept:
                yield [_document_id(p) for p, _ in kept], np.stack([v for _, v in kept]).astype(np.float32)

    def search(self, target: str, vectors: Vectors, k: int) -> list[list[str]]:
        """Qdrant's own (HNSW) search, one query per vector."""
        name = self._vector_name(target)
        found: list[list[str]] = []
        for vector in vectors:
            with _translated():
                response = self._client.query_points(
                    target,
                    query=np.asarray(vector, dtype=np.float32).tolist(),
                    using=name,
                    limit=k,
                    with_payload=INDEX_KEYS,
                )
            found.append([_document_id(p) for p in response.points])
        return found

    def distance(self, target: str) -> Distance:
        with _translated():
            config = self._client.get_collection(target).config
        return _distance(_vector_params(config.params.vectors, self._vector_name(target)), target)

    def alias(self, alias: str) -> AliasInfo:
        if alias in self._collections():
            return AliasInfo(alias, None, is_physical=True)
        target = self._aliases().get(alias)
        if target is None:
            return AliasInfo(alias, None)
        info = self.describe(target)
        return AliasInfo(
            alias, target, fingerprint=info.fingerprint if info else None, model=info.model if info else None
        )

    def move_alias(
        self,
        alias: str,
        target: str,
        *,
        expected: str | None,
        meta: Mapping[str, Any],
        settle: Callable[[], None] | None = None,
    ) -> str | None:
        """Compare-and-swap in ONE update_collection_aliases call, then read back. Qdrant cannot hold
        writers back: `settle` runs right before the call.

        The guard alias `<alias>__reindex_serves__<expected>` is the token: the call first renames it
        to the new target's guard, and a rename of a missing alias fails the whole call before any
        action is applied, so of two movers expecting the same target only the first gets through
        (a server applies a call's actions in order under its alias lock; deleting a missing alias
        would succeed, so it cannot be the check). Local mode holds one process-wide lock instead:
        its update is a read-modify-write of a dict that two threads can interleave, older
        qdrant-client releases apply a call's actions one by one, and its storage has one owning
        process anyway. Qdrant aliases carry no metadata: the target's collection metadata answers
        for `meta`.
        """
        collections = self._collections()
        if alias in collections:
            raise CutoverRefused(_physical_alias_message(alias))
        if target not in collections:
            raise CutoverRefused(f"target collection {target!r} does not exist")
        if settle is not None:
            settle()
        with self._move_lock():
            guards = self._claim(alias, target, expected)
            crashpoints.crash_if_armed("cutover_before_commit")
            try:
                with _translated():
                    self._client.update_collection_aliases(
                        change_aliases_operations=_swap(alias, target, expected, guards)
                    )
            except ReindexError as exc:
                self._after_failed_swap(alias, target, expected, exc)
        self._read_back(alias, target)
        return expected

    def _after_failed_swap(self, alias: str, target: str, expected: str | None, exc: ReindexError) -> None:
        """A refused call moved nothing: CutoverRefused if the guard is gone (another mover won).

        A transient failure may have been applied before the answer was lost: then the read-back decides.
        """
        aliases = self._aliases()
        if isinstance(exc, TransientError) and aliases.get(alias) == target:
            return
        if aliases.get(alias) != expected or _guard(alias, expected) not in aliases:
            raise _moved(alias, aliases.get(alias), expected) from exc
        raise exc

    def _move_lock(self) -> AbstractContextManager[Any]:
        return _local_moves if _is_local(self._client) else nullcontext()

    def _claim(self, alias: str, target: str, expected: str | None) -> list[str]:
        """Check the alias serves `expected` and make sure its guard exists; return the alias's guards.

        An alias without a guard (the first move, or one made by an older version or by hand) is
        adopted: its guard is created first, then the alias is read again; a mover that lost a race
        meanwhile finds the alias moved and removes the guard it made, so it can only fail others.
        """
        aliases = self._aliases()
        current = aliases.get(alias)
        if current != expected:
            raise _moved(alias, current, expected)
        guard = _guard(alias, expected)
        if guard in aliases:
            return _guards_of(alias, aliases)
        with _translated():
            self._client.update_collection_aliases(
                change_aliases_operations=[_create_alias(guard, target if expected is None else expected)]
            )
        aliases = self._aliases()
        if aliases.get(alias) != expected:
            with _translated():
                self._client.update_collection_aliases(change_aliases_operations=[_delete_alias(guard)])
            raise _moved(alias, aliases.get(alias), expected)
        return _guards_of(alias, aliases)

    def _read_back(self, alias: str, target: str) -> None:
        aliases = self._aliases()
        if aliases.get(alias) != target or aliases.get(_guard(alias, target)) != target:
            raise BackendError(
                f"alias {alias!r} does not point to {target!r} after the swap",
                hint="inspect the aliases on the server and rerun cutover",
            )

    def targets(self, alias: str) -> list[str]:
        names = [name for name in self._collections() if name.startswith(f"{alias}__")]
        return sorted(names, key=lambda name: (self._created_at(name), name))

    def drop(self, target: str) -> None:
        readers = sorted(a for a, t in self._aliases().items() if t == target and GUARD_MARK not in a)
        if readers:
            raise CutoverRefused(
                f"collection {target!r} is served by alias {readers[0]!r}",
                hint="move the alias to another target before pruning",
            )
        if target in self._collections():
            with _translated():
                self._client.delete_collection(target)
        self._vector_names.pop(target, None)
        self._native.pop(target, None)

    def close(self) -> None:
        _release(self._lease)
        self._lease = None

    def _vector_name(self, target: str) -> str | None:
        if target not in self._vector_names:
            self._read_layout(target)
        return self._vector_names[target]

    def _point_ids(self, target: str) -> Callable[[Sequence[str]], list[Any]]:
        """How `target` names its points: `point_id` (integer ids kept), or on a target built before that
        was recorded (`NATIVE_IDS`), a UUID for every document, so a resumed run keeps its scheme."""
        if target not in self._native:
            self._read_layout(target)
        return _point_ids if self._native[target] else _uuid_point_ids

    def _read_layout(self, target: str) -> None:
        with _translated():
            config = self._client.get_collection(target).config
        vectors = config.params.vectors
        names: list[str | None] = list(vectors) if isinstance(vectors, Mapping) else [None]
        meta = _reindex_meta(config)
        recorded = meta.get("vector")
        self._vector_names[target] = recorded if recorded in names else next(iter(names), None)
        self._native[target] = meta.get("point_ids") == NATIVE_IDS

    def _collections(self) -> set[str]:
        with _translated():
            return {c.name for c in self._client.get_collections().collections}

    def _aliases(self) -> dict[str, str]:
        with _translated():
            return {a.alias_name: a.collection_name for a in self._client.get_aliases().aliases}

    def _created_at(self, name: str) -> str:
        with _translated():
            config = self._client.get_collection(name).config
        return str(_reindex_meta(config).get("created_at", ""))


def _reindex_meta(config: Any) -> dict[str, Any]:
    """What prepare() recorded in the collection metadata; {} for collections reindex did not build."""
    recorded = (config.metadata or {}).get(META_KEY)
    return dict(recorded) if isinstance(recorded, Mapping) else {}


@dataclass(frozen=True)
class _Bookkeeping:
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
    def of(cls, meta: Mapping[str, Any]) -> _Bookkeeping:
        fingerprint, text_field = meta.get("fingerprint"), meta.get("text_field")
        if not isinstance(fingerprint, str) or not isinstance(text_field, str):
            return cls(None, None)
        return cls(fingerprint, text_field)

    @property
    def keys(self) -> list[str]:
        """The payload keys to read of an unhashed point: the index keys and the top of the text's path."""
        return INDEX_KEYS if self.text_field is None else [*INDEX_KEYS, self.text_field.split(".")[0]]

    def read(self, payload: Mapping[str, Any]) -> tuple[str | None, str | None, bool]:
        """(content hash, fingerprint, written by the application) of one point's payload."""
        if "reindex_content_hash" in payload:
            adopted = payload.get("reindex_origin") == ADOPTED
            return payload["reindex_content_hash"], payload.get("reindex_fingerprint"), adopted
        if self.text_field is None:
            return None, payload.get("reindex_fingerprint"), True
        text = _dotted(payload, self.text_field)
        digest = text_hash(Record("", text)) if isinstance(text, str) else None
        return digest, self.fingerprint, True


def _unhashed(doc_id: str) -> Any:
    """A filter for the application's point of this id (its own point id: it has no `reindex_id`), while
    it still carries no content hash."""
    from qdrant_client import models

    parsed = _parse_point_id(doc_id)
    return models.Filter(
        must=[
            models.HasIdCondition(has_id=[_uuid_point_id(doc_id) if parsed is None else parsed]),
            models.IsEmptyCondition(is_empty=models.PayloadField(key="reindex_content_hash")),
        ]
    )


def _creatable(name: str, longest: int, why: str) -> str:
    """`name` if Qdrant accepts it for a collection or alias the tool creates; else a ValueError naming the fix."""
    refused = sorted(set(name) & set(_NAME_REFUSED))
    if refused:
        fixed = "".join("_" if c in _NAME_REFUSED else c for c in name)
        raise ValueError(
            f"{name!r} has {', '.join(map(repr, refused))}, which Qdrant refuses in collection and alias"
            f" names: use e.g. {fixed!r}"
        )
    if name in (".", ".."):
        raise ValueError(f"{name!r} is not a name Qdrant accepts: use letters or digits")
    if len(name) > longest:
        raise ValueError(
            f"{name[:16]!r}... is {len(name)} characters long: shorten it to {longest} characters or fewer"
            f" ({why})"
        )
    return name


def _check_existing(info: TargetInfo, spec: TargetSpec) -> None:
    if (info.fingerprint, info.dim) != (spec.fingerprint, spec.dim):
        raise ConfigError(
            f"collection {spec.name!r} holds fingerprint {info.fingerprint} and dim {info.dim}, "
            f"not {spec.fingerprint} and {spec.dim}",
            hint="choose another [target] name",
        )


def _physical_alias_message(alias: str) -> str:
    return (
        f"{alias!r} is a real Qdrant collection and Qdrant cannot put an alias over a collection: "
        f"point the application at an alias first (create alias '{alias}_live' -> '{alias}', read "
        f"'{alias}_live', then cut over '{alias}_live'), or reindex under a new name and delete '{alias}' "
        "before cutting over (readers fail in between)"
    )


def _moved(alias: str, current: str | None, expected: str | None) -> CutoverRefused:
    return CutoverRefused(
        f"alias {alias!r} points to {current!r}, expected {expected!r}",
        hint="someone moved it meanwhile: check `reindex status` before retrying",
    )


def _guard(alias: str, served: str | None) -> str:
    """The guard alias saying `alias` serves `served` ('' for no target yet); hashed past Qdrant's limit."""
    name = f"{alias}{GUARD_MARK}{served or ''}"
    if len(name) <= _NAME_MAX:
        return name
    return f"{alias}{GUARD_MARK}{hashlib.sha256((served or '').encode()).hexdigest()[:16]}"


def _guards_of(alias: str, aliases: Mapping[str, str]) -> list[str]:
    return [name for name in aliases if name.startswith(f"{alias}{GUARD_MARK}")]


def _swap(alias: str, target: str, expected: str | None, guards: Sequence[str]) -> list[Any]:
    """The compare (a rename that fails if the expected guard is gone) first, so a refusal applies
    nothing even where a server applies the actions one by one; then the move, then the guards."""
    from qdrant_client import models

    new_guard = _guard(alias, target)
    compare = models.RenameAliasOperation(
        rename_alias=models.RenameAlias(old_alias_name=_guard(alias, expected), new_alias_name=new_guard)
    )
    stale = [_delete_alias(g) for g in guards if g not in (new_guard, _guard(alias, expected))]
    move = [_delete_alias(alias)] if expected is not None else []
    return [compare, *move, _create_alias(alias, target), _create_alias(new_guard, target), *stale]


def _create_alias(alias: str, collection: str) -> Any:
    from qdrant_client import models

    return models.CreateAliasOperation(
        create_alias=models.CreateAlias(collection_name=collection, alias_name=alias)
    )


def _delete_alias(alias: str) -> Any:
    from qdrant_client import models

    return models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=alias))


# ---- clients: one per storage folder or URL, shared by the source and the sink of one run ----


@dataclass
class _Shared:
    client: QdrantClient
    users: int = 0


_clients: dict[str, _Shared] = {}
_clients_lock = threading.Lock()
_local_moves = threading.Lock()  # serialises alias moves on local storage (see QdrantSink.move_alias)


def _acquire(config: _Connection) -> tuple[QdrantClient, str]:
    key = _client_key(config)
    with _clients_lock:
        if key not in _clients:
            _clients[key] = _Shared(_open(config))
        shared = _clients[key]
        shared.users += 1
        return shared.client, key


def _release(key: str | None) -> None:
    if key is None:
        return
    with _clients_lock:
        shared = _clients[key]
        shared.users -= 1
        if shared.users == 0:
            del _clients[key]
            shared.client.close()


def _client_key(config: _Connection) -> str:
    if config.url is not None:
        return f"url:{config.url}|{config.api_key_env or ''}"
    assert config.path is not None
    return "path::memory:" if config.path == ":memory:" else f"path:{Path(config.path).resolve()}"


def _open(config: _Connection) -> QdrantClient:
    try:
        from qdrant_client import QdrantClient
    except ImportError:
        raise MissingDependency("qdrant-client", extra="qdrant") from None
    if config.url is None:
        assert config.path is not None
        return _open_local(QdrantClient, config.path)
    client = QdrantClient(url=config.url, api_key=_api_key(config.api_key_env), check_compatibility=False)
    try:
        with _translated():
            client.get_collections()
    except ReindexError as exc:
        client.close()
        raise ConfigError(
            f"cannot reach Qdrant at {_redacted(config.url)}: {exc.message}",
            hint="check the url, the server, and api_key_env",
        ) from exc
    return client


def _open_local(factory: type[QdrantClient], path: str) -> QdrantClient:
    """Open local storage; unreadable storage fails loudly and is never treated as empty."""
    if path != ":memory:":
        _refuse_headless_storage(Path(path))
        _refuse_locked_storage(Path(path))
    try:
        return factory(location=":memory:") if path == ":memory:" else factory(path=path)
    except RuntimeError as exc:
        if "already accessed" not in str(exc):
            raise BackendError(f"cannot open Qdrant storage {path}: {exc}") from exc
        raise _locked(path) from exc
    except (ValueError, KeyError, TypeError, OSError, sqlite3.Error) as exc:
        raise BackendError(
            f"Qdrant storage {path} is unreadable ({type(exc).__name__}: {exc})",
            hint="restore the folder from a backup; it is never treated as empty",
        ) from exc


def _refuse_locked_storage(folder: Path) -> None:
    """Probe the lock first: a client refused by it leaks its lock file handle."""
    import portalocker

    lock_path = folder / ".lock"
    if not lock_path.exists():
        return
    with lock_path.open("r+") as handle:
        try:
            portalocker.lock(handle, portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING)
        except portalocker.exceptions.LockException:
            raise _locked(folder) from None
        portalocker.unlock(handle)


def _locked(folder: Path | str) -> ConfigError:
    return ConfigError(
        f"another process holds the Qdrant storage folder {folder}",
        hint="stop it, or use a Qdrant server (url) for concurrent access",
    )


def _refuse_headless_storage(folder: Path) -> None:
    collections = folder / "collection"
    if not (folder / "meta.json").exists() and collections.is_dir() and any(collections.iterdir()):
        raise BackendError(
            f"Qdrant storage {folder} has collections but no meta.json",
            hint="restore meta.json from a backup; it is never treated as empty",
        )


def _api_key(env: str | None) -> str | None:
    if env is None:
        return None
    value = os.environ.get(env)
    if not value:
        raise ConfigError(f"environment variable {env} is not set", hint="export it or change api_key_env")
    _secrets.add(value)
    return value


_secrets: set[str] = set()  # every api key read: masked in every message the translator builds


def _masked(text: str) -> str:
    for secret in _secrets:
        text = text.replace(secret, "[redacted]")
    return text


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    return f"{parts.scheme.lower()}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{path}"


def _hash_is(digest: str, points: Sequence[Any] = ()) -> models.Filter:
    """Points storing this content hash (among `points`, when given)."""
    from qdrant_client import models

    stored: list[Any] = [
        models.FieldCondition(key="reindex_content_hash", match=models.MatchValue(value=digest))
    ]
    return models.Filter(must=[models.HasIdCondition(has_id=list(points)), *stored] if points else stored)


def _rows_at(rows: Rows, picked: Sequence[int]) -> Rows:
    return Rows(
        [rows.records[i] for i in picked],
        np.asarray(rows.vectors)[list(picked)],
        [rows.content_hashes[i] for i in picked],
        rows.fingerprint,
    )


def _location(client: QdrantClient) -> str:
    """The server URL the client talks to (host lowercased, port explicit, no credentials or query),
    or the absolute local storage path; `:memory:<id>` for a store that dies with its client."""
    options = client.init_options
    if options.get("path") is not None:
        return str(Path(options["path"]).resolve())
    if options.get("location") == ":memory:":
        return f":memory:{id(client):x}"
    uri = getattr(client._client, "rest_uri", None) or options.get("url") or options.get("location")
    return _redacted(str(uri))


def _is_local(client: QdrantClient) -> bool:
    options = client.init_options
    return options.get("path") is not None or options.get("location") == ":memory:"


@contextmanager
def _translated() -> Iterator[None]:
    """Turn client errors into the error tree, with every api key masked in the message.

    An original error that carries a key is not chained either: a printed traceback would show it.
    """
    try:
        yield
    except Exception as exc:
        error = _translate(exc)
        if error is None:
            raise
        masked = _scrubbed(error)
        raise masked from (exc if masked is error else None)


def _translate(exc: Exception) -> ReindexError | None:
    """Local mode raises ValueError/RuntimeError, a server UnexpectedResponse and transport errors."""
    from qdrant_client.common.client_exceptions import ResourceExhaustedResponse
    from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

    if isinstance(exc, UnexpectedResponse):
        return _from_status(exc.status_code, _server_message(exc))
    if isinstance(exc, ResourceExhaustedResponse):
        return TransientError(
            f"Qdrant is rate limiting: {exc.message}", hint=f"retry after {exc.retry_after_s}s"
        )
    if isinstance(exc, ResponseHandlingException):
        if isinstance(exc.source, ValueError):
            return BackendError(f"unexpected Qdrant response: {exc.source}")
        return TransientError(f"Qdrant request failed: {type(exc.source).__name__}: {exc.source}")
    if isinstance(exc, ValueError):
        if "not found" in str(exc):
            return ConfigError(f"Qdrant: {exc}", hint="check the collection or alias name")
        return BackendError(f"Qdrant rejected the request: {exc}")
    if isinstance(exc, RuntimeError | sqlite3.Error):
        return BackendError(f"Qdrant local storage failed: {exc}")
    if isinstance(exc, ConnectionError | TimeoutError):
        return TransientError(f"Qdrant connection failed: {exc}")
    return None


def _scrubbed(error: ReindexError) -> ReindexError:
    message, hint = _masked(error.message), None if error.hint is None else _masked(error.hint)
    if (message, hint) == (error.message, error.hint):
        return error
    return type(error)(message, hint=hint)


def _from_status(status: int | None, message: str) -> ReindexError:
    if status in (401, 403):
        return ConfigError(f"Qdrant refused the credentials ({status}): {message}", hint="check api_key_env")
    if status == 404:
        return ConfigError(f"Qdrant: {message}", hint="check the collection or alias name")
    if status is None or status in (408, 429) or status >= 500:
        return TransientError(f"Qdrant server error {status}: {message}")
    return BackendError(f"Qdrant rejected the request ({status}): {message}")


def _server_message(exc: Any) -> str:
    try:
        return str(exc.structured()["status"]["error"])
    except (ValueError, KeyError, TypeError):
        return str(exc.reason_phrase)


# ---- payloads and vectors ----


def _dotted(payload: Mapping[str, Any], path: str) -> Any:
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


def _parse_point_id(value: str, *, strict: bool = False) -> int | str | None:
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


def _uuid_point_ids(doc_ids: Sequence[str]) -> list[Any]:
    """`_uuid_point_id` of every id: a target built before integer ids were kept."""
    return [_uuid_point_id(i) for i in doc_ids]


def _candidate_points(doc_id: str) -> set[int | str]:
    """The point ids a document may be stored under: its own id as a point id, `point_id`, or the UUID
    an older target derived."""
    parsed = _parse_point_id(doc_id)
    found: set[int | str] = {point_id(doc_id), _uuid_point_id(doc_id)}
    return found if parsed is None else found | {parsed}


_NAMESPACE_BYTES = POINT_NAMESPACE.bytes


def _uuid5(doc_id: str) -> str:
    """str(uuid.uuid5(POINT_NAMESPACE, doc_id)) without building a UUID object (RFC 4122 section 4.3)."""
    digest = bytearray(hashlib.sha1(_NAMESPACE_BYTES + doc_id.encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    text = digest.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def _point_payloads(docs: Documents, content_hashes: Sequence[str], fingerprint: str) -> list[dict[str, Any]]:
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
    payloads = [_json_safe(docs.payload(i)) for i in range(len(docs))]
    for payload, doc_id, content_hash in zip(payloads, docs.ids, content_hashes, strict=True):
        payload.pop("reindex_origin", None)  # read from an adopted point: this vector is the tool's now
        payload.update(reindex_id=doc_id, reindex_fingerprint=fingerprint, reindex_content_hash=content_hash)
    return payloads


_JSON_SCALARS = frozenset({str, int, bool, type(None)})  # exact types kept as they are


def _json_safe(value: Any) -> Any:
    """Copy `value` as JSON: datetimes as ISO text, Decimal as float, UUID as text, bytes as base64."""
    if type(value) in _JSON_SCALARS:
        return value
    if isinstance(value, Mapping):
        return {
            k if type(k) is str else str(k): v if type(v) in _JSON_SCALARS else _json_safe(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.ndarray | np.generic):
        return _json_safe(value.tolist())
    if isinstance(value, float | Decimal):
        return float(value) if math.isfinite(value) else None
    if value is None or isinstance(value, str | int | bool):
        return value
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    return str(value)


def _document_id(point: Any) -> str:
    """The one name of a point's document, for every read (source scans, verify, sync, search): the
    `reindex_id` the tool stored, where the point's id is the one the tool derives from it (`point_id`, or
    an older target's UUID); else the point id itself (a point the application wrote, or one whose
    payload it copied from another point)."""
    own = str(point.id)
    stored = (point.payload or {}).get("reindex_id")
    if not isinstance(stored, str) or stored == own:
        return own
    return stored if own in (str(point_id(stored)), _uuid_point_id(stored)) else own


def _with_vector(name: str | None) -> bool | list[str]:
    return True if name is None else [name]


def _stored_vector(point: models.Record, name: str | None) -> Vectors:
    raw: Any = point.vector
    if isinstance(raw, Mapping):
        raw = raw.get(name if name is not None else "", [])
    return np.asarray(raw if raw is not None else [], dtype=np.float32)


def _vector_params(vectors: Any, name: str | None) -> Any:
    if not isinstance(vectors, Mapping):
        return vectors
    if name is not None:
        return vectors.get(name)
    return next(iter(vectors.values())) if len(vectors) == 1 else None


def _distance(params: Any, collection: str) -> Distance:
    if params is None:
        return "cosine"
    distance = _DISTANCES.get(str(getattr(params.distance, "value", params.distance)))
    if distance is None:
        raise ConfigError(
            f"collection {collection!r} uses distance {params.distance}",
            hint="reindex supports Cosine, Dot and Euclid",
        )
    return distance


def _qdrant_distance(distance: Distance) -> Any:
    from qdrant_client import models

    return models.Distance(distance.capitalize())  # "cosine" -> Distance.COSINE ("Cosine")
