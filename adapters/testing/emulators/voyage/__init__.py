"""A local Voyage AI API (embeddings, files, batches) that computes real embeddings, for tests and dry runs:
state.py keeps files, batches and billing; app.py is the web layer and `VoyageEmulator`."""

from __future__ import annotations

from reindex_adapters.testing.emulators.voyage.app import ROUTE_TABLE, VoyageEmulator, create_app, error_body
from reindex_adapters.testing.emulators.voyage.state import EXPIRED, PROMPTS, REFUSED, VoyageState

__all__ = [
    "EXPIRED",
    "PROMPTS",
    "REFUSED",
    "ROUTE_TABLE",
    "VoyageEmulator",
    "VoyageState",
    "create_app",
    "error_body",
]
