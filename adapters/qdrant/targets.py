"""What QdrantSink knows of its collections (`Collections`): each one's vector name, point ids and carried
vectors, what a target collection is created with (layout.py), refusing to resume one built another way,
stating it for `plan`, and comparing carried vectors by value for verify."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from reindex.errors import ConfigError
from reindex.ports import Source, TargetSpec
from reindex_adapters.qdrant.bookkeeping import reindex_meta
from reindex_adapters.qdrant.carried import carried_vectors, of_payload, same
from reindex_adapters.qdrant.connection import is_local, translated
from reindex_adapters.qdrant.layout import (
    LOCAL_NOTE,
    TargetOptions,
    carried_names,
    creation,
    described,
    in_words,
    words,
)
from reindex_adapters.qdrant.points import NATIVE_IDS, _point_ids, is_cosine, uuid_point_ids

if TYPE_CHECKING:
    from qdrant_client import QdrantClient, models


class Collections:
    """What the sink knows of each collection: the name of the vector it re-embeds, how its points are named,
    the vectors it carries (read from the collection once, then kept; `forget` drops one), and what a target
    is created with. The sink's parts (reads, kept points, alias moves, rollback) share one."""

    def __init__(self, client: QdrantClient, options: TargetOptions) -> None:
        self.client = client
        self.options = options
        self._vector_names: dict[str, str | None] = {}
        self._native: dict[str, bool] = {}
        self._carried: dict[str, tuple[list[str], set[str]]] = {}  # target -> (carried names, cosine ones)

    def vector_name(self, target: str) -> str | None:
        if target not in self._vector_names:
            self.read_layout(target)
        return self._vector_names[target]

    def point_ids(self, target: str) -> Callable[[Sequence[str]], list[Any]]:
        """How `target` names its points: `point_id` (integer ids kept), or on a target built before that
        was recorded (`NATIVE_IDS`), a UUID for every document, so a resumed run keeps its scheme."""
        if target not in self._native:
            self.read_layout(target)
        return _point_ids if self._native[target] else uuid_point_ids

    def read_layout(self, target: str) -> None:
        with translated():
            config = self.client.get_collection(target).config
        vectors = config.params.vectors
        names: list[str | None] = list(vectors) if isinstance(vectors, Mapping) else [None]
        meta = reindex_meta(config)
        recorded = meta.get("vector")
        self._vector_names[target] = recorded if recorded in names else next(iter(names), None)
        self._native[target] = meta.get("point_ids") == NATIVE_IDS
        self._carried[target] = _carried_layout(config, self._vector_names[target])

    def forget(self, target: str) -> None:
        """Drop what is known of `target` (dropped, or made again)."""
        self._vector_names.pop(target, None)
        self._native.pop(target, None)
        self._carried.pop(target, None)

    def names(self) -> set[str]:
        with translated():
            return {c.name for c in self.client.get_collections().collections}

    def aliases(self) -> dict[str, str]:
        with translated():
            return {a.alias_name: a.collection_name for a in self.client.get_aliases().aliases}

    def layout(self, spec: TargetSpec) -> dict[str, Any]:
        """What `prepare` creates besides the vector, with where each setting comes from (`plan`)."""
        arguments = described(self.arguments(spec))
        vectors = arguments.pop("vectors_config")
        name = spec.source.vector_field
        new = vectors if name is None else vectors[name]
        carried = {n: p for n, p in vectors.items() if n != name} if name is not None else {}
        carried |= arguments.pop("sparse_vectors_config", {})
        chosen = self.options.chosen()
        copied = sorted(k for k in spec.source.layout.get("collection", {}) if k not in chosen)
        summary = [f"vector {name!r}: {in_words(new)}" if name is not None else f"vector: {in_words(new)}"]
        if carried:
            listed = ", ".join(f"{n!r} ({in_words(p)})" for n, p in sorted(carried.items()))
            summary.append(f"carried unchanged with every point: {listed}")
        summary.append(f"set in [target]: {_settings(chosen)}" if chosen else "nothing set in [target]")
        if copied:
            summary.append(f"copied from the source: {', '.join(copied)}")
        indexes = spec.source.layout.get("payload_schema", {})
        if indexes:
            summary.append(f"payload indexes: {', '.join(sorted(indexes))}, created before the first point")
        metadata = spec.source.layout.get("metadata", {})
        if metadata:
            summary.append(f"collection metadata kept: {', '.join(sorted(metadata))}")
        local = is_local(self.client)
        if local and (chosen or copied):
            summary.append(LOCAL_NOTE)
        return {
            "vector": new,
            "carried": carried,
            "collection": arguments,
            "set_in_target": chosen,
            "copied_from_source": copied,
            "payload_indexes": indexes,
            "metadata": metadata,
            "local_mode": local,
            "summary": summary,
        }

    def carried_differences(
        self, target: str, source: Source, parts: Mapping[str, Sequence[str]]
    ) -> dict[str, list[str]]:
        """Of these documents' parts whose digests differ, those whose values differ too: a cosine vector
        within `COSINE_TOLERANCE` of its original is the same (Qdrant renormalised it as it stored it)."""
        names, cosine = self.carried_of(target)
        theirs = {r.id: of_payload(r.payload) or {} for r in source.fetch(list(parts))}
        point_ids = self.point_ids(target)(list(parts))
        with translated():
            found = self.client.retrieve(target, point_ids, with_payload=False, with_vectors=names or False)
        by_point = {str(p): doc_id for p, doc_id in zip(point_ids, parts, strict=True)}
        ours = {by_point[str(p.id)]: carried_vectors(p, names) for p in found}
        differing: dict[str, list[str]] = {}
        for doc_id, candidates in parts.items():
            held, read = ours.get(doc_id, {}), theirs.get(doc_id, {})
            wrong = [n for n in candidates if not same(held.get(n), read.get(n), cosine=n in cosine)]
            if wrong:
                differing[doc_id] = wrong
        return differing

    def carried_of(self, target: str) -> tuple[list[str], set[str]]:
        """The target's carried vector names and those compared as cosine."""
        if target not in self._carried:
            self.read_layout(target)
        return self._carried[target]

    def arguments(self, spec: TargetSpec) -> dict[str, Any]:
        return creation(
            spec.source.layout, spec.source.vector_field, spec.dim, spec.source.distance, self.options
        )

    def check_layout(self, spec: TargetSpec) -> None:
        """Refuse to resume a target built with other [target] settings, or without a vector the source
        carries (built before vectors were carried): mixing would serve neither."""
        with translated():
            config = self.client.get_collection(spec.name).config
        recorded, chosen = reindex_meta(config).get("options") or {}, self.options.chosen()
        if recorded != chosen:
            raise ConfigError(
                f"collection {spec.name!r} was built with [target] settings {_settings(recorded)},"
                f" and [target] now sets {_settings(chosen)}",
                hint="set them back in [target], or rebuild the target with `reindex run --fresh`",
            )
        missing = sorted(set(carried_names(spec.source.layout)) - set(self.carried_of(spec.name)[0]))
        if missing:
            raise ConfigError(
                f"collection {spec.name!r} lacks the vectors {', '.join(map(repr, missing))} that the source"
                " holds beside the one re-embedded (built before they were carried)",
                hint="rebuild the target with them: `reindex run --fresh`",
            )


def _carried_layout(config: models.CollectionConfig, name: str | None) -> tuple[list[str], set[str]]:
    """The names of a collection's vectors other than `name` (carried), and those compared as cosine."""
    vectors = config.params.vectors
    dense = {n: p for n, p in vectors.items() if n != name} if isinstance(vectors, Mapping) else {}
    cosine = {n for n, p in dense.items() if is_cosine(p)}
    return sorted([*dense, *(config.params.sparse_vectors or {})]), cosine


def _settings(chosen: Mapping[str, Any]) -> str:
    """`quantization scalar (quantile 0.99), on_disk true`, or `none`."""
    if not chosen:
        return "none"
    parts = []
    for key, value in chosen.items():
        if isinstance(value, Mapping):
            kind = f" {value['type']}" if "type" in value else ""
            inner = words({k: v for k, v in value.items() if k != "type"})
            parts.append(f"{key}{kind}" + (f" ({inner})" if inner else ""))
        else:
            parts.append(f"{key} {words(value)}")
    return ", ".join(parts)
