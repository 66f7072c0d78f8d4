"""A local OpenAI embeddings + files + batches API that computes real embeddings, for tests and dry runs.

Point the official SDK at `Emulator(embedder).base_url`; reindex_adapters.testing.emulators.faults scripts what goes wrong.
It also serves Azure OpenAI's embeddings route (`AzureOpenAI(azure_endpoint=emulator.azure_endpoint)`):
`/openai/deployments/{deployment}/embeddings`, refused without `api-version` or a key, as Azure does.

state.py: files, batches, billing and traffic · provider.py: what every provider emulator keeps · app.py: the
routes, the app and `Emulator` · __main__.py: `python -m reindex_adapters.testing.emulators.openai`.
"""

from __future__ import annotations

from reindex_adapters.testing.emulators.openai.app import (
    AZURE_NO_DEPLOYMENT,
    AZURE_PREFIX,
    AZURE_UNAUTHORIZED,
    ROUTE_TABLE,
    Emulator,
    Handler,
    create_app,
    endpoint_for,
    json_body,
    parse_multipart,
)
from reindex_adapters.testing.emulators.openai.provider import Ledger, ProviderState
from reindex_adapters.testing.emulators.openai.state import (
    PURPOSES,
    STEPPING,
    UNFINISHED,
    UNSET_BATCH_FIELDS,
    BatchJob,
    EmulatorState,
    StoredFile,
    Traffic,
    encode_vector,
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
