"""QdrantSource: a collection (or an alias) read in point-id order, each point named by its document id, with
its named vectors other than the one re-embedded (carried.py) beside its payload."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from reindex.errors import ConfigError
from reindex.fingerprint import fields_version
from reindex.offers import SourceOffer
from reindex.ports import Record, Sink, SourceSchema
from reindex_adapters.qdrant import offers
from reindex_adapters.qdrant.carried import PointPayload, carried_vectors, digests
from reindex_adapters.qdrant.connection import Connection, acquire, location, release, translated
from reindex_adapters.qdrant.layout import carried_names, local_payload_schema, source_layout
from reindex_adapters.qdrant.points import (
    _distance,
    candidate_points,
    document_id,
    dotted,
    parse_point_id,
)
from reindex_adapters.qdrant.sink import QdrantSink

if TYPE_CHECKING:
    from qdrant_client import QdrantClient, models

BOUNDS_PAGE = 10_000  # points per ids-only scroll page when a ray driver plans shards


class QdrantSource:
    """Reads a collection (or alias) in point-id order; the cursor is the last point id."""

    offer: ClassVar[SourceOffer] = offers.SOURCE  # what `reindex init` writes for it

    class Config(Connection):
        kind: Literal["qdrant"]
        collection: str
        text_field: str = "page_content"  # dotted path into the payload, e.g. "metadata.text"
        vector_name: str | None = None
        page_size: int = Field(default=256, ge=1)
        # the other named vectors (sparse ones, other dense ones) go to the target unchanged with every
        # point; false leaves them behind (a target that cannot hold them: pgvector)
        carry_vectors: bool = True

    def __init__(
        self,
        client: QdrantClient,
        *,
        collection: str,
        text_field: str = "page_content",
        vector_name: str | None = None,
        page_size: int = 256,
        carry_vectors: bool = True,
    ) -> None:
        self._client = client
        self.collection = collection
        self.text_field = text_field
        self.vector_name = vector_name
        self.page_size = page_size
        self.carry_vectors = carry_vectors
        self._lease: str | None = None
        self._checked = False
        self._carried: list[str] | None = None  # the named vectors other than the one re-embedded
        # One process reads it: a collection written to during the run would break a plan of fixed shards
        # (a Qdrant scroll has no key range to read a planned shard by), so the processes engine is not used
        self.shareable = False

    @classmethod
    def from_config(cls, config: Config) -> QdrantSource:
        client, key = acquire(config)
        source = cls(
            client,
            collection=config.collection,
            text_field=config.text_field,
            vector_name=config.vector_name,
            page_size=config.page_size,
            carry_vectors=config.carry_vectors,
        )
        source._lease = key
        return source

    def identity(self) -> str:
        """`qdrant:<server url or absolute path>/<collection>#id,<text field>`: no key, no page size."""
        return f"qdrant:{location(self._client)}/{self.collection}#id,{self.text_field}"

    def schema(self) -> SourceSchema:
        with translated():
            info = self._client.get_collection(self._require())
        config = info.config
        name, params = self._pick_vector(config.params.vectors)
        indexes = info.payload_schema or local_payload_schema(self._client, self._require())
        layout = source_layout(config, name, indexes)
        if not self.carry_vectors:
            layout |= {"dense": {}, "sparse": {}}
        self._carried = carried_names(layout)
        return SourceSchema(
            id_field="id",
            text_field=self.text_field,
            vector_field=name,
            distance=_distance(params, self.collection, name),
            layout=layout,
            carried=tuple(self._carried),
        )

    def count(self) -> int | None:
        with translated():
            return self._client.count(self._require(), exact=True).count

    def scan(self, after: str | None = None) -> Iterator[Record]:
        offset: int | str | None = None if after is None else parse_point_id(after, strict=True)
        while True:
            with translated():
                points, next_offset = self._client.scroll(
                    self._require(),
                    limit=self.page_size,
                    offset=offset,
                    with_payload=True,
                    with_vectors=self._carried_names() or False,
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
        offset: int | str | None = None if after is None else parse_point_id(after, strict=True)
        count, last = 0, ""
        while True:
            with translated():
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
        """The documents with these ids (`document_id`): the point of that id, or the point a reindex
        target stored the document under."""
        wanted = set(ids)
        candidates = {str(p): p for i in wanted for p in candidate_points(i)}
        with translated():
            points = self._client.retrieve(
                self._require(),
                list(candidates.values()),
                with_payload=True,
                with_vectors=self._carried_names() or False,
            )
        records = (self._record(point) for point in points)
        return (record for record in records if record.id in wanted)

    def reading(self, sink: Sink, alias: str, previous: str) -> QdrantSource | None:
        """This source over `previous` when it reads the alias or `previous` itself in the sink's storage:
        the live index the application wrote to until the flip. It shares this source's client."""
        if not isinstance(sink, QdrantSink) or self.collection not in (alias, previous):
            return None
        if location(sink._client) != location(self._client):
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
            carry_vectors=self.carry_vectors,
        )

    def close(self) -> None:
        release(self._lease)
        self._lease = None

    def _require(self) -> str:
        if not self._checked:
            with translated():
                exists = self._client.collection_exists(self.collection)
            if not exists:
                raise ConfigError(
                    f"Qdrant collection or alias {self.collection!r} not found",
                    hint="check [source] collection",
                )
            self._checked = True
        return self.collection

    def _carried_names(self) -> list[str]:
        if self._carried is None:
            self.schema()
        assert self._carried is not None
        return self._carried

    def _record(self, point: models.Record) -> Record:
        payload: Mapping[str, Any] = point.payload or {}
        carried = None
        if self._carried_names():
            vectors = carried_vectors(point, self._carried_names())
            payload, carried = PointPayload(payload, vectors), digests(vectors)
        text = dotted(payload, self.text_field)
        doc_id = document_id(point)
        cursor = None if doc_id == str(point.id) else str(point.id)  # scans resume after a point id
        fields = fields_version(payload)
        if text is None:
            return Record(doc_id, "", payload, cursor, "missing_text", carried, fields)
        if not isinstance(text, str):
            return Record(doc_id, "", payload, cursor, "invalid_text_type", carried, fields)
        return Record(doc_id, text, payload, cursor, carried=carried, fields=fields)

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
