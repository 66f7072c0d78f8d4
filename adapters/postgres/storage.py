"""How a pgvector target stores its vectors: `vector` (float32), `halfvec` (float16) or `bit` (the signs,
binary quantization), optionally with the full vector kept beside the bits for re-ranking.

pgvector's limits decide the default. An HNSW index takes `vector` up to 2,000 dimensions, `halfvec` up to
4,000 and `bit` up to 64,000; any type stores up to 16,000 dimensions without an index. So a model up to
2,000 wide keeps `vector`, a wider one (text-embedding-3-large's 3,072) gets `halfvec` when an index is
wanted, and a combination pgvector cannot index is refused before anything is embedded.

Each type has its own binary COPY field (`copy_head` + `copy_body`), its own value for a row-by-row write,
and is read back as float32 (`read`): halfvec as its halves, bit as ±1/√dim (reindex.vectors.signs), so
the core compares, ranks and re-embeds against what the table really holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from reindex.errors import ConfigError
from reindex.ports import Distance, Precision, StoragePlan, Vectors
from reindex.vectors import signs

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from psycopg import sql

    from reindex_adapters.postgres.connection import Connection

Kind = Literal["vector", "halfvec", "bit"]

INDEX_LIMIT: dict[Kind, int] = {"vector": 2000, "halfvec": 4000, "bit": 64000}  # HNSW (and IVFFlat)
STORE_LIMIT: dict[Kind, int] = {"vector": 16000, "halfvec": 16000, "bit": 64000}  # a column without index
SINCE: dict[Kind, tuple[int, int]] = {"vector": (0, 5), "halfvec": (0, 7), "bit": (0, 7)}  # pgvector version
_OPS: dict[Distance, str] = {"cosine": "cosine_ops", "dot": "ip_ops", "euclid": "l2_ops"}
_PRECISION: dict[Kind, Precision] = {"vector": "float32", "halfvec": "float16", "bit": "bit"}
_VERSION_SQL = "SELECT extversion FROM pg_extension WHERE extname = 'vector'"


@dataclass(frozen=True, slots=True)
class Storage:
    """The vector column's type, and for `bit` whether the full vector is kept (then the column is `vector`
    and the HNSW index is over `binary_quantize(column)::bit(dim)`, an expression index)."""

    kind: Kind
    full_vector: bool = False

    @property
    def column(self) -> Kind:
        """The column's type: the full vector's where it is kept."""
        return "vector" if self.full_vector else self.kind

    @property
    def label(self) -> str:
        return "bit + vector" if self.full_vector else self.kind

    @property
    def precision(self) -> Precision:
        return _PRECISION[self.column]

    def column_sql(self, name: str, dim: int) -> sql.Composable:
        from psycopg import sql

        return sql.SQL("{} {}({})").format(sql.Identifier(name), sql.SQL(self.column), sql.Literal(int(dim)))

    def index_target(self, column: sql.Composable, dim: int, distance: Distance) -> sql.Composable:
        """What the HNSW index is built on, with its operator class."""
        from psycopg import sql

        if self.kind == "bit":
            indexed = self.quantized(column, dim) if self.full_vector else column
            return sql.SQL("({}) bit_hamming_ops").format(indexed)
        return sql.SQL("{} {}").format(column, sql.SQL(f"{self.kind}_{_OPS[distance]}"))

    def quantized(self, value: sql.Composable, dim: int) -> sql.Composable:
        from psycopg import sql

        return sql.SQL("binary_quantize({})::bit({})").format(value, sql.Literal(int(dim)))

    def opclass(self, distance: Distance) -> str:
        return "bit_hamming_ops" if self.kind == "bit" else f"{self.kind}_{_OPS[distance]}"

    def bytes_per_vector(self, dim: int) -> int:
        """The stored value's size: pgvector's 8-byte header (varlena + dims) and its elements."""
        bits = 8 + (dim + 7) // 8
        full = 8 + 4 * dim
        if self.kind == "bit":
            return bits + (full if self.full_vector else 0)
        return 8 + (2 if self.kind == "halfvec" else 4) * dim

    # writing -----------------------------------------------------------------------------------------

    def copy_head(self, dim: int) -> bytes:
        """The binary COPY field's length and the value's own header, the same on every row."""
        if self.column == "vector":
            return _int32(4 + 4 * dim) + _int16(dim) + _int16(0)
        if self.column == "halfvec":
            return _int32(4 + 2 * dim) + _int16(dim) + _int16(0)
        return _int32(4 + (dim + 7) // 8) + _int32(dim)  # varbit: its bit length, then the bits

    def copy_body(self, vectors: Vectors) -> NDArray[Any]:
        """The values, one row each, as numbers the encoder writes big-endian."""
        if self.column == "vector":
            return vectors.astype(np.float32, copy=False)
        if self.column == "halfvec":
            return vectors.astype(np.float16)
        return np.packbits(vectors > 0, axis=1)

    def row_value(self, vector: Vectors) -> Any:
        """One row's value for psycopg's dumpers (pgvector's own for halfvec and bit)."""
        if self.column == "bit":
            from pgvector.psycopg import Bit

            return Bit(np.asarray(vector) > 0)
        if self.column == "halfvec":
            from pgvector.psycopg import HalfVector

            return HalfVector(np.asarray(vector, dtype=np.float32))
        return vector

    def query_value(self, vector: Vectors) -> Any:
        """A query vector as the column compares it."""
        return self.row_value(np.asarray(vector, dtype=np.float32))

    # reading -----------------------------------------------------------------------------------------

    def read(self, value: Any) -> Vectors:
        """A stored value as float32: halves widened, bits as ±1/√dim."""
        if self.column == "bit":
            from pgvector.psycopg import Bit

            if isinstance(value, bytes | bytearray | memoryview):  # binary: no loader is registered for bit
                value = Bit.from_binary(bytes(value))
            elif isinstance(value, str):
                value = Bit.from_text(value)
            return signs(np.asarray(value.to_numpy(), dtype=bool))
        array = value.to_numpy() if hasattr(value, "to_numpy") else value
        return np.asarray(array, dtype=np.float32).copy()

    def dims_sql(self, column: sql.Composable) -> sql.Composable:
        from psycopg import sql

        return sql.SQL("length({})" if self.column == "bit" else "vector_dims({})").format(column)

    def zero_sql(self, column: sql.Composable) -> sql.Composable:
        """True where the stored vector is all zeros. Bits are signs: all clear is a vector, not a defect."""
        from psycopg import sql

        if self.column == "bit":
            return sql.SQL("false")
        norm = "vector_norm" if self.column == "vector" else "l2_norm"
        return sql.SQL(f"{norm}({{}}) = 0").format(column)


VECTOR = Storage("vector")  # what every target was before storage types


def choose(kind: Kind | None, full_vector: bool, dim: int, *, index: bool) -> Storage:
    """The storage `[target] storage` asks for, or the default for `dim`; ConfigError for a combination
    pgvector cannot store or index, naming the fix."""
    if full_vector and kind != "bit":
        raise ConfigError(
            "[target] full_vector keeps the full vector beside its bits, so it needs storage = 'bit'",
            hint='set storage = "bit", or remove full_vector',
        )
    if kind is None:
        kind = "vector" if dim <= INDEX_LIMIT["vector"] or not index else "halfvec"
    storage = Storage(kind, full_vector)
    if dim > STORE_LIMIT[storage.column]:
        raise ConfigError(
            f"pgvector stores {storage.column} up to {STORE_LIMIT[storage.column]:,} dimensions, not {dim:,}",
            hint='set [target] storage = "bit" (binary quantization, indexed up to 64,000)',
        )
    if index and dim > INDEX_LIMIT[kind]:
        narrow: tuple[Kind, ...] = ("halfvec", "bit")
        wider = [k for k in narrow if INDEX_LIMIT[k] >= dim]
        fix = f'set [target] storage = "{wider[0]}"' if wider else "no pgvector type indexes that width"
        raise ConfigError(
            f"pgvector's HNSW index takes {kind} up to {INDEX_LIMIT[kind]:,} dimensions; the model has {dim:,}",
            hint=f'{fix}, or index = "none" (exact scans only)',
        )
    return storage


def plan(storage: Storage, dim: int, distance: Distance, index: bool, hnsw: tuple[int, int]) -> StoragePlan:
    """What `reindex plan` says about a target stored this way."""
    built = "none (exact scans)"
    if index:
        over = f"binary_quantize(…)::bit({dim}), " if storage.full_vector else ""
        built = f"hnsw ({over}{storage.opclass(distance)}, m={hnsw[0]}, ef_construction={hnsw[1]})"
    note = None
    if storage.kind == "halfvec" and dim > INDEX_LIMIT["vector"]:
        note = f"{dim:,} dimensions: vector is indexed up to 2,000, halfvec up to 4,000 (half the storage)"
    elif storage.kind == "bit":
        note = "binary quantization: searched by Hamming distance" + (
            ", re-ranked on the full vector" if storage.full_vector else ""
        )
    return StoragePlan(
        type=storage.label,
        precision=storage.precision,
        index=built,
        bytes_per_vector=storage.bytes_per_vector(dim),
        default=storage.kind == "vector",
        note=note,
    )


def check_server(conn: Connection, storage: Storage) -> None:
    """Refuse a type the target database's pgvector does not have yet (halfvec and bit: 0.7.0)."""
    row = conn.execute(_VERSION_SQL).fetchone()
    if row is None:
        return  # the extension is created by the first write (`Database`), at the server's version
    found = version(str(row[0]))
    wanted = SINCE[storage.kind]
    if found < wanted:
        raise ConfigError(
            f"storage {storage.kind!r} needs pgvector {wanted[0]}.{wanted[1]}.0 or newer; "
            f"the target database has {row[0]}",
            hint="run ALTER EXTENSION vector UPDATE there (after installing pgvector 0.7+), "
            'or set [target] storage = "vector" with index = "none"',
        )


def version(text: str) -> tuple[int, int]:
    major, minor, *_ = [*(int(n) for n in re.findall(r"\d+", text)[:2]), 0, 0]
    return major, minor


def recorded(meta: dict[str, Any], column_type: str) -> Storage:
    """The storage a target was built with: its comment's, else its column's type (targets built before
    storage types were recorded are all `vector`)."""
    kind = meta.get("storage")
    if kind in ("vector", "halfvec", "bit"):
        return Storage(kind, bool(meta.get("full_vector")))
    return Storage("bit" if column_type == "bit" else "halfvec" if column_type == "halfvec" else "vector")


def _int16(value: int) -> bytes:
    return int(value).to_bytes(2, "big", signed=True)


def _int32(value: int) -> bytes:
    return int(value).to_bytes(4, "big", signed=True)
