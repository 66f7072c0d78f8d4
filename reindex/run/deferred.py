"""The deferred path: each shard becomes a provider batch job; jobs are collected as they finish, in any order.

    scan → shard → Job(intent) ─submit(key)→ Job(submitted) ─poll→ write vectors → Job(applied)
         → release files → Job(released) → every job of the shard released, its copies written → shard recorded

Every step is a ledger state written before the next side effect, and the job key is deterministic
(`<plan>-<nonce>-<seq>-<attempt>`), so a crash anywhere, even between the provider creating a batch and the
ledger learning its id, is recovered by submitting the same key again: the embedder adopts the job. The
run's nonce is made anew by `run --fresh`: the batches of a forgotten run are never adopted.

The ledger holds no document text: an item is (custom_id, doc_id, content_hash, tokens). Whenever lines go
out again (a later attempt, an intent recovered after a crash, stragglers sent online, copies taken over),
the documents are re-read from the source by id and screened again. A document gone from the source counts
as vanished; one whose text changed is embedded under its new hash with a new custom_id, so a batch adopted
by key can never hand the old text's vector to the new hash.

A line that fails is dead-lettered `provider_rejected:<code>` at once when the provider refused the input
(a code outside RETRYABLE) and the line was sent alone (attempts after the first send one input per request,
so a poison input never condemns the inputs that shared its request); a retryable failure is sent again
until the line has gone out `provider_attempts` times.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from reindex import crashpoints
from reindex.config import RunConfig
from reindex.errors import ConfigError, Interrupted
from reindex.fingerprint import text_hash
from reindex.ports import (
    ONLINE,
    DeferredEmbedder,
    EmbedsStragglers,
    JobItem,
    JobResult,
    RecallsItems,
    Record,
    Rows,
    Sink,
    Source,
    TargetSpec,
    Tokens,
    Vectors,
)
from reindex.retry import retrying
from reindex.run.copies import copy_rows
from reindex.run.cost import Budget
from reindex.run.io import scan_documents, write_rows
from reindex.run.pipeline import Progress
from reindex.run.shards import Copy, prepare_shard
from reindex.run.validation import vector_dead_letters
from reindex.state.ledger import Ledger
from reindex.state.records import DeadLetter, Job, ShardResult

Item = tuple[str, str, str, int]  # custom_id, doc_id, content_hash, tokens
# JobResult.failed codes worth sending again; any other code is the provider refusing the input itself.
RETRYABLE = frozenset(
    {
        "batch_expired",  # the 24 h window closed first
        "batch_cancelled",
        "batch_failed",  # `batch_failed:<code>`: the batch failed validation and never ran
        "batch_error",  # an error line without a code
        "request_timeout",
        "rate_limit_exceeded",  # a 429 line
        "server_error",  # a 5xx/408/409 line
        "missing_output",
        "malformed_output",
        "output_deleted",
    }
)


def is_retryable(code: str) -> bool:
    return code.split(":", 1)[0] in RETRYABLE


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
        self._keys = {(job.seq, job.attempt): job.key for job in self.jobs.values()}

    def run(self) -> Progress:
        """Submit shards up to `max_open_jobs`, collect finished jobs, until the source is exhausted."""
        self._recover()
        after, seq = self._resume_point()
        shards = scan_documents(self.source, after, self.config.shard_size)
        exhausted, wait = False, self.config.poll_seconds
        while True:
            while not exhausted and len(self._open()) < self.config.max_open_jobs and not self.stop.is_set():
                docs = next(shards, None)
                if docs is None or not self._open_shard(seq, after, docs):
                    exhausted = True
                    break
                after, seq = docs.last_position, seq + 1
            if not self._open():
                break
            if self.stop.is_set():
                raise Interrupted("stopped; provider jobs keep running and a rerun collects them")
            finished = self._collect()
            wait = self.config.poll_seconds if finished else min(wait * 2, self.config.poll_max_seconds)
            if self._open():
                self.stop.wait(wait)
        if self.budget.exhausted:
            raise Interrupted(self.budget.message())
        return self.progress

    # submitting --------------------------------------------------------------------------------------

    def _open_shard(self, seq: int, after: str | None, records: Sequence[Record]) -> bool:
        """Turn a shard into a job intent and submit it; False (and nothing recorded) if over budget."""
        claim = functools.partial(retrying, self.ledger.claim_texts, self.plan_id)
        shard = prepare_shard(self.embedder, self.config, seq, after, records, claim)
        if not self.budget.allows(shard.token_count):
            retrying(functools.partial(self.ledger.release_claims, self.plan_id, keep_owners=self._owners()))
            return False
        items = tuple(
            (f"{seq}-{index}", record.id, digest, shard.tokens[index].count)
            for record, digest, index in zip(shard.records, shard.hashes, shard.owner, strict=True)
        )
        copies = tuple((record.id, digest, owner) for record, digest, owner in shard.copies)
        job = Job(self._key(seq, 0), seq, 0, "intent", None, after, shard.last_cursor, items)
        job = replace(job, documents=shard.documents, duplicates=shard.duplicates, copies=copies)
        self._save(replace(job, truncated=shard.truncated, dead=tuple(shard.dead)))
        claimed = [(d.content_hash, d.reason) for d in shard.dead if d.content_hash in shard.claimed]
        self._settle_texts({digest: f"dead:{reason}" for digest, reason in claimed if digest})
        crashpoints.crash_if_armed("job_after_intent")
        if items:
            self._submit(self.jobs[job.key], {f"{seq}-{i}": t for i, t in enumerate(shard.tokens)})
        else:
            self._settle(seq)
        return True

    def _send(self, job: Job) -> None:
        """Send lines again: through the online endpoint when the embedder offers it, else as a new batch."""
        self._save(job)
        if self.embedder.traits.stragglers_online and isinstance(self.embedder, EmbedsStragglers):
            self._save(replace(job, state="submitted", job_id=ONLINE))  # collected on the next poll
        else:
            self._submit(job)

    def _submit(self, job: Job, tokens: Mapping[str, Tokens] | None = None) -> None:
        """Create the provider job for an intent (or adopt the one a crash left behind)."""
        if tokens is None:  # texts are not kept: read them again
            job, tokens = self._refresh(job)
            if not job.items:
                self._save(replace(job, state="released", job_id=ONLINE))
                self._settle(job.seq)
                return
        payload = [JobItem(custom_id, tokens[custom_id]) for custom_id in _custom_ids(job)]
        job_id = retrying(functools.partial(self.embedder.submit, isolate=job.attempt > 0), job.key, payload)
        crashpoints.crash_if_armed("job_after_create")
        self._save(replace(job, state="submitted", job_id=job_id))

    def _refresh(self, job: Job) -> tuple[Job, dict[str, Tokens]]:
        """Re-read and re-screen a job's documents: vanished and now-dead ones leave it, changed ones get
        their new hash under a new custom_id. Returns the job as saved and each custom_id's tokens."""
        ids = [item[1] for item in job.items]
        records = self._fetch(job, ids)
        shard = prepare_shard(self.embedder, self.config, job.seq, None, records)
        current = {
            record.id: (digest, shard.tokens[index])
            for record, digest, index in zip(shard.records, shard.hashes, shard.owner, strict=True)
        }
        items: list[Item] = []
        tokens: dict[str, Tokens] = {}
        for custom_id, doc_id, digest, _ in job.items:
            if doc_id in current:
                now, text_tokens = current[doc_id]
                custom_id = custom_id if now == digest else _text_id(job.seq, now)
                items.append((custom_id, doc_id, now, text_tokens.count))
                tokens.setdefault(custom_id, text_tokens)
        vanished = len(set(ids) - {record.id for record in records})
        dead = job.dead + tuple(shard.dead)
        refreshed = replace(job, items=tuple(items), dead=dead, vanished=job.vanished + vanished)
        if refreshed != job:
            left = {item[2] for item in job.items} - {item[2] for item in items}
            self._settle_texts(dict.fromkeys(left & self._claimed(job.seq), "dead:unknown"))  # nobody's now
            self._save(refreshed)
        return refreshed, tokens

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
                job, result = self._stragglers(job)
            else:
                job_id = str(job.job_id)
                if isinstance(self.embedder, RecallsItems):  # a job this process may not have submitted
                    self.embedder.recall(job_id, _recalled(job))
                result = retrying(self.embedder.poll, job_id)
            if result.is_terminal:
                self._apply(job, result)
                finished = True
        return finished

    def _stragglers(self, job: Job) -> tuple[Job, JobResult]:
        """Lines sent through the provider's online endpoint now instead of waiting on another batch."""
        job, tokens = self._refresh(job)
        items = [JobItem(custom_id, tokens[custom_id]) for custom_id in _custom_ids(job)]
        if not items:
            return job, JobResult(ONLINE, True)
        assert isinstance(self.embedder, EmbedsStragglers)
        embed = self.embedder.embed_stragglers
        result: JobResult = retrying(embed, items)
        return job, result

    def _apply(self, job: Job, result: JobResult) -> None:
        """Write what finished, send again what may still succeed, dead-letter what the provider refused."""
        if "wrong_dimension" in result.failed.values():
            raise ConfigError(
                f"the provider returned vectors of another size than {self.spec.dim} for job {job.key}",
                hint="check dim / dimensions in [embedder]",
            )
        written, dead, vanished = self._write(job, result.vectors)
        again, refused = self._failed_lines(job, result)
        dead += refused
        self._settle_texts(*_text_states(job.items, written, dead, again, self._claimed(job.seq)))
        crashpoints.crash_if_armed("job_after_write")
        if again and self._job(job.seq, job.attempt + 1) is None:
            key = self._key(job.seq, job.attempt + 1)
            self._send(
                Job(key, job.seq, job.attempt + 1, "intent", None, job.after_cursor, job.last_cursor, again)
            )
        self.budget.charge(result.billed_tokens)
        applied = replace(
            job,
            state="applied",
            written=len(written),
            billed_tokens=result.billed_tokens,
            dead=job.dead + tuple(dead),
            vanished=job.vanished + vanished,
        )
        self._save(applied)
        crashpoints.crash_if_armed("job_after_apply")
        self._release(applied)

    def _failed_lines(self, job: Job, result: JobResult) -> tuple[tuple[Item, ...], list[DeadLetter]]:
        """Split the lines without a vector into (send again, dead letters)."""
        chain = [j for j in self.jobs.values() if j.seq == job.seq and j.attempt <= job.attempt]
        sent = Counter(custom_id for j in chain for custom_id in _custom_ids(j))
        alone = job.attempt > 0 or job.job_id == ONLINE
        again: list[Item] = []
        dead: list[DeadLetter] = []
        for item in (item for item in job.items if item[0] not in result.vectors):
            code = result.failed.get(item[0], "missing_output")
            retryable = is_retryable(code)
            if (retryable and sent[item[0]] < self.config.provider_attempts) or (not retryable and not alone):
                again.append(item)
            else:
                detail = f"sent {sent[item[0]]} times" if retryable else "refused when sent alone"
                dead.append(DeadLetter(item[1], f"provider_rejected:{code}", detail, item[2]))
        return tuple(again), dead

    def _write(self, job: Job, vectors: Mapping[str, Vectors]) -> tuple[list[Item], list[DeadLetter], int]:
        """Write finished lines under the hash of the text that was embedded: (written, dead, vanished)."""
        wanted = [item for item in job.items if item[0] in vectors]
        fetched = {r.id: r for r in self._fetch(job, [item[1] for item in wanted])}
        present = [item for item in wanted if item[1] in fetched]
        if not present:
            return [], [], len(wanted)
        matrix = np.stack([np.asarray(vectors[item[0]], dtype=np.float32) for item in present])
        reasons = vector_dead_letters(matrix, self.spec.dim)
        dead = [
            DeadLetter(item[1], str(reason), "provider output", item[2])
            for item, reason in zip(present, reasons, strict=True)
            if reason
        ]
        keep = np.asarray([reason is None for reason in reasons])
        kept = [item for item, ok in zip(present, keep, strict=True) if ok]
        records = [fetched[item[1]] for item in kept]
        rows = Rows(records, matrix[keep], [item[2] for item in kept], self.spec.fingerprint)
        refused = write_rows(self.sink, self.spec.name, rows)
        gone = {letter.doc_id for letter in refused}
        kept = [item for item in kept if item[1] not in gone]
        self.progress.written += len(kept)
        self.progress.tokens += sum(item[3] for item in kept)
        self.on_progress(self.progress)
        return kept, dead + refused, len(wanted) - len(present)

    def _release(self, job: Job) -> None:
        assert job.job_id is not None
        if job.job_id != ONLINE:
            retrying(self.embedder.release, job.job_id)
        self._save(replace(job, state="released"))
        self._settle(job.seq)

    # settling a shard --------------------------------------------------------------------------------

    def _settle(self, seq: int) -> None:
        """Record the shard once every job of it is released and its copies are written (or dead): its
        counts span all attempts. Copies whose owner no longer stores their text are taken over first."""
        chain = [j for j in self.jobs.values() if j.seq == seq]
        first = next(j for j in chain if j.attempt == 0)
        if first.state == "settled" or any(j in self._in_flight() for j in chain):
            return
        copies, lost, gone = self._pending_copies(chain)
        found = copy_rows(self.ledger, self.sink, self.spec, self.plan_id, copies)
        if lost or found.lost:
            attempt = max(j.attempt for j in chain) + 1
            taken = lost + found.lost
            items = tuple(_item(seq, record, text_hash(record) or digest) for record, digest, _ in taken)
            key = self._key(seq, attempt)
            job = Job(key, seq, attempt, "intent", None, first.after_cursor, first.last_cursor, items)
            self._send(
                replace(job, copies=tuple((record.id, digest, owner) for record, digest, owner in taken))
            )
            return
        if found.waiting:
            return  # another shard still embeds their text: try again on a later poll
        refused = write_rows(self.sink, self.spec.name, found.rows) if found.rows is not None else []
        reused = len(found.rows.records) - len(refused) if found.rows is not None else 0
        dead = [letter for j in chain for letter in j.dead] + found.dead + refused
        cids = [item[0] for item in first.items]
        result = ShardResult(
            seq,
            first.after_cursor,
            first.last_cursor,
            first.documents,
            sum(j.written for j in chain) + reused,
            dead,
            first.duplicates,
            len(cids) - len(set(cids)) + reused,
            sum(item[3] for item in first.items),
            first.truncated,
            0.0,
            billed_tokens=sum(j.billed_tokens for j in chain),
            vanished=sum(j.vanished for j in chain) + gone,
        )
        retrying(self.ledger.record_shard, self.plan_id, result)
        self._save(replace(first, state="settled"))
        self.progress.documents += first.documents
        self.progress.written += reused
        self.progress.dead_letters += len(dead)
        self.on_progress(self.progress)

    def _pending_copies(self, chain: list[Job]) -> tuple[list[Copy], list[Copy], int]:
        """The shard's copies not yet taken over, re-read: (unchanged, changed since the scan, vanished)."""
        first = next(j for j in chain if j.attempt == 0)
        taken = {copy[0] for j in chain if j.attempt > 0 for copy in j.copies}
        pending = [copy for copy in first.copies if copy[0] not in taken]
        fetched = {r.id: r for r in self._fetch(first, [doc_id for doc_id, _, _ in pending])}
        present = [(fetched[d], h, o) for d, h, o in pending if d in fetched]
        changed = [copy for copy in present if text_hash(copy[0]) != copy[1]]
        unchanged = [copy for copy in present if copy not in changed]
        return unchanged, changed, len(pending) - len(present)

    def _fetch(self, job: Job, ids: Sequence[str]) -> list[Record]:
        """The documents with these ids as the source holds them now, read from the job's shard: one read of
        its range (a file has no index by id: fetching by id reads the whole file, once per job), then by
        id for any not found there (the source changed under the range)."""
        first = self.jobs.get(self._keys.get((job.seq, 0), ""))
        if not ids or first is None or not first.documents:
            return _fetch_by_id(self.source, ids)
        wanted = set(ids)
        docs = next(scan_documents(self.source, first.after_cursor, first.documents), None)
        records = [] if docs is None else list(docs.take([i for i, d in enumerate(docs.ids) if d in wanted]))
        missing = wanted - {record.id for record in records}
        return records + _fetch_by_id(self.source, sorted(missing))

    # recovery and bookkeeping ------------------------------------------------------------------------

    def _recover(self) -> None:
        """Finish what a crash interrupted: submit intents (adopting existing jobs), release applied ones."""
        retrying(functools.partial(self.ledger.release_claims, self.plan_id, keep_owners=self._owners()))
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

    def _claimed(self, seq: int) -> set[str]:
        """The texts this shard claimed for the run (its first job's); only it may give them up."""
        first = self._job(seq, 0)
        assert first is not None, f"shard {seq} has no first job"
        return {item[2] for item in first.items}

    def _key(self, seq: int, attempt: int) -> str:
        """The job's key, which the provider keeps with the batch: the same after a crash, so the batch is
        adopted, never sent twice; another after `run --fresh` (a new nonce), so a batch of the forgotten
        run, built from the texts of its day, is never adopted for today's texts."""
        return f"{self.plan_id}-{self.spec.nonce[:8]}-{seq}-{attempt}"

    def _job(self, seq: int, attempt: int) -> Job | None:
        key = self._keys.get((seq, attempt))
        return self.jobs[key] if key is not None else None

    def _owners(self) -> list[str]:
        return [item[1] for job in self._in_flight() for item in job.items]

    def _settle_texts(self, states: Mapping[str, str], owners: Mapping[str, str] | None = None) -> None:
        pairs = [(digest, state) for digest, state in states.items() if digest]
        if pairs or owners:
            retrying(functools.partial(self.ledger.settle_texts, self.plan_id, pairs, owners=owners or None))

    def _save(self, job: Job) -> None:
        retrying(self.ledger.record_job, self.plan_id, job)
        self.jobs[job.key] = job
        self._keys[(job.seq, job.attempt)] = job.key


def _text_states(
    items: Sequence[Item],
    written: Sequence[Item],
    dead: Sequence[DeadLetter],
    again: Sequence[Item],
    claimed: set[str],
) -> tuple[dict[str, str], dict[str, str]]:
    """What became of each text of a job: written (and which document now carries it); for the texts the
    shard claimed also dead with the reason, or nobody's any more (its documents vanished: `dead:unknown`,
    which copies treat as lost and embed themselves). Pending texts stay claimed."""
    owners: dict[str, str] = {}
    for _, doc_id, digest, _ in written:
        owners.setdefault(digest, doc_id)
    reasons = {letter.content_hash: letter.reason for letter in dead if letter.content_hash}
    pending = {item[2] for item in again}
    states: dict[str, str] = {}
    for digest in dict.fromkeys(item[2] for item in items):
        if digest in owners:
            states[digest] = "written"
        elif digest not in pending and digest in claimed:
            states[digest] = f"dead:{reasons.get(digest, 'unknown')}"
    return states, owners


def _item(seq: int, record: Record, digest: str) -> Item:
    """An item added after the shard's first job (a copy taken over): its custom_id names its text."""
    return (_text_id(seq, digest), record.id, digest, 0)  # tokens are counted when it is sent


def _text_id(seq: int, digest: str) -> str:
    """The custom_id of a text that joined a shard's jobs after the first (changed, or taken over)."""
    return f"{seq}-{digest[:16]}"


def _custom_ids(job: Job) -> list[str]:
    return list(dict.fromkeys(item[0] for item in job.items))


def _recalled(job: Job) -> list[tuple[str, int]]:
    """(custom id, tokens) of the job's items, in the order `submit` was given them (`_custom_ids`)."""
    tokens = {custom_id: count for custom_id, _, _, count in job.items}
    return [(custom_id, tokens[custom_id]) for custom_id in _custom_ids(job)]


def _fetch_by_id(source: Source, ids: Sequence[str]) -> list[Record]:
    return retrying(lambda: list(source.fetch(ids))) if ids else []


def _slice(rows: Rows, start: int, end: int) -> Rows:
    return Rows(
        rows.records[start:end], rows.vectors[start:end], rows.content_hashes[start:end], rows.fingerprint
    )
