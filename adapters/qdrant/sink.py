"""QdrantSink: targets are fresh collections `<alias>__<fp8>` with their identity in the collection metadata,
served through a collection alias (its moves: alias.py)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator

from reindex.columns import documents
from reindex.errors import ConfigError, CutoverRefused
from reindex.fingerprint import document_version, fields_version
from reindex.offers import TargetOffer
from reindex.ports import (
    AliasInfo,
    Distance,
    IndexEntry,
    Loss,
    Record,
    Rows,
    Source,
    TargetInfo,
    TargetSection,
    TargetSpec,
    Vectors,
)
from reindex.vectors import vector_problem
from reindex_adapters.qdrant import offers
from reindex_adapters.qdrant.alias import ALIAS_MAX, GUARD_MARK, AliasMoves, local_move_lock
from reindex_adapters.qdrant.bookkeeping import (
    ADOPTED,
    META_KEY,
    Bookkeeping,
    hash_is,
    reindex_meta,
    unhashed,
)
from reindex_adapters.qdrant.carried import carried_vectors, digests, of_payload, point_version
from reindex_adapters.qdrant.connection import (
    NAME_MAX,
    Connection,
    acquire,
    creatable,
    is_local,
    location,
    release,
    translated,
)
from reindex_adapters.qdrant.kept import KeptPoints
from reindex_adapters.qdrant.layout import TargetOptions, losses, payload_indexes, refuse_unaccepted
from reindex_adapters.qdrant.points import (
    NATIVE_IDS,
    document_id,
    json_safe,
    point_payloads,
    stored_vector,
    vector_params,
)
from reindex_adapters.qdrant.reads import PointReads
from reindex_adapters.qdrant.rollback import CarryBack
from reindex_adapters.qdrant.targets import Collections

if TYPE_CHECKING:
    from qdrant_client import QdrantClient, models


class QdrantSink:
    """Targets are collections `<alias>__<fp8>` with their identity in the collection metadata; a source's
    other named vectors (sparse ones, a second dense one) are carried to the target unchanged."""

    offer: ClassVar[TargetOffer] = offers.TARGET  # what `reindex init` writes for it

    holds_writers = False  # nothing holds a collection's writers: cutover --sync carries the window after

    class Config(Connection, TargetOptions, TargetSection):
        kind: Literal["qdrant"]
        upsert_batch: int = Field(default=256, ge=1)

        @field_validator("alias")
        @classmethod
        def _alias_qdrant_accepts(cls, alias: str) -> str:
            """Refused here, at config time: Qdrant would refuse it only at cutover, after the whole run.
            Its target, `<alias>__<fp8>`, is then one Qdrant accepts too."""
            return creatable(alias, ALIAS_MAX, "for the guard alias the tool adds") if alias else alias

        @field_validator("name")
        @classmethod
        def _name_qdrant_accepts(cls, name: str | None) -> str | None:
            return creatable(name, NAME_MAX, "Qdrant's limit") if name else name

    def __init__(
        self, client: QdrantClient, *, upsert_batch: int = 256, options: TargetOptions | None = None
    ) -> None:
        self._client = client
        self.upsert_batch = upsert_batch
        self.options = options or TargetOptions()
        self._lease: str | None = None
        # its parts, composed: what it knows of each collection, and what reads, keeps, moves and rolls back
        self.collections = Collections(client, self.options)
        self._reads = PointReads(self.collections, upsert_batch)
        self._kept = KeptPoints(self.collections, upsert_batch)
        self._back = CarryBack(self.collections)
        self._moves = AliasMoves(self.collections, self.describe, self.carry_back, self._move_lock)
        self.shareable = False  # several processes may open it (a server's URL): reindex.run.processes

    @classmethod
    def from_config(cls, config: Config) -> QdrantSink:
        client, key = acquire(config)
        options = TargetOptions.model_validate(config.model_dump(include=set(TargetOptions.model_fields)))
        sink = cls(client, upsert_batch=config.upsert_batch, options=options)
        sink._lease = key
        sink.shareable = config.url is not None  # local mode: one process opens the folder
        return sink

    def identity(self) -> str:
        """`qdrant:<server url or absolute path>`: where the collections live, never the api key."""
        return f"qdrant:{location(self._client)}"

    def scratch(self, spec: TargetSpec, token: str) -> TargetSpec | None:
        """A collection of the target's settings named `reindex_rehearsal_<token>`, served by no alias."""
        return replace(spec, name=f"reindex_rehearsal_{token}")

    def scratches(self) -> list[str]:
        return sorted(name for name in self.collections.names() if name.startswith("reindex_rehearsal_"))

    def prepare(self, spec: TargetSpec) -> None:
        """Create the collection with its identity in the metadata; an existing one is never re-stamped.

        It gets the source's other named vectors, carried unchanged, and the settings `[target]` sets or
        the source has (`layout.creation`); those `[target]` set are recorded, and an existing target built
        with other ones, or without a vector the source carries, is refused rather than mixed."""
        existing = self.describe(spec.name)
        if existing is not None:
            _check_existing(existing, spec)
            self.collections.check_layout(spec)
            self._index_payload(spec)  # idempotent: a target an earlier version built gets them too
            return
        name = spec.source.vector_field
        meta = {
            "fingerprint": spec.fingerprint,
            "dim": spec.dim,
            "alias": spec.alias,
            "vector": name,
            "text_field": spec.source.text_field,  # where an application's point holds its text
            "model": json_safe(spec.model),
            "plan_id": spec.plan_id,
            "nonce": spec.nonce,
            "created_at": datetime.now(UTC).isoformat(),
            "point_ids": NATIVE_IDS,
            "options": self.options.chosen(),
            # the cutover keeps every dead letter's point here (`keep`): a blank point only the collection
            # rolled back to holds was deleted through the alias (rollback.py), not left out by an earlier
            # version that kept none
            "keeps_dead_letters": True,
        }
        refuse_unaccepted(self.losses(spec), spec.source.layout.get("source") or spec.alias)
        metadata = {**spec.source.layout.get("metadata", {}), META_KEY: meta}  # the application's kept
        with translated():
            self._client.create_collection(spec.name, **self.collections.arguments(spec), metadata=metadata)
        self._index_payload(spec)  # before the first point: a tenant index shapes how points are stored

    def _index_payload(self, spec: TargetSpec) -> None:
        """The source's payload indexes, with their parameters (layout.payload_indexes)."""
        for field, schema in payload_indexes(spec.source.layout).items():
            with translated(), warnings.catch_warnings():
                # local mode warns that payload indexes do nothing there (text indexes with `scoring`
                # do: its text queries need them); on a server they are what filtered searches use
                warnings.filterwarnings("ignore", "Payload indexes have no effect", UserWarning)
                self._client.create_payload_index(spec.name, field, schema, wait=True)

    def losses(self, spec: TargetSpec) -> list[Loss]:
        """What the new collection cannot keep of the source's (layout.py), `[target] accept` applied."""
        return losses(spec.source.layout, spec.source.vector_field, self.options.accept)

    def write(self, target: str, rows: Rows) -> None:
        """Upsert by point id, `upsert_batch` points per request, each a columnar `models.Batch`.

        One request per chunk (a server refuses bodies past 32 MB), the vectors as one `tolist` of the
        numpy rows, no `PointStruct` per row; wait=True on a server, and local mode stores every point
        before it returns, so a returned write is durable. The client's `upload_collection` is not used:
        on a server it opens its own connection, retries with warnings on its own and defaults to
        wait=False, while retries belong to the pipeline and errors to `translated`.
        """
        self._upsert(target, rows)

    def write_guarded(self, target: str, rows: Rows, expected: Mapping[str, str | None]) -> None:
        """Upsert each row only while its point holds what `expected` says (by document id): a point whose
        stored content hash is that hash is updated, and one deleted meanwhile is not re-created; None
        (no point) inserts, or writes over a point kept without the migration's vector (`keep`), and never
        over a point written meanwhile. One request per expected hash: meant for the few documents of a
        cutover's window (`reindex.flip.window.after_flip`), not a bulk load."""
        from qdrant_client import models

        groups: dict[str | None, list[int]] = {}
        for row, record in enumerate(rows.records):
            groups.setdefault(expected.get(record.id), []).append(row)
        for digest, picked in groups.items():
            part = _rows_at(rows, picked)
            if digest is None:
                self._upsert(
                    target, part, mode=models.UpdateMode.UPDATE_ONLY, only=self._kept.without_vector(target)
                )
                self._upsert(target, part, mode=models.UpdateMode.INSERT_ONLY)
            else:
                self._upsert(target, part, mode=models.UpdateMode.UPDATE_ONLY, only=hash_is(digest))

    def delete_guarded(self, target: str, expected: Mapping[str, str]) -> None:
        """Delete each document's point only while it stores the content hash `expected` names for it."""
        from qdrant_client import models

        groups: dict[str, list[Any]] = {}
        ids_of = self.collections.point_ids(target)
        for doc_id, digest in expected.items():
            groups.setdefault(digest, []).append(ids_of([doc_id])[0])
        for digest, points in groups.items():
            with translated():
                self._client.delete(target, models.FilterSelector(filter=hash_is(digest, points)), wait=True)

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
        name = self.collections.vector_name(target)
        ids: list[Any] = self.collections.point_ids(target)(docs.ids)
        payloads = point_payloads(docs, rows.content_hashes, rows.fingerprint)
        carried, _ = self.collections.carried_of(target)
        others = [of_payload(docs.payload(i)) or {} for i in range(len(docs))] if carried else []
        guards: dict[str, Any] = {} if mode is None else {"update_mode": mode, "update_filter": only}
        for start in range(0, len(ids), self.upsert_batch):
            stop = start + self.upsert_batch
            chunk = vectors[start:stop].tolist()
            # built without validation: ids and payloads are ours, and local mode and the server both
            # check every vector again, so validating each float here too would only repeat that work
            batch: Any = models.Batch.model_construct(
                ids=ids[start:stop],
                vectors=chunk if name is None else {name: chunk},
                payloads=payloads[start:stop],
            )
            if carried:  # a point at a time: a carried vector may be absent from some points
                rows_of = zip(ids[start:stop], chunk, others[start:stop], payloads[start:stop], strict=True)
                batch = [
                    models.PointStruct.model_construct(id=i, vector={name or "": v, **more}, payload=p)
                    for i, v, more, p in rows_of
                ]
            with translated():
                self._client.upsert(target, batch, wait=True, **guards)

    def delete(self, target: str, ids: Sequence[str]) -> None:
        from qdrant_client import models

        with translated():
            self._client.delete(
                target, models.PointIdsList(points=self.collections.point_ids(target)(ids)), wait=True
            )

    def finalize(self, spec: TargetSpec) -> None:
        """Index `reindex_id` on a server, for verify and sync; local mode has no payload indexes."""
        if is_local(self._client):
            return
        from qdrant_client import models

        with translated():
            self._client.create_payload_index(
                spec.name, "reindex_id", models.PayloadSchemaType.KEYWORD, wait=True
            )

    def describe(self, target: str) -> TargetInfo | None:
        with translated():
            if not self._client.collection_exists(target):
                return None
            config = self._client.get_collection(target).config
            count = self._client.count(target, exact=True).count
        meta = reindex_meta(config)
        params = vector_params(config.params.vectors, meta.get("vector"))
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
        whole payload): their hash and fingerprint are derived from their text (`Bookkeeping`), and they
        are marked. Every point's payload is digested for verify (`IndexEntry.fields`)."""
        for entry, _ in self._entries(target, dim, whole=False):
            yield entry

    def scan_states(self, target: str, dim: int) -> Iterator[tuple[IndexEntry, str, str]]:
        """Each entry, points kept without a vector (`keep`) included, with a digest of its whole point
        (payload, every vector) and its document version (all but the re-embedded vector: what the old
        collection's copy has too) (`GuardedSink`): after a flip, a write through the alias that leaves the
        text as it was (`set_payload` of another field, `update_vectors` of a carried vector) still reads
        as the application's change, and so does one into the old collection in the window."""
        for entry, point in self._entries(target, dim, whole=True):
            payload = point.payload or {}
            yield entry, point_version(point), document_version(payload, entry.carried or {})

    def _entries(self, target: str, dim: int, *, whole: bool) -> Iterator[tuple[IndexEntry, models.Record]]:
        name = self.collections.vector_name(target)
        carried, _ = self.collections.carried_of(target)
        with translated():
            bookkeeping = Bookkeeping.of(reindex_meta(self._client.get_collection(target).config))
        for points in self._reads.pages(target, name, self.upsert_batch, carried, whole=whole):
            for point in points:
                vector = stored_vector(point, name)
                if not vector.size and not whole:  # a document kept without a vector (`keep`): no entry
                    continue
                payload = point.payload or {}
                digest, fingerprint, application = bookkeeping.read(payload)
                derived = "reindex_content_hash" not in payload
                problem = vector_problem(vector, dim)
                parts = digests(carried_vectors(point, carried)) if carried else None
                entry = IndexEntry(
                    document_id(point),
                    digest,
                    fingerprint,
                    problem,
                    application,
                    derived,
                    parts,
                    fields_version(payload),
                )
                yield entry, point

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
                        filter=unhashed(doc_id),
                    )
                )
                for doc_id, digest in items[start : start + self.upsert_batch]
            ]
            with translated():
                self._client.batch_update_points(target, operations, wait=True)
        return len(items)

    def targets(self, alias: str) -> list[str]:
        names = [name for name in self.collections.names() if name.startswith(f"{alias}__")]
        return sorted(names, key=lambda name: (self._created_at(name), name))

    def drop(self, target: str) -> None:
        readers = sorted(
            a for a, t in self.collections.aliases().items() if t == target and GUARD_MARK not in a
        )
        if readers:
            raise CutoverRefused(
                f"collection {target!r} is served by alias {readers[0]!r}",
                hint="move the alias to another target before pruning",
            )
        if target in self.collections.names():
            with translated():
                self._client.delete_collection(target)
        self.collections.forget(target)

    def _move_lock(self) -> AbstractContextManager[Any]:
        return local_move_lock(self._client)

    # the parts' calls ---------------------------------------------------------------------------------------

    def fetch(self, target: str, ids: Sequence[str]) -> dict[str, Vectors]:
        return self._reads.fetch(target, ids)

    def fetch_matching(self, target: str, expected: Mapping[str, str]) -> dict[str, Vectors]:
        return self._reads.fetch_matching(target, expected)

    def scan_vectors(self, target: str, batch: int = 5000) -> Iterator[tuple[list[str], Vectors]]:
        return self._reads.scan_vectors(target, batch)

    def search(self, target: str, vectors: Vectors, k: int) -> list[list[str]]:
        return self._reads.search(target, vectors, k)

    def distance(self, target: str) -> Distance:
        return self._reads.distance(target)

    def layout(self, spec: TargetSpec) -> dict[str, Any]:
        return self.collections.layout(spec)

    def carried_differences(
        self, target: str, source: Source, parts: Mapping[str, Sequence[str]]
    ) -> dict[str, list[str]]:
        return self.collections.carried_differences(target, source, parts)

    def alias(self, alias: str) -> AliasInfo:
        return self._moves.alias(alias)

    def move_alias(
        self,
        alias: str,
        target: str,
        *,
        expected: str | None,
        meta: Mapping[str, Any],
        settle: Callable[[], None] | None = None,
    ) -> str | None:
        return self._moves.move_alias(alias, target, expected=expected, meta=meta, settle=settle)

    def keep(self, target: str, records: Sequence[Record], expected: Mapping[str, str] | None = None) -> None:
        self._kept.keep(target, records, expected)

    def unserve(self, target: str, ids: Sequence[str], expected: Mapping[str, str] | None = None) -> None:
        self._kept.unserve(target, ids, expected)

    def kept(self, target: str) -> list[str]:
        return self._kept.kept(target)

    def carry_back(
        self, newer: str, older: str, since: Mapping[Any, tuple[str, Any]] | None = None
    ) -> dict[Any, tuple[str, Any]]:
        return self._back.carry_back(newer, older, since)

    def unserved(self, alias: str, served: str, replaced: str) -> list[str]:
        return self._back.unserved(alias, served, replaced)

    def close(self) -> None:
        release(self._lease)
        self._lease = None

    def _created_at(self, name: str) -> str:
        with translated():
            config = self._client.get_collection(name).config
        return str(reindex_meta(config).get("created_at", ""))


def _check_existing(info: TargetInfo, spec: TargetSpec) -> None:
    if (info.fingerprint, info.dim) != (spec.fingerprint, spec.dim):
        raise ConfigError(
            f"collection {spec.name!r} holds fingerprint {info.fingerprint} and dim {info.dim}, "
            f"not {spec.fingerprint} and {spec.dim}",
            hint="choose another [target] name",
        )


def _rows_at(rows: Rows, picked: Sequence[int]) -> Rows:
    return Rows(
        [rows.records[i] for i in picked],
        np.asarray(rows.vectors)[list(picked)],
        [rows.content_hashes[i] for i in picked],
        rows.fingerprint,
    )
