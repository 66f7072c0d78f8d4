"""The shard loop: read → screen → tokenize | embed → validate | write → mark, as three overlapping stages.

    reader thread ──prepared──► main thread (model) ──embedded──► writer thread (sink, then ledger)

Queues are bounded (`[run] queue_depth` shards), so memory is flat whatever the corpus size; the
writer marks a shard in the ledger only after the sink's write returned, in order (a recorder thread
commits it while the next shard is written), so the ledger always holds a contiguous prefix and a crash
redoes at most the shards in flight.
"""

from __future__ import annotations

import functools
import gc
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, NoReturn

import numpy as np

from reindex import crashpoints
from reindex.batching import batch_budget, batch_texts, padded_tokens, token_batches
from reindex.capabilities import CountsExactly, Metered
from reindex.columns import TokenColumns
from reindex.config import RunConfig
from reindex.errors import BudgetRefused, ConfigError, Interrupted
from reindex.ports import Embedder, Record, Rows, Sink, Source, TargetSpec, Vectors
from reindex.retry import retrying
from reindex.run.claims import ClaimBook, Claims, WindowClaims, run_wide
from reindex.run.copies import Copies, copy_rows
from reindex.run.cost import Budget, Spending
from reindex.run.feeding import Batch, Feeder
from reindex.run.io import _rows, scan_documents, slice, write_rows
from reindex.run.progress import Progress
from reindex.run.shards import (
    Copy,
    Pretokenized,
    Shard,
    finish_shard,
    keep_records,
    prepare_shard,
    text_settlements,
    unstorable,
)
from reindex.run.validation import vector_problems
from reindex.state.ledger import Ledger
from reindex.state.records import DeadLetter, ShardResult

Plan = tuple[TokenColumns, list[Batch]]  # a window's unique texts and the batches the model takes them in
# The model stage waits on the GIL whenever a CPU stage holds it: a short switch interval hands it back
# within 0.1 ms instead of 5 ms (measured on an H200: 5,141 -> 6,597 documents/s with the old core).
SWITCH_INTERVAL = 1e-4
# A shard's columns are lists and dicts by the thousand that reference counting frees (no cycles), so the
# cyclic collector's default first generation (700 allocations) only re-walks them: 5% of a run's wall time
# through an online endpoint, 0.25 s per 20,000 documents, all of it holding the GIL. A run raises it.
GC_THRESHOLD = 50_000
# How long a copy waits for the shard that claimed its text (in another lane or on another worker) to store
# it, polling at growing intervals up to COPY_POLL_MAX: past that it embeds the text itself, within the budget.
COPY_PATIENCE = 600.0
COPY_POLL_MAX = 1.0
_DONE = object()

__all__ = [
    "Copies",
    "Pipeline",
    "Progress",
    "Shard",
    "copy_rows",
    "prepare_shard",
    "retrying",
    "text_settlements",
    "write_rows",
]


class Pipeline:
    def __init__(
        self,
        *,
        source: Source,
        embedder: Embedder,
        sink: Sink,
        ledger: Ledger,
        spec: TargetSpec,
        plan_id: str,
        run: RunConfig,
        stop: threading.Event | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        budget: Spending | None = None,
        claims: Claims | None = None,
        worker: str | None = None,
        model_lock: threading.Lock | None = None,
        limit: int | None = None,
    ) -> None:
        """`claims`: where text claims live (default: this process's memory, see `ClaimBook`); `worker`:
        recorded with each shard (the ray engine's "node/actor"); `model_lock`: held for each model call,
        shared by pipelines that share the embedder (a ray actor's lanes); `limit`: read no shard after the
        one that reaches this many documents (plan's rehearsal)."""
        self.source, self.embedder, self.sink, self.ledger = source, embedder, sink, ledger
        self.spec, self.plan_id, self.config = spec, plan_id, run
        self.stop = stop or threading.Event()
        self.on_progress = on_progress or (lambda progress: None)
        self.progress = Progress()
        self.budget: Spending = budget or Budget(None, None)
        self._failed = threading.Event()
        self._failure: BaseException | None = None
        self._last_mark = time.monotonic()
        self._model = model_lock or threading.Lock()  # the writer re-embeds lost copies: one call at a time
        self._feeder = Feeder(embedder, retrying)
        # dedupe across the whole run (texts in the ledger) or the texts in flight here (reindex.run.claims)
        self._run_wide = run_wide(run, embedder)
        self._claims = claims or (ClaimBook(ledger, plan_id) if self._run_wide else WindowClaims(plan_id))
        self.worker = worker
        self.limit = limit
        if self.budget.max_usd is not None and isinstance(embedder, CountsExactly):
            embedder.count_tokens_exactly()  # the cap reserves each shard's tokens before sending it

    def run(self) -> Progress:
        """Process every shard after the ledger's resume point; raise Interrupted if stopped early."""
        interval, threshold = sys.getswitchinterval(), gc.get_threshold()
        sys.setswitchinterval(min(interval, SWITCH_INTERVAL))
        gc.set_threshold(max(threshold[0], GC_THRESHOLD), *threshold[1:])
        try:
            return self._run()
        finally:
            sys.setswitchinterval(interval)
            gc.set_threshold(*threshold)

    def _run(self) -> Progress:
        after, seq = self.ledger.resume_point(self.plan_id)
        self.ledger.release_claims(self.plan_id)  # claims of shards that died in flight
        prepared: queue.Queue[Any] = queue.Queue(self.config.queue_depth)
        embedded: queue.Queue[Any] = queue.Queue(self.config.queue_depth)
        threads = [
            threading.Thread(target=self._guard, args=(self._read, after, seq, prepared), daemon=True),
            threading.Thread(target=self._guard, args=(self._write_all, embedded), daemon=True),
        ]
        for thread in threads:
            thread.start()
        self._guard(self._embed_all, prepared, embedded)
        for thread in threads:
            thread.join()
        if self._failure is not None:
            raise self._failure
        if self.budget.exhausted:  # the reader claimed nothing more; what was in flight landed
            raise Interrupted(self.budget.message())
        if self.stop.is_set():
            raise Interrupted(
                f"stopped after {self.progress.documents} documents; rerun the same command to continue"
            )
        return self.progress

    def process(self, records: list[Record]) -> Shard:
        """Screen, embed and write records synchronously, outside the shard ledger (sync, dlq retry).

        The same path as a shard of the run: texts claimed run-wide, copies checked against what their
        owner stores, refused rows dead-lettered; the texts it claimed or took over are settled."""
        shard = self._prepare(0, None, records)
        self._embed([shard])
        self._store(shard)
        self._settle(shard)
        return shard

    def _settle(self, shard: Shard) -> None:
        """Outside a shard record (sync, dlq retry): the texts this shard claimed or took over."""
        owners = shard.claimed | shard.owners
        if self._run_wide:
            retrying(
                functools.partial(self.ledger.settle_texts, owners=owners),
                self.plan_id,
                text_settlements(shard),
            )
        else:
            self._claims.settle(text_settlements(shard), owners)
        self._claims.release(owners)

    def run_shard(
        self, seq: int, after: str | None, records: Sequence[Record], pretokenized: Pretokenized | None = None
    ) -> Shard | None:
        """One shard of a run, start to end in this thread: prepare, embed, write, record (the ray engine's
        actors call this for each shard the driver planned, with its texts hashed and tokenized by the read
        task that read it: `pretokenized`). None if the budget refuses its tokens: nothing is sent or
        recorded, and the texts it claimed stay claimed until a rerun releases them (as for a shard that
        died in flight; a shard that meets one meanwhile embeds that text itself, within the budget). None
        too if the budget refuses copies it must embed itself after it sent its own texts (`BudgetRefused`):
        it is not recorded, and what it stored is settled so that nobody pays for it again."""
        shard = self._prepare(seq, after, records, pretokenized)
        if not self.budget.allows(shard.token_count):
            return None
        shard.reserved = shard.token_count
        self._embed([shard], stoppable=False)
        crashpoints.crash_if_armed("after_embed")
        try:
            self._write(shard)
        except BudgetRefused:
            return None
        self._record(shard)
        return shard

    def _guard(self, stage: Callable[..., None], *args: Any) -> None:
        try:
            stage(*args)
        except BaseException as exc:
            if self._failure is None:
                self._failure = exc
            self._failed.set()

    def _put(self, channel: queue.Queue[Any], item: Any, *, force: bool = False) -> bool:
        """Hand `item` on; give up if a stage failed, or (unless forced) once a stop was requested."""
        while not self._failed.is_set() and (force or not self.stop.is_set()):
            try:
                channel.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _items(self, channel: queue.Queue[Any], *, until_stop: bool = False) -> Iterator[Any]:
        while not self._failed.is_set() and not (until_stop and self.stop.is_set()):
            try:
                item = channel.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is _DONE:
                return
            yield item

    # reader stage -------------------------------------------------------------------------------------

    def _read(self, after: str | None, seq: int, out: queue.Queue[Any]) -> None:
        read = 0
        for documents in scan_documents(self.source, after, self.config.shard_size):
            shard = self._prepare(seq, after, documents)
            if not self.budget.allows(shard.token_count):
                break  # over budget: claim nothing more; what is in flight still lands
            shard.reserved = shard.token_count
            if self._failed.is_set() or not self._put(out, shard):
                return
            after, seq = shard.last_cursor, seq + 1
            read += len(documents)
            if self.stop.is_set() or (self.limit is not None and read >= self.limit):
                break
        self._put(out, _DONE)

    def _prepare(
        self, seq: int, after: str | None, records: Sequence[Record], pretokenized: Pretokenized | None = None
    ) -> Shard:
        claim = functools.partial(retrying, self._claims.claim)
        return prepare_shard(self.embedder, self.config, seq, after, records, claim, pretokenized)

    # model stage --------------------------------------------------------------------------------------

    def _embed_all(self, source: queue.Queue[Any], out: queue.Queue[Any]) -> None:
        windows = self._windows(source)
        window, plan = next(windows, None), None
        while window is not None:
            following: list[tuple[list[Shard], Plan]] = []

            def ahead(following: list[tuple[list[Shard], Plan]] = following) -> Plan | None:
                """The next window when it is already queued (never waited for): its first call is launched
                before this window's last one is collected (`reindex.run.feeding`)."""
                if source.empty():
                    return None
                upcoming = next(windows, None)
                if upcoming is None:
                    return None
                following.append((upcoming, self._plan(upcoming)))
                return following[0][1]

            if self.stop.is_set() or not self._embed(window, plan=plan, ahead=ahead):
                break  # released: these shards are not in the ledger, so a rerun redoes them
            for shard in window:
                crashpoints.crash_if_armed("after_embed")
                if not self._put(out, shard, force=True):
                    self._feeder.abandon()
                    return
            window, plan = following[0] if following else (next(windows, None), None)
        self._feeder.abandon()
        self._put(out, _DONE, force=True)

    def _windows(self, source: queue.Queue[Any]) -> Iterator[list[Shard]]:
        """Consecutive shards sorted and batched together: the length-sorting window spans shards, so
        small shards still never put short and long texts in one padded batch. Bounded: memory stays flat."""
        size = max(1, -(-self.config.sort_window // self.config.shard_size))
        window: list[Shard] = []
        for shard in self._items(source, until_stop=True):
            window.append(shard)
            if len(window) >= size or source.empty():  # never leave the model idle waiting for a full window
                yield window
                window = []
        if window:
            yield window

    def _plan(self, window: list[Shard]) -> Plan:
        """The window's unique texts as one set of columns, and the batches the model takes them in."""
        tokens = TokenColumns.concat([shard.tokens for shard in window])
        budget = batch_budget(self.config, self.embedder), batch_texts(self.config, self.embedder)
        return tokens, token_batches(tokens.counts, *budget)

    def _embed(
        self,
        window: list[Shard],
        *,
        stoppable: bool = True,
        plan: Plan | None = None,
        ahead: Callable[[], Plan | None] | None = None,
    ) -> bool:
        """Embed the window's unique texts batch by batch; False if a stop request released it midway."""
        with self._model:
            return self._embed_locked(window, stoppable, plan or self._plan(window), ahead)

    def _embed_locked(
        self, window: list[Shard], stoppable: bool, plan: Plan, ahead: Callable[[], Plan | None] | None
    ) -> bool:
        dim = self.embedder.info.dim
        tokens, batches = plan
        lengths = tokens.counts
        unique = np.empty((len(lengths), dim), dtype=np.float32)
        started = time.monotonic()
        metered = self.embedder if isinstance(self.embedder, Metered) else None
        billed_before = metered.billed_tokens if metered is not None else 0
        problems: dict[int, str] = {}
        done = 0
        stopped = self.stop.is_set if stoppable else lambda: False
        documents, before = sum(shard.documents for shard in window), self.progress.embedding
        for batch, vectors, refused in self._feeder.calls(tokens, batches, stopped, ahead):
            unique[batch] = _checked(vectors, len(batch), dim, self.embedder)
            problems |= {int(batch[row]): reason for row, reason in refused.items()}
            done += 1
            self.progress.embedding = before + documents * done / len(batches)
        self.progress.embedding = before + documents  # a window with nothing to embed (all reused) too
        if done < len(batches):
            return False  # released by a stop request midway
        self.progress.model_seconds += time.monotonic() - started
        # Each call's own bill where its handles say (the next window's first call may already be billing),
        # else what the embedder billed meanwhile.
        billed = self._feeder.billed
        if billed is None:
            billed = (metered.billed_tokens if metered is not None else 0) - billed_before
        window[-1].billed_tokens += billed
        self.progress.padded_tokens += padded_tokens(lengths, batches)
        self.progress.tokens += billed if tokens.bounded else int(lengths.sum())
        problems = vector_problems(unique, dim) | problems
        offset = 0
        for shard in window:
            shard.counted_by_provider = tokens.bounded
            count = len(shard.tokens)
            mine = {i - offset: r for i, r in problems.items() if offset <= i < offset + count}
            finish_shard(shard, unique[offset : offset + count], mine, dim)
            self.progress.reused += len(shard.owner) - count
            offset += count
        return True

    # writer stage -------------------------------------------------------------------------------------

    def _write_all(self, source: queue.Queue[Any]) -> None:
        """Write shard after shard; each is recorded in the ledger by a recorder thread while the next one
        is written, in order, one record at a time. So a crash leaves at most two shards in the target that
        the ledger does not mark (the one being recorded and the one being written), and the ledger's
        commit never stalls the sink. A shard with copies waits for the record before it: its copies may
        name texts that shard settles (the ledger, not a claim, says their vector is stored)."""
        recording: Future[None] | None = None
        with ThreadPoolExecutor(1, thread_name_prefix="reindex-recorder") as recorder:
            try:
                for shard in self._items(source):
                    if shard.copies and recording is not None:
                        recording.result()
                    self._write(shard)
                    if recording is not None:
                        recording.result()
                    recording = recorder.submit(self._record, shard)
            finally:
                if recording is not None:
                    recording.result()

    def _write(self, shard: Shard) -> None:
        """Write the shard to the sink; it is recorded once written (see `_write_all`)."""
        assert shard.vectors is not None
        if crashpoints.armed("mid_write") and len(shard.records) > 1:
            rows = _rows(shard, self.spec.fingerprint)
            self.sink.write(self.spec.name, slice(rows, 0, len(rows.records) // 2))
            crashpoints.die()
        self._store(shard)
        crashpoints.crash_if_armed("after_write")

    def _record(self, shard: Shard) -> None:
        now = time.monotonic()
        texts, owners = text_settlements(shard), shard.claimed | shard.owners
        result = ShardResult(
            shard.seq,
            shard.after_cursor,
            shard.last_cursor,
            shard.documents,
            len(shard.written_ids),
            shard.dead,
            shard.duplicates,
            len(shard.owner) - len(shard.tokens) + len(shard.copied),
            shard.recorded_tokens,
            shard.truncated,
            now - self._last_mark,
            billed_tokens=shard.billed_tokens,
            # the claims were only in memory: written here, once; none where dedupe is windowed
            texts=texts if self._run_wide else (),
            owners=owners if self._run_wide else {},
            worker=self.worker,
        )
        self.budget.charge(shard.billed_tokens, reserved=shard.reserved)
        self._last_mark = now
        retrying(self.ledger.record_shard, self.plan_id, result)
        self._claims.settle(texts, owners)  # a windowed dedupe remembers them; the ledger has them otherwise
        self._claims.release(owners)
        self.progress.documents += shard.documents
        self.progress.written += len(shard.written_ids)
        self.progress.dead_letters += len(shard.dead)
        self.on_progress(self.progress)

    def _store(self, shard: Shard) -> None:
        """Write a shard's own rows, then its copies; every document ends written or dead-lettered."""
        assert shard.vectors is not None
        refused = self._write_rows(_rows(shard, self.spec.fingerprint))
        if refused:
            gone = {letter.doc_id for letter in refused}
            shard.unstorable |= unstorable(shard.records, shard.hashes, refused)
            keep_records(shard, [record.id not in gone for record in shard.records])
            shard.dead.extend(refused)
        lost: list[Copy] = []
        for copies in self._copies(shard.copies):
            shard.dead.extend(copies.dead)
            lost += copies.lost
            if copies.rows is not None:
                refused = self._write_rows(copies.rows)
                shard.dead.extend(refused)
                gone = {letter.doc_id for letter in refused}
                shard.copied += [record.id for record in copies.rows.records if record.id not in gone]
        self._embed_lost(shard, lost)

    def _copies(self, copies: list[Copy]) -> Iterator[Copies]:
        """The shard's copies as they become ready: at once when their owner stores their text (or the
        ledger says it died or is lost), later when the shard that claimed it is still in flight (another
        lane's, another worker's). Embedding those now would bill their texts twice, and without a
        reservation, past `max_cost_usd`: so they wait for the owner's write, polling. They stop waiting,
        and are embedded here within the budget, once the budget is exhausted (the owner's shard may be
        the one it refused, whose claims stay) or after COPY_PATIENCE seconds."""
        found = copy_rows(self._claims, self.sink, self.spec, self.plan_id, copies)
        deadline, pause = time.monotonic() + COPY_PATIENCE, 0.02
        while found.waiting and time.monotonic() < deadline and not self.budget.exhausted:
            yield replace(found, waiting=[])
            time.sleep(pause)
            pause = min(pause * 2, COPY_POLL_MAX)
            found = copy_rows(self._claims, self.sink, self.spec, self.plan_id, found.waiting)
        yield replace(found, waiting=[], lost=found.lost + found.waiting)

    def _embed_lost(self, shard: Shard, lost: list[Copy]) -> None:
        """Copies whose owner no longer stores their text's vector: embed them here and take the text over,
        within the budget (`_refuse` when it says no)."""
        if not lost:
            return
        extra = prepare_shard(self.embedder, self.config, shard.seq, None, [record for record, _, _ in lost])
        if not self.budget.allows(extra.token_count):
            self._refuse(shard)
        shard.reserved += extra.token_count
        self._embed([extra], stoppable=False)
        assert extra.vectors is not None
        refused = self._write_rows(_rows(extra, self.spec.fingerprint))
        gone = {letter.doc_id for letter in refused}
        shard.unstorable |= unstorable(extra.records, extra.hashes, refused)
        keep_records(extra, [record.id not in gone for record in extra.records])
        extra.dead.extend(refused)
        shard.dead.extend(extra.dead)
        shard.copied += [record.id for record in extra.records]
        shard.billed_tokens += extra.billed_tokens
        shard.truncated += extra.truncated
        for record, digest in zip(extra.records, extra.hashes, strict=True):
            shard.owners.setdefault(digest, record.id)
            shard.settled[digest] = "written"
        for letter in extra.dead:
            if letter.content_hash and letter.content_hash not in shard.settled:
                shard.owners.setdefault(letter.content_hash, letter.doc_id)
                shard.settled[letter.content_hash] = f"dead:{letter.reason}"

    def _refuse(self, shard: Shard) -> NoReturn:
        """The budget refused copies `shard` must embed itself, after it sent its own texts: it stops
        unrecorded (a rerun does it). What it was billed is charged, and the texts it stored are settled, so
        that other shards copy them and the rerun finds them stored (its documents copy their own vectors)
        rather than paying for them again."""
        self.budget.charge(shard.billed_tokens, reserved=shard.reserved)
        owners = shard.claimed | shard.owners
        retrying(
            functools.partial(self.ledger.settle_texts, owners=owners), self.plan_id, text_settlements(shard)
        )
        self._claims.release(owners)
        raise BudgetRefused(self.budget.message())

    def _write_rows(self, rows: Rows) -> list[DeadLetter]:
        return write_rows(self.sink, self.spec.name, rows)


def _checked(vectors: Vectors, rows: int, dim: int, embedder: Any) -> Vectors:
    """The model's output must be (rows, dim) floats: anything else is a misconfiguration, not a bad text."""
    shape = vectors.shape if isinstance(vectors, np.ndarray) else None
    dtype = vectors.dtype if isinstance(vectors, np.ndarray) else None
    if shape != (rows, dim) or dtype is None or not np.issubdtype(dtype, np.floating):
        name = embedder.info.model
        raise ConfigError(
            f"{name} returned {dtype} vectors of shape {shape} for {rows} texts; the target expects ({rows}, {dim})",
            hint="check [embedder] dim / dimensions against the model's output",
        )
    return vectors
