"""PostgreSQL: a table or view as a source, a pgvector table behind a view as the target, the shared ledger.

sink.py: connection, catalog, source, sink, alias and COPY write · copy_format.py: the binary COPY encoding ·
rules.py: defaults, NOT NULLs, CHECKs and identity sequences carried to a target · survey.py: what
`reindex init` sees · ledger.py: the ledger several machines share.
"""

from __future__ import annotations

from reindex_adapters.postgres.sink import PgvectorSink, PostgresSource

__all__ = ["PgvectorSink", "PostgresSource"]
