"""OpenAI and OpenAI-compatible endpoints: online embeddings, the Batch API, and Azure OpenAI.

online.py: the `openai` and `openai-batch` embedders · azure.py: the `azure-openai` embedder.
"""

from __future__ import annotations

from reindex_adapters.openai.online import PRICES, OpenAIBatchEmbedder, OpenAIEmbedder

__all__ = ["PRICES", "OpenAIBatchEmbedder", "OpenAIEmbedder"]
