"""What `reindex init --embedder KIND` writes in [embedder], for every kind the tool runs.

Each kind's class says what it writes (its `offer`, reindex/offers.py): its required keys set, the key's environment variable by name (never a key), and the options
worth knowing as commented examples. Where a required value cannot be guessed (an Azure resource, a
Bedrock role and buckets), a placeholder is written and `init` says to set it before `reindex run`.
Without --embedder the model's name picks the kind: a model a provider sells gets that provider's kind
(OpenAI's its online API, as before; the others their batch API), anything else runs locally.
"""

from __future__ import annotations

from reindex import registry
from reindex.errors import ConfigError
from reindex.init.request import InitRequest
from reindex.offers import EmbedderOffer, Entry


def entries(request: InitRequest) -> list[Entry]:
    """[embedder] for the request's kind (or the one its model implies)."""
    offers = registry.embedder_offers()
    kind = request.embedder or kind_of(request.model, offers)
    if kind not in offers:
        raise ConfigError(
            f"--embedder {kind!r} is not a kind the tool runs",
            hint=f"one of: {', '.join(registry.public('embedder', offers))}",
        )
    offer = offers[kind]
    if offer.key_env is None and request.api_key_env is not None:
        raise ConfigError(
            f"--api-key-env is for provider kinds, not {kind} ({offer.no_key})", hint="leave it out"
        )
    return offer.entries(request.model, request.api_key_env or offer.key_env or "")


def kind_of(model: str, offers: dict[str, EmbedderOffer]) -> str:
    """The kind a model name implies: the one that claims it (a provider that sells it), else a local model."""
    return next((kind for kind, offer in offers.items() if model in offer.claims), "sentence-transformers")


def placeholders(written: list[Entry]) -> list[str]:
    """The keys written with a value to replace."""
    return [entry.key for entry in written if entry.fill_in and not entry.is_example]
