"""Text claims of a running pipeline, held in memory until their shard is recorded; and how far dedupe reaches.

Dedupe is run-wide (`[run] dedupe = "run"`): every text is embedded once per run, whatever shard or process
meets it again, because every text's owner and state are written to the ledger with its shard. That is
exactly-once billing for a paid embedder, and the default there. Its price is a ledger row per text, whose
cost per document grows with the corpus (random keys in a B-tree: each shard's texts dirty one page each once
the table outgrows them, and every page goes through the WAL). A local model bills nothing: by default
(`"auto"`) its dedupe reaches the texts in flight and the last 50,000 to 100,000 recorded in this process
(`WindowClaims`), and a text met again beyond that is embedded again (the same vector), so the ledger gains
no row per text and the run's cost per document stays flat (issue 44).

A claim says "this document will carry this text's vector for the whole run", so other documents with
the same text copy it instead of embedding it again. The pipeline's claims live only as long as the
process (a new run releases the claims of shards that died in flight), so they need not be written twice:
the book keeps them here, asks the ledger only about texts settled before, and the shard's one
`record_shard` statement writes each text with its owner and what became of it. Provider batch runs keep
their claims in the ledger (their jobs outlive the process).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence, Set
from typing import Any, Protocol

from reindex.capabilities import Metered
from reindex.config import RunConfig
from reindex.ports import DeferredEmbedder
from reindex.state import ledger
from reindex.state.ledger import Ledger

RECENT_TEXTS = 100_000  # texts a windowed dedupe remembers after their shard is recorded: half to all


class Claims(Protocol):
    def claim(self, owners: Mapping[str, str]) -> dict[str, tuple[str, str]]: ...
    def text_states(self, plan_id: str, hashes: Sequence[str]) -> dict[str, tuple[str, str]]: ...
    def settle(self, states: Sequence[tuple[str, str]], owners: Mapping[str, str]) -> None: ...
    def release(self, hashes: Iterable[str]) -> None: ...


def run_wide(run: RunConfig, embedder: Any) -> bool:
    """Whether dedupe reaches the whole run (texts in the ledger) or the texts in flight (see above)."""
    if run.dedupe != "auto":
        return run.dedupe == "run"
    return isinstance(embedder, (DeferredEmbedder, Metered)) or embedder.traits.paid


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
            fresh = dict(owners)
            _drop(fresh, owners.keys() - (rest - booked.keys() - settled.keys()))
            self._claims.update(fresh)
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

    def settle(self, states: Sequence[tuple[str, str]], owners: Mapping[str, str]) -> None:
        """What became of a recorded shard's texts: the ledger holds it, nothing to keep here."""

    def release(self, hashes: Iterable[str]) -> None:
        """Forget claims whose shard is recorded: the ledger holds them now."""
        with self._lock:
            _drop(self._claims, self._claims.keys() & set(hashes))


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

    def settle(self, states: Sequence[tuple[str, str]], owners: Mapping[str, str]) -> None:
        """Nothing to keep: the shard's record settled its rows."""

    def release(self, hashes: Iterable[str]) -> None:
        """Nothing to forget: the claims are rows the shard's record already settled."""


class WindowClaims(ClaimBook):
    """Claims for a run whose dedupe reaches the texts in flight (`run_wide` False): in-flight claims in
    memory, as `ClaimBook`, and the texts settled lately, so a copy whose owner's shard was recorded
    meanwhile still finds it; the ledger is never asked, and holds no row per text. The settled texts are
    two generations of dicts, each up to half of `RECENT_TEXTS`: when the newer fills it becomes the older
    and the older is dropped whole, so a text is remembered for at least half the bound and memory stays
    bounded, at the cost of dict updates made at C speed (an ordered map's per-text upkeep cost the run
    30% more CPU per document)."""

    def __init__(self, plan_id: str, recent: int | None = None) -> None:
        self.plan_id = plan_id
        self._claims: dict[str, str] = {}
        self._lock = threading.Lock()
        self._newer: dict[str, tuple[str, str]] = {}
        self._older: dict[str, tuple[str, str]] = {}
        self._half = max(1, (RECENT_TEXTS if recent is None else recent) // 2)

    def _settled(self, hashes: Set[str]) -> dict[str, tuple[str, str]]:
        older = {d: self._older[d] for d in hashes & self._older.keys()}
        return older | {d: self._newer[d] for d in hashes & self._newer.keys()}

    def claim(self, owners: Mapping[str, str]) -> dict[str, tuple[str, str]]:
        with self._lock:
            booked = self._booked(owners.keys())
            recent = self._settled(owners.keys() - booked.keys())
            taken = booked.keys() | recent.keys()
            fresh = dict(owners)
            _drop(fresh, taken)
            self._claims.update(fresh)
        return ledger.held(owners, recent | booked)

    def text_states(self, plan_id: str, hashes: Sequence[str]) -> dict[str, tuple[str, str]]:
        wanted = set(hashes)
        with self._lock:
            return self._settled(wanted) | self._booked(wanted)

    def settle(self, states: Sequence[tuple[str, str]], owners: Mapping[str, str]) -> None:
        """Remember what became of a recorded shard's texts. A shard's texts all have their owner among
        `owners` but where it took over another's claim: then they go in by C-level iteration (`zip`,
        `map`), which the interpreter does not interrupt every switch interval as it does a loop of its
        own (the pipeline's is 0.1 ms, and five threads take turns)."""
        settled = dict(states)
        with self._lock:
            if owners.keys() >= settled.keys():
                held = map(owners.__getitem__, settled)
                self._newer.update(zip(settled, zip(held, settled.values(), strict=True), strict=True))
            else:
                self._newer.update(
                    (digest, (owner, state))
                    for digest, state in settled.items()
                    if (owner := owners.get(digest) or self._claims.get(digest)) is not None
                )
            if len(self._newer) >= self._half:
                self._older, self._newer = self._newer, {}


def _drop(claims: dict[str, str], digests: Iterable[str]) -> None:
    """Delete `digests` (all present) from `claims` by C-level iteration (see `WindowClaims.settle`)."""
    deque(map(claims.pop, digests), maxlen=0)
