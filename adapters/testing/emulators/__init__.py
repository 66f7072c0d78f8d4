"""Local emulators of provider wire formats, for tests and dry runs: the official SDKs talk to them.

openai/ (`python -m reindex_adapters.testing.emulators.openai`), mistral.py, gemini/, bedrock.py, cohere/,
voyage/ (each served by `python -m reindex_adapters.testing.emulators mistral|gemini|bedrock|cohere|voyage`);
server.py runs one on a local port, faults.py scripts the failures they inject.
"""

from __future__ import annotations
