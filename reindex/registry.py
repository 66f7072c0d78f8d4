"""Kind → "module:Class" tables for sources, embedders and sinks. Built-ins and plugins use one door.

Adapter modules import their SDK lazily, so resolving a kind never pulls torch or psycopg by itself.
Third-party adapters register through the `reindex.sources`, `reindex.embedders` and `reindex.sinks`
entry-point groups with the same "module:Class" value; so do the test doubles this distribution ships
(`memory` source and sink, `hash` and `memory-batch` embedders, in reindex_adapters.testing). What `reindex
init` proposes for a kind its class declares (`offer`, reindex/offers.py): no table here names a kind twice.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any, Literal

from pydantic import BaseModel

from reindex.errors import ConfigError, validate
from reindex.offers import (
    EmbedderOffer,
    OffersEmbedder,
    OffersSource,
    OffersTarget,
    SourceOffer,
    TargetOffer,
)
from reindex.survey import Overrides, Survey

Role = Literal["source", "embedder", "target"]

SOURCES: dict[str, str] = {
    "postgres": "reindex_adapters.postgres:PostgresSource",
    "qdrant": "reindex_adapters.qdrant:QdrantSource",
    "parquet": "reindex_adapters.files:ParquetSource",
    "jsonl": "reindex_adapters.files:JsonlSource",
}
EMBEDDERS: dict[str, str] = {
    "sentence-transformers": "reindex_adapters.sentence_transformers:SentenceTransformerEmbedder",
    "openai": "reindex_adapters.openai:OpenAIEmbedder",
    "openai-batch": "reindex_adapters.openai:OpenAIBatchEmbedder",
    "azure-openai": "reindex_adapters.openai.azure:AzureOpenAIEmbedder",
    "bedrock-batch": "reindex_adapters.bedrock:BedrockBatchEmbedder",
    "cohere": "reindex_adapters.cohere:CohereEmbedder",
    "cohere-batch": "reindex_adapters.cohere:CohereBatchEmbedder",
    "gemini-batch": "reindex_adapters.gemini:GeminiBatchEmbedder",
    "mistral-batch": "reindex_adapters.mistral:MistralBatchEmbedder",
    "voyage": "reindex_adapters.voyage:VoyageEmbedder",
    "voyage-batch": "reindex_adapters.voyage:VoyageBatchEmbedder",
    "vllm": "reindex_adapters.vllm:VllmEmbedder",
}
SINKS: dict[str, str] = {
    "pgvector": "reindex_adapters.postgres:PgvectorSink",
    "qdrant": "reindex_adapters.qdrant:QdrantSink",
}
LEDGERS: dict[str, str] = {
    "postgres": "reindex_adapters.postgres.ledger:PostgresLedger",
}
# [run] engine -> the module whose `run` drives the shards ("local", the default, is reindex.run.pipeline)
ENGINES: dict[str, str] = {
    "ray": "reindex.run.ray",
}
# 0.1 module paths a config, a plugin's entry point or a script may still name -> where they live since 0.2
MOVED: dict[str, str] = {
    "adapters.memory": "reindex_adapters.testing.memory",
    "adapters.openai_emulator": "reindex_adapters.testing.emulators.openai",
    "adapters.openai_faults": "reindex_adapters.testing.emulators.faults",
    "adapters.local_server": "reindex_adapters.testing.emulators.server",
    "adapters.mistral_emulator": "reindex_adapters.testing.emulators.mistral",
    "adapters.gemini.emulator": "reindex_adapters.testing.emulators.gemini",
    "adapters.gemini.service": "reindex_adapters.testing.emulators.gemini",
    "adapters.bedrock.emulator": "reindex_adapters.testing.emulators.bedrock",
    "adapters.ray_engine": "reindex.run.ray",
    "adapters.pg_copy": "reindex_adapters.postgres",
    "adapters.postgres_survey": "reindex_adapters.postgres.survey",
    "adapters.postgres_rules": "reindex_adapters.postgres",
    "adapters.postgres_ledger": "reindex_adapters.postgres.ledger",
    "adapters.qdrant_survey": "reindex_adapters.qdrant.survey",
    "adapters.files_survey": "reindex_adapters.files.survey",
    "adapters.azure_openai": "reindex_adapters.openai.azure",
}
_TABLES: dict[Role, tuple[dict[str, str], str]] = {
    "source": (SOURCES, "reindex.sources"),
    "embedder": (EMBEDDERS, "reindex.embedders"),
    "target": (SINKS, "reindex.sinks"),
}


TEST_DOUBLES = "reindex_adapters.testing"  # registered like plugins, for the tests: never offered in a hint


def kinds(role: Role) -> dict[str, str]:
    table, group = _TABLES[role]
    return {**_plugins(group), **table}


@functools.cache
def _plugins(group: str) -> dict[str, str]:
    """The group's entry points, read once per process: reading them walks the metadata of every installed
    distribution (milliseconds each time), and configs are checked and adapters built many times a run."""
    return {ep.name: ep.value for ep in entry_points(group=group)}


def resolve(role: Role, kind: str) -> Any:
    """Return the adapter class registered for `kind`."""
    known = kinds(role)
    if kind not in known:
        offered = sorted(public(role, known))
        raise ConfigError(f"unknown {role} kind {kind!r}", hint=f"use one of: {', '.join(offered)}")
    module_name, _, class_name = known[kind].partition(":")
    return getattr(load(module_name, f"{role} kind {kind!r}"), class_name)


def load(module_name: str, named_by: str) -> Any:
    """Import a module a table or a plugin names; one that moved in 0.2 gets its new path as the fix."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise  # the module exists; something it imports is missing
        raise ConfigError(
            f"{named_by} names the module {module_name!r}, which does not exist",
            hint=f"point it at {moved_to(module_name)!r} (modules moved in reindex-embeddings 0.2)"
            if moved_to(module_name) != module_name
            else "check the plugin's entry point",
        ) from None


def moved_to(module_name: str) -> str:
    """The 0.2 path of a module named by its 0.1 path (the adapters/ folder installs as reindex_adapters)."""
    for old, new in sorted(MOVED.items(), key=lambda item: -len(item[0])):
        if module_name == old or module_name.startswith(old + "."):
            return new + module_name[len(old) :]
    if module_name.startswith("adapters."):
        return "reindex_adapters." + module_name.removeprefix("adapters.")
    return module_name


BACKENDS_PROBE = (
    "reindex_adapters.devices:describe_backends"  # what this machine can run: CUDA, vLLM, CPU flags
)


def probe_backends() -> dict[str, Any]:
    module_name, _, name = BACKENDS_PROBE.partition(":")
    probe: dict[str, Any] = getattr(importlib.import_module(module_name), name)()
    return probe


def source_offers() -> dict[str, SourceOffer]:
    """What `reindex init` may propose as a [source], by kind: each registered kind that describes itself."""
    return {kind: adapter.offer for kind, adapter in _offering("source") if isinstance(adapter, OffersSource)}


def survey(offer: SourceOffer) -> Callable[[dict[str, Any], Overrides], Survey]:
    """The function a source kind's offer names to read the source for `reindex init`."""
    module_name, _, name = offer.survey.partition(":")
    function: Callable[[dict[str, Any], Overrides], Survey] = getattr(load(module_name, "a survey"), name)
    return function


def target_offers() -> dict[str, TargetOffer]:
    return {kind: adapter.offer for kind, adapter in _offering("target") if isinstance(adapter, OffersTarget)}


def embedder_offers() -> dict[str, EmbedderOffer]:
    return {
        kind: adapter.offer for kind, adapter in _offering("embedder") if isinstance(adapter, OffersEmbedder)
    }


def _offering(role: Role) -> list[tuple[str, Any]]:
    """Every kind of `role`, resolved (a test double that declares an offer is offered where named)."""
    return [(kind, resolve(role, kind)) for kind in kinds(role)]


def public(role: Role, named: Iterable[str]) -> list[str]:
    """The kinds of `named` a hint may suggest: the test doubles never."""
    known = kinds(role)
    return [kind for kind in named if not known.get(kind, "").startswith(TEST_DOUBLES)]


def resolve_ledger(kind: str) -> Any:
    module_name, _, class_name = LEDGERS[kind].partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def resolve_engine(name: str) -> Any:
    return importlib.import_module(ENGINES[name])


def build(role: Role, section: Mapping[str, Any] | BaseModel) -> Any:
    """Construct the adapter from its section: a config's, validated once already (`reindex.config`), or a
    table (a route's [embedder], [compare] embedder) validated here against the kind's Config."""
    if isinstance(section, BaseModel):
        adapter = resolve(role, str(getattr(section, "kind", "")))
        if isinstance(section, adapter.Config):
            return adapter.from_config(section)
        section = section.model_dump(exclude_unset=True)
    adapter = resolve(role, str(section.get("kind", "")))
    return adapter.from_config(validate(role, adapter.Config, dict(section)))
