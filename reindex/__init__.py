"""reindex: re-embed a corpus into a fresh target, prove coverage, flip a read alias atomically."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("reindex-embeddings")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
