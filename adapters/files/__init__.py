"""Files as sources: JSONL and Parquet, read as Arrow record batches.

jsonl.py: the sources · survey.py: what `reindex init` sees.
"""

from __future__ import annotations

from reindex_adapters.files.jsonl import JsonlSource, ParquetSource

__all__ = ["JsonlSource", "ParquetSource"]
