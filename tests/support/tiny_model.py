"""A tiny random BERT saved as a sentence-transformers model: real loading and encode code, in a second."""

from __future__ import annotations

import itertools
import string
from pathlib import Path
from typing import Any

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = """
the of and to in is was for on that with as by at from it an be this are or which his her their has had
have not but were they all one two three new more first also after who can other time when been would
there its into only some most over such these many than about we you he she them our out up what so if
no may any each how like between both through during before under while where because however these
document documents topic about text model models vector vectors search index query data source target
embedding embeddings alias table collection shard batch ledger run runs verify cutover rollback sync
word words long short page pages book books city country world year years day days people work life
system systems use used using make made give given take taken see seen know known find found way ways
water fire earth air light dark small large great good bad old young high low left right north south
east west red green blue black white house school family group part place case point number week month
""".split()  # noqa: SIM905 - a word list reads better as text


def vocabulary() -> list[str]:
    """Specials, characters, two-letter pieces and common words: a few thousand WordPiece entries."""
    chars = list(string.ascii_lowercase + string.digits)
    pairs = ["".join(p) for p in itertools.product(string.ascii_lowercase, repeat=2)]
    numbers = [str(n) for n in range(1000)]
    pieces = chars + list(string.punctuation) + pairs
    tokens = SPECIALS + pieces + [f"##{p}" for p in chars + pairs] + WORDS + numbers
    return list(dict.fromkeys(tokens))


def build_tiny_model(directory: Path, *, seed: int = 0) -> Path:
    """Save a 2-layer, 32-wide BERT with a mean-pooling head under `directory` and return its path."""
    import torch
    from transformers import BertConfig, BertModel

    hf_dir = directory / "hf"
    tokenizer = _fast_tokenizer(vocabulary())
    tokenizer.save_pretrained(hf_dir)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        config = BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=512,
        )
        BertModel(config).eval().save_pretrained(hf_dir)
    return _wrap(hf_dir, directory / "sentence-transformer")


def _fast_tokenizer(vocab: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    ids = {token: i for i, token in enumerate(vocab)}
    backend = Tokenizer(models.WordPiece(ids, unk_token="[UNK]", max_input_chars_per_word=100))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    backend.decoder = decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
    )


def _wrap(hf_dir: Path, out: Path) -> Path:
    from sentence_transformers import SentenceTransformer

    try:
        from sentence_transformers.sentence_transformer import modules
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers import models as modules  # type: ignore[attr-defined,no-redef]
    Pooling, Transformer = modules.Pooling, modules.Transformer

    transformer = Transformer(str(hf_dir), max_seq_length=128)
    dimension = (
        getattr(transformer, "get_embedding_dimension", None) or transformer.get_word_embedding_dimension
    )
    pooling = Pooling(dimension(), pooling_mode="mean")
    SentenceTransformer(modules=[transformer, pooling], device="cpu").save(str(out))
    return out
