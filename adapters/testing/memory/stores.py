"""The named, process-wide stores (`store()`) and MemoryStore: source documents in id order, a sink's targets
and aliases, and the batch provider's side, shared by every adapter a command opens on one name.

Every command opens its adapters anew from the TOML, so `store = "<name>"` on `[source]` and `[target]`
puts them on one process-wide `MemoryStore` (see `store()`): documents a test inserts, edits and deletes
between commands, and the sink's targets and aliases. Without `store` each adapter has a private one.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from reindex.ports import Record, TargetSpec, Vectors
from reindex_adapters.testing.memory.provider import BatchProvider

Stored = tuple[Record, Vectors, str, str]  # record, vector, content hash, fingerprint
_SEP = "\x1f"  # cursor of a record that shares its id with later ones: `<id>\x1f<index among them>`
_STORES: dict[str, MemoryStore] = {}
_STORES_LOCK = threading.Lock()


def store(name: str) -> MemoryStore:
    """The process-wide store called `name`, created empty on first use."""
    with _STORES_LOCK:
        return _STORES.setdefault(name, MemoryStore(name))


def forget_store(name: str) -> None:
    """Drop a named store (tests: a fresh world per example)."""
    with _STORES_LOCK:
        _STORES.pop(name, None)


class MemoryStore:
    """Source documents kept in id order (keyset scans, like a table's primary key), plus a sink's
    targets, specs and aliases. Several records may share an id, as in a file; they keep insertion order."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name
        self.lock = threading.RLock()
        self.seeded = False  # `[source] documents` loaded once into a named store
        self._docs: dict[str, list[Record]] = {}
        self._ids: list[str] = []  # sorted keys of _docs
        self.targets: dict[str, dict[str, Stored]] = {}
        self.specs: dict[str, TargetSpec] = {}
        self.aliases: dict[str, tuple[str, Mapping[str, Any]]] = {}
        self._fail_in: int | None = None
        self._fail_landed = False
        self.provider = BatchProvider()  # a batch API's side, for `memory-batch` with this store

    # source side ---------------------------------------------------------------------------------------

    def load(self, documents: Sequence[Record]) -> None:
        """Append many records at once (one sort, not one insertion each)."""
        with self.lock:
            for record in documents:
                self._docs.setdefault(record.id, []).append(_plain(record))
            self._ids = sorted(self._docs)

    def put(self, doc_id: str, text: str, **fields: Any) -> None:
        """Insert the document, or replace every record with this id by it."""
        with self.lock:
            if doc_id not in self._docs:
                bisect.insort(self._ids, doc_id)
            self._docs[doc_id] = [_document(doc_id, text, fields)]

    def append(self, doc_id: str, text: str, **fields: Any) -> None:
        """Add one more record with this id (a duplicate id, as a JSONL file can hold)."""
        with self.lock:
            if doc_id not in self._docs:
                bisect.insort(self._ids, doc_id)
            self._docs.setdefault(doc_id, []).append(_document(doc_id, text, fields))

    def edit(self, doc_id: str, text: str) -> None:
        """Change the text of every record with this id, keeping the other fields."""
        with self.lock:
            self._docs[doc_id] = [
                _document(doc_id, text, {k: v for k, v in r.payload.items() if k not in ("id", "text")})
                for r in self._docs[doc_id]
            ]

    def delete(self, doc_id: str) -> None:
        with self.lock:
            if self._docs.pop(doc_id, None) is not None:
                self._ids.remove(doc_id)

    def get(self, doc_id: str) -> list[Record]:
        with self.lock:
            return list(self._docs.get(doc_id, []))

    def ids(self) -> list[str]:
        with self.lock:
            return list(self._ids)

    def records(self) -> list[Record]:
        """Every record in scan order."""
        return list(self.scan())

    def __len__(self) -> int:
        with self.lock:
            return sum(len(group) for group in self._docs.values())

    def scan(self, after: str | None = None) -> Iterator[Record]:
        """Keyset scan: each step finds the next record after the last position, so a document inserted
        behind the cursor is not seen (as with Postgres) and one inserted ahead of it is."""
        key = _parse(after)
        while True:
            with self.lock:
                step = self._next(key)
            if step is None:
                return
            record, key = step
            yield record

    def _next(self, key: tuple[str, int | None] | None) -> tuple[Record, tuple[str, int]] | None:
        if key is not None and key[1] is not None and key[1] + 1 < len(self._docs.get(key[0], [])):
            doc_id, index = key[0], key[1] + 1
        else:
            at = 0 if key is None else bisect.bisect_right(self._ids, key[0])
            if at >= len(self._ids):
                return None
            doc_id, index = self._ids[at], 0
        group = self._docs[doc_id]
        cursor = doc_id if index == len(group) - 1 else f"{doc_id}{_SEP}{index}"
        r = group[index]
        return Record(r.id, r.text, r.payload, cursor=cursor, defect=r.defect), (doc_id, index)

    # sink side -----------------------------------------------------------------------------------------

    def fail_write(self, after: int | None, *, landed: bool = False) -> None:
        """Make the `after`-th sink write from now raise BackendError once (None: never), like a crash.

        `landed`: the rows are stored first and the error comes after, like a crash before the ledger mark.
        """
        with self.lock:
            self._fail_in, self._fail_landed = after, landed

    def write_fails(self) -> bool | None:
        """Count one write; None when it goes through, else whether it lands before failing."""
        with self.lock:
            if self._fail_in is None:
                return None
            self._fail_in -= 1
            if self._fail_in > 0:
                return None
            self._fail_in = None
            return self._fail_landed


def _document(doc_id: str, text: str, fields: Mapping[str, Any]) -> Record:
    return Record(doc_id, text, {"id": doc_id, "text": text, **fields})


def _plain(record: Record) -> Record:
    return Record(record.id, record.text, record.payload, defect=record.defect)


def _parse(after: str | None) -> tuple[str, int | None] | None:
    if after is None:
        return None
    doc_id, sep, index = after.rpartition(_SEP)
    return (doc_id, int(index)) if sep and index.isdigit() else (after, None)
