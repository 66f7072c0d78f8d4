"""`python -m reindex_adapters.testing.emulators.openai --port 8089 --model hash`: serve the emulator."""

from __future__ import annotations

from reindex_adapters.testing.emulators.openai.state import main

if __name__ == "__main__":
    main()
