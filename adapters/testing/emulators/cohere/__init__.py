"""A local Cohere datasets + Embed Jobs + /v2/embed API, for tests and dry runs (state.py: what it keeps and
does; app.py: the routes and `CohereEmulator`).

Point the official SDK at it: `cohere.ClientV2(api_key=..., base_url=CohereEmulator(embedder).base_url)`.
Datasets are stored as Cohere serves them: their rows in Avro parts at download URLs (served here too, under
/_emulator/parts/), which is what the SDK's `co.utils.save_dataset` and the adapter read. The faults are the
OpenAI emulator's FaultPlan (reindex_adapters.testing.emulators.faults), with its route names: `files` for the
datasets, `batch_create`, `batch_list`, `batch_retrieve`, `batch_cancel` for the embed jobs, `embeddings` for
/v2/embed.

    polls_per_step      gets per status step (dataset queued → processing → validated; job processing, then
                        terminal); 0: terminal on one get
    slow_creates        the dataset (first) or job exists at once, the create answers only after `create_delay_s`
    rate_limit(_on), server_errors(_on), unauthorized: 429 with Retry-After, 5xx, 401
    poison_substring    a row whose text contains it is dropped by validation with a warning naming its line
                        (with `skip_malformed_input`; else the dataset fails); /v2/embed refuses it with a 400
    fail_validation     the dataset fails validation (its `validation_error` says why)
    expire_after, cancel_after   the job ends `failed` / `cancelled` with only its first K rows in its output
    failed_lines        the first K rows of each job are missing from its output (not billed)
    shuffle/duplicate/malformed_output_line: the output's faults; delete_output: the output dataset is gone
    requests_per_minute, tokens_per_minute: /v2/embed's rate limits, per key

Vectors are the embedder's (HashEmbedder: deterministic from the text); tokens are counted with cl100k_base and
billed per job (`meta.billed_units.input_tokens`) and per /v2/embed request.
"""

from __future__ import annotations

from reindex_adapters.testing.emulators.cohere.app import ROUTE_TABLE, CohereEmulator, create_app
from reindex_adapters.testing.emulators.cohere.state import INVALID_TEXT, CohereState, error_body

__all__ = ["INVALID_TEXT", "ROUTE_TABLE", "CohereEmulator", "CohereState", "create_app", "error_body"]
