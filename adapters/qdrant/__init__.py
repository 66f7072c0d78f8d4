"""Qdrant: a collection (or an alias) as a source, a fresh collection behind an alias as the target.

sink.py: client, point ids, source, sink and alias · survey.py: what `reindex init` sees.
"""

from __future__ import annotations

from reindex_adapters.qdrant.sink import QdrantSink, QdrantSource

__all__ = ["QdrantSink", "QdrantSource"]
