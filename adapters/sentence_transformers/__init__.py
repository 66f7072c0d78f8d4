"""The local `sentence-transformers` embedder, and the columnar tokenizer it shares with the hash embedder.

tokenizer.py: the embedder and `ColumnTokenizer`.
"""

from __future__ import annotations

from reindex_adapters.sentence_transformers.tokenizer import ColumnTokenizer, SentenceTransformerEmbedder

__all__ = ["ColumnTokenizer", "SentenceTransformerEmbedder"]
