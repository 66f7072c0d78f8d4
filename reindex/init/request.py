"""What `reindex init` was asked for on the command line: `InitRequest`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from reindex.offers import Value
from reindex.survey import Overrides


@dataclass(frozen=True)
class InitRequest:
    """What the command line asked for. One source, named by its kind's option (--table, --collection,
    --file, or --source KIND with --source-set), and a target of any kind that describes itself
    (reindex/offers.py)."""

    model: str
    # the source's options by key, as their own options gave them: its name (table, collection, file) and its
    # connection (dsn_env, dsn, url, path, api_key_env); a kind that does not take one refuses it by name
    source: Mapping[str, str] = field(default_factory=dict)
    source_settings: Mapping[str, Value] = field(default_factory=dict)  # --source-set KEY=VALUE: any key
    source_kind: str | None = None  # default: the kind whose option names the source (--table: postgres)
    target: str | None = None  # default: the source's backend
    target_options: Mapping[str, str] = field(default_factory=dict)  # --target-dsn-env, --target-url, ...
    target_settings: Mapping[str, Value] = field(default_factory=dict)  # --target-set KEY=VALUE
    alias: str | None = None  # default: the name applications read now
    embedder: str | None = None  # default: the kind that sells the model, else sentence-transformers
    api_key_env: str | None = None  # a provider's key; default: the provider's usual variable
    id_field: str | None = None  # a column, or a field of a file; each wins over detection
    text_field: str | None = None
    vector_field: str | None = None  # a column, or a Qdrant vector name

    @property
    def given(self) -> Overrides:
        return Overrides(self.id_field, self.text_field, self.vector_field)
