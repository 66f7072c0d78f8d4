"""The backfill: a migration's adapters, shards, the local pipeline and the ray engine, claims and budget."""

from __future__ import annotations
