"""The Ledger port: the durable record of a migration, what its text claims mean, and the refusals every
ledger raises."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from reindex.errors import CutoverRefused, LeaseLost
from reindex.state.records import (
    Cutover,
    DeadLetter,
    Job,
    Lease,
    PlannedShard,
    RunInfo,
    RunSummary,
    ShardRecord,
    ShardResult,
    Verification,
    WorkerSummary,
)


class Ledger(Protocol):
    """The durable record of a migration. SqliteLedger by default; PostgresLedger in adapters/ for shared runs."""

    def begin(
        self,
        plan_id: str,
        *,
        alias: str,
        target: str,
        fingerprint: str,
        model: dict[str, Any],
        config_key: str | None = None,
    ) -> str:
        """Create or reopen the run; return its nonce (random, made once per run, kept until forget)."""
        ...

    def run_info(self, plan_id: str) -> RunInfo | None: ...
    def find_run(self, config_key: str) -> RunInfo | None:
        """The newest run begun with this config key (source, target and embedder settings)."""
        ...

    def forget(self, plan_id: str) -> None:
        """Delete a run's shards, dead letters, texts, jobs and run row (start afresh); keep cutovers."""
        ...

    def alias_lock(self, alias: str, *, wait_seconds: float = 5.0) -> AbstractContextManager[None]:
        """Serialise cutover, rollback, prune and `cutover --sync` per alias; CutoverRefused if busy."""
        ...

    def resume_point(self, plan_id: str) -> tuple[str | None, int]: ...
    def plan_shards(self, plan_id: str, shards: Sequence[PlannedShard]) -> None: ...
    def fence(self, lease: Lease) -> None: ...
    def shard_plan(self, plan_id: str) -> list[PlannedShard]: ...
    def workers(self, plan_id: str) -> list[WorkerSummary]: ...
    def shards(self, plan_id: str) -> list[ShardRecord]:
        """The run's recorded shards in the order they were written."""
        ...

    def record_shard(self, plan_id: str, shard: ShardResult) -> None: ...
    def settle_retry(
        self, plan_id: str, *, written: Sequence[str], vanished: Sequence[str], dead: Sequence[DeadLetter]
    ) -> None: ...
    def record_dead_letters(self, plan_id: str, letters: Sequence[DeadLetter]) -> None: ...
    def finish(self, plan_id: str) -> None: ...
    def summary(self, plan_id: str) -> RunSummary | None: ...
    def dead_letters(self, plan_id: str) -> list[DeadLetter]: ...
    def record_verification(
        self, plan_id: str, complete: bool, report: dict[str, Any], *, kind: str = "coverage"
    ) -> None: ...
    def verifications(self, plan_id: str, kind: str | None = None) -> list[Verification]: ...
    def cutover_intent(
        self,
        alias: str,
        old: str | None,
        new: str,
        *,
        fingerprint: str | None,
        action: str,
        forced: bool,
        report: dict[str, Any] | None = None,
    ) -> int: ...
    def settle_cutover(self, cutover_id: int, state: str, *, old: str | None = None) -> None: ...
    def cutovers(self, alias: str) -> list[Cutover]: ...
    def lease(self, key: str) -> AbstractContextManager[Lease]: ...
    def record_job(self, plan_id: str, job: Job) -> None:
        """Store the job whole: recorded again, its row takes every field of the new one."""
        ...

    def jobs(self, plan_id: str) -> list[Job]: ...
    def claim_texts(self, plan_id: str, owners: Mapping[str, str]) -> dict[str, tuple[str, str]]: ...
    def text_states(self, plan_id: str, hashes: Sequence[str]) -> dict[str, tuple[str, str]]: ...
    def settle_texts(
        self, plan_id: str, states: Sequence[tuple[str, str]], *, owners: Mapping[str, str] | None = None
    ) -> None: ...
    def release_claims(self, plan_id: str, *, keep_owners: Sequence[str] = ()) -> None: ...
    def close(self) -> None: ...


def held(owners: Mapping[str, str], states: Mapping[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """Of the ledger's states for texts a shard wants to claim ({hash: owner}), the ones it must not embed:
    another document holds the text, or this very document already settled it past the run's cursor: a
    sync wrote it, or its sink refused every row that carries it (a NUL byte Postgres refuses; only such
    refusals stay dead in the ledger, see `shards.text_settlements`). Such a self-copy costs nothing and
    still checks the stored vector (`copies.copy_rows`); were it embedded again, a provider would bill the
    text twice. Other dead texts are tried again: a changed over-length policy may save them."""
    return {
        digest: state
        for digest, state in states.items()
        if state[0] != owners[digest] or state[1] == "written" or state[1].startswith("dead:sink_rejected")
    }


def lease_lost(key: str, token: int, stored: int | None) -> LeaseLost:
    """The refusal of a fenced write: `stored` is the key's newest token, None when the loss was seen first
    (the lease connection dropped)."""
    how = (
        "was lost (its connection dropped, or another run took it)"
        if stored is None
        else f"was taken over (token {stored})"
    )
    return LeaseLost(
        f"the lease {key!r} (token {token}) {how}: this run writes nothing more",
        hint="rerun the same command to continue once no other run holds the lease",
    )


def alias_busy(alias: str, wait_seconds: float) -> CutoverRefused:
    return CutoverRefused(
        f"alias {alias!r} is locked: another cutover, rollback or prune holds it (waited {wait_seconds:g} s)",
        hint="wait for it to finish, then retry",
    )


# The tables `forget` empties of a run (cutovers stay: they are the alias's history)
FORGET_TABLES = ("shards", "shard_plan", "dead_letters", "texts", "jobs", "verifications", "runs")
