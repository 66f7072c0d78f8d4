"""Columnar batches: a shard's documents and tokens as a few lists and arrays, not one object per document.

    Documents     ids, texts, payloads (or None: nothing but id and text), defects by row
    TokenColumns  counts and original counts as arrays; ragged token ids (flat + offsets) or texts

Both are also sequences of the per-document types (`Record`, `Tokens`), built on demand, so code that is
not on the hot path (provider batches, tests, small sinks) reads them as before. The hot path calls
`take`, `concat` and `padded`: O(1) Python calls per shard, the per-document work in C (list slicing,
numpy gathers).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
from numpy.typing import NDArray

from reindex.capabilities import EmbedsColumns, TokenizesColumns
from reindex.ports import Record, Tokens

Indexes = Sequence[int] | NDArray[np.integer[Any]]
Int64s = NDArray[np.int64]


@dataclass(eq=False, slots=True)
class Documents(Sequence[Record]):
    """Source documents as columns. `payloads` None means each payload is just `{id_field: id, text_field:
    text}` (a JSONL line or Parquet row with no other field): nothing per document to carry."""

    ids: list[str]
    texts: list[str]
    payloads: list[Mapping[str, Any]] | None = None
    fields: tuple[str, str] = ("id", "text")
    defects: dict[int, tuple[str, str]] = field(default_factory=dict)  # row -> (reason, detail)
    last_position: str | None = None  # where a scan resumes after the last document

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, index: int) -> Record: ...
    @overload
    def __getitem__(self, index: slice) -> Documents: ...
    def __getitem__(self, index: int | slice) -> Record | Documents:
        if isinstance(index, slice):
            return self.take(range(len(self.ids))[index])
        defect = self.defects.get(index % len(self.ids) if index < 0 else index)
        return Record(self.ids[index], self.texts[index], self.payload(index), defect=defect and defect[0])

    def __iter__(self) -> Iterator[Record]:
        return (self[i] for i in range(len(self.ids)))

    def payload(self, index: int) -> Mapping[str, Any]:
        if self.payloads is not None:
            return self.payloads[index]
        return {self.fields[0]: self.ids[index], self.fields[1]: self.texts[index]}

    @property
    def has_payload(self) -> bool:
        """False when no document carries anything besides its id and text."""
        return self.payloads is not None

    def take(self, rows: Indexes) -> Documents:
        """The documents at `rows`, in that order; defects follow their rows."""
        picked = rows.tolist() if isinstance(rows, np.ndarray) else list(rows)
        defects: dict[int, tuple[str, str]] = {}
        if self.defects:
            defects = {new: self.defects[old] for new, old in enumerate(picked) if old in self.defects}
        return Documents(
            [self.ids[i] for i in picked],
            [self.texts[i] for i in picked],
            None if self.payloads is None else [self.payloads[i] for i in picked],
            self.fields,
            defects,
            self.last_position,
        )

    @classmethod
    def from_records(cls, records: Iterable[Record]) -> Documents:
        """Columns of per-document records (sources without a columnar scan, tests, sync)."""
        if isinstance(records, Documents):
            return records
        listed = list(records)
        defects = {i: (r.defect, f"source position {r.position}") for i, r in enumerate(listed) if r.defect}
        return cls(
            [r.id for r in listed],
            [r.text for r in listed],
            [r.payload for r in listed],
            defects=defects,
            last_position=listed[-1].position if listed else None,
        )

    @classmethod
    def concat(cls, parts: Sequence[Documents]) -> Documents:
        if len(parts) == 1:
            return parts[0]
        ids = [i for part in parts for i in part.ids]
        texts = [t for part in parts for t in part.texts]
        payloads = None
        if any(part.payloads is not None for part in parts):
            payloads = [part.payload(i) for part in parts for i in range(len(part))]
        defects: dict[int, tuple[str, str]] = {}
        offset = 0
        for part in parts:
            defects |= {offset + row: defect for row, defect in part.defects.items()}
            offset += len(part)
        fields = parts[0].fields if parts else ("id", "text")
        return cls(ids, texts, payloads, fields, defects, parts[-1].last_position if parts else None)


@dataclass(eq=False, slots=True)
class TokenColumns(Sequence[Tokens]):
    """Tokenized texts as columns. Local models fill `ids`/`offsets` (row i is ids[offsets[i]:offsets[i+1]],
    specials included); text embedders (providers, hash) fill `texts`; an embedder without a columnar
    tokenizer leaves its own per-text data in `items`, and any embedder may carry per-row data there beside
    `texts` or `ids` (the hash embedder's keys): `take` and `concat` keep every column aligned."""

    counts: Int64s  # tokens that will be embedded, after truncation, specials included
    original: Int64s  # tokens the whole text has
    ids: Int64s | None = None
    offsets: Int64s | None = None
    texts: list[str] | None = None
    items: list[Any] | None = None
    # True: `counts` are upper bounds a remote model was not asked to count exactly (`reindex_adapters.openai.online`), and
    # the provider's usage is the count the run records.
    bounded: bool = False

    def __len__(self) -> int:
        return len(self.counts)

    @overload
    def __getitem__(self, index: int) -> Tokens: ...
    @overload
    def __getitem__(self, index: slice) -> TokenColumns: ...
    def __getitem__(self, index: int | slice) -> Tokens | TokenColumns:
        if isinstance(index, slice):
            return self.take(np.arange(len(self.counts))[index])
        return Tokens(int(self.counts[index]), int(self.original[index]), self._data(index))

    def __iter__(self) -> Iterator[Tokens]:
        return (self[i] for i in range(len(self.counts)))

    def _data(self, index: int) -> Any:
        if self.ids is not None and self.offsets is not None:
            return self.ids[self.offsets[index] : self.offsets[index + 1]].tolist()
        if self.texts is not None:
            return self.texts[index]
        return None if self.items is None else self.items[index]

    @property
    def truncated(self) -> NDArray[np.bool_]:
        return self.original > self.counts

    def take(self, rows: Indexes) -> TokenColumns:
        """The rows at `rows`, in that order (ragged ids gathered in one numpy call)."""
        picked = np.asarray(rows, dtype=np.int64)
        ids = offsets = None
        if self.ids is not None and self.offsets is not None:
            ids, offsets = _gather(self.ids, self.offsets, picked)
        listed = picked.tolist()
        return TokenColumns(
            self.counts[picked],
            self.original[picked],
            ids,
            offsets,
            None if self.texts is None else [self.texts[i] for i in listed],
            None if self.items is None else [self.items[i] for i in listed],
            self.bounded,
        )

    @classmethod
    def concat(cls, parts: Sequence[TokenColumns]) -> TokenColumns:
        """The rows of all parts in order. Empty parts carry no columns and are left out: an empty shard's
        tokens must not hide the texts (or ids) the others carry."""
        parts = [part for part in parts if len(part)]
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls.from_tokens([])
        ids = offsets = None
        if all(p.ids is not None and p.offsets is not None for p in parts):
            ids = np.concatenate([p.ids for p in parts if p.ids is not None])
            lengths = np.concatenate([np.diff(p.offsets) for p in parts if p.offsets is not None])
            offsets = _offsets(lengths)
        texts = [t for p in parts for t in p.texts or ()] if all(p.texts is not None for p in parts) else None
        items = [t for p in parts for t in p.items or ()] if all(p.items is not None for p in parts) else None
        return cls(
            np.concatenate([p.counts for p in parts]),
            np.concatenate([p.original for p in parts]),
            ids,
            offsets,
            texts,
            items,
            any(p.bounded for p in parts),
        )

    @classmethod
    def from_tokens(cls, tokens: Sequence[Tokens]) -> TokenColumns:
        """Columns of an embedder's per-text `Tokens` (embedders without `tokenize_columns`)."""
        if isinstance(tokens, TokenColumns):
            return tokens
        return cls(
            np.fromiter((t.count for t in tokens), dtype=np.int64, count=len(tokens)),
            np.fromiter((t.original_count for t in tokens), dtype=np.int64, count=len(tokens)),
            items=[t.data for t in tokens],
        )

    def padded(self, pad_id: int, *, left: bool = False) -> tuple[Int64s, Int64s]:
        """(ids, attention mask) padded to the longest row: one boolean-mask assignment, no Python loop."""
        if self.ids is None or self.offsets is None:
            raise TypeError("padded() needs token ids (a local model's tokenize_columns)")
        lengths = np.diff(self.offsets)
        width = int(lengths.max()) if len(lengths) else 0
        positions = np.arange(width)
        mask = positions >= (width - lengths)[:, None] if left else positions < lengths[:, None]
        matrix = np.full((len(lengths), width), pad_id, dtype=np.int64)
        matrix[mask] = self.ids  # row-major: each row's ids land in its own unmasked span, in order
        return matrix, mask.astype(np.int64)


def _offsets(lengths: Int64s) -> Int64s:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _gather(ids: Int64s, offsets: Int64s, rows: Int64s) -> tuple[Int64s, Int64s]:
    """Ragged rows `rows` of (ids, offsets), concatenated: a repeat + arange index, one fancy-index."""
    starts, lengths = offsets[rows], offsets[rows + 1] - offsets[rows]
    new = _offsets(lengths)
    index = np.repeat(starts - new[:-1], lengths) + np.arange(int(new[-1]), dtype=np.int64)
    return ids[index], new


def ragged(sequences: Sequence[Sequence[int]]) -> tuple[Int64s, Int64s]:
    """(flat ids, offsets) of a list of id lists: one chained fromiter."""
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    offsets = _offsets(lengths)
    flat = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int64, count=int(offsets[-1]))
    return flat, offsets


def documents(records: Sequence[Record]) -> Documents:
    """`records` as columns (a no-op for `Documents`)."""
    return Documents.from_records(records)


def tokenize(embedder: Any, texts: list[str]) -> TokenColumns:
    """The embedder's `tokenize_columns` where it `TokenizesColumns` (local models, hash), else its per-text
    `tokenize`."""
    if isinstance(embedder, TokenizesColumns):
        result: TokenColumns = embedder.tokenize_columns(texts)
        return result
    return TokenColumns.from_tokens(embedder.tokenize(texts))


def embed(embedder: Any, tokens: TokenColumns) -> Any:
    """The embedder's `embed_columns` where it `EmbedsColumns`, else its per-text `embed`."""
    if isinstance(embedder, EmbedsColumns):
        return embedder.embed_columns(tokens)
    return embedder.embed(list(tokens))
