"""`python -m reindex_adapters.testing.emulators mistral|gemini|bedrock|voyage|cohere [--port N] [--model hash] [--dim D]`:
serve one provider's emulator for a dry run until interrupted; the first line printed names its URL.
(The OpenAI emulator has its own: `python -m reindex_adapters.testing.emulators.openai`.)"""

from __future__ import annotations

import argparse
import contextlib
import threading
from typing import Any

from reindex.ports import Embedder

# each provider's default embedding width
DIMS = {"mistral": 1024, "gemini": 3072, "bedrock": 1024, "voyage": 1024, "cohere": 1024}


def _embedder(model: str, dim: int) -> Embedder:
    if model == "hash":
        from reindex_adapters.testing.memory import HashEmbedder

        return HashEmbedder(dim=dim)
    from reindex.registry import build

    embedder: Embedder = build("embedder", {"kind": "sentence-transformers", "model": model})
    return embedder


def _emulator(provider: str, embedder: Embedder, port: int, buckets: tuple[str, ...]) -> tuple[Any, str]:
    """The emulator, not started, and what to print once it is (the address its SDK takes)."""
    if provider == "mistral":
        from reindex_adapters.testing.emulators.mistral import MistralEmulator

        return MistralEmulator(embedder, port=port), "server_url"
    if provider == "gemini":
        from reindex_adapters.testing.emulators.gemini.app import GeminiEmulator

        return GeminiEmulator(embedder, port=port), "base_url"
    if provider == "cohere":
        from reindex_adapters.testing.emulators.cohere import CohereEmulator

        return CohereEmulator(embedder, port=port), "base_url"
    if provider == "voyage":
        from reindex_adapters.testing.emulators.voyage import VoyageEmulator

        return VoyageEmulator(embedder, port=port), "base_url"
    from reindex_adapters.testing.emulators.bedrock import BedrockEmulator

    return BedrockEmulator(embedder, buckets=buckets), "url"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m reindex_adapters.testing.emulators", description=__doc__)
    parser.add_argument("provider", choices=sorted(DIMS))
    parser.add_argument(
        "--port", type=int, default=0, help="0: a free port (mistral, gemini, voyage, cohere)"
    )
    parser.add_argument("--model", default="hash", help='a sentence-transformers model path, or "hash"')
    parser.add_argument("--dim", type=int, default=None, help="vector size of the hash model")
    parser.add_argument("--bucket", action="append", default=[], help="bedrock: an S3 bucket to create")
    args = parser.parse_args(argv)
    emulator, address = _emulator(
        args.provider, _embedder(args.model, args.dim or DIMS[args.provider]), args.port, tuple(args.bucket)
    )
    with emulator:
        extra = f" (S3 at {emulator.s3_url})" if args.provider == "bedrock" else ""
        print(f"{args.provider} emulator at {getattr(emulator, address)}{extra}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
