"""The ports. Everything in adapters/ implements one of these; the core only sees these.

Source ──Record──► Embedder (tokenize → embed) ──Rows──► Sink ──► alias
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

Vectors = NDArray[np.float32]  # shape (n, dim)
Distance = Literal["cosine", "dot", "euclid"]
VectorProblem = Literal["non_finite", "zero", "dimension"]
# What a stored vector reads back as: as computed, rounded to half precision, or its signs (1 bit per
# dimension, read back as ±1/√dim so cosine, dot and Euclidean order agree with Hamming distance)
Precision = Literal["float32", "float16", "bit"]


@dataclass(frozen=True, slots=True)
class Record:
    """One source document. `payload` is carried to the target unchanged (columns or payload fields)."""

    id: str  # stable key: the point/row key in every sink
    text: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    cursor: str | None = None  # the source position to resume after; None means `id`
    defect: str | None = None  # set by a source that could not read this document (a dead-letter reason)
    # digests of what the target must hold of this document beside its text, payload and new vector, by
    # part (Qdrant: the point's other named vectors, carried unchanged); None: nothing. Verify and sync
    # compare them with `IndexEntry.carried`, so an edit of a carried part alone is seen and carried.
    carried: Mapping[str, str] | None = None
    # a digest of the payload the target copies whole (`reindex.fingerprint.fields_version`: a Qdrant
    # point's fields); None: the source does not say. Verify and sync compare it with `IndexEntry.fields`
    # where both sides have one, so a field the application set alone, the text untouched, is carried.
    fields: str | None = None

    @property
    def position(self) -> str:
        return self.id if self.cursor is None else self.cursor


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str  # as Postgres' format_type() prints it: 'bigint', 'jsonb', 'vector(768)'
    not_null: bool = False
    default: str | None = None  # the default's expression as Postgres prints it; None for a numbered one
    numbered: bool = False  # an identity or serial column: keys the database hands out from a sequence


@dataclass(frozen=True, slots=True)
class Check:
    """A CHECK constraint of the source table, as Postgres prints it: 'CHECK ((length(text) > 0))'."""

    name: str
    definition: str


@dataclass(frozen=True, slots=True)
class SourceSchema:
    """What the target must reproduce so applications can read it as a drop-in replacement."""

    id_field: str
    text_field: str
    vector_field: str | None = None  # pg column / Qdrant vector name of the old vectors; None = unnamed
    columns: tuple[Column, ...] = ()  # the relational schema (Postgres sources); () = schemaless
    distance: Distance = "cosine"
    checks: tuple[Check, ...] = ()  # the relational schema's CHECK constraints on those columns
    # what a target of the same backend reproduces besides the vector, as that backend's own JSON (Qdrant:
    # the other named vectors' params, carried unchanged, and the collection's index settings); {}: none
    layout: Mapping[str, Any] = field(default_factory=dict)
    # the parts each record carries (`Record.carried`): only a `CarryingSink` can hold them
    carried: tuple[str, ...] = ()


class Source(Protocol):
    # several processes may open it at once (the `processes` engine); False: one process reads it
    # (Qdrant's local mode, the in-memory test store), and a run over it stays in one process
    shareable: bool

    def schema(self) -> SourceSchema: ...

    def count(self) -> int | None: ...

    def scan(self, after: str | None = None) -> Iterator[Record]:
        """Yield records in a stable order, strictly after the position `after` (keyset, not offset)."""
        ...

    def fetch(self, ids: Sequence[str]) -> Iterator[Record]:
        """Yield the records with these ids that still exist (dead-letter retry, sample checks)."""
        ...

    def identity(self) -> str:
        """Name the data this reads, independent of how it is reached: no credentials, no DSN form, no
        tuning knobs (page size). Postgres: `postgres:<system identifier>/<database>/<schema>.<table>
        #<id column>,<text column>`; files: the absolute path and fields. Part of the plan id."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class EmbedderInfo:
    """Everything that makes vectors comparable. `fingerprint` hashes all of it (reindex.fingerprint)."""

    kind: str
    model: str
    dim: int
    max_tokens: int
    fingerprint: str
    options: Mapping[str, Any] = field(default_factory=dict)  # revision, pooling, normalize, prompt...

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "model": self.model,
            "dim": self.dim,
            "max_tokens": self.max_tokens,
            "fingerprint": self.fingerprint,
            "options": dict(self.options),
        }


@dataclass(frozen=True, slots=True)
class Tokens:
    """One text, tokenized once. `data` is what `embed` consumes (token ids locally, text for providers)."""

    count: int  # tokens that will be embedded, after truncation and special tokens
    original_count: int  # tokens the full text has
    data: Any

    @property
    def is_truncated(self) -> bool:
        return self.original_count > self.count


DEFAULT_WINDOW_HOURS = 24.0  # a batch window where a provider states none: OpenAI's only, Bedrock's default


class Section(BaseModel):
    """What the core reads of every adapter's table in a config: its kind. Every adapter's `Config` extends
    it; the config is validated once, into the kind's own `Config`, and the core reads that (reindex.config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str


class TargetSection(Section):
    """What the core reads of every [target]: the name applications read, and the target's own name (None:
    `<alias>__<fingerprint8>`). Every sink's `Config` extends it."""

    alias: str = Field(min_length=1)
    name: str | None = None


@dataclass(frozen=True, slots=True)
class EmbedderTraits:
    """What an embedder is, declared once where it is built (as dlt's `DestinationCapabilitiesContext` and
    SQLAlchemy's `Dialect.supports_*` declare a backend's): the core reads these and probes for nothing.
    The defaults describe a free model in the worker's own process (the `hash` test model)."""

    # a provider's API over the network (online or batch): paced, its rate limits and concurrency one
    # budget, so a run of it stays in one process, and its report counts requests instead of padding
    remote: bool = False
    # where its own model runs ('cpu', 'cuda', 'cuda:1'); None where there is no model to feed (a provider,
    # the hash model). A model on a device gets a model process of its own per device (`processes` engine)
    device: str | None = None
    devices: int = (
        0  # the model processes it wants: one per GPU it sees, or one on the CPU; 0 without a device
    )
    # USD per 1M input tokens this embedder is billed at (its tier's); None: not priced (free, or unlisted)
    price_per_million: float | None = None
    # the list prices by tier ("online", "batch") `plan` compares; {}: a model that costs nothing per token
    prices: Mapping[str, float | None] = field(default_factory=dict)
    # a batch job's window, which `plan` counts against a deadline; None: DEFAULT_WINDOW_HOURS
    completion_window_hours: float | None = None
    stragglers_online: bool = False  # deferred: the lines a job left are sent through the online endpoint
    batch_tokens: int | None = None  # padded tokens per model call it suits; `[run] batch_tokens` overrides
    max_batch: int | None = None  # texts per model call at most (a provider's); `[run] max_batch` overrides

    @property
    def paid(self) -> bool:
        """A model billed per token: `plan` never calls it, and its texts are deduped over the whole run."""
        return bool(self.prices)


class Embedder(Protocol):
    """Fixes its options and loads its model at construction; `embed` runs once per batch."""

    info: EmbedderInfo
    traits: EmbedderTraits

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]: ...

    def embed(self, items: Sequence[Tokens]) -> Vectors: ...


@runtime_checkable
class KnowsIdentity(Protocol):
    """An embedder class slow to load (a local model) that names, without loading, everything its `info`
    depends on: the config, the model's files, the library versions. `reindex.identities` remembers each
    load's `info` under that key, so a verb that needs only the identity (verify, cutover) loads nothing."""

    def identity_key(self, config: Any) -> str | None:
        """A digest that changes whenever `info` could; None where it cannot be told without loading."""
        ...


ONLINE = "online"  # the job id of lines sent through the online endpoint (or of a job left with no lines)


@dataclass(frozen=True, slots=True)
class JobItem:
    """One input of a provider job. `custom_id` is short (< 64 chars) and unique within the job."""

    custom_id: str
    tokens: Tokens


@dataclass(frozen=True, slots=True)
class JobResult:
    """What a provider job has produced so far; `is_terminal` once nothing more will come."""

    status: str  # the provider's own word: validating, in_progress, completed, expired, cancelled, failed...
    is_terminal: bool
    vectors: Mapping[str, Vectors] = field(default_factory=dict)  # custom_id -> vector, successes only
    failed: Mapping[str, str] = field(default_factory=dict)  # custom_id -> error code (e.g. batch_expired)
    billed_tokens: int = 0  # from the provider's usage fields


@runtime_checkable
class DeferredEmbedder(Protocol):
    """Submit now, collect later (provider batch APIs, about half the online price).

    `submit` must never create two provider jobs for one key: it records the key on the job
    (batch metadata) and, before creating anything, looks for a job already carrying it.
    """

    info: EmbedderInfo
    if TYPE_CHECKING:  # declared as on every embedder; out of the runtime check, which must never make a
        traits: EmbedderTraits  # lazily identified model (`reindex.run.identities.Unloaded`) load to read it

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]: ...

    def submit(self, key: str, items: Sequence[JobItem], *, isolate: bool = False) -> str:
        """Create, or adopt if one exists with this key, the provider job for `items`; return its id.

        `isolate` asks for one input per provider request (retries: a rejected request fails them all).
        """
        ...

    def poll(self, job_id: str) -> JobResult:
        """Check a job; when terminal, download its output and error files and return every line."""
        ...

    def release(self, job_id: str) -> None:
        """Delete the job's provider files once its results are durable in the target."""
        ...


@runtime_checkable
class EmbedsStragglers(Protocol):
    """A deferred embedder that can send a job's last lines through its provider's online endpoint instead
    of another batch; the run does so where its traits say `stragglers_online`."""

    def embed_stragglers(self, items: Sequence[JobItem]) -> JobResult: ...


@runtime_checkable
class CaveatsPrices(Protocol):
    """A paid embedder whose list price, or whose bill, is not confirmed by its provider: `plan` names each
    caveat beside the cost, and the price the budget (`max_cost_usd`) charges is the higher one."""

    @property
    def price_caveats(self) -> tuple[str, ...]: ...


@dataclass(frozen=True, slots=True)
class TokenCounts:
    """How an embedder counts tokens: exactly, in the model's own tokenizer, or as an estimate, and how."""

    exact: bool
    basis: str  # e.g. "mistral-embed's own tokenizer" or "estimate: cl100k_base x 1.25 ..."


MODEL_TOKENIZER = TokenCounts(
    True, "the model's own tokenizer"
)  # what an embedder that says nothing counts with


@runtime_checkable
class CountsTokens(Protocol):
    """An embedder whose token counts may not be the model's own: `plan` says whether its counts, and so
    the cost, the budget and which texts are cut, are exact or estimated. Without it: MODEL_TOKENIZER."""

    @property
    def token_counts(self) -> TokenCounts: ...


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """One online request's limits: its provider's, or the config's lower ones."""

    inputs: int  # texts per request
    tokens: int | None  # tokens per request, all its texts together; None where the provider states none


@runtime_checkable
class LimitsRequests(Protocol):
    """An online remote embedder that says how much one request carries: `plan` times an online route by
    it (OpenAI takes 2,048 texts a request, Voyage 1,000, Cohere 96)."""

    @property
    def request_limits(self) -> RequestLimits: ...


@runtime_checkable
class RecallsItems(Protocol):
    """A deferred embedder that keeps no map of a job's lines on the provider (a file there may not be
    readable back: OpenAI refuses to serve `purpose="user_data"` files): before polling a job, the core
    hands it that job's items from the ledger, so a process that did not submit it (a resume after kill
    -9, an adoption by key) maps each output line back to its items and knows their token estimates
    without reading the job's input back (which no provider promises to serve)."""

    def recall(self, job_id: str, items: Sequence[tuple[str, int]]) -> None:
        """The items `submit` was given for this job, in the order it was given them: (custom id, tokens)."""
        ...


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """A physical target to create: named `<alias>__<fingerprint8>` unless configured."""

    name: str
    alias: str
    dim: int
    fingerprint: str
    model: Mapping[str, Any]  # EmbedderInfo.describe(): recorded on the target and the alias
    source: SourceSchema
    plan_id: str = ""  # the migration that owns the target; recorded on it by prepare()
    nonce: str = ""  # random per ledger run: a target rebuilt or dropped elsewhere is never "resumed"


@dataclass(frozen=True, slots=True)
class StoragePlan:
    """How a target will store its vectors, as `plan` states it and the target's identity records."""

    type: str  # what the target stores: 'vector', 'halfvec', 'bit', 'bit + vector'
    precision: Precision  # what a stored vector reads back as (verify quantizes fresh vectors alike)
    index: str  # the ANN index it gets, in words: 'hnsw (halfvec_cosine_ops, m=16, ef_construction=64)'
    bytes_per_vector: int  # on disk, per row, the index not included
    default: bool  # the backend's plain storage: left out of the target's name and plan id
    note: str | None = None  # why this type, in one line, where the sink chose it


@runtime_checkable
class PlansStorage(Protocol):
    """A sink that chooses how vectors are stored (pgvector: vector, halfvec, bit)."""

    def plan_storage(self, dim: int, distance: Distance) -> StoragePlan:
        """The storage a target of `dim` gets; ConfigError for one the backend cannot store or index."""
        ...

    def precision(self, target: str) -> Precision:
        """What the target's stored vectors read back as."""
        ...


@dataclass(frozen=True, slots=True)
class Rows:
    """A batch to upsert. Replaying it is harmless: writes are keyed by `Record.id`."""

    records: Sequence[Record]
    vectors: Vectors
    content_hashes: Sequence[str]
    fingerprint: str


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """What verify reads of one stored vector; never the vector itself unless it is wrong."""

    id: str
    content_hash: str | None
    fingerprint: str | None
    problem: VectorProblem | None = None
    # True: the application wrote it through the alias, without the tool's bookkeeping (the sink derived
    # hash and fingerprint from its text and the target: Qdrant as it reads, pgvector's trigger as the row
    # is written); None: the sink cannot tell (a pgvector target older than its origin column)
    application: bool | None = None
    # True: nothing is stored on the vector yet, hash and fingerprint were derived as it was read (a Qdrant
    # point the application upserted since the tool last wrote or adopted it)
    derived: bool = False
    carried: Mapping[str, str] | None = None  # digests of the parts carried beside it, as `Record.carried`
    fields: str | None = None  # the digest of the payload it holds, as `Record.fields`; None: not read


@dataclass(frozen=True, slots=True)
class TargetInfo:
    name: str
    count: int
    dim: int | None
    fingerprint: str | None  # recorded on the target by prepare(); None for targets we did not build
    model: Mapping[str, Any] | None
    plan_id: str | None = None  # TargetSpec.plan_id and .nonce as prepare() recorded them
    nonce: str | None = None


@dataclass(frozen=True, slots=True)
class AliasInfo:
    alias: str
    target: str | None  # the physical target it resolves to; None if the alias does not exist
    is_physical: bool = False  # the name is a real table/collection today (needs adoption)
    fingerprint: str | None = None
    model: Mapping[str, Any] | None = None


class Sink(Protocol):
    """Lifecycle: prepare → write* → finalize → (verify) → move_alias. `drop` exists only for prune."""

    # True where `move_alias` holds the alias's writers back while `settle` runs (pgvector's lock); False
    # where a write can land in the old index between the final catch-up and the flip (Qdrant), which
    # `cutover --sync` then carries over after the flip (reindex.flip.window.after_flip)
    holds_writers: bool
    # several processes may write it at once (the `processes` engine); False: one process opens it (Qdrant's
    # local mode, the in-memory test store)
    shareable: bool

    def identity(self) -> str:
        """Name where this writes, independent of credentials and knobs: `pgvector:<system identifier>/
        <database>/<schema>`, `qdrant:<url or absolute path>`. Part of the plan id."""
        ...

    def prepare(self, spec: TargetSpec) -> None:
        """Create the target if missing, recording fingerprint, dim, plan_id and nonce on it
        (idempotent); refuse one built for another fingerprint or dim. Never re-stamps an existing one."""
        ...

    def write(self, target: str, rows: Rows) -> None:
        """Upsert by `Record.id`; ids are unique within `rows` (the core dedupes)."""
        ...

    def delete(self, target: str, ids: Sequence[str]) -> None: ...

    def finalize(self, spec: TargetSpec) -> None:
        """After the bulk load: build the ANN index, analyze, carry grants. Idempotent."""
        ...

    def describe(self, target: str) -> TargetInfo | None: ...

    def scan_index(self, target: str, dim: int) -> Iterator[IndexEntry]:
        """Every stored vector's id, hashes and sanity (finite, non-zero, `dim`), in any order."""
        ...

    def fetch(self, target: str, ids: Sequence[str]) -> dict[str, Vectors]: ...

    def fetch_matching(self, target: str, expected: Mapping[str, str]) -> dict[str, Vectors]:
        """The vectors of the ids (keys) whose stored content hash equals the expected one (values).

        Copies use it: a text embedded once is given to other documents only while the document that
        carries it still holds that very text's vector."""
        ...

    def scan_vectors(self, target: str, batch: int = 5000) -> Iterator[tuple[list[str], Vectors]]:
        """Every stored vector with its document id, `batch` at a time, in any order (exact neighbours
        for `reindex compare`)."""
        ...

    def search(self, target: str, vectors: Vectors, k: int) -> list[list[str]]:
        """The ids of each vector's `k` nearest stored vectors, as the target's own ANN index finds them."""
        ...

    def distance(self, target: str) -> Distance:
        """The metric the target's vectors are compared by (its ANN index's, else cosine)."""
        ...

    def alias(self, alias: str) -> AliasInfo: ...

    def move_alias(
        self,
        alias: str,
        target: str,
        *,
        expected: str | None,
        meta: Mapping[str, Any],
        settle: Callable[[], None] | None = None,
    ) -> str | None:
        """Point `alias` at `target` atomically if it still points at `expected`, then read it back.

        `settle` (the final catch-up of `cutover --sync`) runs right before the move, once writers to the
        alias are held back where the backend can hold them (pgvector: an EXCLUSIVE lock that readers pass,
        kept until the move commits), so no write lands in the old index between the two.

        Returns what the alias served before: `expected`, or the new name of a physical table it
        adopted (pgvector renames a real table `<alias>__adopted` and keeps it for rollback). Raises
        CutoverRefused when the alias moved meanwhile, when the backend cannot adopt a physical
        index (Qdrant), or when the lock cannot be had within the bounded retries.
        """
        ...

    def targets(self, alias: str) -> list[str]:
        """Physical targets built for this alias (`<alias>__*`), oldest first."""
        ...

    def drop(self, target: str) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class IndexSource(Protocol):
    """A source that reads an index the sink serves (a Qdrant collection, often through the very alias
    being moved; a Postgres view named like the alias): after a flip it no longer sees what the old index
    received, and the alias serves what the application writes since (`reindex.prove.served`)."""

    def reading(self, sink: Sink, alias: str, previous: str) -> Source | None:
        """This source over the index `previous` if it reads `alias` or `previous` in the sink's own store;
        None when it reads something else, which then still holds every write."""
        ...

    def over(self, index: str) -> Source:
        """This source's settings (text field, vector) over another index of the same store: the target
        that the alias serves after a flip (`reindex.prove.served`)."""
        ...


@runtime_checkable
class GuardedSink(Protocol):
    """A sink that writes and deletes only where the stored point is still what the caller saw (Qdrant's
    conditional upserts): after a flip, the tool's catch-up never overwrites the application's newer write."""

    def write_guarded(self, target: str, rows: Rows, expected: Mapping[str, str | None]) -> None:
        """Upsert a row only where its document's stored content hash is the expected one, or, for None,
        where it has no point or a point without the migration's vector (`KeepsDocuments.keep`)."""
        ...

    def delete_guarded(self, target: str, expected: Mapping[str, str]) -> None:
        """Delete a document's vector only where its stored content hash is the expected one."""
        ...

    def scan_states(self, target: str, dim: int) -> Iterator[tuple[IndexEntry, str, str]]:
        """`Sink.scan_index`, points kept without a vector included, each entry with a digest of its whole
        point (payload, every vector) and its `reindex.fingerprint.document_version` (all but the vector
        re-embedded): what `reindex.flip.window.Settled` compares across a flip."""
        ...


@runtime_checkable
class KeepsDocuments(Protocol):
    """A sink whose target keeps every document of the index it replaces, one that cannot be embedded too:
    its point stays, payload and carried vectors, without the migration's vector (Qdrant). After the flip
    the alias then serves each of the application's points, and what it serves is the whole truth: a dead
    letter is judged by the point the application can change or delete, never by the index the run read."""

    def keep(self, target: str, records: Sequence[Record], expected: Mapping[str, str] | None = None) -> None:
        """Store these documents without the migration's vector: where the target holds no point of theirs
        or one without that vector, or, for the ids `expected` names, only where the point still stores that
        content hash."""
        ...

    def unserve(self, target: str, ids: Sequence[str], expected: Mapping[str, str] | None = None) -> None:
        """Remove the migration's vector of these documents and keep their points (payload, carried
        vectors); for the ids `expected` names, only where the point still stores that content hash."""
        ...

    def kept(self, target: str) -> list[str]:
        """The documents the target holds without the migration's vector, sorted."""
        ...


@runtime_checkable
class AdoptingSink(Protocol):
    """A sink that stores the bookkeeping of application-written vectors after the fact (Qdrant, whose
    upserts replace a point's whole payload); pgvector fills it as the row is written, in a trigger."""

    def adopt(self, target: str, hashes: Mapping[str, str], fingerprint: str) -> int:
        """Record the content hash (values) and `fingerprint` on these ids (keys) where they still carry
        none; return how many were asked for. Never touches a vector."""
        ...


@runtime_checkable
class CarryingSink(Protocol):
    """A sink whose targets hold parts of each document carried from the source unchanged (Qdrant: a point's
    other named vectors), digested by part in `Record.carried` and `IndexEntry.carried`. Two digests that
    differ may still hold the same value: Qdrant renormalises a cosine vector as it stores it, and local
    mode does so in float64 at every write and load, so a copy can differ from its original in the last bit."""

    def carried_differences(
        self, target: str, source: Source, parts: Mapping[str, Sequence[str]]
    ) -> dict[str, list[str]]:
        """Of `parts` (document id -> the parts whose digests differ), those that differ by value too, read
        from both sides now; a part only one side holds always differs."""
        ...


@runtime_checkable
class DescribingSink(Protocol):
    """A sink that creates a target with more than its vector (Qdrant: carried vectors, index, quantization
    and on-disk settings), which `plan` states before anything is built."""

    def layout(self, spec: TargetSpec) -> dict[str, Any]:
        """What `prepare` would create for `spec` besides the vector, as JSON, with where each setting
        comes from; ConfigError for settings the target cannot take."""
        ...


@dataclass(frozen=True, slots=True)
class Privilege:
    """A privilege the tool's role lacks for a migration, and the statement that grants it."""

    need: str  # what is missing, in one line
    fix: str  # the statement to run (a GRANT, an ALTER ... OWNER)


@runtime_checkable
class ChecksPrivileges(Protocol):
    """A sink that can say, before anything is embedded, which privileges its role lacks for `spec`:
    `plan` lists them (exit 2) and `prepare` refuses while one is missing."""

    def missing_privileges(self, spec: TargetSpec) -> list[Privilege]: ...


@dataclass(frozen=True, slots=True)
class Loss:
    """Something the live index has that the first cutover would not keep (a table's row security, its
    unique constraints), as the sink found it; `[target] accept` names the ones the user gives up."""

    key: str  # the name `[target] accept` takes
    what: str  # what is lost, in one line
    objects: tuple[str, ...]  # the objects found, in the backend's own words
    accepted: bool = False


@runtime_checkable
class NamesUnserved(Protocol):
    """A sink that can say, after a move, which documents the target it moved away from holds a vector for
    and the target it serves now does not (pgvector: rows the application wrote while the newer target was
    live, which the older model never embedded). `rollback` names them; none is dropped."""

    def unserved(self, alias: str, served: str, replaced: str) -> list[str]:
        """Document ids with a vector in `replaced` and none in `served`, sorted."""
        ...


@runtime_checkable
class RestoresTable(Protocol):
    """A sink whose earlier version put a view in the application's table's place, and that can move it
    back into the table, serving the same vectors (pgvector `mode = "column"` over a 0.2 installation).
    `cutover` does it first, with the application writing on until one short transaction."""

    def restore_table(self, alias: str) -> str | None:
        """Move the alias back into the application's table: the target it serves, or None when the alias
        is not such a view (nothing was done)."""
        ...


@runtime_checkable
class NamesLosses(Protocol):
    """A sink whose first cutover replaces the live index by another kind of object (pgvector: a table by a
    view over the new target), and can say before anything is built what the live one has that it would
    not keep: `plan` lists it, and `run` and the cutover refuse what is not accepted."""

    def losses(self, spec: TargetSpec) -> list[Loss]:
        """What the index `spec.alias` serves today has that the cutover onto `spec` would not keep; empty
        once the alias is the tool's own."""
        ...


@runtime_checkable
class MakesScratchTargets(Protocol):
    """A sink that can make a throwaway target of a target's shape, apart from everything the application
    reads: `plan` writes its first shards there, timed, and drops it (`reindex.plan.rehearsal`)."""

    def scratch(self, spec: TargetSpec, token: str) -> TargetSpec | None:
        """`spec` renamed to a throwaway target `reindex_rehearsal_<token>` (in the target's schema, where
        there are schemas), which `prepare` creates empty and `drop` removes; None where no target of this
        sink stands apart (a column of the application's table)."""
        ...

    def scratches(self) -> list[str]:
        """The scratch targets there are, by the names `drop` takes: a plan killed in its rehearsal leaves
        one, which a later rehearsal drops once it is old (`reindex.plan.rehearsal`)."""
        ...
