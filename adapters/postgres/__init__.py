"""PostgreSQL: a table or view as a source; as the target a pgvector table behind a view (mode "table") or a
column of the application's own table (mode "column"); the shared ledger.

source.py: the source · sink.py: the pgvector sink · connection.py: DSNs, password masking and the
connection · catalog.py: catalog reads (columns, layouts, distances) · ddl.py: creating targets · write.py: the
COPY/upsert write path · alias.py: the alias view, its swap, adoption and grants · copy_format.py: the binary
COPY encoding · rules.py: defaults, NOT NULLs, CHECKs and identity sequences carried to a target · survey.py:
what `reindex init` sees · ledger.py: the ledger several machines share · fidelity.py: what a table has that a
mode would not keep · side_by_side.py: the column-mode sink, with column_targets.py (which column holds which
target), column_write.py, column_index.py (its HNSW index, built concurrently) and dependents.py (views over
the vector column, carried across a flip).
"""

from __future__ import annotations

from reindex_adapters.postgres.side_by_side import PgvectorColumnSink
from reindex_adapters.postgres.sink import PgvectorSink
from reindex_adapters.postgres.source import PostgresSource

__all__ = ["PgvectorColumnSink", "PgvectorSink", "PostgresSource"]
