"""What `reindex init --embedder KIND` writes in [embedder], for every kind the tool runs.

Each kind gets its required keys set, the key's environment variable by name (never a key), and the options
worth knowing as commented examples. Where a required value cannot be guessed (an Azure resource, a
Bedrock role and buckets), a placeholder is written and `init` says to set it before `reindex run`.
Without --embedder the model's name picks the kind: a model a provider sells gets that provider's kind
(OpenAI's its online API, as before; the others their batch API), anything else runs locally.
"""

from __future__ import annotations

from collections.abc import Callable

from reindex import registry
from reindex.errors import ConfigError
from reindex.init.request import InitRequest
from reindex.init.text import Entry

_KEYS = {  # each provider's usual variable for its key
    "openai": "OPENAI_API_KEY",
    "openai-batch": "OPENAI_API_KEY",
    "azure-openai": "AZURE_OPENAI_API_KEY",
    "gemini-batch": "GEMINI_API_KEY",
    "mistral-batch": "MISTRAL_API_KEY",
    "voyage": "VOYAGE_API_KEY",
    "voyage-batch": "VOYAGE_API_KEY",
    "cohere": "CO_API_KEY",
    "cohere-batch": "CO_API_KEY",
}


def entries(request: InitRequest) -> list[Entry]:
    """[embedder] for the request's kind (or the one its model implies)."""
    kind = request.embedder or kind_of(request.model)
    if kind not in WRITERS:
        raise ConfigError(
            f"--embedder {kind!r} is not a kind the tool runs", hint=f"one of: {', '.join(WRITERS)}"
        )
    if kind not in _KEYS and request.api_key_env is not None:
        reason = (
            "credentials come from boto3's chain" if kind == "bedrock-batch" else "a local model has no key"
        )
        raise ConfigError(f"--api-key-env is for provider kinds, not {kind} ({reason})", hint="leave it out")
    return WRITERS[kind](request.model, request.api_key_env or _KEYS.get(kind, ""))


def kind_of(model: str) -> str:
    """The kind a model name implies: the provider that sells it, else a local model."""
    return registry.provider_kind(model) or "sentence-transformers"


def placeholders(written: list[Entry]) -> list[str]:
    """The keys written with a value to replace."""
    return [entry.key for entry in written if entry.fill_in and not entry.is_example]


# local models ---------------------------------------------------------------------------------------------


def _local(kind: str) -> Callable[[str, str], list[Entry]]:
    def write(model: str, _: str) -> list[Entry]:
        written = [
            Entry(
                "kind",
                kind,
                "or vllm on GPUs" if kind == "sentence-transformers" else "continuous batching on GPUs",
            ),
            Entry("model", model, "a Hugging Face name, or a folder relative to this file"),
            Entry("normalize", True),
            Entry(
                "prompt",
                "passage: ",
                "a prefix some models expect (e5, bge); part of the fingerprint",
                is_example=True,
            ),
            Entry("max_tokens", 256, "default: the model's limit", is_example=True),
        ]
        if kind == "sentence-transformers":
            written.append(
                Entry(
                    "precision",
                    "fp32",
                    "bf16 / fp16 change the vectors, and so the fingerprint",
                    is_example=True,
                )
            )
        return written

    return write


# providers ------------------------------------------------------------------------------------------------


def _key(variable: str) -> Entry:
    return Entry("api_key_env", variable, "the key is read from this variable, never written here")


def _provider(kind: str, other: str, *examples: Entry) -> Callable[[str, str], list[Entry]]:
    """A provider kind that needs only its model and its key: the other tier named, options as examples."""

    def write(model: str, variable: str) -> list[Entry]:
        return [Entry("kind", kind, other), Entry("model", model), _key(variable), *examples]

    return write


_OPENAI_OPTIONS = (
    Entry("base_url", "http://127.0.0.1:8089/v1", "any OpenAI-compatible endpoint", is_example=True),
    Entry("dimensions", 512, "text-embedding-3 shortening (part of the fingerprint)", is_example=True),
)
_VOYAGE_OPTIONS = (
    Entry(
        "input_type", "document", "how Voyage embeds stored texts (part of the fingerprint)", is_example=True
    ),
    Entry("output_dimension", 1024, "256, 512, 1024 or 2048 where the model takes it", is_example=True),
)
_COHERE_OPTIONS = (
    Entry(
        "input_type",
        "search_document",
        "how Cohere embeds stored texts (part of the fingerprint)",
        is_example=True,
    ),
)


def _azure(model: str, variable: str) -> list[Entry]:
    return [
        Entry("kind", "azure-openai", "online only: Azure's Batch API takes no embeddings"),
        Entry("model", model, "the model the deployment serves (its price and tokenizer)"),
        Entry(
            "azure_endpoint", "https://RESOURCE.openai.azure.com", "your resource's endpoint", fill_in=True
        ),
        Entry("api_version", "2024-10-21", "an API version your resource serves"),
        Entry("deployment", model, "your deployment's name, if not the model's", fill_in=True),
        _key(variable),
        Entry("dimensions", 512, "text-embedding-3 shortening (part of the fingerprint)", is_example=True),
    ]


def _gemini(model: str, variable: str) -> list[Entry]:
    return [
        Entry("kind", "gemini-batch", "Gemini's Batch API, at half the online price"),
        Entry("model", model),
        _key(variable),
        Entry("output_dimensionality", 768, "768, 1536 or 3072 (part of the fingerprint)", is_example=True),
        Entry(
            "task_type",
            "RETRIEVAL_DOCUMENT",
            "sent with every text (part of the fingerprint)",
            is_example=True,
        ),
    ]


def _mistral(model: str, variable: str) -> list[Entry]:
    return [
        Entry("kind", "mistral-batch", "Mistral's batch API, at half the online price"),
        Entry("model", model, "mistral-embed: the one model taken (1,024 dimensions)"),
        _key(variable),
        Entry("server_url", "http://127.0.0.1:8090", "another endpoint (the SDK's option)", is_example=True),
        Entry(
            "timeout_hours", 24, "the job's own limit; lines not done by then are sent again", is_example=True
        ),
    ]


def _bedrock(model: str, _: str) -> list[Entry]:
    return [
        Entry(
            "kind",
            "bedrock-batch",
            "Bedrock batch inference; credentials from boto3's chain",
            above=("AWS credentials come from AWS_PROFILE, the AWS_* variables or an instance role",),
        ),
        Entry("model", model),
        Entry("region", "us-east-1", "your Bedrock region", fill_in=True),
        Entry(
            "role_arn",
            "arn:aws:iam::123456789012:role/bedrock-batch",
            "the service role Bedrock assumes",
            fill_in=True,
        ),
        Entry(
            "input_s3_uri",
            "s3://your-bucket/reindex/in",
            "where records are written for Bedrock",
            fill_in=True,
        ),
        Entry(
            "output_s3_uri", "s3://your-bucket/reindex/out", "where Bedrock writes its results", fill_in=True
        ),
        Entry("dimensions", 1024, "256, 512 or 1024 (part of the fingerprint)"),
    ]


WRITERS: dict[str, Callable[[str, str], list[Entry]]] = {
    "sentence-transformers": _local("sentence-transformers"),
    "vllm": _local("vllm"),
    "openai": _provider("openai", "or openai-batch: the Batch API at about half the price", *_OPENAI_OPTIONS),
    "openai-batch": _provider("openai-batch", "or openai: online", *_OPENAI_OPTIONS),
    "azure-openai": _azure,
    "gemini-batch": _gemini,
    "mistral-batch": _mistral,
    "bedrock-batch": _bedrock,
    "voyage-batch": _provider("voyage-batch", "or voyage: online", *_VOYAGE_OPTIONS),
    "voyage": _provider("voyage", "or voyage-batch: the Batch API, a third off", *_VOYAGE_OPTIONS),
    "cohere-batch": _provider("cohere-batch", "or cohere: online", *_COHERE_OPTIONS),
    "cohere": _provider("cohere", "or cohere-batch: Embed Jobs", *_COHERE_OPTIONS),
}
