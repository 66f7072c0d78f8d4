"""MemorySource: records in a MemoryStore, scanned in id order like a table's primary key."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from pydantic import ConfigDict, Field

from reindex.ports import Record, Section, SourceSchema
from reindex_adapters.testing.memory.stores import MemoryStore, store


class MemorySource:
    """Records in a MemoryStore, scanned in id order; the cursor is the id (keyset, as for Postgres)."""

    shareable = False  # its store lives in this process

    class Config(Section):
        model_config = ConfigDict(extra="forbid", frozen=True)
        kind: Literal["memory"]
        documents: list[dict[str, Any]] = Field(default_factory=list)
        store: str | None = None  # a named, process-wide store shared with other adapters and commands

    def __init__(self, records: Sequence[Record] = (), *, store: MemoryStore | None = None) -> None:
        self.store = store if store is not None else MemoryStore()
        if records:
            self.store.load(records)
        self._identity = f"memory:{self.store.name}" if self.store.name else _inline_identity(records)

    @classmethod
    def from_config(cls, config: Config) -> MemorySource:
        records = [Record(str(d["id"]), str(d["text"]), d) for d in config.documents]
        if config.store is None:
            return cls(records)
        shared = store(config.store)
        with shared.lock:
            if not shared.seeded:
                shared.seeded = True
                shared.load(records)
        return cls(store=shared)

    @property
    def records(self) -> list[Record]:
        return self.store.records()

    def identity(self) -> str:
        return self._identity

    def schema(self) -> SourceSchema:
        return SourceSchema(id_field="id", text_field="text")

    def count(self) -> int | None:
        return len(self.store)

    def scan(self, after: str | None = None) -> Iterator[Record]:
        return self.store.scan(after)

    def fetch(self, ids: Sequence[str]) -> Iterator[Record]:
        for doc_id in sorted(set(ids)):
            yield from self.store.get(doc_id)

    def close(self) -> None:
        pass


def _inline_identity(records: Sequence[Record]) -> str:
    """A private store is named by what it was given: the same TOML documents, the same source."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(
            f"{len(record.id)}:{record.id}{len(record.text)}:{record.text}".encode("utf-8", "surrogatepass")
        )
    return f"memory:inline:{digest.hexdigest()[:16]}"
