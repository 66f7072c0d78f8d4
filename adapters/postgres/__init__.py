"""PostgreSQL: a table or view as a source, a pgvector table behind a view as the target, the shared ledger.

source.py: the source · sink.py: the pgvector sink · connection.py: DSNs, password masking and the
connection · catalog.py: catalog reads (columns, layouts, distances) · ddl.py: creating targets · write.py: the
COPY/upsert write path · alias.py: the alias view, its swap, adoption and grants · copy_format.py: the binary
COPY encoding · rules.py: defaults, NOT NULLs, CHECKs and identity sequences carried to a target · survey.py:
what `reindex init` sees · ledger.py: the ledger several machines share.
"""

from __future__ import annotations

from reindex_adapters.postgres.sink import PgvectorSink
from reindex_adapters.postgres.source import PostgresSource

__all__ = ["PgvectorSink", "PostgresSource"]
