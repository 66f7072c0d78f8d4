"""The local `sentence-transformers` embedder, and the columnar tokenizer it shares with the hash embedder.

embedder.py: SentenceTransformerEmbedder · tokenizer.py: ColumnTokenizer · model.py: loading the model, its
token limit and its identity.
"""

from __future__ import annotations

from reindex_adapters.sentence_transformers.embedder import SentenceTransformerEmbedder
from reindex_adapters.sentence_transformers.tokenizer import ColumnTokenizer

__all__ = ["ColumnTokenizer", "SentenceTransformerEmbedder"]
