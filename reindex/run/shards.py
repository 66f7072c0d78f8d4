"""A shard in flight: its records screened, deduplicated by text, tokenized once, then given vectors.

prepare_shard: screen → fold duplicate ids → claim texts run-wide → tokenize each text once → length policy
finish_shard:  each record gets its text's vector, or a dead letter when the vector came back unusable
pretokenize:   the tokenize step done ahead, elsewhere (the ray engine's read tasks): each distinct text of
               the screened shard, keyed by content hash, for `prepare_shard` to take its rows from
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from reindex.columns import Documents, TokenColumns, documents, tokenize
from reindex.config import RunConfig
from reindex.fingerprint import content_hashes
from reindex.ports import Record, Vectors
from reindex.run.validation import screen
from reindex.state.records import DeadLetter

Claim = Callable[
    [dict[str, str]], dict[str, tuple[str, str]]
]  # {hash: doc} -> {hash: (owner, state)} elsewhere
Copy = tuple[Record, str, str]  # (record, content hash, the document that carries that text's vector)


@dataclass
class Pretokenized:
    """A shard's distinct texts tokenized ahead of its claims: row `rows[hash]` of `tokens`; `hashes`: every
    document's content hash, in the shard's order, so that screening it again hashes nothing."""

    hashes: list[str | None]
    rows: dict[str, int]
    tokens: TokenColumns

    def take(self, hashes: Sequence[str]) -> TokenColumns | None:
        """The rows of `hashes`, in that order; None if one is missing (the caller tokenizes)."""
        try:
            return self.tokens.take([self.rows[digest] for digest in hashes])
        except KeyError:
            return None


def pretokenize(tokenizer: Callable[[list[str]], TokenColumns], records: Sequence[Record]) -> Pretokenized:
    """Tokenize each distinct text `prepare_shard` could embed from `records`: all that screening keeps, as
    the claims that will set some aside are not known yet (a copy's tokens are then not used)."""
    docs = documents(records)
    hashes = content_hashes(docs.texts)
    screened = screen(docs, hashes)
    rows: dict[str, int] = {}
    texts: list[str] = []
    for digest, text in zip(screened.hashes, screened.records.texts, strict=True):
        if digest not in rows:
            rows[digest] = len(texts)
            texts.append(text)
    return Pretokenized(hashes, rows, tokenizer(texts) if texts else TokenColumns.from_tokens([]))


@dataclass
class Shard:
    seq: int
    after_cursor: str | None
    last_cursor: str
    documents: int
    records: Documents  # kept documents, columnar
    hashes: list[str]
    owner: list[int]  # record i is embedded as unique text owner[i]
    tokens: TokenColumns  # one row per unique text
    dead: list[DeadLetter]
    duplicates: int
    truncated: int = 0
    vectors: Vectors | None = None
    billed_tokens: int = 0
    reserved: int = 0  # tokens the budget holds for this shard: its texts, then copies it embeds itself
    copies: list[Copy] = field(default_factory=list)  # texts another document carries: copied, not embedded
    claimed: dict[str, str] = field(default_factory=dict)  # texts this shard embeds for the run -> owner
    copied: list[str] = field(default_factory=list)  # copies written (ids): not embedded as this shard's own
    owners: dict[str, str] = field(default_factory=dict)  # texts this shard took over (re-embedded copies)
    settled: dict[str, str] = field(default_factory=dict)  # what became of the texts it took over
    unstorable: set[str] = field(default_factory=set)  # texts whose row the sink refused for a NUL they hold
    # The provider's usage is its token count: the run only bounded its texts' tokens (`TokenColumns.bounded`)
    counted_by_provider: bool = False

    @property
    def recorded_tokens(self) -> int:
        """The tokens the ledger records for this shard: counted here, or billed by the provider (a window's
        bill is on its last shard, so a run's total is exact)."""
        return self.billed_tokens if self.counted_by_provider else self.token_count

    @property
    def written_ids(self) -> list[str]:
        return self.records.ids + self.copied

    @property
    def token_count(self) -> int:
        return int(self.tokens.counts.sum())


def prepare_shard(
    embedder: Any,
    run: RunConfig,
    seq: int,
    after: str | None,
    records: Sequence[Record],
    claim: Claim | None = None,
    pretokenized: Pretokenized | None = None,
) -> Shard:
    """Screen, fold duplicate ids, set aside texts embedded elsewhere in the run (`claim`), tokenize each
    remaining distinct text once (or take its rows from `pretokenized`), and apply the over-length policy."""
    docs = documents(records)
    ahead = (
        pretokenized.hashes if pretokenized is not None and len(pretokenized.hashes) == len(docs) else None
    )
    screened = screen(docs, ahead)
    kept, hashes, copies, claimed = _claim(screened.records, screened.hashes, claim)
    unique: dict[str, int] = {}
    owner = [unique.setdefault(digest, len(unique)) for digest in hashes]
    firsts: dict[str, int] = {}
    for row, digest in enumerate(hashes):
        firsts.setdefault(digest, row)
    texts = [kept.texts[row] for row in firsts.values()]  # dicts keep insertion order: unique's order
    tokens = pretokenized.take(list(firsts)) if pretokenized is not None and texts else None
    if tokens is None:
        tokens = tokenize(embedder, texts) if texts else TokenColumns.from_tokens([])
    last = docs.last_position
    shard = Shard(
        seq,
        after,
        last if last is not None else (after or ""),
        len(docs),
        kept,
        hashes,
        owner,
        tokens,
        screened.dead,
        screened.duplicates,
        copies=copies,
        claimed=claimed,
    )
    _apply_length_policy(shard, run.too_long, embedder.info.max_tokens)
    return shard


def _claim(
    docs: Documents, hashes: list[str], claim: Claim | None
) -> tuple[Documents, list[str], list[Copy], dict[str, str]]:
    """Content-addressed dedupe across the run: a text another document already carries is not embedded."""
    if claim is None or not len(docs):
        return docs, hashes, [], {}
    firsts: dict[str, str] = {}
    for doc_id, digest in zip(docs.ids, hashes, strict=True):
        firsts.setdefault(digest, doc_id)
    elsewhere = claim(firsts)
    if not elsewhere:
        return docs, hashes, [], firsts
    rows = [row for row, digest in enumerate(hashes) if digest not in elsewhere]
    copies = [
        (docs[row], digest, elsewhere[digest][0]) for row, digest in enumerate(hashes) if digest in elsewhere
    ]
    claimed = {digest: owner for digest, owner in firsts.items() if digest not in elsewhere}
    return docs.take(rows), [hashes[row] for row in rows], copies, claimed


def _apply_length_policy(shard: Shard, policy: str, limit: int) -> None:
    over = shard.tokens.truncated
    if not over.any():
        return
    rows = np.asarray(shard.owner, dtype=np.int64)
    if policy == "truncate":
        shard.truncated = int(over[rows].sum())
        return
    for row in np.flatnonzero(over[rows]).tolist():
        index = shard.owner[row]
        detail = f"{int(shard.tokens.original[index])} tokens > {limit}"
        shard.dead.append(DeadLetter(shard.records.ids[row], "too_long", detail, shard.hashes[row]))
    keep_records(shard, ~over[rows])


def finish_shard(shard: Shard, unique: Vectors, problems: Mapping[int, str], dim: int) -> None:
    """Give each record its text's vector, dead-lettering those whose vector came back unusable
    (`problems`: unique text -> reason, usually empty)."""
    shard.vectors = unique[shard.owner] if shard.owner else np.empty((0, dim), dtype=np.float32)
    if not problems:
        return
    keep = [index not in problems for index in shard.owner]
    for row, index in enumerate(shard.owner):
        if index in problems:
            digest = shard.hashes[row]
            shard.dead.append(DeadLetter(shard.records.ids[row], problems[index], "embedder output", digest))
    keep_records(shard, keep)


def keep_records(shard: Shard, keep: Sequence[bool] | NDArray[np.bool_]) -> None:
    """Drop dead-lettered records from a shard, keeping vectors aligned if present."""
    mask = np.asarray(keep, dtype=bool)
    if mask.all():
        return
    rows = np.flatnonzero(mask)
    shard.records = shard.records.take(rows)
    listed = rows.tolist()
    shard.hashes = [shard.hashes[row] for row in listed]
    shard.owner = [shard.owner[row] for row in listed]
    if shard.vectors is not None:
        shard.vectors = shard.vectors[mask]


def text_settlements(shard: Shard) -> list[tuple[str, str]]:
    """What became of each text this shard claimed or took over: written, or dead with the reason (in key
    order, as the ledger takes them). Set operations for the common shard, where every claim was written."""
    lost = shard.claimed.keys() - set(shard.hashes)
    reasons = (
        {letter.content_hash: letter.reason for letter in shard.dead if letter.content_hash} if lost else {}
    )
    settled = shard.settled | dict.fromkeys(shard.claimed, "written")
    for digest in lost:
        settled[digest] = f"dead:{reasons.get(digest, 'unknown')}"
    # A sink refuses a row, not a text (a NUL may sit in the payload): copies must try for themselves,
    # unless the text itself holds the NUL, which the sink refuses in every row that carries it.
    for digest in lost | shard.settled.keys():
        if settled[digest].startswith("dead:sink_rejected") and digest not in shard.unstorable:
            settled[digest] = "lost"
    return sorted(settled.items())


def unstorable(records: Sequence[Record], hashes: Sequence[str], refused: Sequence[DeadLetter]) -> set[str]:
    """The hashes of refused rows whose text holds a NUL byte: no row carrying that text can be stored by
    a sink that refuses NUL (Postgres), so its copies are dead letters rather than texts to embed again."""
    gone = {letter.doc_id for letter in refused if letter.reason.startswith("sink_rejected")}
    return {
        digest
        for record, digest in zip(records, hashes, strict=True)
        if record.id in gone and "\x00" in record.text
    }
