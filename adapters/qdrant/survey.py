"""What `reindex init` sees in a Qdrant collection or alias: payload text fields, vectors, points, alias state.

Documents are keyed by their point id, so only the text field (and a named vector) are chosen here. The
vector to re-embed is the one named on the command line, else the one an earlier migration re-embedded, else
the only dense one; the others (sparse ones, other dense ones) are carried to the target unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from reindex.errors import ConfigError, validate
from reindex.survey import (
    SAMPLE_ROWS,
    VECTOR_NAMES,
    Choice,
    Overrides,
    Survey,
    choose_by_name,
    choose_text,
    text_lengths,
)
from reindex_adapters.qdrant.alias import GUARD_MARK
from reindex_adapters.qdrant.bookkeeping import INDEX_KEYS, reindex_meta
from reindex_adapters.qdrant.connection import acquire, release, translated
from reindex_adapters.qdrant.layout import in_words, source_layout
from reindex_adapters.qdrant.points import _distance, vector_params
from reindex_adapters.qdrant.sink import QdrantSink
from reindex_adapters.qdrant.source import QdrantSource

if TYPE_CHECKING:
    from qdrant_client import QdrantClient


def survey(section: dict[str, Any], given: Overrides) -> Survey:
    """Read the collection's config and a sample of payloads; an api key comes from its environment variable."""
    config = validate("source", QdrantSource.Config, section)
    if given.id_field is not None:
        raise ConfigError("a Qdrant source is keyed by its point ids", hint="leave out --id-column")
    client, lease = acquire(config)
    try:
        with translated():
            return _survey(client, config.collection, given)
    finally:
        release(lease)


def _survey(client: QdrantClient, name: str, given: Overrides) -> Survey:
    alias = QdrantSink(client).alias(name)
    if not alias.is_physical and alias.target is None:
        raise ConfigError(f"Qdrant collection or alias {name!r} not found", hint=_known(client))
    collection = alias.target or name
    config = client.get_collection(collection).config
    recorded = reindex_meta(config).get("vector") if alias.fingerprint else None
    vector, params = _pick_vector(name, config.params.vectors, given.vector_field, recorded)
    points, _ = client.scroll(name, limit=SAMPLE_ROWS, with_payload=True, with_vectors=False)
    lengths = text_lengths([_documents_fields(p.payload or {}) for p in points], into_json_strings=True)
    return Survey(
        kind="qdrant",
        name=name,
        relation="collection" if alias.is_physical else "alias",
        documents=client.count(name, exact=True).count,
        units="points",
        id=Choice("id", "the point id"),
        text=choose_text(lengths, given.text_field),
        vector=vector,
        vector_type=f"({params.size} floats)",
        dim=params.size,
        distance=_distance(params, name),
        alias=None if alias.is_physical else alias,
        text_lengths=lengths,
        notes=(
            _alias_note(name, alias.is_physical, alias.target, alias.fingerprint),
            *_carried_note(source_layout(config, vector.field)),
        ),
    )


def _pick_vector(name: str, vectors: Any, given: str | None, recorded: Any = None) -> tuple[Choice, Any]:
    """The vector the old embeddings live in (a named one among several) and its size and distance."""
    names = list(vectors) if isinstance(vectors, Mapping) else []
    if not names and given is not None:
        raise ConfigError(f"{name!r} has one unnamed vector", hint="leave out --vector-name")
    if not names:
        vector = Choice(None, "unnamed")
    elif given is None and recorded in names:
        others = tuple(n for n in names if n != recorded)
        vector = Choice(recorded, "the one the alias's model wrote, an earlier migration's", others)
    else:
        vector = choose_by_name(names, VECTOR_NAMES, given)
        if vector.reason == "the first of several":
            reason = (
                "the first of several dense vectors; nothing tells which one the new model replaces: check"
            )
            vector = Choice(vector.field, reason, vector.others)
    params = vector_params(vectors, vector.field)
    if params is None:
        raise ConfigError(
            f"{name!r} has no vector named {vector.field!r}", hint=f"vectors: {', '.join(names)}"
        )
    return vector, params


def _carried_note(layout: Mapping[str, Any]) -> tuple[str, ...]:
    carried = {**layout["dense"], **layout["sparse"]}
    if not carried:
        return ()
    listed = ", ".join(f"{n!r} ({in_words(p)})" for n, p in sorted(carried.items()))
    return (f"carried to the target unchanged with every point, as the source holds them: {listed}",)


def _documents_fields(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The payload without the keys this tool adds to every point it writes."""
    return {key: value for key, value in payload.items() if key not in INDEX_KEYS}


def _alias_note(name: str, is_physical: bool, target: str | None, fingerprint: str | None) -> str:
    if is_physical:
        return (
            f"{name} is a collection, and Qdrant cannot put an alias over one: once, create an alias "
            f"(e.g. {name}_live -> {name}), point the application at it, and use it as --alias"
        )
    if fingerprint:
        return f"{name} is already an alias: an earlier migration pointed it at {target}"
    return f"{name} is already an alias of {target}: the cutover moves it to the new collection"


def _known(client: QdrantClient) -> str:
    names = [c.name for c in client.get_collections().collections]
    names += [a.alias_name for a in client.get_aliases().aliases if GUARD_MARK not in a.alias_name]
    return f"check --collection; found: {', '.join(sorted(names)) or 'none'}"
