"""OpenAI and OpenAI-compatible endpoints: online embeddings, the Batch API, and Azure OpenAI.

client.py: the SDK client, its errors, limits, list prices, model identity · online.py: the `openai` embedder ·
batch.py: the `openai-batch` embedder · azure.py: the `azure-openai` embedder.
"""

from __future__ import annotations

from reindex_adapters.openai.batch import OpenAIBatchEmbedder
from reindex_adapters.openai.client import PRICES
from reindex_adapters.openai.online import OpenAIEmbedder

__all__ = ["PRICES", "OpenAIBatchEmbedder", "OpenAIEmbedder"]
