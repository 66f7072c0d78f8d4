"""The deferred path: each shard becomes a provider batch job; jobs are collected as they finish, in any order.

    scan → shard → Job(intent) ─submit(key)→ Job(submitted) ─poll→ write vectors → Job(applied)
         → release files → Job(released) → all jobs of the shard released → shard recorded

Every step is a ledger state written before the next side effect, and the job key is deterministic
(`<plan>-<seq>-<attempt>`), so a crash anywhere, even between the provider creating a batch and the
ledger learning its id, is recovered by submitting the same key again: the embedder adopts the job.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from reindex import crashpoints
from reindex.batching import chunks
from reindex.config import RunConfig
from reindex.cost import Budget
from reindex.errors import Interrupted
from reindex.ledger import DeadLetter, Job, Ledger, ShardResult
from reindex.pipeline import Progress, _retrying, copy_rows, prepare_shard
from reindex.ports import (
    DeferredEmbedder,
    JobItem,
    JobResult,
    Record,
    Rows,
    Sink,
    Source,
    TargetSpec,
    Tokens,
    Vectors,
)
from reindex.validation import vector_dead_letters

ONLINE = "online"  # the job id of lines sent through the online endpoint instead of another batch
Item = tuple[
    str, str, str, int, str
]  # custom_id, doc_id, content_hash, tokens, text (first doc of a text only)


class DeferredRun:
    def __init__(
        self,
        *,
        source: Source,
        embedder: DeferredEmbedder,
        sink: Sink,
        ledger: Ledger,
        spec: TargetSpec,
        plan_id: str,
        run: RunConfig,
        budget: Budget,
        stop: threading.Event | None = None,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> None:
        self.source, self.embedder, self.sink, self.ledger = source, embedder, sink, ledger
        self.spec, self.plan_id, self.config, self.budget = spec, plan_id, run, budget
        self.stop = stop or threading.Event()
        self.on_progress = on_progress or (lambda progress: None)
        self.progress = Progress()
        self.jobs: dict[str, Job] = {job.key: job for job in ledger.jobs(plan_id)}

    def run(self) -> Progress:
        """Submit shards up to `max_open_jobs`, collect finished jobs, until the source is exhausted."""
        self._recover()
        after, seq = self._resume_point()
        shards = chunks(self.source.scan(after), self.config.shard_size)
        exhausted, wait = False, self.config.poll_seconds
        while True:
            while not exhausted and len(self._open()) < self.config.max_open_jobs and not self.stop.is_set():
                records = next(shards, None)
                if records is None or not self._open_shard(seq, after, records):
                    exhausted = True
                    break
                after, seq = records[-1].position, seq + 1
            if not self._open():
                break
            if self.stop.is_set():
                raise Interrupted("stopped; provider jobs keep running and a rerun collects them")
            wait = (
                self.config.poll_seconds if self._collect() else min(wait * 2, self.config.poll_max_seconds)
            )
            if self._open():
                self.stop.wait(wait)
        if self.budget.exhausted:
            raise Interrupted(self.budget.message())
        return self.progress

    # submitting --------------------------------------------------------------------------------------

    def _open_shard(self, seq: int, after: str | None, records: list[Record]) -> bool:
        """Turn a shard into a job intent and submit it; False (and nothing recorded) if over budget."""
        claim = functools.partial(self.ledger.claim_texts, self.plan_id)
        shard = prepare_shard(self.embedder, self.config, seq, after, records, claim)
        if not self.budget.allows(sum(t.count for t in shard.tokens)):
            self.ledger.release_claims(self.plan_id, keep_owners=self._owners())
            return False
        items: list[Item] = []
        first: set[int] = set()
        for record, digest, index in zip(shard.records, shard.hashes, shard.owner, strict=True):
            items.append(
                (
                    f"{seq}-{index}",
                    record.id,
                    digest,
                    shard.tokens[index].count,
                    "" if index in first else record.text,
                )
            )
            first.add(index)
        job = Job(
            f"{self.plan_id}-{seq}-0",
            seq,
            0,
            "intent",
            None,
            after,
            shard.last_cursor,
            tuple(items),
            documents=shard.documents,
            duplicates=shard.duplicates,
            truncated=shard.truncated,
            dead=tuple(shard.dead),
            copies=tuple((r.id, digest, owner) for r, digest, owner in shard.copies),
        )
        self._save(job)
        dead_texts = [
            (d.content_hash, f"dead:{d.reason}") for d in shard.dead if d.content_hash in shard.claimed
        ]
        self.ledger.settle_texts(self.plan_id, [(digest, state) for digest, state in dead_texts if digest])
        crashpoints.crash_if_armed("job_after_intent")
        if items:
            self._submit(job, {f"{seq}-{i}": tokens for i, tokens in enumerate(shard.tokens)})
        else:
            self._settle(seq)
        return True

    def _submit(self, job: Job, tokens: dict[str, Tokens] | None = None) -> None:
        """Create the provider job for an intent (or adopt the one a crash left behind)."""
        texts = {item[0]: item[4] for item in job.items if item[4]}
        if tokens is None:  # recovering an intent: the texts travel in the ledger, tokenize them again
            tokens = dict(zip(texts, self.embedder.tokenize(list(texts.values())), strict=True))
        payload = [JobItem(custom_id, tokens[custom_id]) for custom_id in texts]
        job_id = _retrying(functools.partial(self.embedder.submit, isolate=job.attempt > 0), job.key, payload)
        crashpoints.crash_if_armed("job_after_create")
        self._save(replace(job, state="submitted", job_id=job_id))

    # collecting --------------------------------------------------------------------------------------

    def _collect(self) -> bool:
        """Poll every submitted job once; apply the finished ones. True if any finished."""
        in_flight = self._in_flight()
        for job in [j for j in self._open() if j not in in_flight]:
            self._settle(job.seq)
        finished = False
        for job in [j for j in self._open() if j.state == "submitted"]:
            assert job.job_id is not None
            if job.job_id == ONLINE:
                result = _retrying(self._stragglers, job)
            else:
                result = _retrying(self.embedder.poll, job.job_id)
            if result.is_terminal:
                self._apply(job, result)
                finished = True
        return finished

    def _apply(self, job: Job, result: JobResult) -> None:
        """Write what finished, resubmit only the lines that did not (bounded), dead-letter the rest."""
        written, dead, vanished = self._write(job, result.vectors)
        final = job.job_id == ONLINE or job.attempt + 1 >= self.config.provider_attempts
        self.ledger.settle_texts(self.plan_id, self._text_states(job, result, dead, final))
        crashpoints.crash_if_armed("job_after_write")
        lost = [item for item in job.items if item[0] not in result.vectors]
        if job.job_id != ONLINE and job.attempt + 1 < self.config.provider_attempts:
            if lost:
                again = Job(
                    f"{self.plan_id}-{job.seq}-{job.attempt + 1}",
                    job.seq,
                    job.attempt + 1,
                    "intent",
                    None,
                    job.after_cursor,
                    job.last_cursor,
                    _with_texts(lost, job.items),
                )
                self._save(again)
                if getattr(self.embedder, "stragglers_online", False):
                    self._save(replace(again, state="submitted", job_id=ONLINE))  # collected on the next poll
                else:
                    self._submit(again)
        else:
            for item in lost:
                code = result.failed.get(item[0], "missing_output")
                detail = f"after {job.attempt + 1} attempts"
                dead.append(DeadLetter(item[1], f"provider_rejected:{code}", detail, item[2]))
        self.budget.charge(result.billed_tokens)
        applied = replace(
            job,
            state="applied",
            written=written,
            billed_tokens=result.billed_tokens,
            dead=job.dead + tuple(dead),
            vanished=vanished,
        )
        self._save(applied)
        crashpoints.crash_if_armed("job_after_apply")
        self._release(applied)

    def _write(self, job: Job, vectors: Mapping[str, Vectors]) -> tuple[int, list[DeadLetter], int]:
        """Write finished lines with the hash of the text that was embedded (sync catches later edits)."""
        wanted = [item for item in job.items if item[0] in vectors]
        fetched = {r.id: r for r in self.source.fetch([item[1] for item in wanted])}
        present = [item for item in wanted if item[1] in fetched]
        if not present:
            return 0, [], len(wanted)
        matrix = np.stack([np.asarray(vectors[item[0]], dtype=np.float32) for item in present])
        reasons = vector_dead_letters(matrix, self.spec.dim)
        dead = [
            DeadLetter(item[1], str(reason), "provider output", item[2])
            for item, reason in zip(present, reasons, strict=True)
            if reason
        ]
        keep = np.asarray([reason is None for reason in reasons])
        kept = [item for item, ok in zip(present, keep, strict=True) if ok]
        if kept:
            rows = Rows(
                [fetched[item[1]] for item in kept],
                matrix[keep],
                [item[2] for item in kept],
                self.spec.fingerprint,
            )
            _retrying(self.sink.write, self.spec.name, rows)
        self.progress.written += len(kept)
        self.progress.tokens += sum(item[3] for item in kept)
        self.on_progress(self.progress)
        return len(kept), dead, len(wanted) - len(present)

    @staticmethod
    def _text_states(
        job: Job, result: JobResult, dead: list[DeadLetter], final: bool
    ) -> list[tuple[str, str]]:
        """Texts this job settled: written, or dead (vector invalid, or rejected on the last attempt)."""
        invalid = {letter.content_hash: letter.reason for letter in dead}
        states: dict[str, str] = {}
        for custom_id, _, digest, _, _ in job.items:
            if custom_id in result.vectors:
                states[digest] = f"dead:{invalid[digest]}" if digest in invalid else "written"
            elif final:
                states[digest] = f"dead:provider_rejected:{result.failed.get(custom_id, 'missing_output')}"
        return list(states.items())

    def _stragglers(self, job: Job) -> JobResult:
        """The lines a batch left unfinished, through the provider's online endpoint (`stragglers_online`)."""
        texts = {item[0]: item[4] for item in job.items if item[4]}
        tokens = self.embedder.tokenize(list(texts.values()))
        items = [JobItem(custom_id, t) for custom_id, t in zip(texts, tokens, strict=True)]
        result: JobResult = self.embedder.embed_stragglers(items)  # type: ignore[attr-defined]
        return result

    def _release(self, job: Job) -> None:
        assert job.job_id is not None
        if job.job_id != ONLINE:
            _retrying(self.embedder.release, job.job_id)
        stripped = tuple((c, d, h, n, "") for c, d, h, n, _ in job.items)
        self._save(replace(job, state="released", items=stripped))
        self._settle(job.seq)

    def _settle(self, seq: int) -> None:
        """Record the shard once every job of it is released and the texts it shares with other shards are
        written: its counts span all attempts and copies."""
        attempts = [j for j in self.jobs.values() if j.seq == seq]
        first = next(j for j in attempts if j.attempt == 0)
        if first.state == "settled" or any(j in self._in_flight() for j in attempts):
            return
        fetched = {r.id: r for r in self.source.fetch([doc_id for doc_id, _, _ in first.copies])}
        copies = [(fetched[d], h, o) for d, h, o in first.copies if d in fetched]
        rows, copy_dead, waiting = copy_rows(self.ledger, self.sink, self.spec, self.plan_id, copies)
        if waiting:
            return
        if rows is not None:
            _retrying(self.sink.write, self.spec.name, rows)
        reused = len(rows.records) if rows is not None else 0
        dead = [letter for j in attempts for letter in j.dead] + copy_dead
        self.ledger.record_shard(
            self.plan_id,
            ShardResult(
                seq,
                first.after_cursor,
                first.last_cursor,
                first.documents,
                sum(j.written for j in attempts) + reused,
                dead,
                first.duplicates,
                len(first.items) - len({item[0] for item in first.items}) + reused,
                sum(item[3] for item in first.items),
                first.truncated,
                0.0,
                billed_tokens=sum(j.billed_tokens for j in attempts),
                vanished=sum(j.vanished for j in attempts) + len(first.copies) - len(copies),
            ),
        )
        self._save(replace(first, state="settled"))
        self.progress.documents += first.documents
        self.progress.written += reused
        self.progress.dead_letters += len(dead)

    # recovery ----------------------------------------------------------------------------------------

    def _recover(self) -> None:
        """Finish what a crash interrupted: submit intents (adopting existing jobs), release applied ones."""
        self.ledger.release_claims(self.plan_id, keep_owners=self._owners())
        for job in sorted(self.jobs.values(), key=lambda j: (j.seq, j.attempt)):
            if job.state == "intent" and job.items:
                self._submit(job)
            elif job.state == "applied":
                self._release(job)
            elif job.state in ("released", "intent"):
                self._settle(job.seq)

    def _resume_point(self) -> tuple[str | None, int]:
        after, seq = self.ledger.resume_point(self.plan_id)
        starts = [j for j in self.jobs.values() if j.attempt == 0 and j.seq >= seq]
        if starts:
            last = max(starts, key=lambda j: j.seq)
            return last.last_cursor, last.seq + 1
        return after, seq

    def _in_flight(self) -> list[Job]:
        return [
            j
            for j in self.jobs.values()
            if j.state in ("submitted", "applied") or (j.state == "intent" and j.items)
        ]

    def _open(self) -> list[Job]:
        """Jobs in flight, and first jobs of shards still waiting for texts other shards embed."""
        in_flight = self._in_flight()
        waiting = [j for j in self.jobs.values() if j.attempt == 0 and j.state != "settled"]
        return in_flight + [j for j in waiting if j not in in_flight]

    def _owners(self) -> list[str]:
        return [item[1] for job in self._in_flight() for item in job.items]

    def _save(self, job: Job) -> None:
        self.ledger.record_job(self.plan_id, job)
        self.jobs[job.key] = job


def _with_texts(items: Sequence[Item], all_items: Sequence[Item]) -> tuple[Item, ...]:
    """Carry each retried text again (a job's text sits on the first document of that text)."""
    texts = {item[0]: item[4] for item in all_items if item[4]}
    seen: set[str] = set()
    carried: list[Item] = []
    for cid, doc_id, digest, count, _ in items:
        carried.append((cid, doc_id, digest, count, texts.get(cid, "") if cid not in seen else ""))
        seen.add(cid)
    return tuple(carried)
