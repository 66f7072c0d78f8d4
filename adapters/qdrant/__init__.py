"""Qdrant: a collection (or an alias) as a source, a fresh collection behind an alias as the target.

connection.py: settings, shared clients, error translation · points.py: point ids, payloads, vectors ·
bookkeeping.py: the keys reindex stores · source.py: QdrantSource · sink.py: QdrantSink ·
alias.py: alias reads and compare-and-swap moves · survey.py: what `reindex init` sees.
"""

from __future__ import annotations

from reindex_adapters.qdrant.sink import QdrantSink
from reindex_adapters.qdrant.source import QdrantSource

__all__ = ["QdrantSink", "QdrantSource"]
