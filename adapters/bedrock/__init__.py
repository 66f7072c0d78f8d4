"""Amazon Bedrock batch inference (Titan Text Embeddings V2) through boto3.

connection.py: clients, S3 URIs, error translation · embedder.py: the `bedrock-batch` embedder ·
records.py: reading output records; the emulator is reindex_adapters.testing.emulators.bedrock.
"""

from __future__ import annotations

from reindex_adapters.bedrock.embedder import PRICES, PRICES_TAKEN, TITAN_V2, BedrockBatchEmbedder, job_name

__all__ = ["PRICES", "PRICES_TAKEN", "TITAN_V2", "BedrockBatchEmbedder", "job_name"]
