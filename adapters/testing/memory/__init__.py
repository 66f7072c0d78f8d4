"""In-memory source, sink and a deterministic embedder: the shipped fakes for tests and demo mode.

hash_embedder.py: everything, for now (split into one file per concern next).
"""

from __future__ import annotations

from reindex_adapters.testing.memory.hash_embedder import (
    CHUNK_ROWS,
    FREE_BATCH_TOKENS,
    HASH_MODEL,
    BatchProvider,
    Bill,
    HashEmbedder,
    Int64s,
    MemoryBatchEmbedder,
    MemorySink,
    MemorySource,
    MemoryStore,
    ProviderJob,
    Stored,
    Words,
    forget_store,
    store,
)

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
    "ProviderJob",
    "Stored",
    "Words",
    "forget_store",
    "store",
]
