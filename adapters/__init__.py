"""Backends implementing reindex.ports: one module per backend, resolved by kind in reindex.registry."""

from __future__ import annotations
