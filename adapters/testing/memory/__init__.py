"""In-memory source, sink and a deterministic embedder: the shipped fakes for tests and demo mode.

stores.py: the named process-wide stores and MemoryStore · source.py: MemorySource · sink.py: MemorySink ·
hash_embedder.py: the free `hash` embedder · batch.py: the `memory-batch` embedder · provider.py: the batch
provider's side it keeps on a store. The entry points name the classes here, at package level.
"""

from __future__ import annotations

from reindex_adapters.testing.memory.batch import MemoryBatchEmbedder
from reindex_adapters.testing.memory.hash_embedder import (
    CHUNK_ROWS,
    FREE_BATCH_TOKENS,
    HASH_MODEL,
    HashEmbedder,
    Int64s,
    Words,
)
from reindex_adapters.testing.memory.paced import PacedEmbedder, WordTokenizer
from reindex_adapters.testing.memory.provider import BatchProvider, Bill, ProviderJob
from reindex_adapters.testing.memory.sink import MemorySink
from reindex_adapters.testing.memory.source import MemorySource
from reindex_adapters.testing.memory.stores import MemoryStore, Stored, forget_store, store

__all__ = [
    "CHUNK_ROWS",
    "FREE_BATCH_TOKENS",
    "HASH_MODEL",
    "BatchProvider",
    "Bill",
    "HashEmbedder",
    "Int64s",
    "MemoryBatchEmbedder",
    "MemorySink",
    "MemorySource",
    "MemoryStore",
    "PacedEmbedder",
    "ProviderJob",
    "Stored",
    "WordTokenizer",
    "Words",
    "forget_store",
    "store",
]
