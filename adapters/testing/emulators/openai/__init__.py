"""The OpenAI embeddings + files + batches API emulator (`python -m reindex_adapters.testing.emulators.openai`).

state.py: everything, for now (split into state, app and the command line next).
"""

from __future__ import annotations

from reindex_adapters.testing.emulators.openai.state import (
    AZURE_NO_DEPLOYMENT,
    AZURE_PREFIX,
    AZURE_UNAUTHORIZED,
    PURPOSES,
    ROUTE_TABLE,
    STEPPING,
    UNFINISHED,
    UNSET_BATCH_FIELDS,
    BatchJob,
    Emulator,
    EmulatorState,
    Handler,
    Ledger,
    ProviderState,
    StoredFile,
    Traffic,
    create_app,
    encode_vector,
    endpoint_for,
    json_body,
    parse_multipart,
    shorten,
)

__all__ = [
    "AZURE_NO_DEPLOYMENT",
    "AZURE_PREFIX",
    "AZURE_UNAUTHORIZED",
    "PURPOSES",
    "ROUTE_TABLE",
    "STEPPING",
    "UNFINISHED",
    "UNSET_BATCH_FIELDS",
    "BatchJob",
    "Emulator",
    "EmulatorState",
    "Handler",
    "Ledger",
    "ProviderState",
    "StoredFile",
    "Traffic",
    "create_app",
    "encode_vector",
    "endpoint_for",
    "json_body",
    "parse_multipart",
    "shorten",
]
