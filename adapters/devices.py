"""What this machine can embed with: CUDA devices, precisions, vLLM, CPU precision flags, and a choice.

Imports torch only when called, so `reindex --help` stays fast.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from pathlib import Path
from typing import Any, Literal

Recommendation = Literal["vllm", "sentence-transformers cuda", "sentence-transformers cpu"]
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile")
CPUINFO = Path("/proc/cpuinfo")


def describe_backends() -> dict[str, Any]:
    """A JSON-ready description of the embedding backends this machine supports, with a recommendation."""
    cuda = describe_cuda()
    vllm = _package("vllm")
    cpu = describe_cpu()
    recommendation, precision = recommend(cuda, vllm_installed=vllm["installed"], cpu_flags=cpu["flags"])
    return {
        "cuda": cuda,
        "vllm": vllm,
        "sentence_transformers": _package("sentence-transformers"),
        "cpu": cpu,
        "recommendation": recommendation,
        "precision": precision,
    }


def describe_cuda() -> dict[str, Any]:
    """CUDA as torch sees it: devices, memory, bf16/fp16 support. `available` is False without torch."""
    if importlib.util.find_spec("torch") is None:
        return {"available": False, "reason": "torch is not installed", "devices": []}
    import torch

    if not torch.cuda.is_available():
        return {"available": False, "reason": "torch.cuda.is_available() is False", "devices": []}
    devices = [_device(torch, index) for index in range(torch.cuda.device_count())]
    return {
        "available": True,
        "torch_cuda": torch.version.cuda,
        "devices": devices,
        "bf16": bool(torch.cuda.is_bf16_supported()),
        "fp16": all(d["compute_capability"] >= [5, 3] for d in devices),
    }


def _device(torch: Any, index: int) -> dict[str, Any]:
    properties = torch.cuda.get_device_properties(index)
    return {
        "index": index,
        "name": str(properties.name),
        "memory_gib": round(properties.total_memory / 2**30, 1),
        "compute_capability": [int(properties.major), int(properties.minor)],
    }


def describe_cpu(cpuinfo: Path = CPUINFO) -> dict[str, Any]:
    """Cores and the instruction-set flags that decide whether bf16/int8 pay off on this CPU."""
    present: set[str] = set()
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("flags"):
                present = set(line.partition(":")[2].split())
                break
    return {"cores": os.cpu_count(), "flags": {flag: flag in present for flag in CPU_FLAGS}}


def recommend(
    cuda: dict[str, Any], *, vllm_installed: bool, cpu_flags: dict[str, bool]
) -> tuple[Recommendation, str]:
    """vLLM on a GPU when installed, else sentence-transformers on the GPU, else on the CPU.

    bf16 pays off on a CPU only with AMX; without it fp32 is faster (measured on AVX512_BF16 Xeons).
    """
    if cuda.get("available"):
        return ("vllm" if vllm_installed else "sentence-transformers cuda"), "fp16"
    return "sentence-transformers cpu", "bf16" if cpu_flags.get("amx_bf16") else "fp32"


def _package(distribution: str) -> dict[str, Any]:
    module = distribution.replace("-", "_")
    if importlib.util.find_spec(module) is None:
        return {"installed": False, "version": None}
    try:
        version: str | None = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"installed": True, "version": version}
