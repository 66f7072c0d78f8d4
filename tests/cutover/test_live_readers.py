"""Cutover under live readers: while the alias flips back and forth, no reader errors or sees two versions."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector
from qdrant_client import QdrantClient

from reindex.errors import CutoverRefused
from reindex.fingerprint import content_hash, target_name
from reindex.flip import cutover
from reindex.ports import Record, Rows, Sink, SourceSchema, TargetSpec
from reindex.state.sqlite import SqliteLedger
from reindex_adapters.postgres.sink import PgvectorSink
from reindex_adapters.qdrant.points import point_id
from reindex_adapters.qdrant.sink import QdrantSink
from reindex_adapters.testing.memory import HashEmbedder

pytestmark = pytest.mark.serial  # readers keep a rate while the alias flips

ALIAS = "docs"
FLIPS = 24
READ_SECONDS_CAP = 20.0
LOOKUP_SQL = "SELECT id, reindex_fingerprint FROM docs WHERE id = ANY(%s)"
ANN_SQL = "SELECT reindex_fingerprint FROM docs ORDER BY embedding <=> %s LIMIT 10"

Step = Callable[[Any, np.random.Generator], list[set[str]]]


@dataclass
class Tally:
    """One reader's observations; merged after the threads stop, so no locking is needed."""

    queries: int = 0
    errors: list[str] = field(default_factory=list)
    mixed: list[list[str]] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (started, seconds)

    def observe(self, units: list[set[str]], started: float, seconds: float) -> None:
        self.queries += 1
        self.latencies.append((started, seconds))
        for fingerprints in units:
            if len(fingerprints) != 1:
                self.mixed.append(sorted(fingerprints))
            for fp in fingerprints:
                self.seen[fp] = self.seen.get(fp, 0) + 1


@dataclass
class Totals:
    queries: int
    errors: list[str]
    mixed: list[list[str]]
    seen: dict[str, int]
    max_latency: float
    seconds: float

    @property
    def per_second(self) -> float:
        return self.queries / self.seconds


def merge(tallies: Sequence[Tally], seconds: float) -> Totals:
    seen: dict[str, int] = {}
    for tally in tallies:
        for fp, n in tally.seen.items():
            seen[fp] = seen.get(fp, 0) + n
    return Totals(
        queries=sum(t.queries for t in tallies),
        errors=[e for t in tallies for e in t.errors],
        mixed=[m for t in tallies for m in t.mixed],
        seen=seen,
        max_latency=max((s for t in tallies for _, s in t.latencies), default=0.0),
        seconds=seconds,
    )


class Readers:
    """Reader threads that loop over `step` until stopped; each step is timed and its units checked."""

    def __init__(self, connect: Callable[[], Any], steps: Sequence[Step]) -> None:
        self.stop = threading.Event()
        self.tallies = [Tally() for _ in steps]
        self.ready = threading.Barrier(len(steps) + 1, timeout=15)
        self.threads = [
            threading.Thread(target=self._loop, args=(connect, step, tally, seed), daemon=True)
            for seed, (step, tally) in enumerate(zip(steps, self.tallies, strict=True))
        ]

    def __enter__(self) -> Readers:
        for thread in self.threads:
            thread.start()
        self.ready.wait()
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.seconds = time.perf_counter() - self.started
        for thread in self.threads:
            thread.join(timeout=10)
        assert not any(t.is_alive() for t in self.threads), "a reader did not stop"

    def totals(self) -> Totals:
        return merge(self.tallies, self.seconds)

    def _loop(self, connect: Callable[[], Any], step: Step, tally: Tally, seed: int) -> None:
        rng = np.random.default_rng(seed)
        handle = connect()
        try:
            self.ready.wait()
            while not self.stop.is_set():
                started = time.perf_counter()
                try:
                    units = step(handle, rng)
                except Exception as exc:  # counted, never swallowed: the test asserts none happened
                    tally.errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                tally.observe(units, started, time.perf_counter() - started)
        finally:
            close = getattr(handle, "close", None)
            if close is not None:
                close()


def corpus(n: int) -> list[Record]:
    return [Record(f"d{i:05d}", f"document {i} about topic {i % 37} and more", {"n": i}) for i in range(n)]


def spec_for(embedder: HashEmbedder) -> TargetSpec:
    info = embedder.info
    return TargetSpec(
        name=target_name(ALIAS, info.fingerprint),
        alias=ALIAS,
        dim=info.dim,
        fingerprint=info.fingerprint,
        model=info.describe(),
        source=SourceSchema(id_field="id", text_field="text"),
    )


def build(sink: Sink, embedder: HashEmbedder, records: list[Record]) -> TargetSpec:
    spec = spec_for(embedder)
    sink.prepare(spec)
    vectors = embedder.embed(embedder.tokenize([r.text for r in records]))
    sink.write(spec.name, Rows(records, vectors, [content_hash(r.text) for r in records], spec.fingerprint))
    sink.finalize(spec)
    return spec


def go_live(sink: Sink, ledger: SqliteLedger, spec: TargetSpec) -> cutover.AliasMove:
    return cutover.move(
        sink, ledger, alias=ALIAS, target=spec.name, fingerprint=spec.fingerprint, model=dict(spec.model)
    )


def flip(sink: Sink, ledger: SqliteLedger, new: TargetSpec, flips: int, pause: float = 0.02) -> float:
    """Alternate a cutover onto `new` with a rollback; return the slowest flip in seconds."""
    slowest = 0.0
    for i in range(flips):
        started = time.perf_counter()
        moved = go_live(sink, ledger, new) if i % 2 == 0 else cutover.rollback(sink, ledger, ALIAS)
        slowest = max(slowest, time.perf_counter() - started)
        assert moved.changed
        time.sleep(pause)
    return slowest


def report(name: str, totals: Totals, flips: int, slowest_flip: float) -> None:
    print(
        f"\n[{name}] flips={flips} queries={totals.queries} qps={totals.per_second:.0f}"
        f" max_latency_ms={totals.max_latency * 1000:.1f} slowest_flip_ms={slowest_flip * 1000:.1f}"
        f" errors={len(totals.errors)} mixed={len(totals.mixed)} seen={totals.seen}"
    )


def assert_clean(totals: Totals, fingerprints: set[str]) -> None:
    assert totals.errors == [], totals.errors[:5]
    assert totals.mixed == [], totals.mixed[:5]
    assert set(totals.seen) == fingerprints, "readers should have seen both targets while flipping"
    assert totals.per_second >= 200


# pgvector --------------------------------------------------------------------------------------------


def pg_connect(dsn: str, *, repeatable: bool = False) -> Callable[[], psycopg.Connection[Any]]:
    def connect() -> psycopg.Connection[Any]:
        conn = psycopg.connect(dsn, autocommit=True)
        if repeatable:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        register_vector(conn)
        return conn

    return connect


def lookup(conn: psycopg.Connection[Any], rng: np.random.Generator, ids: Sequence[str]) -> set[str]:
    wanted = list(rng.choice(ids, size=20, replace=False))
    rows = conn.execute(LOOKUP_SQL, [wanted]).fetchall()
    assert len(rows) == len(wanted), f"{len(rows)} of {len(wanted)} ids found"
    return {fp for _, fp in rows}


def ann(conn: psycopg.Connection[Any], rng: np.random.Generator, dim: int) -> set[str]:
    query = rng.standard_normal(dim).astype(np.float32)
    rows = conn.execute(ANN_SQL, [query]).fetchall()
    assert len(rows) == 10, f"ANN returned {len(rows)} rows"
    return {fp for (fp,) in rows}


def single_statements(ids: Sequence[str], dim: int) -> Step:
    def step(conn: psycopg.Connection[Any], rng: np.random.Generator) -> list[set[str]]:
        return [lookup(conn, rng, ids) if rng.random() < 0.5 else ann(conn, rng, dim)]

    return step


def one_transaction(ids: Sequence[str], dim: int) -> Step:
    """Two statements in one REPEATABLE READ transaction: together they must see one fingerprint."""

    def step(conn: psycopg.Connection[Any], rng: np.random.Generator) -> list[set[str]]:
        with conn.transaction():
            first = lookup(conn, rng, ids)
            second = ann(conn, rng, dim)
        return [first, second, first | second]

    return step


def alias_coupled(embedders: dict[str, HashEmbedder], *, lock: bool = True) -> Step:
    """Read the alias's fingerprint and dim from the view comment, then query with a vector of that dim.

    The view is locked first: a LOCK statement takes no snapshot, so the comment read next is the one
    of the view this transaction holds (an unlocked comment read can describe a view swapped away
    before the query reaches it).
    """

    def step(conn: psycopg.Connection[Any], rng: np.random.Generator) -> list[set[str]]:
        with conn.transaction():
            if lock:
                conn.execute("LOCK TABLE docs IN ACCESS SHARE MODE")
            row = conn.execute("SELECT obj_description('docs'::regclass, 'pg_class')").fetchone()
            assert row is not None and row[0] is not None, "the alias view has no comment"
            meta = json.loads(row[0])
            embedder = embedders[meta["fingerprint"]]
            assert meta["model"]["dim"] == embedder.info.dim
            query = embedder.vector(f"query {rng.integers(1_000_000)}")
            rows = conn.execute(ANN_SQL, [query]).fetchall()
        assert len(rows) == 10, f"ANN returned {len(rows)} rows"
        return [{fp for (fp,) in rows} | {meta["fingerprint"]}]

    return step


@pytest.fixture
def pg_sink(pg_dsn: str) -> Iterator[PgvectorSink]:
    sink = PgvectorSink(pg_dsn)
    yield sink
    sink.close()


def test_readers_never_error_or_mix_versions_while_the_view_flips(
    pg_dsn: str, pg_sink: PgvectorSink, tmp_path: Path
) -> None:
    records = corpus(2000)
    ids = [r.id for r in records]
    old = build(pg_sink, HashEmbedder(dim=16, seed="a"), records)
    new = build(pg_sink, HashEmbedder(dim=16, seed="b"), records)
    assert old.fingerprint != new.fingerprint
    ledger = SqliteLedger(tmp_path / "state.db")
    go_live(pg_sink, ledger, old)
    steps = [single_statements(ids, 16)] * 3 + [one_transaction(ids, 16)] * 3
    with Readers(pg_connect(pg_dsn, repeatable=True), steps) as readers:
        slowest = flip(pg_sink, ledger, new, FLIPS)
    totals = readers.totals()
    report("pgvector same dim", totals, FLIPS, slowest)
    assert_clean(totals, {old.fingerprint, new.fingerprint})
    assert [m.state for m in ledger.cutovers(ALIAS)] == ["done"] * (FLIPS + 1)
    ledger.close()


def test_readers_coupled_to_the_alias_comment_survive_a_dimension_change(
    pg_dsn: str, pg_sink: PgvectorSink, tmp_path: Path
) -> None:
    records = corpus(2000)
    embedders = [HashEmbedder(dim=16, seed="a"), HashEmbedder(dim=24, seed="b")]
    old, new = (build(pg_sink, e, records) for e in embedders)
    ledger = SqliteLedger(tmp_path / "state.db")
    go_live(pg_sink, ledger, old)
    steps = [alias_coupled({e.info.fingerprint: e for e in embedders})] * 4
    with Readers(pg_connect(pg_dsn, repeatable=True), steps) as readers:
        slowest = flip(pg_sink, ledger, new, FLIPS)
    totals = readers.totals()
    report("pgvector 16d <-> 24d", totals, FLIPS, slowest)
    assert_clean(totals, {old.fingerprint, new.fingerprint})
    ledger.close()


def test_the_harness_catches_readers_that_read_the_comment_without_locking_the_view(
    pg_dsn: str, pg_sink: PgvectorSink, tmp_path: Path
) -> None:
    """The counters are not blind: without the LOCK, a reader meets a view of the other dimension (or a
    comment its snapshot cannot see yet)."""
    records = corpus(500)
    embedders = [HashEmbedder(dim=16, seed="a"), HashEmbedder(dim=24, seed="b")]
    old, new = (build(pg_sink, e, records) for e in embedders)
    ledger = SqliteLedger(tmp_path / "state.db")
    go_live(pg_sink, ledger, old)
    steps = [alias_coupled({e.info.fingerprint: e for e in embedders}, lock=False)] * 4
    with Readers(pg_connect(pg_dsn, repeatable=True), steps) as readers:
        flip(pg_sink, ledger, new, 12)
    errors = readers.totals().errors
    assert any("different vector dimensions" in e for e in errors), errors[:3]
    ledger.close()


def test_prepared_readers_survive_a_dimension_change_only_if_they_name_their_columns(
    pg_dsn: str, pg_sink: PgvectorSink, tmp_path: Path
) -> None:
    """A server-side prepared `SELECT *` keeps the old row type: after 16d -> 24d it fails on every call
    until the connection is reset. Applications must name columns (or not prepare) across such a cutover."""
    records = corpus(50)
    old, new = (build(pg_sink, HashEmbedder(dim=d, seed=s), records) for d, s in ((16, "a"), (24, "b")))
    ledger = SqliteLedger(tmp_path / "state.db")
    go_live(pg_sink, ledger, old)
    star, named = "SELECT * FROM docs WHERE id = %s", "SELECT id, reindex_fingerprint FROM docs WHERE id = %s"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for statement in (star, named):
            conn.execute(statement, ["d00001"], prepare=True).fetchall()
        go_live(pg_sink, ledger, new)
        assert conn.execute(named, ["d00001"], prepare=True).fetchall() == [("d00001", new.fingerprint)]
        for _ in range(2):
            with pytest.raises(psycopg.errors.FeatureNotSupported, match="cached plan must not change"):
                conn.execute(star, ["d00001"], prepare=True)
    ledger.close()


def test_a_long_reader_makes_cutover_refuse_without_stalling_other_readers(
    pg_dsn: str, tmp_path: Path
) -> None:
    timeout_ms, attempts = 300, 3
    with (
        closing(PgvectorSink(pg_dsn, lock_timeout_ms=timeout_ms, swap_attempts=attempts)) as sink,
        closing(SqliteLedger(tmp_path / "state.db")) as ledger,
    ):
        _long_reader_refusal(pg_dsn, sink, ledger, timeout_ms, attempts)


def _long_reader_refusal(
    pg_dsn: str, sink: PgvectorSink, ledger: SqliteLedger, timeout_ms: int, attempts: int
) -> None:
    records = corpus(200)
    ids = [r.id for r in records]
    old = build(sink, HashEmbedder(dim=16, seed="a"), records)
    new = build(sink, HashEmbedder(dim=16, seed="b"), records)
    go_live(sink, ledger, old)
    with psycopg.connect(pg_dsn) as long_reader:
        assert long_reader.execute("SELECT count(*) FROM docs").fetchone() == (200,)
        with Readers(pg_connect(pg_dsn), [single_statements(ids, 16)] * 2) as readers:
            time.sleep(0.2)
            started = time.perf_counter()
            with pytest.raises(CutoverRefused, match="could not lock") as refused:
                go_live(sink, ledger, new)
            waited = time.perf_counter() - started
            time.sleep(0.2)
        long_reader.commit()
    totals = readers.totals()
    backoff = 0.15 + 0.3  # the two sleeps between three attempts, at their largest
    assert refused.value.exit_code == 4
    assert attempts * timeout_ms / 1000 <= waited < attempts * timeout_ms / 1000 + backoff + 0.5
    assert totals.errors == [] and totals.mixed == [] and set(totals.seen) == {old.fingerprint}
    # Readers queue behind each attempt's lock request (up to one lock timeout), then pass while the swap
    # backs off. The bounds are stated against the refusal itself, not the timeout plus a margin: a loaded
    # machine can add a few hundred ms to one read, but a swap that held its lock across attempts would
    # keep every reader out for the whole refusal.
    finished = [s + d for t in readers.tallies for s, d in t.latencies]
    during = sum(started < end < started + waited for end in finished)
    print(
        f"\n[long reader] refused after {waited * 1000:.0f} ms; reader max {totals.max_latency * 1000:.0f} ms;"
        f" {during} reads finished meanwhile"
    )
    assert totals.max_latency > 0.1, "readers queue behind a waiting swap"
    assert totals.max_latency < waited, "no reader sat out the whole refused cutover"
    assert during >= attempts, f"only {during} reads finished while the cutover was being refused"
    assert sink.alias(ALIAS).target == old.name
    assert ledger.cutovers(ALIAS)[-1].state == "aborted"
    assert go_live(sink, ledger, new).changed and sink.alias(ALIAS).target == new.name


# Qdrant ----------------------------------------------------------------------------------------------


def qdrant_step(client: QdrantClient, ids: Sequence[str], dim: int) -> Step:
    def step(_: object, rng: np.random.Generator) -> list[set[str]]:
        points: Sequence[Any]
        if rng.random() < 0.5:
            points = client.query_points(
                collection_name=ALIAS,
                query=rng.standard_normal(dim).tolist(),
                limit=10,
                with_payload=["reindex_fingerprint"],
            ).points
        else:
            wanted = [point_id(i) for i in rng.choice(ids, size=20, replace=False)]
            points = client.retrieve(collection_name=ALIAS, ids=wanted, with_payload=["reindex_fingerprint"])
        assert len(points) in (10, 20), f"{len(points)} points returned"
        return [{str((p.payload or {}).get("reindex_fingerprint")) for p in points}]

    return step


def test_qdrant_readers_see_one_collection_per_response_while_the_alias_flips(tmp_path: Path) -> None:
    """No lock around the shared local client: its alias swap replaces the alias dict in one assignment
    and readers only read, so local mode is safe here (a server applies the swap atomically itself)."""
    client = QdrantClient(":memory:")
    sink = QdrantSink(client)
    records = corpus(1000)
    ids = [r.id for r in records]
    old = build(sink, HashEmbedder(dim=16, seed="a"), records)
    new = build(sink, HashEmbedder(dim=16, seed="b"), records)
    ledger = SqliteLedger(tmp_path / "state.db")
    go_live(sink, ledger, old)
    with Readers(lambda: None, [qdrant_step(client, ids, 16)] * 4) as readers:
        slowest = flip(sink, ledger, new, FLIPS)
    totals = readers.totals()
    report("qdrant local", totals, FLIPS, slowest)
    assert_clean(totals, {old.fingerprint, new.fingerprint})
    ledger.close()
    client.close()
