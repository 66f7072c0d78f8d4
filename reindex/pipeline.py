"""The shard loop: read → screen → tokenize | embed → validate | write → mark, as three overlapping stages.

    reader thread ──prepared──► main thread (model) ──embedded──► writer thread (sink, then ledger)

Queues are bounded (`[run] queue_depth` shards), so memory is flat whatever the corpus size; the
writer records a shard in the ledger only after the sink's write returned, in order, so the ledger
always holds a contiguous prefix and a crash redoes at most the shards in flight.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import stamina

from reindex import crashpoints
from reindex.batching import chunks, padded_tokens, token_batches
from reindex.config import RunConfig
from reindex.cost import Budget
from reindex.errors import Interrupted, TransientError
from reindex.ledger import DeadLetter, Ledger, ShardResult
from reindex.ports import DeferredEmbedder, Embedder, Record, Rows, Sink, Source, TargetSpec, Tokens, Vectors
from reindex.validation import screen, vector_dead_letters

T = TypeVar("T")
Claim = Callable[
    [dict[str, str]], dict[str, tuple[str, str]]
]  # {hash: doc} -> {hash: (owner, state)} elsewhere
_DONE = object()


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
    copies: list[tuple[Record, str, str]] = field(default_factory=list)  # (record, hash, owner doc elsewhere)
    claimed: set[str] = field(default_factory=set)  # texts this shard embeds for the whole run


@dataclass
class Progress:
    documents: int = 0
    written: int = 0
    dead_letters: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    reused: int = 0
    model_seconds: float = 0.0
    started: float = field(default_factory=time.monotonic)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started


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
        budget: Budget | None = None,
    ) -> None:
        self.source, self.embedder, self.sink, self.ledger = source, embedder, sink, ledger
        self.spec, self.plan_id, self.config = spec, plan_id, run
        self.stop = stop or threading.Event()
        self.on_progress = on_progress or (lambda progress: None)
        self.progress = Progress()
        self.budget = budget or Budget(None, None)
        self._failed = threading.Event()
        self._failure: BaseException | None = None
        self._last_mark = time.monotonic()

    def run(self) -> Progress:
        """Process every shard after the ledger's resume point; raise Interrupted if stopped early."""
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
        if self.stop.is_set():
            raise Interrupted(
                f"stopped after {self.progress.documents} documents; rerun the same command to continue"
            )
        return self.progress

    def process(self, records: list[Record]) -> Shard:
        """Screen, embed and write one batch of records synchronously, outside the shard ledger (retries)."""
        shard = self._prepare(0, None, records)
        self._embed([shard])
        assert shard.vectors is not None
        if shard.records:
            _retrying(
                self.sink.write,
                self.spec.name,
                Rows(shard.records, shard.vectors, shard.hashes, self.spec.fingerprint),
            )
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
        for records in chunks(self.source.scan(after), self.config.shard_size):
            shard = self._prepare(seq, after, records)
            if not self.budget.allows(sum(t.count for t in shard.tokens)):
                break  # over budget: claim nothing more; what is in flight still lands
            if self._failed.is_set() or not self._put(out, shard):
                return
            after, seq = records[-1].position, seq + 1
            if self.stop.is_set():
                break
        self._put(out, _DONE)

    def _prepare(self, seq: int, after: str | None, records: list[Record]) -> Shard:
        claim = functools.partial(self.ledger.claim_texts, self.plan_id)
        return prepare_shard(self.embedder, self.config, seq, after, records, claim)

    # model stage --------------------------------------------------------------------------------------

    def _embed_all(self, source: queue.Queue[Any], out: queue.Queue[Any]) -> None:
        for window in self._windows(source):
            if self.stop.is_set() or not self._embed(window):
                break  # released: these shards are not in the ledger, so a rerun redoes them
            for shard in window:
                crashpoints.crash_if_armed("after_embed")
                if not self._put(out, shard, force=True):
                    return
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

    def _embed(self, window: list[Shard]) -> bool:
        """Embed the window's unique texts batch by batch; False if a stop request released it midway."""
        dim = self.embedder.info.dim
        tokens = [t for shard in window for t in shard.tokens]
        lengths = [t.count for t in tokens]
        batches = token_batches(lengths, batch_budget(self.config, self.embedder), self.config.max_batch)
        unique = np.empty((len(lengths), dim), dtype=np.float32)
        started = time.monotonic()
        billed_before = getattr(self.embedder, "billed_tokens", 0)
        rejected: dict[int, str] = {}
        for batch in batches:
            if self.stop.is_set():
                return False
            vectors = _retrying(self.embedder.embed, [tokens[i] for i in batch])
            unique[batch] = vectors if vectors.shape == (len(batch), dim) else np.nan
            for row, reason in _rejections(self.embedder).items():
                rejected[batch[row]] = reason
        self.progress.model_seconds += time.monotonic() - started
        window[-1].billed_tokens = getattr(self.embedder, "billed_tokens", 0) - billed_before
        self.progress.padded_tokens += padded_tokens(lengths, batches)
        self.progress.tokens += sum(lengths)
        reasons: list[str | None] = vector_dead_letters(unique, dim) if lengths else []
        for index, reason in rejected.items():
            reasons[index] = reason
        offset = 0
        for shard in window:
            count = len(shard.tokens)
            _finish(shard, unique[offset : offset + count], reasons[offset : offset + count], dim)
            self.progress.reused += len(shard.owner) - count
            offset += count
        return True

    # writer stage -------------------------------------------------------------------------------------

    def _write_all(self, source: queue.Queue[Any]) -> None:
        for shard in self._items(source):
            self._write(shard)

    def _write(self, shard: Shard) -> None:
        assert shard.vectors is not None
        rows = Rows(shard.records, shard.vectors, shard.hashes, self.spec.fingerprint)
        if crashpoints.armed("mid_write") and len(rows.records) > 1:
            half = len(rows.records) // 2
            self.sink.write(self.spec.name, _slice(rows, half))
            crashpoints.die()
        if rows.records:
            _retrying(self.sink.write, self.spec.name, rows)
        copied, copy_dead, _ = copy_rows(self.ledger, self.sink, self.spec, self.plan_id, shard.copies)
        if copied is not None:
            _retrying(self.sink.write, self.spec.name, copied)
        shard.dead.extend(copy_dead)
        reused = len(copied.records) if copied is not None else 0
        crashpoints.crash_if_armed("after_write")
        now = time.monotonic()
        result = ShardResult(
            shard.seq,
            shard.after_cursor,
            shard.last_cursor,
            shard.documents,
            len(shard.records) + reused,
            shard.dead,
            shard.duplicates,
            len(shard.owner) - len(shard.tokens) + reused,
            sum(t.count for t in shard.tokens),
            shard.truncated,
            now - self._last_mark,
            billed_tokens=shard.billed_tokens,
            texts=text_settlements(shard),
        )
        self.budget.charge(shard.billed_tokens, reserved=sum(t.count for t in shard.tokens))
        self._last_mark = now
        _retrying(self.ledger.record_shard, self.plan_id, result)
        self.progress.documents += shard.documents
        self.progress.written += len(shard.records) + reused
        self.progress.dead_letters += len(shard.dead)
        self.on_progress(self.progress)


def prepare_shard(
    embedder: Embedder | DeferredEmbedder,
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
        records[-1].position,
        len(records),
        kept,
        hashes,
        owner,
        embedder.tokenize(texts),
        screened.dead,
        screened.duplicates,
        copies=copies,
        claimed=claimed,
    )
    _apply_length_policy(shard, run.too_long, embedder.info.max_tokens)
    return shard


def _claim(
    records: list[Record], hashes: list[str], claim: Claim | None
) -> tuple[list[Record], list[str], list[tuple[Record, str, str]], set[str]]:
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


def copy_rows(
    ledger: Ledger, sink: Sink, spec: TargetSpec, plan_id: str, copies: Sequence[tuple[Record, str, str]]
) -> tuple[Rows | None, list[DeadLetter], bool]:
    """Vectors for documents whose text another document carries: (rows, dead letters, still waiting)."""
    if not copies:
        return None, [], False
    states = ledger.text_states(plan_id, [digest for _, digest, _ in copies])
    if any(states.get(digest, ("", ""))[1] == "claimed" for _, digest, _ in copies):
        return None, [], True
    stored = sink.fetch(spec.name, sorted({owner for _, _, owner in copies}))
    ready = [(r, h, o) for r, h, o in copies if states.get(h, ("", ""))[1] == "written" and o in stored]
    dead = []
    for record, digest, owner in copies:
        state = states.get(digest, ("", ""))[1]
        if (record, digest, owner) not in ready:
            reason = state[5:] if state.startswith("dead:") else "duplicate_source_lost"
            dead.append(DeadLetter(record.id, reason, f"same text as {owner}", digest))
    if not ready:
        return None, dead, False
    vectors = np.stack([stored[owner] for _, _, owner in ready]).astype(np.float32)
    return Rows([r for r, _, _ in ready], vectors, [h for _, h, _ in ready], spec.fingerprint), dead, False


def text_settlements(shard: Shard) -> list[tuple[str, str]]:
    """What became of each text this shard claimed: written, or dead with the reason."""
    written = set(shard.hashes)
    settled = [(digest, "written") for digest in shard.claimed if digest in written]
    reasons = {letter.content_hash: letter.reason for letter in shard.dead if letter.content_hash}
    settled += [
        (digest, f"dead:{reasons.get(digest, 'unknown')}")
        for digest in shard.claimed
        if digest not in written
    ]
    return settled


def _apply_length_policy(shard: Shard, policy: str, limit: int) -> None:
    over = {i for i, tokens in enumerate(shard.tokens) if tokens.is_truncated}
    if policy == "truncate" or not over:
        shard.truncated = sum(1 for i in shard.owner if i in over)
        return
    for record, digest, index in zip(shard.records, shard.hashes, shard.owner, strict=True):
        if index in over:
            detail = f"{shard.tokens[index].original_count} tokens > {limit}"
            shard.dead.append(DeadLetter(record.id, "too_long", detail, digest))
    _keep(shard, [index not in over for index in shard.owner])


def batch_budget(run: RunConfig, embedder: Any) -> int:
    """Padded tokens per model call: `[run] batch_tokens`, else what the embedder suits (CPU small, GPU large)."""
    return int(run.batch_tokens or getattr(embedder, "batch_tokens", None) or 4096)


def _finish(shard: Shard, unique: Vectors, reasons: Sequence[str | None], dim: int) -> None:
    """Give each record its text's vector, dead-lettering those whose vector came back unusable."""
    for record, digest, index in zip(shard.records, shard.hashes, shard.owner, strict=True):
        if reasons[index]:
            shard.dead.append(DeadLetter(record.id, str(reasons[index]), "embedder output", digest))
    keep = [reasons[index] is None for index in shard.owner]
    shard.vectors = unique[shard.owner] if shard.owner else np.empty((0, dim), dtype=np.float32)
    _keep(shard, keep)


def _rejections(embedder: Any) -> dict[int, str]:
    """Rows of the last `embed` call a provider refused ({row: "provider_rejected:<code>"}), if it says."""
    last = getattr(embedder, "last_rejections", None)
    return dict(last()) if callable(last) else {}


def _retrying(function: Callable[..., T], *args: Any) -> T:
    """The one retry policy: jittered exponential backoff on TransientError, bounded in attempts and time."""
    for attempt in stamina.retry_context(on=TransientError, attempts=6, timeout=120.0):
        with attempt:
            return function(*args)
    raise AssertionError("unreachable: stamina re-raises the last error")


def _keep(shard: Shard, keep: Sequence[bool]) -> None:
    """Drop dead-lettered records from a shard, keeping vectors aligned if present."""
    if all(keep):
        return
    shard.records = [r for r, k in zip(shard.records, keep, strict=True) if k]
    shard.hashes = [h for h, k in zip(shard.hashes, keep, strict=True) if k]
    shard.owner = [o for o, k in zip(shard.owner, keep, strict=True) if k]
    if shard.vectors is not None:
        shard.vectors = shard.vectors[np.asarray(keep, dtype=bool)]


def _slice(rows: Rows, end: int) -> Rows:
    return Rows(rows.records[:end], rows.vectors[:end], rows.content_hashes[:end], rows.fingerprint)
