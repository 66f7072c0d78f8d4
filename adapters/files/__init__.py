"""Files as sources: JSONL and Parquet, read as Arrow record batches.

core.py: the sources · survey.py: what `reindex init` sees.
"""

from __future__ import annotations

from reindex_adapters.files.core import JsonlSource, ParquetSource

__all__ = ["JsonlSource", "ParquetSource"]
