"""reindex: re-embed a corpus into a fresh target, prove coverage, flip a read alias atomically."""

from __future__ import annotations

__version__ = "0.1.0"
