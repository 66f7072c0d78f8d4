"""What `reindex init` writes for an export file as the [source]: the file, its id and its text field."""

from __future__ import annotations

from reindex.offers import SourceOffer

JSONL = SourceOffer(
    "reindex_adapters.files.survey:survey_jsonl",
    option="file",
    name_key="path",
    id_key="id_field",
    text_key="text_field",
    suffixes=(".jsonl", ".ndjson"),
)
PARQUET = SourceOffer(
    "reindex_adapters.files.survey:survey_parquet",
    option="file",
    name_key="path",
    id_key="id_field",
    text_key="text_field",
    noun="column",
    suffixes=(".parquet",),
)
