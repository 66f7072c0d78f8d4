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
from collections.abc import Iterable, Mapping, Sequence, Set
from typing import Protocol

from reindex.state import ledger
from reindex.state.ledger import Ledger


class Claims(Protocol):
    def claim(self, owners: Mapping[str, str]) -> dict[str, tuple[str, str]]: ...
    def text_states(self, plan_id: str, hashes: Sequence[str]) -> dict[str, tuple[str, str]]: ...
    def release(self, hashes: Iterable[str]) -> None: ...


class ClaimBook:
    """`claim_texts` / `text_states` for one pipeline: in-flight claims in memory, settled texts in the
    ledger. One pipeline per plan at a time (the run lease), so memory is the whole truth about claims."""

    def __init__(self, ledger: Ledger, plan_id: str) -> None:
        self.ledger, self.plan_id = ledger, plan_id
        self._claims: dict[str, str] = {}  # content hash -> the document that claimed it
        self._lock = threading.Lock()

    def claim(self, owners: Mapping[str, str]) -> dict[str, tuple[str, str]]:
        """Claim each text (hash -> document) unless another document holds it, here or in the ledger;
        return {hash: (owner, state)} for the texts not to embed (`reindex.state.ledger.held`). Set operations:
        a shard's texts are looked up at C speed, and only the unclaimed ones in the ledger."""
        with self._lock:
            booked = self._booked(owners.keys())
        rest = owners.keys() - booked.keys()
        settled = ledger.held(owners, self.ledger.text_states(self.plan_id, sorted(rest))) if rest else {}
        with self._lock:
            booked |= self._booked(rest)  # claimed meanwhile: the claim wins over the ledger's word
            self._claims.update({digest: owners[digest] for digest in rest - booked.keys() - settled.keys()})
        return ledger.held(owners, settled | booked)

    def _booked(self, hashes: Set[str]) -> dict[str, tuple[str, str]]:
        return {digest: (self._claims[digest], "claimed") for digest in hashes & self._claims.keys()}

    def text_states(self, plan_id: str, hashes: Sequence[str]) -> dict[str, tuple[str, str]]:
        """What the ledger says of each text, with this run's in-flight claims on top. A claim in the ledger
        that this book does not hold is no one's here (a stopped ray or batch run left it, and only its
        rerun fulfils it): it is left out, so its copies are embedded, not waited for."""
        states = {
            digest: state
            for digest, state in self.ledger.text_states(plan_id, hashes).items()
            if state[1] != "claimed"
        }
        with self._lock:
            states |= self._booked(set(hashes))
        return states

    def release(self, hashes: Iterable[str]) -> None:
        """Forget claims whose shard is recorded: the ledger holds them now."""
        with self._lock:
            for digest in self._claims.keys() & set(hashes):
                del self._claims[digest]


class LedgerClaims:
    """Claims straight in the ledger, for pipelines in several processes at once (the ray engine's actors):
    each sees the others' claims, and a copy of a text another shard claimed waits for that shard to store
    it (`reindex.run.copies`). The shard's record settles its texts; nothing is held here."""

    def __init__(self, ledger: Ledger, plan_id: str) -> None:
        self.ledger, self.plan_id = ledger, plan_id

    def claim(self, owners: Mapping[str, str]) -> dict[str, tuple[str, str]]:
        return self.ledger.claim_texts(self.plan_id, owners)

    def text_states(self, plan_id: str, hashes: Sequence[str]) -> dict[str, tuple[str, str]]:
        return self.ledger.text_states(plan_id, hashes)

    def release(self, hashes: Iterable[str]) -> None:
        """Nothing to forget: the claims are rows the shard's record already settled."""
