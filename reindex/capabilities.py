"""Optional capabilities: what only some adapters can do, each a Protocol the core checks with
`isinstance` (`reindex.ports` holds the ports every adapter implements, and the traits every embedder
declares). docs/extending.md lists them with what the core does with each.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from reindex.ports import Vectors

# `reindex.columns.TokenColumns` (a shard's token ids as flat arrays) imports the ports: the protocols
# below name it `TokenColumns` in words and `Any` in their signatures
TokenColumns = Any

# sources ------------------------------------------------------------------------------------------------


@runtime_checkable
class NamesPaths(Protocol):
    """An adapter's `Config` whose keys named here hold file paths, read against the config file's folder
    unless absolute (`reindex.config`: a JSONL or Parquet file, Qdrant's local storage, a tokenizer file)."""

    PATHS: ClassVar[tuple[str, ...]]


@runtime_checkable
class NamesModelPaths(Protocol):
    """An adapter's `Config` whose keys named here hold a model: a folder beside the config file where one
    is there, else a Hugging Face hub id, left as it is."""

    MODEL_PATHS: ClassVar[tuple[str, ...]]


@runtime_checkable
class ScansColumns(Protocol):
    """A source that reads a shard as columns (`reindex.columns.Documents`), without a `Record` per document
    (files, Postgres): the run reads it through this instead of `scan`."""

    def scan_documents(self, after: str | None, size: int) -> Iterator[Any]:
        """Shards of up to `size` documents strictly after `after`, in `scan`'s order."""
        ...


@runtime_checkable
class BoundsShards(Protocol):
    """A source that can say where each shard ends without reading the documents (JSONL: a pass over the
    bytes; Parquet: arithmetic; Postgres and Qdrant: a query over the ids). Others are read through once."""

    def shard_bounds(self, after: str | None, size: int) -> Iterator[tuple[str, int]]:
        """(last position, documents) of each shard of `size` documents after `after`."""
        ...


@runtime_checkable
class ScansRanges(Protocol):
    """A source that reads a planned shard by its key range as it is now (Postgres, JSONL), so a source
    written to during the run is read as the one-process pipeline would read it."""

    def scan_range(self, after: str | None, last: str) -> Any:
        """The documents (`Documents`) strictly after `after` up to and including `last`."""
        ...


# embedders and their calls ------------------------------------------------------------------------------


@runtime_checkable
class TokenizesColumns(Protocol):
    """An embedder that tokenizes a shard's texts into columns (`reindex.columns.TokenColumns`: flat id
    arrays) rather than one `Tokens` per text: every local model, and OpenAI's online kind. Where it has
    this, the core calls only this (a subclass that changes `tokenize` changes this too)."""

    def tokenize_columns(self, texts: list[str]) -> TokenColumns: ...


@runtime_checkable
class EmbedsColumns(Protocol):
    """An embedder that embeds a shard's tokens as columns rather than a list of `Tokens`: every local
    model. Where it has this, the core calls only this (a subclass that changes `embed` changes this too)."""

    def embed_columns(self, tokens: TokenColumns) -> Vectors: ...


@runtime_checkable
class ShipsTokenizer(Protocol):
    """An embedder whose tokenizer pickles apart from its model, so worker processes and Ray's read tasks
    tokenize while the model embeds (None: this one's tokenizer needs nothing shipped: whitespace words).
    A model on a device without it tokenizes inside its own engine (vLLM), and its run stays in one process."""

    @property
    def column_tokenizer(self) -> Any: ...


@runtime_checkable
class ThreadedTokenizer(Protocol):
    """A shipped tokenizer (`ShipsTokenizer.column_tokenizer`) that tokenizes on threads of its own: where it
    lands (a worker process, a Ray task) is given the cores that process may use, or each would take all."""

    threads: int | None


@runtime_checkable
class PipelinesCalls(Protocol):
    """An embedder whose calls are launched and collected apart, so the next call's host work (padding,
    a request's body) overlaps this one's model or network time (`reindex.run.feeding`)."""

    def prepare_columns(self, tokens: TokenColumns) -> Any:
        """The call's input, built on the preparing thread."""
        ...

    def embed_prepared(self, prepared: Any) -> Vectors | Pending:
        """Launch the call: its vectors at once, or a `Pending` collected later."""
        ...


@runtime_checkable
class Pending(Protocol):
    """A model call launched and not yet collected (`PipelinesCalls.embed_prepared`)."""

    def result(self) -> Vectors: ...


@runtime_checkable
class PendingRequests(Pending, Protocol):
    """A remote call's requests in flight: watched (`done`), stopped (`cancel`), and, once collected, what
    the provider refused by row and the tokens it billed, the requests that failed included."""

    def done(self) -> bool: ...

    def cancel(self) -> None: ...

    def rejections(self) -> dict[int, str]: ...

    def billed_tokens(self) -> int: ...


@runtime_checkable
class Metered(Protocol):
    """A paid online embedder that counts what it was billed: the provider's own usage fields, a running
    total. Its texts are deduped over the whole run, so none is paid for twice (`reindex.run.claims`)."""

    billed_tokens: int


@runtime_checkable
class RefusesRows(Protocol):
    """An embedder whose provider may refuse single inputs of a call by their content: those rows come back
    NaN, and this names them, so each becomes a dead letter with the provider's code."""

    def last_rejections(self) -> dict[int, str]:
        """{row of the last `embed` call: "provider_rejected:<code>"}."""
        ...


@runtime_checkable
class CountsExactly(Protocol):
    """A metered embedder that can switch from estimated to exact token counts (a budget needs them)."""

    def count_tokens_exactly(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Traffic:
    """A remote embedder's requests so far, and their pace between the first send and the last answer."""

    requests: int = 0
    retries: int = 0
    rate_limited: int = 0  # answered 429
    refused: int = 0  # answered busy (429, 5xx, a timeout): each is retried
    requests_per_second: float | None = None
    tokens_per_minute: float | None = None


@runtime_checkable
class ReportsTraffic(Protocol):
    """A remote embedder that reports its requests: how many, retried, rate limited, and their pace."""

    @property
    def traffic(self) -> Traffic: ...


@runtime_checkable
class Closes(Protocol):
    """An adapter holding connections or threads that `close` releases (sources and sinks always do)."""

    def close(self) -> None: ...


# sinks --------------------------------------------------------------------------------------------------


@runtime_checkable
class TimesIndexBuild(Protocol):
    """A sink whose `finalize` builds an ANN index and says how long that took: the run report has it apart
    from the load (pgvector's CREATE INDEX; Qdrant indexes as points arrive)."""

    # the last finalize's index build; None: it built none
    index_seconds: float | None
