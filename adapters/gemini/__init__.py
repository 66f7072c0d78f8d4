"""Google Gemini's Batch API for embeddings, through the official `google-genai` SDK (Gemini Developer API).

batch.py      the `gemini-batch` embedder: input files, create or adopt by display name, poll, release
responses.py  a responses file read: vectors by line key, refused lines in the run's codes, billed tokens
client.py     the SDK's client, and its errors made ours (RetryInfo delays; the key never shown)
(the emulator is reindex_adapters.testing.emulators.gemini)
"""

from __future__ import annotations

from reindex_adapters.gemini.batch import PRICES, PRICES_TAKEN, GeminiBatchEmbedder
from reindex_adapters.gemini.client import make_client, retry_delay
from reindex_adapters.gemini.responses import line_code, read_responses

__all__ = [
    "PRICES",
    "PRICES_TAKEN",
    "GeminiBatchEmbedder",
    "line_code",
    "make_client",
    "read_responses",
    "retry_delay",
]
