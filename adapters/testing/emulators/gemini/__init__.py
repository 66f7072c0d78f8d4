"""The Gemini Batch API emulator: state.py holds files, batches and billing; app.py is its web layer."""

from __future__ import annotations
