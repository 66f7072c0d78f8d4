"""What the ledger records and returns: shards, dead letters, jobs, runs, cutovers, verifications, leases,
and the row forms both ledgers store them in."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class DeadLetter:
    doc_id: str
    reason: str  # one of reindex.run.validation.REASONS
    detail: str = ""
    content_hash: str | None = None


@dataclass(frozen=True, slots=True)
class ShardResult:
    seq: int
    after_cursor: str | None
    last_cursor: str
    documents: int
    written: int
    dead_letters: Sequence[DeadLetter]
    duplicates: int  # duplicate ids with identical text, folded into one write
    reused: int  # documents whose text was already embedded in this shard (embedded once)
    tokens: int
    truncated: int
    seconds: float
    billed_tokens: int = 0  # what the provider charged for (online or batch usage fields)
    vanished: int = 0  # documents deleted from the source before their vectors could be written
    texts: Sequence[tuple[str, str]] = ()  # (content_hash, "written" | "dead:<reason>") this shard embedded
    # content_hash -> the document that now owns the text (re-embedded copies); recorded with the shard
    owners: Mapping[str, str] = field(default_factory=dict)
    worker: str | None = None  # "node/actor" that wrote it (engine `ray`); None for the local engine


@dataclass(frozen=True)
class WorkerSummary:
    """What one worker of a ray run wrote: `status --json` lists them."""

    worker: str
    shards: int
    documents: int
    docs_per_second: float  # over its shard times
    recent_docs_per_second: float  # over its shards of the last minute it wrote in
    last_written_at: float


def worker_summaries(rows: Sequence[tuple[str, int, float, float]]) -> list[WorkerSummary]:
    """Per worker, from (worker, documents, seconds, written_at) of each shard it recorded."""
    by_worker: dict[str, list[tuple[int, float, float]]] = {}
    for worker, documents, seconds, at in rows:
        by_worker.setdefault(worker, []).append((int(documents), float(seconds), float(at)))
    summaries = []
    for worker, shards in sorted(by_worker.items()):
        last = max(at for _, _, at in shards)
        recent = [(d, s) for d, s, at in shards if at >= last - 60]
        summaries.append(
            WorkerSummary(
                worker,
                len(shards),
                sum(d for d, _, _ in shards),
                _rate(sum(d for d, _, _ in shards), sum(s for _, s, _ in shards)),
                _rate(sum(d for d, _ in recent), sum(s for _, s in recent)),
                last,
            )
        )
    return summaries


def _rate(documents: int, seconds: float) -> float:
    return round(documents / seconds, 1) if seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Job:
    """A provider job (deferred embedder) for one shard's texts, or for the lines a previous attempt lost.

    States: intent (key durable, nothing created) → submitted (provider job id known) → applied (vectors
    durable in the target) → released (provider files deleted). The key is deterministic, so recovery
    adopts a job the provider created even if its id never reached the ledger.
    """

    key: str
    seq: int
    attempt: int
    state: str
    job_id: str | None
    after_cursor: str | None
    last_cursor: str
    items: tuple[tuple[str, str, str, int], ...]  # (custom_id, doc_id, content_hash, tokens); never text
    documents: int = 0  # shard documents, on attempt 0 only
    duplicates: int = 0
    truncated: int = 0
    dead: tuple[DeadLetter, ...] = ()  # screening dead letters (attempt 0) or final provider rejections
    written: int = 0
    billed_tokens: int = 0
    vanished: int = 0  # finished lines whose documents had left the source
    # attempt 0: (doc_id, content_hash, owner doc) of texts embedded elsewhere; later attempts: the copies
    # this job took over (embeds itself) because no stored vector carried their text any more
    copies: tuple[tuple[str, str, str], ...] = ()


def job_row(plan_id: str, job: Job) -> tuple[Any, ...]:
    """The column values of a job, in table order (shared by both ledgers)."""
    return (
        plan_id,
        job.key,
        job.seq,
        job.attempt,
        job.state,
        job.job_id,
        job.after_cursor,
        job.last_cursor,
        job.documents,
        job.duplicates,
        job.truncated,
        job.written,
        job.billed_tokens,
        json.dumps(job.items),
        json.dumps([asdict(d) for d in job.dead]),
        time.time(),
        job.vanished,
        json.dumps(job.copies),
    )


def job_from_row(row: Sequence[Any]) -> Job:
    """A job from its row. Rows written before texts left the ledger carry a fifth item field (the text):
    it is ignored, and gone once the job is recorded again."""
    items = tuple((str(i[0]), str(i[1]), str(i[2]), int(i[3])) for i in json.loads(row[13]))
    dead = tuple(DeadLetter(**d) for d in json.loads(row[14]))
    return Job(
        key=row[1],
        seq=row[2],
        attempt=row[3],
        state=row[4],
        job_id=row[5],
        after_cursor=row[6],
        last_cursor=row[7],
        documents=row[8],
        duplicates=row[9],
        truncated=row[10],
        written=row[11],
        billed_tokens=row[12],
        items=items,
        dead=dead,
        vanished=row[16],
        copies=tuple((str(c[0]), str(c[1]), str(c[2])) for c in json.loads(row[17])),
    )


@dataclass(frozen=True, slots=True)
class RunSummary:
    plan_id: str
    alias: str
    target: str
    fingerprint: str
    state: str  # running | complete
    shards: int
    documents: int
    written: int
    dead_letters: int
    duplicates: int
    vanished: int  # dead-lettered documents gone from the source when retried
    reused: int
    tokens: int
    truncated: int
    seconds: float
    last_cursor: str | None
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)
    billed_tokens: int = 0
    finalized: bool = False  # a run of it has finalized the target (its index and triggers) at least once

    @property
    def reconciled(self) -> bool:
        """Documents in = vectors written + dead letters (+ duplicate ids folded, + retried-and-vanished)."""
        return self.documents == self.written + self.dead_letters + self.duplicates + self.vanished


@dataclass(frozen=True, slots=True)
class ShardRecord:
    """One recorded shard as the report plots it: how much it carried and how long it took."""

    seq: int
    documents: int
    written: int
    tokens: int
    seconds: float  # since the previous record of the same run: the run's wall time, shard by shard
    written_at: float  # epoch seconds
    worker: str | None


@dataclass(frozen=True, slots=True)
class Cutover:
    id: int
    alias: str
    old: str | None
    new: str
    fingerprint: str | None
    action: str  # cutover | rollback
    forced: bool
    state: str  # pending | done | aborted
    at: float


@dataclass(frozen=True, slots=True)
class Verification:
    """One check of a run's target: `coverage` (verify) or `quality` (compare), passed or not, its report."""

    at: float
    kind: str
    passed: bool
    report: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Lease:
    """The one-run-at-a-time right to write a migration's progress.

    `token` increases with every acquisition of `key` (a fencing token): while a lease is held, every
    ledger write checks in its own transaction that the token is still the newest, and raises
    LeaseLost otherwise, so a stale runner can neither record shards nor release another's claims.
    `lost` is set within seconds once the lease is known to be gone (its connection dropped);
    the run watches it and stops (exit 75).
    """

    key: str
    token: int
    lost: threading.Event = field(default_factory=threading.Event, compare=False)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What a migration's commands need without loading the model (cached at `begin`)."""

    plan_id: str
    alias: str
    target: str
    fingerprint: str
    model: dict[str, Any]
    nonce: str
    config_key: str | None


@dataclass(frozen=True)
class PlannedShard:
    """A shard fixed in advance (engine `ray`): documents after `after_cursor` up to `last_cursor`."""

    seq: int
    after_cursor: str | None
    last_cursor: str
    documents: int
    recorded: bool = False  # the ledger holds the shard's record: written


def shard_row(plan_id: str, shard: ShardResult, now: float) -> tuple[Any, ...]:
    """The shards columns both ledgers insert, in the order of their INSERT statements."""
    return (
        plan_id,
        shard.seq,
        shard.after_cursor,
        shard.last_cursor,
        shard.documents,
        shard.written,
        len(shard.dead_letters),
        shard.duplicates,
        shard.reused,
        shard.tokens,
        shard.truncated,
        shard.seconds,
        now,
        shard.billed_tokens,
        shard.vanished,
        shard.worker,
    )


def run_info_from_row(row: Sequence[Any]) -> RunInfo:
    """(plan_id, alias, target, fingerprint, model, nonce, config_key) as both ledgers select them."""
    return RunInfo(row[0], row[1], row[2], row[3], json.loads(row[4]), row[5] or "", row[6])
