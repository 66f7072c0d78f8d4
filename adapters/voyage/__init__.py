"""Voyage AI: the `voyage` (online /v1/embeddings) and `voyage-batch` (Batch API) embedders.

models.py: sizes, limits, prices, shared settings and identity · tokens.py: exact or estimated token counts ·
client.py: the SDK and httpx, pacing, error translation · online.py: `voyage` · lines.py: batch JSONL lines ·
batch.py: `voyage-batch`.
"""

from __future__ import annotations

from reindex_adapters.voyage.batch import VoyageBatchEmbedder
from reindex_adapters.voyage.models import MODELS, PRICES, PRICES_TAKEN
from reindex_adapters.voyage.online import VoyageEmbedder

__all__ = ["MODELS", "PRICES", "PRICES_TAKEN", "VoyageBatchEmbedder", "VoyageEmbedder"]
