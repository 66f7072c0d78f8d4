"""Test doubles shipped with the adapters, registered through entry points like any plugin.

memory/: an in-process store as source and sink, the free `hash` embedder, the `memory-batch` provider ·
emulators/: local servers speaking the OpenAI, Mistral, Gemini and Bedrock wire formats, with faults.
"""

from __future__ import annotations
