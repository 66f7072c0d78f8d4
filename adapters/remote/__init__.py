"""The toolkit every remote provider adapter shares (openai, azure-openai, mistral, gemini, bedrock, the emulators).

errors.py: ProviderBusy, ProviderRejected, ProviderNotFound, Retry-After · keys.py: API keys from the environment,
redacted from messages · pacing.py: Pacer, Traffic, Paced · tokens.py: tiktoken counting and cutting ·
decoding.py: vectors from an answer · lines.py: batch output lines joined on custom_id · jobs.py: creating a
batch job once per key, adopting it after an uncertain create.
"""

from __future__ import annotations
