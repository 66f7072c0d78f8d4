"""A rollback that loses nothing: what the application wrote through the alias while the newer collection was
live goes back with the alias into the collection it served before.

Qdrant has no trigger to log those writes, so they are found by comparison: the newer collection against
the older one, point by point, on everything the application can change (payload less the tool's
`reindex_*` keys, and every vector other than the one the migration re-embeds: `point_version`). Between
the flip and the rollback the older collection is frozen (the alias served the newer one), so each
difference is the application's write: a point only the newer holds was added, one only the older holds
was deleted, and one that differs was changed. Each is written into the older collection as the newer holds
it; the older model's vector is kept where the text is the same, and left out where it changed or the
point is new, since the older model never embedded that text: `rollback` names those (`unserved`), and
they are served with the newer vectors again at the next `cutover --sync`.

Nothing holds a Qdrant collection's writers, so the comparison runs twice: before the alias moves, and
after, for what reached the newer collection in between; a point the application has written in the older
collection since the move is left as it is (its later write stands). Memory: one entry per point of the
older collection (id and digests), for the length of the rollback.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from reindex_adapters.qdrant.bookkeeping import reindex_meta
from reindex_adapters.qdrant.carried import point_version
from reindex_adapters.qdrant.connection import translated
from reindex_adapters.qdrant.points import document_id, dotted

if TYPE_CHECKING:
    from qdrant_client import models

    from reindex_adapters.qdrant.targets import Collections

PAGE = 256

# a point's state for the comparison: (digest of what the application can change, its text)
_State = tuple[str, Any]


class CarryBack:
    """QdrantSink's rollback half: carrying the application's writes back, and naming what is unserved."""

    def __init__(self, collections: Collections) -> None:
        self.collections = collections

    def carry_back(
        self, newer: str, older: str, since: Mapping[Any, _State] | None = None
    ) -> dict[Any, _State]:
        """Write into `older` what the application wrote into `newer` since the flip between them. With
        `since` (what the first pass left, returned by it), only what changed in `newer` since then, and
        only where `older` still holds what that pass left. Returns the state both now agree on."""
        name, text_field, keeps = self._rollback_layout(newer)
        ours = dict(self._states(newer, name, text_field))
        if since is None:
            theirs = dict(self._states(older, name, text_field))
            changed = sorted({*ours, *theirs} - {i for i in ours if ours[i] == theirs.get(i)}, key=str)
        else:
            changed = sorted({*ours, *since} - {i for i in ours if ours[i] == since.get(i)}, key=str)
            theirs = dict(self._states(older, name, text_field, only=changed))
            changed = [i for i in changed if theirs.get(i) == since.get(i)]  # an older write stands
        # a blank point only the older holds is a dead letter an earlier version did not keep in the newer;
        # in a newer that keeps them, the application deleted it through the alias
        if since is None and not keeps:
            changed = [i for i in changed if i in ours or not _blank(theirs[i][1])]
        self._carry(newer, older, name, changed, ours, theirs)
        return dict(ours)  # what the older collection holds now, as far as the application can change it

    def unserved(self, alias: str, served: str, replaced: str) -> list[str]:
        """Documents the served collection holds without the migration's vector (a text the older model
        never embedded, carried back by `carry_back`) while the replaced one serves them with it."""
        from qdrant_client import models

        name = self.collections.vector_name(replaced) or ""
        missing = models.Filter(must_not=[models.HasVectorCondition(has_vector=name)])
        found: list[str] = []
        for points in self._scroll(served, missing, with_vectors=False):
            ids = [p.id for p in points]
            with translated():
                held = self.collections.client.retrieve(
                    replaced, ids, with_payload=["reindex_id"], with_vectors=[name]
                )
            found += [document_id(p) for p in held if _has(p, name)]
        return sorted(found)

    def _carry(
        self,
        newer: str,
        older: str,
        name: str | None,
        ids: Sequence[Any],
        ours: Mapping[Any, _State],
        theirs: Mapping[Any, _State],
    ) -> None:
        from qdrant_client import models

        gone = [i for i in ids if i not in ours]
        if gone:
            with translated():
                self.collections.client.delete(older, models.PointIdsList(points=gone), wait=True)
        written = [i for i in ids if i in ours]
        for start in range(0, len(written), PAGE):
            part = written[start : start + PAGE]
            with translated():
                points = self.collections.client.retrieve(newer, part, with_payload=True, with_vectors=True)
                kept = self.collections.client.retrieve(
                    older, part, with_payload=False, with_vectors=_names(name)
                )
            vectors = {p.id: _vector_of(p, name) for p in kept}
            structs = []
            for point in points:
                same_text = point.id in theirs and theirs[point.id][1] == ours[point.id][1]
                own = vectors.get(point.id) if same_text else None
                structs.append(_struct(point, name, own))
            with translated():
                self.collections.client.upsert(older, structs, wait=True)

    def _states(
        self, collection: str, name: str | None, text_field: str, only: Sequence[Any] | None = None
    ) -> Iterator[tuple[Any, _State]]:
        pages: Iterator[list[models.Record]]
        if only is None:
            pages = self._scroll(collection, None, with_vectors=True)
        else:
            pages = (self._retrieve(collection, only[s : s + PAGE]) for s in range(0, len(only), PAGE))
        for points in pages:
            for point in points:
                yield (
                    point.id,
                    (point_version(point, leave=name or ""), dotted(point.payload or {}, text_field)),
                )

    def _retrieve(self, collection: str, ids: Sequence[Any]) -> list[models.Record]:
        with translated():
            return self.collections.client.retrieve(
                collection, list(ids), with_payload=True, with_vectors=True
            )

    def _scroll(
        self, collection: str, only: models.Filter | None, *, with_vectors: bool
    ) -> Iterator[list[models.Record]]:
        offset: Any = None
        while True:
            with translated():
                points, offset = self.collections.client.scroll(
                    collection,
                    scroll_filter=only,
                    limit=PAGE,
                    offset=offset,
                    with_payload=True,
                    with_vectors=with_vectors,
                )
            yield points
            if offset is None:
                return

    def _rollback_layout(self, newer: str) -> tuple[str | None, str, bool]:
        """The migration's vector name and text field, as the newer collection records them, and whether
        every blank point it lacks was deleted from it: it keeps the dead letters' points (made by a version
        that does), or the tool did not build it (the application's own collection, rolled away from when a
        rollback is rolled forward again: what it lacks, the application deleted)."""
        with translated():
            meta = reindex_meta(self.collections.client.get_collection(newer).config)
        text_field = str(meta.get("text_field") or "page_content")
        keeps = bool(meta.get("keeps_dead_letters")) or not meta.get("fingerprint")
        return self.collections.vector_name(newer), text_field, keeps


def _blank(text: Any) -> bool:
    return not isinstance(text, str) or not text.strip()


def _names(name: str | None) -> bool | list[str]:
    return True if name is None else [name]


def _has(point: models.Record, name: str) -> bool:
    raw: Any = point.vector
    value = raw.get(name) if isinstance(raw, Mapping) else raw
    return value is not None and len(value) > 0


def _vector_of(point: models.Record, name: str | None) -> Any:
    raw: Any = point.vector
    value = raw.get(name or "") if isinstance(raw, Mapping) else raw
    return value if value is not None and len(value) > 0 else None


def _struct(point: models.Record, name: str | None, own: Any) -> models.PointStruct:
    """The newer collection's point for the older one: its payload less the tool's keys, its vectors other
    than the migration's, and the older model's vector `own` (None: unserved)."""
    from qdrant_client import models

    payload = {k: v for k, v in (point.payload or {}).items() if not k.startswith("reindex_")}
    raw: Any = point.vector
    others = {k: v for k, v in raw.items() if k != (name or "")} if isinstance(raw, Mapping) else {}
    vector: Any = {**others, **({name or "": own} if own is not None else {})}
    if name is None and not others and own is not None:
        vector = own
    return models.PointStruct(id=point.id, vector=vector, payload=payload)
