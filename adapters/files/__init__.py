"""Files as sources: JSONL and Parquet, read as Arrow record batches.

jsonl.py: JsonlSource · parquet.py: ParquetSource · records.py: what both share ·
survey.py: what `reindex init` sees.
"""

from __future__ import annotations

from reindex_adapters.files.jsonl import JsonlSource
from reindex_adapters.files.parquet import ParquetSource

__all__ = ["JsonlSource", "ParquetSource"]
