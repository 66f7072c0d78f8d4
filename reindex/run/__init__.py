"""The backfill: a migration's adapters, shards, the local pipeline and its source reads and sink writes
(io.py), the ray engine (ray/), claims and budget."""

from __future__ import annotations
