"""What a column target's write sends: its rows for the COPY stage, and the digest that tells its vectors
from the ones the application writes over them later (side_by_side.py)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from psycopg import sql

    from reindex.ports import Vectors
    from reindex_adapters.postgres.catalog import Layout
    from reindex_adapters.postgres.storage import Storage


COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" * 2


def digest(layout: Layout, value: sql.Composable) -> sql.Composable:
    """A digest of a stored vector's bytes (its type's binary send form): what the tool wrote, to tell it
    from what the application writes in its place later."""
    from psycopg import sql

    return sql.SQL("left(md5({}_send({})), 16)").format(sql.SQL(layout.storage.column), value)


def stage_payload(ids: Sequence[str], hashes: Sequence[str], storage: Storage, vectors: Vectors) -> bytes:
    """Binary COPY of (id text, content hash text, vector) rows."""
    dim = int(vectors.shape[1]) if len(vectors.shape) == 2 else 0
    head = storage.copy_head(dim)
    body = storage.copy_body(vectors)
    big = body.astype(body.dtype.newbyteorder(">"), copy=False) if body.dtype.itemsize > 1 else body
    parts = [COPY_HEADER]
    for i, (key, content) in enumerate(zip(ids, hashes, strict=True)):
        key_bytes, content_bytes = key.encode(), content.encode()
        parts.append(
            b"\x00\x03"
            + struct.pack(">i", len(key_bytes))
            + key_bytes
            + struct.pack(">i", len(content_bytes))
            + content_bytes
            + head
            + big[i].tobytes()
        )
    parts.append(b"\xff\xff")
    return b"".join(parts)
