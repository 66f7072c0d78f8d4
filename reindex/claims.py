"""Text claims of a running pipeline, held in memory until their shard is recorded.

A claim says "this document will carry this text's vector for the whole run", so other documents with
the same text copy it instead of embedding it again. The pipeline's claims live only as long as the
process (a new run releases the claims of shards that died in flight), so they need not be written twice:
the book keeps them here, asks the ledger only about texts settled before, and the shard's one
`record_shard` statement writes each text with its owner and what became of it. Provider batch runs keep
their claims in the ledger (their jobs outlive the process).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from reindex import ledger
from reindex.ledger import Ledger


class Claims(Protocol):
    def claim(self, owners: Mapping[str, str]) -> dict[str, tuple[str, str]]: ...
    def text_states(self, plan_id: str, hashes: Sequence[str]) -> dict[str, tuple[str, str]]: ...
    def release(self, hashes: Iterable[str]) -> None: ...


class ClaimBook:
    """`claim_texts` / `text_states` for one pipeline: in-flight claims in memory, settled texts in the
    ledger. One pipeline per plan at a time (the run lease), so memory is the whole truth about claims."""

    def __init__(self, ledger: Ledger, plan_id: str) -> None:
        self.ledger, self.plan_id = ledger, plan_id
        self._claims: dict[str, tuple[str, str]] = {}  # content hash -> (owner document, state)
        self._lock = threading.Lock()

    def claim(self, owners: Mapping[str, str]) -> dict[str, tuple[str, str]]:
        """Claim each text (hash -> document) unless another document holds it, here or in the ledger;
        return {hash: (owner, state)} for the texts not to embed (`reindex.ledger.held`)."""
        with self._lock:
            held = {d: self._claims[d] for d in owners if d in self._claims}
            rest = [digest for digest in owners if digest not in held]
        settled = ledger.held(owners, self.ledger.text_states(self.plan_id, rest)) if rest else {}
        with self._lock:
            for digest in rest:
                if digest in self._claims:  # claimed meanwhile
                    held[digest] = self._claims[digest]
                elif digest in settled:
                    held[digest] = settled[digest]
                else:
                    self._claims[digest] = (owners[digest], "claimed")
        return ledger.held(owners, held)

    def text_states(self, plan_id: str, hashes: Sequence[str]) -> dict[str, tuple[str, str]]:
        """What the ledger says of each text, with this run's in-flight claims on top."""
        states = self.ledger.text_states(plan_id, hashes)
        with self._lock:
            states |= {d: self._claims[d] for d in hashes if d in self._claims}
        return states

    def release(self, hashes: Iterable[str]) -> None:
        """Forget claims whose shard is recorded: the ledger holds them now."""
        with self._lock:
            for digest in hashes:
                self._claims.pop(digest, None)


class LedgerClaims:
    """Claims straight in the ledger, for pipelines in several processes at once (the ray engine's actors):
    each sees the others' claims. The shard's record settles its texts; nothing is held here."""

    def __init__(self, ledger: Ledger, plan_id: str) -> None:
        self.ledger, self.plan_id = ledger, plan_id

    def claim(self, owners: Mapping[str, str]) -> dict[str, tuple[str, str]]:
        return self.ledger.claim_texts(self.plan_id, owners)

    def text_states(self, plan_id: str, hashes: Sequence[str]) -> dict[str, tuple[str, str]]:
        return self.ledger.text_states(plan_id, hashes)

    def release(self, hashes: Iterable[str]) -> None:
        """Nothing to forget: the claims are rows the shard's record already settled."""
