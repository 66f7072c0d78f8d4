"""What `reindex init` learns from a source before it writes a config: fields, size, old vectors, alias.

Each backend fills a Survey (its `offer`'s survey, reindex/offers.py); the rules for choosing
one field among several live here, so every backend chooses the same way and explains it the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from reindex.ports import AliasInfo, Distance

SAMPLE_ROWS = 200  # rows read to measure text lengths: enough to tell a title from a body, and fast
TEXT_NAMES = ("body", "text", "content", "page_content", "chunk", "document", "_node_content.text")
ID_NAMES = ("id", "_id", "doc_id", "document_id", "uuid")
VECTOR_NAMES = ("embedding", "embeddings", "vector", "vectors")
_MAX_DEPTH = 3  # nested objects followed when looking for text fields (metadata.text, _node_content.text)


@dataclass(frozen=True)
class Overrides:
    """Fields named on the command line; each wins over detection."""

    id_field: str | None = None
    text_field: str | None = None
    vector_field: str | None = None


@dataclass(frozen=True)
class Choice:
    """One field chosen among candidates: why, and which others there were (the file comments both)."""

    field: str | None
    reason: str
    others: tuple[str, ...] = ()

    def describe(self) -> str:
        """`"body" (a well-known name; also "title")`."""
        others = f"; also {', '.join(map(quoted, self.others))}" if self.others else ""
        return f"{quoted(self.field or '')} ({self.reason}{others})"


@dataclass(frozen=True)
class Survey:
    """What one source showed: enough to write its [source] section and to explain the choices."""

    kind: str  # the [source] kind: postgres | qdrant | jsonl | parquet | a plugin's
    name: str  # the table or view, collection or alias, or file path
    relation: str  # "table", "view", "collection", "alias", "JSONL file", ...
    documents: int | None
    units: str  # what `documents` counts: "rows", "points", "documents"
    id: Choice
    text: Choice
    vector: Choice
    vector_type: str | None = None  # read after the name: "vector(384)" (Postgres), "(384 floats)"
    dim: int | None = None
    distance: Distance | None = None  # None when nothing says (no ANN index, a file)
    alias: AliasInfo | None = None  # the name is an alias today: what it serves, and its fingerprint
    text_lengths: Mapping[str, float | None] = field(default_factory=dict)  # average characters, sampled
    notes: tuple[str, ...] = ()  # what the backend wants the reader to know (adoption, odd shapes)
    unknown_distance: str | None = None  # why the distance is not known, where the backend can say

    def describe(self) -> str:
        """`table docs, 12,345 rows; current vectors: embedding vector(384), cosine`."""
        count = "an unknown number of" if self.documents is None else f"{self.documents:,}"
        if self.vector_type is None:
            vectors = "no vectors found"
        else:
            described = [
                f"{self.vector.field or 'unnamed'} {self.vector_type}",
                self.distance or self.unknown_distance,
            ]
            vectors = "current vectors: " + ", ".join(part for part in described if part)
        return f"{self.relation} {self.name}, {count} {self.units}; {vectors}"

    def choices(self) -> str:
        """`id "id" (the primary key); text "body" (a well-known name; also "title")`."""
        roles = [("id", self.id), ("text", self.text), ("vector", self.vector)]
        return "; ".join(f"{role} {choice.describe()}" for role, choice in roles if choice.field)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["is_alias"] = self.alias is not None
        if self.alias is not None:
            data["alias"] = {"target": self.alias.target, "fingerprint": self.alias.fingerprint}
        return data


def choose_text(lengths: Mapping[str, float | None], given: str | None) -> Choice:
    """The given field, else a well-known name, else the longest average text in the sample."""
    names = list(lengths)
    if given is not None:
        return Choice(given, "given on the command line", _others(names, given))
    known = [name for name in TEXT_NAMES if name in lengths]
    if known:
        return Choice(known[0], "a well-known name", _others(names, known[0]))
    measured = {name: length for name, length in lengths.items() if length is not None}
    if len(names) == 1:
        return Choice(names[0], "the only text field")
    if measured:
        longest = max(measured, key=lambda name: measured[name])
        reason = f"the longest average text in a sample ({measured[longest]:,.0f} characters)"
        return Choice(longest, reason, _others(names, longest))
    if names:
        return Choice(names[0], "the first text field (no rows to sample)", _others(names, names[0]))
    return Choice(None, "no text field")


def choose_by_name(names: Sequence[str], preferred: Sequence[str], given: str | None) -> Choice:
    """The given field, else the first well-known name, else the only candidate; several unknown: none."""
    if given is not None:
        return Choice(given, "given on the command line", _others(names, given))
    known = [name for name in preferred if name in names]
    if known:
        return Choice(known[0], "a well-known name", _others(names, known[0]))
    if len(names) == 1:
        return Choice(names[0], "the only candidate")
    if names:
        return Choice(names[0], "the first of several", _others(names, names[0]))
    return Choice(None, "none found")


def text_lengths(rows: Iterable[Mapping[str, Any]], *, into_json_strings: bool = False) -> dict[str, float]:
    """Average length of every string field in `rows`, by dotted path, in the order first seen.

    `into_json_strings` also reads inside strings that hold a JSON object, as the Qdrant source does
    (LlamaIndex keeps the node, text included, as JSON in `_node_content`).
    """
    totals: dict[str, list[int]] = {}
    for row in rows:
        for path, value in _leaves(row, "", into_json_strings, _MAX_DEPTH):
            if isinstance(value, str):
                totals.setdefault(path, []).append(len(value))
    return {path: sum(lengths) / len(lengths) for path, lengths in totals.items()}


def vector_sizes(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Top-level fields holding lists of numbers (old vectors in an export), with their length."""
    sizes: dict[str, int] = {}
    for row in rows:
        for name, value in row.items():
            if _is_vector(value):
                sizes.setdefault(name, len(value))
    return sizes


def quoted(name: str) -> str:
    """A field name as comments and messages show it: in double quotes, like the TOML value."""
    return f'"{name}"'


def _leaves(value: Any, prefix: str, into_json_strings: bool, depth: int) -> Iterator[tuple[str, Any]]:
    if into_json_strings and prefix and isinstance(value, str) and value.startswith("{"):
        value = _json_object(value) or value
    if not isinstance(value, Mapping) or depth == 0:
        yield prefix, value
        return
    for key, item in value.items():
        yield from _leaves(item, f"{prefix}.{key}" if prefix else str(key), into_json_strings, depth - 1)


def _json_object(text: str) -> Mapping[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, Mapping) else None


def _is_vector(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) > 1
        and all(isinstance(x, int | float) and not isinstance(x, bool) for x in value)
    )


def _others(names: Sequence[str], chosen: str) -> tuple[str, ...]:
    return tuple(name for name in names if name != chosen)
