"""A shard in flight: its records screened, deduplicated by text, tokenized once, then given vectors.

prepare_shard: screen → fold duplicate ids → claim texts run-wide → tokenize each text once → length policy
finish_shard:  each record gets its text's vector, or a dead letter when the vector came back unusable
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reindex.config import RunConfig
from reindex.ledger import DeadLetter
from reindex.ports import Record, Tokens, Vectors
from reindex.validation import screen

Claim = Callable[
    [dict[str, str]], dict[str, tuple[str, str]]
]  # {hash: doc} -> {hash: (owner, state)} elsewhere
Copy = tuple[Record, str, str]  # (record, content hash, the document that carries that text's vector)


@dataclass
class Shard:
    seq: int
    after_cursor: str | None
    last_cursor: str
    documents: int
    records: list[Record]
    hashes: list[str]
    owner: list[int]  # record i is embedded as unique text owner[i]
    tokens: list[Tokens]  # one per unique text
    dead: list[DeadLetter]
    duplicates: int
    truncated: int = 0
    vectors: Vectors | None = None
    billed_tokens: int = 0
    copies: list[Copy] = field(default_factory=list)  # texts another document carries: copied, not embedded
    claimed: set[str] = field(default_factory=set)  # texts this shard embeds for the whole run
    copied: list[str] = field(default_factory=list)  # copies written (ids): not embedded as this shard's own
    owners: dict[str, str] = field(default_factory=dict)  # texts this shard took over (re-embedded copies)
    settled: dict[str, str] = field(default_factory=dict)  # what became of the texts it took over

    @property
    def written_ids(self) -> list[str]:
        return [record.id for record in self.records] + self.copied


def prepare_shard(
    embedder: Any,
    run: RunConfig,
    seq: int,
    after: str | None,
    records: list[Record],
    claim: Claim | None = None,
) -> Shard:
    """Screen, fold duplicate ids, set aside texts embedded elsewhere in the run (`claim`), tokenize each
    remaining distinct text once, and apply the over-length policy."""
    screened = screen(records)
    kept, hashes, copies, claimed = _claim(screened.records, screened.hashes, claim)
    unique: dict[str, int] = {}
    owner = [unique.setdefault(digest, len(unique)) for digest in hashes]
    texts = [""] * len(unique)
    for record, index in zip(kept, owner, strict=True):
        texts[index] = record.text
    shard = Shard(
        seq,
        after,
        records[-1].position if records else (after or ""),
        len(records),
        kept,
        hashes,
        owner,
        embedder.tokenize(texts) if texts else [],
        screened.dead,
        screened.duplicates,
        copies=copies,
        claimed=claimed,
    )
    _apply_length_policy(shard, run.too_long, embedder.info.max_tokens)
    return shard


def _claim(
    records: list[Record], hashes: list[str], claim: Claim | None
) -> tuple[list[Record], list[str], list[Copy], set[str]]:
    """Content-addressed dedupe across the run: a text another document already carries is not embedded."""
    if claim is None or not records:
        return records, hashes, [], set()
    firsts: dict[str, str] = {}
    for record, digest in zip(records, hashes, strict=True):
        firsts.setdefault(digest, record.id)
    elsewhere = claim(firsts)
    kept = [(r, h) for r, h in zip(records, hashes, strict=True) if h not in elsewhere]
    copies = [(r, h, elsewhere[h][0]) for r, h in zip(records, hashes, strict=True) if h in elsewhere]
    return [r for r, _ in kept], [h for _, h in kept], copies, set(firsts) - set(elsewhere)


def _apply_length_policy(shard: Shard, policy: str, limit: int) -> None:
    over = {i for i, tokens in enumerate(shard.tokens) if tokens.is_truncated}
    if policy == "truncate" or not over:
        shard.truncated = sum(1 for i in shard.owner if i in over)
        return
    for record, digest, index in zip(shard.records, shard.hashes, shard.owner, strict=True):
        if index in over:
            detail = f"{shard.tokens[index].original_count} tokens > {limit}"
            shard.dead.append(DeadLetter(record.id, "too_long", detail, digest))
    keep_records(shard, [index not in over for index in shard.owner])


def finish_shard(shard: Shard, unique: Vectors, reasons: Sequence[str | None], dim: int) -> None:
    """Give each record its text's vector, dead-lettering those whose vector came back unusable."""
    for record, digest, index in zip(shard.records, shard.hashes, shard.owner, strict=True):
        if reasons[index]:
            shard.dead.append(DeadLetter(record.id, str(reasons[index]), "embedder output", digest))
    keep = [reasons[index] is None for index in shard.owner]
    shard.vectors = unique[shard.owner] if shard.owner else np.empty((0, dim), dtype=np.float32)
    keep_records(shard, keep)


def keep_records(shard: Shard, keep: Sequence[bool]) -> None:
    """Drop dead-lettered records from a shard, keeping vectors aligned if present."""
    if all(keep):
        return
    shard.records = [r for r, k in zip(shard.records, keep, strict=True) if k]
    shard.hashes = [h for h, k in zip(shard.hashes, keep, strict=True) if k]
    shard.owner = [o for o, k in zip(shard.owner, keep, strict=True) if k]
    if shard.vectors is not None:
        shard.vectors = shard.vectors[np.asarray(keep, dtype=bool)]


def text_settlements(shard: Shard) -> list[tuple[str, str]]:
    """What became of each text this shard claimed or took over: written, or dead with the reason."""
    written = set(shard.hashes)
    reasons = {letter.content_hash: letter.reason for letter in shard.dead if letter.content_hash}
    settled = dict(shard.settled)
    for digest in shard.claimed:
        if digest in written:
            settled[digest] = "written"
        else:
            settled[digest] = f"dead:{reasons.get(digest, 'unknown')}"
    # A sink refuses a row, not a text (a NUL may sit in the payload): copies must try for themselves.
    return sorted((d, "lost" if s.startswith("dead:sink_rejected") else s) for d, s in settled.items())
