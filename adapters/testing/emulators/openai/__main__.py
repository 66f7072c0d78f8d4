"""`python -m reindex_adapters.testing.emulators.openai --port 8089 --model hash`: serve the emulator."""

from __future__ import annotations

import argparse

import reindex_adapters.testing.emulators.openai as package
from reindex.ports import Embedder
from reindex_adapters.testing.emulators.faults import FaultPlan
from reindex_adapters.testing.emulators.openai.app import create_app


def _load_embedder(model: str, dim: int) -> Embedder:
    if model == "hash":
        from reindex_adapters.testing.memory import HashEmbedder

        return HashEmbedder(dim=dim)
    from reindex.registry import build

    embedder: Embedder = build("embedder", {"kind": "sentence-transformers", "model": model})
    return embedder


def main(argv: list[str] | None = None) -> None:
    """Serve the emulator until interrupted: `python -m reindex_adapters.testing.emulators.openai --port 8089 --model hash`."""
    parser = argparse.ArgumentParser(
        prog="python -m reindex_adapters.testing.emulators.openai", description=package.__doc__
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8089)
    parser.add_argument("--model", default="hash", help='a sentence-transformers model path, or "hash"')
    parser.add_argument("--dim", type=int, default=1536, help="vector size of the hash model")
    parser.add_argument("--polls-per-step", type=int, default=1, help="batch retrieves per status step")
    args = parser.parse_args(argv)
    import uvicorn

    app = create_app(_load_embedder(args.model, args.dim), FaultPlan(polls_per_step=args.polls_per_step))
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
