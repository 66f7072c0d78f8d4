"""A whole batch as one binary COPY payload for a pgvector target, built per batch, not per row.

Each row is a fixed-width head (field count, the vector in its column's binary format (adapters/postgres/
storage.py: vector, halfvec or bit), the fingerprint,
the content hash, a constant '{}' payload, the next field's length), built as one (n, width) byte
matrix, followed by its variable fields (id, text, per-document payload) and their lengths. The pieces
are interleaved by list slicing and joined once: no per-row Python beyond one `str.encode` per text.

    PGCOPY signature | (head_i, id_i, len(text_i), text_i [, len(json_i)+1, json_i])... | trailer

A target with the source table's own columns (`Schema`) takes the same fixed head (vector, fingerprint,
content hash), then each source column's field as its type's binary dumper made it (`encode_schema`; the
caller dumps, since dumpers belong to a connection), NULL as length -1.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from reindex.columns import Documents
from reindex.ports import Vectors
from reindex_adapters.postgres.storage import VECTOR, Storage

SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # flags 0, no header extension
TRAILER = b"\xff\xff"
_JSONB_VERSION = b"\x01"
_EMPTY_PAYLOAD = _JSONB_VERSION + b"{}"
_encode_json = json.JSONEncoder(default=str, allow_nan=False).encode  # the C encoder, built once

Bytes = NDArray[np.uint8]
Chunk = bytes | NDArray[Any]  # a constant run of bytes, or an (n, k) matrix: k numbers per row, big-endian
Field = bytes | bytearray | memoryview  # one value as its binary dumper wrote it


@dataclass(frozen=True, slots=True)
class Schemaless:
    """The column names of a schemaless target and the payload keys already stored as columns."""

    id: str
    text: str
    payload: str
    vector: str
    carried: frozenset[str]
    storage: Storage = VECTOR
    fingerprint: str = "reindex_fingerprint"
    content_hash: str = "reindex_content_hash"


@dataclass(frozen=True, slots=True)
class Schema:
    """A target with the source table's columns (same names and types) beside the tool's own."""

    columns: tuple[str, ...]  # the source's columns, in the order the caller dumps them
    types: tuple[int, ...]  # their type oids, for the binary dumpers
    key: str
    text: str
    vector: str
    storage: Storage = VECTOR
    fingerprint: str = "reindex_fingerprint"
    content_hash: str = "reindex_content_hash"


@dataclass(frozen=True, slots=True)
class Payload:
    columns: tuple[str, ...]  # the COPY column list, in the order the rows carry them
    data: bytes  # signature + rows + trailer, for one `copy.write`


def encode(
    target: Schemaless, docs: Documents, vectors: Vectors, content_hashes: Sequence[str], fingerprint: str
) -> Payload:
    """The COPY payload of `docs` with their vectors; UnicodeEncodeError for a text that is not UTF-8."""
    dim = vectors.shape[1]
    fixed: list[tuple[str, list[Chunk]]] = [
        (target.vector, [target.storage.copy_head(dim), target.storage.copy_body(vectors)]),
        (target.fingerprint, [_constant(fingerprint.encode())]),
    ]
    variable: list[tuple[str, list[bytes], bytes]] = []  # (column, values, constant prefix of each value)
    hashes = _fixed_ascii(content_hashes)
    if hashes is None:
        variable.append((target.content_hash, _utf8(content_hashes), b""))
    else:
        fixed.append((target.content_hash, [_int32(hashes.shape[1]), hashes]))
    empty = _payload_is_empty(docs, target.carried)
    if empty:
        fixed.append((target.payload, [_constant(_EMPTY_PAYLOAD)]))
    variable += [(target.id, _utf8(docs.ids), b""), (target.text, _utf8(docs.texts), b"")]
    if not empty:
        variable.append((target.payload, _payloads(docs, target.carried), _JSONB_VERSION))
    columns = (*(name for name, _ in fixed), *(name for name, _, _ in variable))
    head = [_int16(len(columns)), *(chunk for _, chunks in fixed for chunk in chunks)]
    return Payload(columns, _assemble(len(docs), head, [(values, p) for _, values, p in variable]))


def encode_schema(
    target: Schema,
    fields: Sequence[Sequence[Field | None]],
    vectors: Vectors,
    content_hashes: Sequence[str],
    fingerprint: str,
) -> Payload:
    """The COPY payload of rows whose source columns are already dumped: `fields[c][i]` is column c of row
    i (None: NULL). The reindex_origin column is left out: NULL, the tool's own row."""
    n, dim = vectors.shape
    head: list[Chunk] = [
        _int16(3 + len(target.columns)),
        target.storage.copy_head(dim),
        target.storage.copy_body(vectors),
        _constant(fingerprint.encode()),
    ]
    columns = [target.vector, target.fingerprint, target.content_hash]
    hashes = _fixed_ascii(content_hashes)
    variable: list[tuple[Sequence[Field | None], bytes]] = []
    if hashes is None:
        variable.append((_utf8(content_hashes), b""))
    else:
        head += [_int32(hashes.shape[1]), hashes]
    if len(fields) != len(target.columns) or not fields:
        raise ValueError(f"{len(fields)} dumped columns for {len(target.columns)} source columns")
    variable += [(column, b"") for column in fields]
    columns += target.columns
    return Payload(tuple(columns), _assemble(n, head, variable))


def json_dumps(value: Any) -> str:
    """JSON for jsonb: NaN and infinity (which jsonb refuses) become null; unknown types their str()."""
    try:
        return _encode_json(value)
    except ValueError:
        return json.dumps(_json_safe(value), default=str)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _payload_is_empty(docs: Documents, carried: frozenset[str]) -> bool:
    """No payload column values: the documents carry nothing but the id and text stored as columns."""
    return not docs.has_payload and set(docs.fields) <= carried


def _payloads(docs: Documents, carried: frozenset[str]) -> list[bytes]:
    return [
        json_dumps({k: v for k, v in docs.payload(i).items() if k not in carried}).encode()
        for i in range(len(docs))
    ]


def _assemble(n: int, head: list[Chunk], variable: Sequence[tuple[Sequence[Field | None], bytes]]) -> bytes:
    """Interleave per-row pieces: head (ending in the first variable field's length), then each field, each
    value after its column's constant prefix (the jsonb version byte); None is NULL (length -1, no bytes)."""
    fields = [_field(values, prefix) for values, prefix in variable]
    (first, first_lengths), first_prefix = fields[0], variable[0][1]
    head += [_be32(first_lengths), first_prefix]
    columns: list[Sequence[Field]] = [_rows(n, head), first]
    for (values, lengths), (_, prefix) in zip(fields[1:], variable[1:], strict=True):
        columns += [_prefixes(lengths, prefix), values]
    step = len(columns)
    parts: list[Field] = [b""] * (n * step + 2)
    parts[0], parts[-1] = SIGNATURE, TRAILER
    for k, column in enumerate(columns):
        parts[1 + k : 1 + n * step : step] = column
    return b"".join(parts)


def _field(values: Sequence[Field | None], prefix: bytes) -> tuple[list[Field], NDArray[np.int64]]:
    """A column's values with NULLs as empty pieces, and each field's int32 length (counting the prefix;
    -1 for NULL, which has no prefix either: only prefix-free columns hold NULLs)."""
    listed = list(values)
    nulls = None
    if None in listed:
        nulls = np.fromiter((v is None for v in listed), dtype=bool, count=len(listed))
        listed = [b"" if v is None else v for v in listed]
    lengths = np.fromiter(map(len, listed), dtype=np.int64, count=len(listed)) + len(prefix)  # type: ignore[arg-type]
    if nulls is not None:
        lengths[nulls] = -1
    return cast("list[Field]", listed), lengths


def _rows(n: int, chunks: list[Chunk]) -> list[bytes]:
    """One bytes object per row: the chunks side by side in an (n, width) matrix, split by a void view."""
    spans = [np.frombuffer(c, dtype=np.uint8) if isinstance(c, bytes) else c for c in chunks]
    width = sum(span.shape[-1] * span.itemsize for span in spans)
    block = np.empty((n, width), dtype=np.uint8)
    at = 0
    for span in spans:  # each lands as big-endian numbers in its byte columns: one strided copy
        size = span.shape[-1] * span.itemsize
        block[:, at : at + size].view(span.dtype.newbyteorder(">"))[...] = span
        at += size
    return cast("list[bytes]", block.view(np.dtype((np.void, width))).ravel().tolist())


def _prefixes(lengths: NDArray[np.int64], prefix: bytes) -> list[bytes]:
    """Per-row `int32 length` (already counting the constant prefix, the jsonb version byte) and that prefix."""
    return _rows(len(lengths), [_be32(lengths), prefix])


def _be32(values: NDArray[np.int64]) -> Bytes:
    """(n, 1): each value as a big-endian int32."""
    return values.astype(">i4").reshape(-1, 1)


def _fixed_ascii(values: Sequence[str]) -> Bytes | None:
    """(n, width) bytes when every value is ASCII of one length (hex content hashes), else None."""
    if not values or len(set(map(len, values))) != 1 or not all(map(str.isascii, values)):
        return None
    width = len(values[0])
    if width == 0:
        return None
    return np.array(values, dtype=f"S{width}").view(np.uint8).reshape(len(values), width)


def _utf8(values: Sequence[str]) -> list[bytes]:
    return list(map(str.encode, values))


def _constant(value: bytes) -> bytes:
    """A field with the same value on every row: its int32 length and its bytes."""
    return _int32(len(value)) + value


def _int16(value: int) -> bytes:
    return int(value).to_bytes(2, "big", signed=True)


def _int32(value: int) -> bytes:
    return int(value).to_bytes(4, "big", signed=True)
