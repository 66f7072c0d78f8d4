"""Cohere: the online /v2/embed endpoint and Embed Jobs (embed-input datasets embedded asynchronously).

client.py: the SDK client, its errors, the models, list prices and a model's identity · online.py: the `cohere`
embedder (and the /v2/embed request both kinds send) · datasets.py: uploading, finding, validating and reading
datasets · batch.py: the `cohere-batch` embedder.
"""

from __future__ import annotations

from reindex_adapters.cohere.batch import CohereBatchEmbedder
from reindex_adapters.cohere.client import PRICES, PRICES_TAKEN
from reindex_adapters.cohere.online import CohereEmbedder

__all__ = ["PRICES", "PRICES_TAKEN", "CohereBatchEmbedder", "CohereEmbedder"]
