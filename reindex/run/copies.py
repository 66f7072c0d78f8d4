"""Copies: documents whose text another document already carries get that document's vector, not a new embed.

A copy is only as good as the vector it copies. The ledger says which document carries a text (its owner),
but the owner may have been re-embedded for an edited text since (`sync`), deleted, or its vector may have
been lost; so the vector is taken only while the owner's stored content hash is still that text's hash
(`Sink.fetch_matching`). Every other copy is handed back as `lost`: the caller embeds it and becomes the
text's owner. A text still claimed (its owner's shard is in flight, in another lane or on another worker) is
copied as soon as its owner stores it, before the owner's record says so: until then it is `waiting`, and
the caller waits for it rather than paying for the text a second time. Nothing is silently dropped: each
copy ends written, dead (its text failed for its owner with a reason intrinsic to the text), waiting or
lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from reindex.ports import Rows, Sink, TargetSpec, Vectors
from reindex.run.shards import Copy
from reindex.state.records import DeadLetter


class TextStates(Protocol):
    def text_states(self, plan_id: str, hashes: Sequence[str]) -> dict[str, tuple[str, str]]: ...


@dataclass
class Copies:
    rows: Rows | None = None  # ready to write
    dead: list[DeadLetter] = field(default_factory=list)
    waiting: list[Copy] = field(default_factory=list)  # the owner's text is still claimed, not settled
    lost: list[Copy] = field(default_factory=list)  # no stored vector carries this text: embed it again


def copy_rows(
    ledger: TextStates, sink: Sink, spec: TargetSpec, plan_id: str, copies: Sequence[Copy]
) -> Copies:
    """Sort copies into ready rows, dead letters, still-waiting and lost (see the module docstring)."""
    result = Copies()
    if not copies:
        return result
    states = ledger.text_states(plan_id, sorted({digest for _, digest, _ in copies}))
    candidates: list[tuple[Copy, str]] = []  # (copy, the owner the ledger names now)
    claimed: set[int] = set()  # positions in candidates whose owner has not recorded its text yet
    for copy in copies:
        record, digest, _ = copy
        owner, state = states.get(digest, ("", ""))
        if state in ("written", "claimed"):
            if state == "claimed":
                claimed.add(len(candidates))
            candidates.append((copy, owner))
        elif state.startswith("dead:") and state != "dead:unknown":
            detail = "its text, dead-lettered before" if owner == record.id else f"same text as {owner}"
            result.dead.append(DeadLetter(record.id, state[5:], detail, digest))
        else:
            result.lost.append(copy)
    stored = _owners_matching(sink, spec.name, candidates)
    ready: list[tuple[Copy, Vectors]] = []
    for position, (copy, owner) in enumerate(candidates):
        if (owner, copy[1]) in stored:
            ready.append((copy, stored[owner, copy[1]]))
        elif position in claimed:
            result.waiting.append(copy)
        else:
            result.lost.append(copy)
    # A copy whose own document already stores its text's vector (it copied it before its owner moved on)
    # needs no owner: embedding it again would bill the text twice.
    own = _matching(sink, spec.name, {copy[0].id: copy[1] for copy in result.lost})
    ready += [(copy, own[copy[0].id]) for copy in result.lost if copy[0].id in own]
    result.lost = [copy for copy in result.lost if copy[0].id not in own]
    if ready:
        vectors = np.stack([vector for _, vector in ready]).astype(np.float32)
        records = [copy[0] for copy, _ in ready]
        result.rows = Rows(records, vectors, [copy[1] for copy, _ in ready], spec.fingerprint)
    return result


def _owners_matching(
    sink: Sink, target: str, candidates: Sequence[tuple[Copy, str]]
) -> dict[tuple[str, str], Vectors]:
    """{(owner, hash): vector} for owners whose stored content hash is that text's. The ledger may still name
    one document as the owner of two texts (its old one, which a copy took while it lasted, and its new one),
    so the owners are asked in rounds of one text each: one round unless that happens."""
    wanted: dict[str, set[str]] = {}
    for copy, owner in candidates:
        wanted.setdefault(owner, set()).add(copy[1])
    found: dict[tuple[str, str], Vectors] = {}
    while wanted:
        expected = {owner: digests.pop() for owner, digests in wanted.items()}
        found |= {(owner, expected[owner]): v for owner, v in _matching(sink, target, expected).items()}
        wanted = {owner: digests for owner, digests in wanted.items() if digests}
    return found


def _matching(sink: Sink, target: str, expected: dict[str, str]) -> dict[str, Vectors]:
    return sink.fetch_matching(target, expected) if expected else {}
