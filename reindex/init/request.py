"""What `reindex init` was asked for on the command line: `InitRequest`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reindex.survey import Overrides


@dataclass(frozen=True)
class InitRequest:
    """What the command line asked for. One source: a Postgres table, a Qdrant collection, or a file."""

    model: str
    table: str | None = None
    source_dsn_env: str | None = None
    source_dsn: str | None = None  # only without a password (a local socket, .pgpass, PGPASSWORD)
    collection: str | None = None
    source_url: str | None = None
    source_path: str | None = None  # Qdrant local storage
    source_api_key_env: str | None = None
    file: Path | None = None
    target: str | None = None  # pgvector | qdrant; default: the source's backend
    target_dsn_env: str | None = None
    target_dsn: str | None = None
    target_url: str | None = None
    target_path: str | None = None
    target_api_key_env: str | None = None
    alias: str | None = None  # default: the name applications read now
    embedder: str | None = None  # default: openai for a provider's model, else sentence-transformers
    api_key_env: str | None = None  # the openai kinds' key; default OPENAI_API_KEY
    id_field: str | None = None  # a column, or a field of a file; each wins over detection
    text_field: str | None = None
    vector_field: str | None = None  # a column, or a Qdrant vector name

    @property
    def given(self) -> Overrides:
        return Overrides(self.id_field, self.text_field, self.vector_field)
