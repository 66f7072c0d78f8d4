"""The lifecycle with an application that writes through the alias at every step (issue 31).

A live Qdrant collection behind an alias is migrated while the application goes on writing through that
alias with its ordinary client calls (upsert with the vector of the model the alias serves at that moment,
set_payload and overwrite_payload of the text, delete by id and by filter), on integer or UUID point ids,
with the source read through the alias or by the old collection's own name. Its writes land between the
tool's commands and at the instants inside `cutover --sync` that matter: right after the final catch-up
(the window before the flip) and right after the flip. Commands are killed at each step of `cutover --sync`
and of `sync`, then recovered as the README says (run the same command again).

After every step the checker asserts:
- no acknowledged application write is lost or reverted: once a sync or a `cutover --sync` returns, the
  alias serves exactly the application's documents (less, after the flip, those whose text cannot be
  embedded: the dead letters), with the texts it last wrote;
- verify says complete only if every served vector equals a fresh embedding of its served text under the
  served fingerprint, and the dead letters it counts are exactly the application's unembeddable documents;
- the ledger reconciles (in = written + dead-lettered) after every run and sync that returned.

A kill here is an exception raised at the chosen point (a `BaseException`, so no handler of the tool's
catches it): the process's `finally` blocks still run, which a SIGKILL would skip; the subprocess crash
tests (tests/durability) cover that difference. Budget: CI runs a bounded number of examples;
`REINDEX_SOAK=<n>` multiplies them.
"""

from __future__ import annotations

import itertools
import json
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from pgvector.psycopg import register_vector
from psycopg import sql
from qdrant_client import QdrantClient, models

from reindex import commands, crashpoints
from reindex.config import Config, load
from reindex.errors import CutoverRefused, VerificationFailed
from reindex.fingerprint import content_hash, target_name
from reindex.flip import choreography, sync
from reindex.flip import window as flip_window
from reindex_adapters.testing.memory import HashEmbedder
from tests.lifecycle.support import machine_settings, toml

DIM = 8
ALIAS, OLD_COLLECTION = "notes_live", "notes"
OLD = HashEmbedder(DIM, seed="old")  # the model the application used before: the same dimension
NEW = HashEmbedder(DIM, seed="new")
NAMES = tuple(range(1, 9))
DENSE, SPARSE = "dense", "keywords"  # the named vectors of a collection with named vectors
WORDS = st.sampled_from(("alpha", "beta", "gamma", "delta"))
GOOD = st.lists(WORDS, min_size=1, max_size=3).map(" ".join)
POISON = st.sampled_from(("", "   "))
KILLS = (
    "cutover_after_intent",
    "cutover_after_move",
    "after_flip_start",
    "after_flip_mid",
    "sync_before_adopt",
)


def _parts(point: Any) -> tuple[str, list[float], dict[str, Any]]:
    """(text, the re-embedded vector, payload); the vector [] where the point has none."""
    payload = point.payload or {}
    vector = point.vector.get(DENSE, []) if isinstance(point.vector, dict) else point.vector
    return str(payload.get("text")), vector or [], payload


def _sparse(point: Any) -> float | None:
    """The value of the carried sparse vector a named-vector point holds (one index: its name)."""
    held = point.vector.get(SPARSE) if isinstance(point.vector, dict) else None
    return None if held is None else float(held.values[0])


class Killed(BaseException):
    """The process dies here."""


def poison(text: str) -> bool:
    return not text.strip()


class _Application(RuleBasedStateMachine):
    """What the two machines share: the application's documents by name, on integer or UUID ids."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="reindex-appwrites-"))
        self.truth: dict[int, str] = {}  # name -> the text the application last wrote (acknowledged)
        self.integer_ids = True
        self.ran = False

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def key(self, name: int) -> int | str:
        """The id the application stores a document under: the name, or a UUID made from it."""
        return name if self.integer_ids else str(uuid.uuid5(uuid.NAMESPACE_URL, f"note-{name}"))

    def name_of(self, key: Any) -> int:
        return next(n for n in NAMES if str(self.key(n)) == str(key))

    def configured(self, source: dict[str, Any], target: dict[str, Any]) -> Config:
        """The migration's config: the `new` model, small shards, every dead letter allowed."""
        run = {"state": str(self.root / "state.db"), "shard_size": 3, "max_dead_letters": 1.0}
        sections = {"source": source, "embedder": {"kind": "hash", "dim": DIM, "seed": "new"}}
        path = self.root / "notes.toml"
        path.write_text(toml(sections | {"target": target, "run": run}))
        return load(path)

    def flipped(self) -> bool:
        raise NotImplementedError

    def served_texts(self) -> dict[int, str]:
        """What the alias serves now: name -> text."""
        raise NotImplementedError

    def expected_served(self) -> dict[int, str]:
        """What the alias must serve: every document before the flip; after it, the embeddable ones."""
        if not self.flipped():
            return dict(self.truth)
        return {n: t for n, t in self.truth.items() if not poison(t)}

    def _acknowledged_writes_stand(self, after: str) -> None:
        served, expected = self.served_texts(), self.expected_served()
        assert served == expected, f"after {after}: the alias serves {served}, the truth {expected}"


class QdrantApplication(_Application):
    """One live collection, one application, one migration to the `new` model."""

    def __init__(self) -> None:
        super().__init__()
        self.storage = self.root / "qdrant"
        self.source = ALIAS
        self.pending = False  # a kill left the carry-over after the flip unfinished
        self.phase: str | None = None  # "window": the application writes between final catch-up and flip
        self.window_written: dict[int, str] = {}  # what it wrote in the window of a carry-over still due
        self.deleted_since_flip: set[int] = set()  # what it deleted through the alias since that flip
        self.fields: dict[int, str] = {}  # name -> the `acl` field it last set without touching the text
        self.named = False  # named vectors: the re-embedded DENSE one and a carried SPARSE one
        self.sparse: dict[int, float] = {}  # name -> the value of its carried sparse vector (named only)

    # the world -------------------------------------------------------------------------------------------

    @contextmanager
    def client(self) -> Iterator[QdrantClient]:
        client = QdrantClient(path=str(self.storage))
        try:
            yield client
        finally:
            client.close()

    def config(self) -> Config:
        source = {
            "kind": "qdrant",
            "path": str(self.storage),
            "collection": self.source,
            "text_field": "text",
        } | ({"vector_name": DENSE} if self.named else {})
        return self.configured(source, {"kind": "qdrant", "path": str(self.storage), "alias": ALIAS})

    @property
    def target(self) -> str:
        return target_name(ALIAS, NEW.info.fingerprint)

    def flipped(self, client: QdrantClient | None = None) -> bool:
        if client is None:
            with self.client() as opened:
                return self.flipped(opened)
        aliases = {a.alias_name: a.collection_name for a in client.get_aliases().aliases}
        return aliases.get(ALIAS) == self.target

    def served(self, collection: str = ALIAS) -> dict[int, tuple[str, list[float], dict[str, Any]]]:
        with self.client() as client:
            points, _ = client.scroll(collection, limit=100, with_payload=True, with_vectors=True)
        return {self.name_of(p.id): _parts(p) for p in points}

    def served_texts(self) -> dict[int, str]:
        return {n: t for n, (t, _, _) in self.served().items()}

    def served_sparse(self) -> dict[int, float]:
        with self.client() as client:
            points, _ = client.scroll(ALIAS, limit=100, with_vectors=True)
        return {self.name_of(p.id): value for p in points if (value := _sparse(p)) is not None}

    def vectors(self, name: int, vector: Any) -> Any:
        """What the application upserts: the vector, and with named vectors a fresh sparse one beside it."""
        if not self.named:
            return vector.tolist()
        self.sparse[name] = 1.0
        return {DENSE: vector.tolist(), SPARSE: models.SparseVector(indices=[name], values=[1.0])}

    def expected_served(self) -> dict[int, str]:
        """Every document, before the flip and after it: a blank one keeps its point, without a vector."""
        return dict(self.truth)

    # the application writes through the alias -------------------------------------------------------------

    def _write(self, client: QdrantClient, op: tuple[Any, ...]) -> None:
        """One application write, made with the model the alias serves now; the truth follows it."""
        kind, name, text = op
        flipped = self.flipped(client)
        model = NEW if flipped else OLD
        # what it can address: served, and its own (a pending carry-over may serve what it deleted)
        served = {self.name_of(p.id) for p in client.scroll(ALIAS, limit=100)[0]} & set(self.truth)
        if kind in ("upsert", "upsert_in_flight"):
            model = OLD if kind == "upsert_in_flight" else model  # embedded before the flip, landing after it
            vector = model.vector(text) if not poison(text) else OLD.vector("blank")
            client.upsert(ALIAS, [models.PointStruct(id=self.key(name), vector=self.vectors(name, vector), payload={"text": text})], wait=True)  # fmt: skip
            self.truth[name] = text
            self.fields.pop(name, None)  # an upsert replaces the whole payload
        elif kind == "update_sparse" and name in served and self.named:  # a carried vector, text untouched
            value = float(len(text) + 2)
            vectors = {SPARSE: models.SparseVector(indices=[name], values=[value])}
            client.update_vectors(ALIAS, [models.PointVectors(id=self.key(name), vector=vectors)], wait=True)
            self.sparse[name] = value
        elif kind == "set_field" and name in served:  # another field: the text and its vector stay
            client.set_payload(ALIAS, {"acl": text}, points=[self.key(name)], wait=True)
            self.fields[name] = text
        elif kind in ("set_payload", "overwrite_payload") and name in served:
            if kind == "set_payload":
                client.set_payload(ALIAS, {"text": text}, points=[self.key(name)], wait=True)
            else:
                client.overwrite_payload(ALIAS, {"text": text}, points=[self.key(name)], wait=True)
                self.fields.pop(name, None)
            self.truth[name] = text
        elif kind == "delete" and name in served:
            client.delete(ALIAS, models.PointIdsList(points=[self.key(name)]), wait=True)
            self.truth.pop(name, None)
            self.fields.pop(name, None)
            self.sparse.pop(name, None)
            self.deleted_since_flip |= {name} if flipped else set()
        elif kind == "delete_by_filter" and name in served:
            text = self.truth[name]
            match = models.FieldCondition(key="text", match=models.MatchValue(value=text))
            client.delete(ALIAS, models.FilterSelector(filter=models.Filter(must=[match])), wait=True)
            for other in served:
                if self.truth.get(other) == text:
                    self.truth.pop(other)
                    self.fields.pop(other, None)
                    self.sparse.pop(other, None)
                    self.deleted_since_flip |= {other} if flipped else set()
        if self.phase == "window" and name in self.truth:
            self.window_written[name] = self.truth[name]
        event(f"application {kind}")

    def _ops(self, data: st.DataObject, label: str, *, flipped: bool | None = None) -> list[tuple[Any, ...]]:
        """Writes of good and blank texts, before the flip and after it: a blank text is a dead letter whose
        point the alias goes on serving, without a vector (docs/backends.md)."""
        texts = st.one_of(GOOD, GOOD, POISON)
        kinds = st.sampled_from(
            (
                "upsert",
                "upsert",
                "upsert_in_flight",
                "set_payload",
                "overwrite_payload",
                "set_field",
                "update_sparse",
                "delete",
                "delete_by_filter",
            )
        )
        op = st.tuples(kinds, st.sampled_from(NAMES), texts)
        drawn: list[tuple[Any, ...]] = data.draw(st.lists(op, max_size=3), label=label)
        return drawn

    @initialize(
        integer_ids=st.booleans(),
        by_name=st.booleans(),
        named=st.booleans(),
        corpus=st.dictionaries(
            st.sampled_from(NAMES), st.one_of(GOOD, GOOD, GOOD, POISON), min_size=1, max_size=6
        ),
    )
    def live_collection(self, integer_ids: bool, by_name: bool, named: bool, corpus: dict[int, str]) -> None:
        self.integer_ids, self.source = integer_ids, OLD_COLLECTION if by_name else ALIAS
        self.named = named
        dense = models.VectorParams(size=DIM, distance=models.Distance.COSINE)
        with self.client() as client:
            if named:
                client.create_collection(
                    OLD_COLLECTION,
                    {DENSE: dense},
                    sparse_vectors_config={SPARSE: models.SparseVectorParams()},
                )
            else:
                client.create_collection(OLD_COLLECTION, dense)
            create = models.CreateAlias(collection_name=OLD_COLLECTION, alias_name=ALIAS)
            client.update_collection_aliases(
                change_aliases_operations=[models.CreateAliasOperation(create_alias=create)]
            )
            for name, text in corpus.items():
                self._write(client, ("upsert", name, text))
        event(f"integer ids: {integer_ids}, source by name: {by_name}, named vectors: {named}")

    @rule(data=st.data())
    def application_writes(self, data: st.DataObject) -> None:
        ops = self._ops(data, "writes")
        with self.client() as client:
            for op in ops:
                self._write(client, op)

    # the operator ----------------------------------------------------------------------------------------

    @rule()
    def run(self) -> None:
        report = commands.run(self.config())
        assert report.reconciled, report.to_json()
        self.ran = True

    @precondition(lambda self: self.ran)
    @rule(kill=st.sampled_from((None, None, "after_flip_start", "after_flip_mid", "sync_before_adopt")))
    def sync(self, kill: str | None) -> None:
        with self._killed_at(kill) as died:
            commands.sync(self.config())
        if died():
            return
        self.pending = False
        assert commands.status(self.config()).reconciled
        self._acknowledged_writes_stand("sync")

    @precondition(lambda self: self.ran)
    @rule(with_sync=st.booleans(), kill=st.sampled_from((None, None, *KILLS)), data=st.data())
    def cutover(self, with_sync: bool, kill: str | None, data: st.DataObject) -> None:
        window = self._ops(data, "window") if with_sync else []
        after = self._ops(data, "after the flip", flipped=True) if with_sync else []
        with self._killed_at(kill, window, after, with_sync) as died:
            try:
                commands.cutover(self.config(), sync=with_sync)
            except VerificationFailed:
                assert not self.pending or not with_sync, "a cutover --sync refused to finish a pending flip"
                event("cutover refused")
                return
        if died():
            return
        event(f"cutover{' --sync' if with_sync else ''} returned")
        if with_sync:
            self._acknowledged_writes_stand("cutover --sync")

    def _the_one_known_gap(self) -> None:
        """A document inserted into the old collection in the window (after the final catch-up read it,
        before the flip) and deleted through the alias after the flip, before the carry-over reads the old
        collection, comes back. Still impossible to close: the insert reached only the old collection and
        the delete only the new one, where it found no point, so the new collection after it is exactly
        as it is when the application never deleted anything, and Qdrant keeps no record of a delete of
        a missing point (docs/backends.md). Tolerated in exactly that form; the application then has it
        again."""
        points = self.served()
        served = {n: t for n, (t, _, _) in points.items()}
        for name, text in self.window_written.items():
            if name in self.deleted_since_flip and name not in self.truth and served.get(name) == text:
                event("known gap: a window write deleted through the alias before the carry-over came back")
                self.truth[name] = text
                if "acl" in points[name][2]:
                    self.fields[name] = points[name][2]["acl"]
                if (value := self.served_sparse().get(name)) is not None:
                    self.sparse[name] = value

    @precondition(lambda self: self.ran)
    @rule()
    def verify(self) -> None:
        coverage = commands.verify(self.config())
        event(f"verify complete: {coverage.complete}")
        if not coverage.complete:
            return
        assert not self.pending, "verify is complete while the carry-over after the flip is pending"
        built = self.served(self.target)
        texts = {n: t for n, (t, _, _) in built.items()}
        good = {n: t for n, t in self.truth.items() if not poison(t)}
        # the cutover keeps the dead letters' points: before it the target may hold them or not
        expected = self.truth if self.flipped() else good | {n: t for n, t in texts.items() if poison(t)}
        assert texts == expected, "complete, but not the application's documents"
        for name, (text, vector, payload) in built.items():
            if poison(text):
                assert not vector, f"{name}: complete, but a blank text is served with a vector"
                continue
            assert np.allclose(vector, NEW.vector(text), atol=1e-6), f"{name}: complete with a stale vector"
            digest = payload.get("reindex_content_hash")
            assert digest in (None, content_hash(text)), f"{name}: stored hash is not its text's"
            fingerprint = payload.get("reindex_fingerprint")
            assert fingerprint in (None, NEW.info.fingerprint), f"{name}: fingerprint {fingerprint}"
        dead = sum(poison(t) for t in self.truth.values())
        assert coverage.dead_letters == dead, f"dead letters {coverage.dead_letters}, the truth has {dead}"

    @precondition(lambda self: self.ran)
    @rule()
    def rollback(self) -> None:
        """Back to the older collection: every write made through the alias since the flip goes with it."""
        try:
            moved = commands.rollback(self.config())
        except CutoverRefused as refused:
            assert self.pending or "nothing to roll back" in str(refused), refused
            event("rollback refused")
            return
        event(f"rolled back, {moved.unserved} unserved")
        self._acknowledged_writes_stand("rollback")

    # after every step ------------------------------------------------------------------------------------

    @invariant()
    def the_alias_serves_every_acknowledged_write_unless_a_carry_over_is_pending(self) -> None:
        if self.pending or not self.ran:
            return
        if not self.flipped():
            self._acknowledged_writes_stand("the old collection")

    def _acknowledged_writes_stand(self, after: str) -> None:
        if not self.pending:
            self._the_one_known_gap()
            self.window_written, self.deleted_since_flip = {}, set()
        super()._acknowledged_writes_stand(after)
        fields = {n: p["acl"] for n, (_, _, p) in self.served().items() if "acl" in p}
        assert fields == self.fields, (
            f"after {after}: the alias serves fields {fields}, the truth {self.fields}"
        )
        sparse = self.served_sparse()
        assert sparse == self.sparse, (
            f"after {after}: the alias serves sparse {sparse}, the truth {self.sparse}"
        )

    @contextmanager
    def _killed_at(
        self,
        point: str | None,
        window: list[tuple[Any, ...]] | None = None,
        after: list[tuple[Any, ...]] | None = None,
        with_sync: bool = True,
    ) -> Iterator[Callable[[], bool]]:
        """Patch the application's writes in at the window and after the flip, and the kill at `point`."""
        died = [False]
        patches: list[tuple[Any, str, Any]] = []

        def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
            original = getattr(owner, name)
            patches.append((owner, name, original))
            setattr(owner, name, make(original))

        def kill(name: str) -> None:
            if name == point:
                died[0] = True
                raise Killed(name)

        def take(original: Any) -> Any:
            def taken(settled: Any, m: Any, *args: Any) -> None:
                original(settled, m, *args)
                self.phase = "window"
                try:
                    for op in window or ():
                        self._write(m.sink._client, op)
                finally:
                    self.phase = None

            return taken

        def after_flip(original: Any) -> Any:
            def flipped(m: Any, *args: Any) -> Any:
                self.pending = True  # the flip landed; its carry-over runs now
                for op in after or ():
                    self._write(m.sink._client, op)
                kill("after_flip_start")
                done = original(m, *args)
                self.pending = False  # carried over: nothing of the window is due any more
                return done

            return flipped

        def rewrite(original: Any) -> Any:
            def rewritten(*args: Any) -> Any:
                done = original(*args)
                kill("after_flip_mid")
                return done

            return rewritten

        def adopt(original: Any) -> Any:
            def adopted(*args: Any) -> Any:
                kill("sync_before_adopt")
                return original(*args)

            return adopted

        def crash(original: Any) -> Any:
            def crashed(name: str) -> None:
                if name == "cutover_after_move" and point == name:
                    self.pending = self.pending or bool(with_sync)  # the flip landed, its carry-over is due
                kill(name)
                original(name)

            return crashed

        patch(flip_window.Settled, "take", take)
        patch(choreography, "after_flip", after_flip)
        patch(flip_window, "after_flip", after_flip)
        patch(flip_window, "_rewrite", rewrite)
        patch(sync, "_adopt", adopt)
        patch(crashpoints, "crash_if_armed", crash)
        try:
            try:
                yield lambda: died[0]
            except Killed as exc:
                event(f"killed at {exc}")
        finally:
            for owner, name, original in reversed(patches):
                setattr(owner, name, original)
        if died[0] and not self.flipped():
            self.pending = False  # killed before the flip: nothing to carry over


_tables = itertools.count()


class PgvectorApplication(_Application):
    """One live table the application reads and writes by its own name, migrated with the source named like
    the alias (the first cutover adopts the table and puts a view in its place). pgvector holds the writers
    through `cutover --sync`'s final catch-up and flip, so the application writes between commands; its
    writes are upserts with the model the name serves, text-only updates, and deletes by id and by text.
    `rollback` is a step too: what the application wrote while the newer target was live stays served."""

    DSN = ""

    def __init__(self) -> None:
        super().__init__()
        self.table = f"notes_{next(_tables)}"

    @property
    def target(self) -> str:
        return target_name(self.table, NEW.info.fingerprint)

    def config(self) -> Config:
        source = {"kind": "postgres", "dsn": self.DSN, "table": self.table, "text_column": "text"}
        return self.configured(
            source,
            {
                "kind": "pgvector",
                "dsn": self.DSN,
                "alias": self.table,
                "index": "none",
                "accept": ["table_statements", "column_order"],
            },
        )

    def query(self, statement: Any, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.DSN, autocommit=True) as conn:
            register_vector(conn)
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    def flipped(self) -> bool:
        rows = self.query(
            "SELECT c.relname FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid"
            " JOIN pg_class c ON c.oid = d.refobjid WHERE r.ev_class = %s::regclass AND c.oid <> r.ev_class",
            [self.table],
        )
        return any(name == self.target for (name,) in rows)

    def rows(self, relation: str) -> dict[int, tuple[str, Any, dict[str, Any]]]:
        """name -> (text, vector, bookkeeping) of a table or the view."""
        columns = [c for (c,) in self.query(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
            [relation],
        )]  # fmt: skip
        kept = [c for c in ("reindex_content_hash", "reindex_fingerprint") if c in columns]
        listed = sql.SQL(", ").join(sql.Identifier(c) for c in ["id", "text", "embedding", *kept])
        found = self.query(sql.SQL("SELECT {} FROM {}").format(listed, sql.Identifier(relation)))
        return {self.name_of(r[0]): (r[1], r[2], dict(zip(kept, r[3:], strict=True))) for r in found}

    def served_texts(self) -> dict[int, str]:
        return {n: t for n, (t, _, _) in self.rows(self.table).items()}

    def _acknowledged_writes_stand(self, after: str) -> None:
        """As for every machine; and a blank text a rollback carried into the newer target stays served,
        without a vector (kept_writes.py): the application wrote it, while a catch-up dead-letters it
        instead. Only with the text the application last wrote."""
        served, expected = self.served_texts(), self.expected_served()
        extra = {n: t for n, t in served.items() if n not in expected}
        assert all(poison(t) and self.truth.get(n) == t for n, t in extra.items()), (
            f"after {after}: the alias serves {served}, the truth {expected}"
        )
        kept = {n: t for n, t in served.items() if n in expected}
        assert kept == expected, f"after {after}: the alias serves {served}, the truth {expected}"

    def _write(self, op: tuple[Any, ...]) -> None:
        kind, name, text = op
        model = NEW if self.flipped() else OLD
        served = set(self.rows(self.table)) & set(self.truth)
        table = sql.Identifier(self.table)
        if kind in ("upsert", "upsert_in_flight"):
            model = OLD if kind == "upsert_in_flight" else model  # embedded before the flip, landing after it
            vector = model.vector(text) if not poison(text) else OLD.vector("blank")
            self.query(
                sql.SQL("INSERT INTO {} (id, text, embedding) VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE"
                        " SET text = excluded.text, embedding = excluded.embedding").format(table),
                [self.key(name), text, vector],
            )  # fmt: skip
            self.truth[name] = text
        elif kind in ("set_payload", "overwrite_payload") and name in served:  # the text alone
            self.query(sql.SQL("UPDATE {} SET text = %s WHERE id = %s").format(table), [text, self.key(name)])
            self.truth[name] = text
        elif kind == "delete" and name in served:
            self.query(sql.SQL("DELETE FROM {} WHERE id = %s").format(table), [self.key(name)])
            self.truth.pop(name)
        elif kind == "delete_by_filter" and name in served:
            gone = self.query(
                sql.SQL("DELETE FROM {} WHERE text = %s RETURNING id").format(table), [self.truth[name]]
            )
            for (key,) in gone:
                self.truth.pop(self.name_of(key), None)
        event(f"application {kind}")

    @initialize(
        integer_ids=st.booleans(),
        corpus=st.dictionaries(
            st.sampled_from(NAMES), st.one_of(GOOD, GOOD, GOOD, POISON), min_size=1, max_size=6
        ),
    )
    def live_table(self, integer_ids: bool, corpus: dict[int, str]) -> None:
        self.integer_ids = integer_ids
        kind = sql.SQL("bigint" if integer_ids else "uuid")
        self.query(
            sql.SQL("CREATE TABLE {} (id {} PRIMARY KEY, text text NOT NULL, embedding vector({}))").format(
                sql.Identifier(self.table), kind, sql.Literal(DIM)
            )
        )
        for name, text in corpus.items():
            self._write(("upsert", name, text))
        event(f"integer ids: {integer_ids}")

    @rule(data=st.data())
    def application_writes(self, data: st.DataObject) -> None:
        texts = GOOD if self.flipped() else st.one_of(GOOD, GOOD, POISON)
        kinds = st.sampled_from(
            ("upsert", "upsert", "upsert_in_flight", "set_payload", "delete", "delete_by_filter")
        )
        for op in data.draw(
            st.lists(st.tuples(kinds, st.sampled_from(NAMES), texts), max_size=3), label="writes"
        ):
            self._write(op)

    @rule()
    def run(self) -> None:
        report = commands.run(self.config())
        assert report.reconciled, report.to_json()
        self.ran = True

    @precondition(lambda self: self.ran)
    @rule(kill=st.sampled_from((None, None, "sync_before_adopt")))
    def sync(self, kill: str | None) -> None:
        with _killed(kill) as died:
            commands.sync(self.config())
        if died():
            return
        assert commands.status(self.config()).reconciled
        self._acknowledged_writes_stand("sync")

    @precondition(lambda self: self.ran)
    @rule(
        with_sync=st.booleans(),
        kill=st.sampled_from(
            (None, None, "cutover_after_intent", "cutover_before_commit", "cutover_after_move")
        ),
    )
    def cutover(self, with_sync: bool, kill: str | None) -> None:
        with _killed(kill) as died:
            try:
                commands.cutover(self.config(), sync=with_sync)
            except VerificationFailed:
                event("cutover refused")
                return
        if not died():
            event(f"cutover{' --sync' if with_sync else ''} returned")
        self._acknowledged_writes_stand("cutover")

    @precondition(lambda self: self.ran)
    @rule()
    def verify(self) -> None:
        coverage = commands.verify(self.config())
        event(f"verify complete: {coverage.complete}")
        if not coverage.complete:
            return
        built = self.rows(self.target)
        good = {n: t for n, t in self.truth.items() if not poison(t)}
        assert {n: t for n, (t, _, _) in built.items()} == good, (
            "complete, but not the application's documents"
        )
        for name, (text, vector, kept) in built.items():
            assert np.allclose(vector, NEW.vector(text), atol=1e-6), f"{name}: complete with a stale vector"
            assert kept.get("reindex_content_hash") == content_hash(text), (
                f"{name}: stored hash is not its text's"
            )
            assert kept.get("reindex_fingerprint") == NEW.info.fingerprint, f"{name}: another fingerprint"
        dead = sum(poison(t) for t in self.truth.values())
        assert coverage.dead_letters == dead, f"dead letters {coverage.dead_letters}, the truth has {dead}"

    @precondition(lambda self: self.ran)
    @rule()
    def rollback(self) -> None:
        try:
            moved = commands.rollback(self.config())
        except CutoverRefused:
            event("nothing to roll back")
            return
        event(f"rolled back, {moved.unserved} unserved")
        self._acknowledged_writes_stand("rollback")

    @invariant()
    def the_name_serves_every_acknowledged_write(self) -> None:
        if self.ran:
            self._acknowledged_writes_stand("the last step")


@contextmanager
def _killed(point: str | None) -> Iterator[Callable[[], bool]]:
    """The process dies at `point` (a crash point, or just before sync adopts)."""
    died = [False]
    original_crash, original_adopt = crashpoints.crash_if_armed, sync._adopt

    def kill(name: str) -> None:
        if name == point:
            died[0] = True
            raise Killed(name)

    def crashed(name: str) -> None:
        kill(name)
        original_crash(name)

    def adopted(*args: Any) -> Any:
        kill("sync_before_adopt")
        return original_adopt(*args)

    crashpoints.crash_if_armed, sync._adopt = crashed, adopted  # type: ignore[assignment]
    try:
        try:
            yield lambda: died[0]
        except Killed as exc:
            event(f"killed at {exc}")
    finally:
        crashpoints.crash_if_armed, sync._adopt = original_crash, original_adopt


def test_on_qdrant_application_writes_through_the_alias_are_never_lost_and_complete_means_fresh() -> None:
    run_state_machine_as_test(QdrantApplication, settings=machine_settings(12, 14))


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_on_pgvector_application_writes_through_the_name_are_never_lost_and_complete_means_fresh(
    pg_dsn: str,
) -> None:
    machine = type("PgvectorApplicationHere", (PgvectorApplication,), {"DSN": pg_dsn})
    run_state_machine_as_test(machine, settings=machine_settings(6, 12))


class PgvectorColumnApplication(PgvectorApplication):
    """The same application and table in `mode = "column"`, with rollback and roll-forward among the steps.
    The table stays the application's: every row it wrote stays (a blank text is a row without a vector, not
    a row gone), whichever model is served; verify's "complete" must still mean fresh, including after the
    application replaced a vector the tool wrote with the old model's, text unchanged (`upsert_in_flight`)."""

    def config(self) -> Config:
        source = {"kind": "postgres", "dsn": self.DSN, "table": self.table, "text_column": "text"}
        target = {
            "kind": "pgvector",
            "dsn": self.DSN,
            "alias": self.table,
            "index": "none",
            "mode": "column",
            "accept": ["extra_column"],
        }
        return self.configured(source, target)

    def _comments(self) -> dict[str, dict[str, Any]]:
        rows = self.query(
            "SELECT attname, col_description(attrelid, attnum) FROM pg_attribute WHERE attrelid = %s::regclass"
            " AND attnum > 0 AND NOT attisdropped",
            [self.table],
        )
        marks = {name: json.loads(comment).get("reindex", {}) for name, comment in rows if comment}
        return {name: mark for name, mark in marks.items() if mark}

    def flipped(self) -> bool:
        return any(m.get("target") == self.target and m.get("served") for m in self._comments().values())

    def expected_served(self) -> dict[int, str]:
        return dict(self.truth)  # the table holds every row the application wrote

    def served_texts(self) -> dict[int, str]:
        found = self.query(sql.SQL("SELECT id, text FROM {}").format(sql.Identifier(self.table)))
        return {self.name_of(key): text for key, text in found}

    def built(self) -> dict[int, tuple[str, Any]]:
        """name -> (text, vector) of the rows the target's column holds a vector for."""
        column = next((n for n, m in self._comments().items() if m.get("target") == self.target), None)
        if column is None:
            return {}
        found = self.query(
            sql.SQL("SELECT id, text, {c} FROM {t} WHERE {c} IS NOT NULL").format(
                c=sql.Identifier(column), t=sql.Identifier(self.table)
            )
        )
        return {self.name_of(key): (text, vector) for key, text, vector in found}

    @precondition(lambda self: self.ran)
    @rule()
    def verify(self) -> None:
        coverage = commands.verify(self.config())
        event(f"verify complete: {coverage.complete}")
        if not coverage.complete:
            return
        built = self.built()
        good = {n: t for n, t in self.truth.items() if not poison(t)}
        assert {n: t for n, (t, _) in built.items()} == good, "complete, but not the application's documents"
        for name, (text, vector) in built.items():
            assert np.allclose(vector, NEW.vector(text), atol=1e-6), f"{name}: complete with a stale vector"
        dead = sum(poison(t) for t in self.truth.values())
        assert coverage.dead_letters == dead, f"dead letters {coverage.dead_letters}, the truth has {dead}"


def test_in_column_mode_writes_survive_rollback_and_roll_forward_and_complete_means_fresh(
    pg_dsn: str,
) -> None:
    machine = type("PgvectorColumnApplicationHere", (PgvectorColumnApplication,), {"DSN": pg_dsn})
    run_state_machine_as_test(machine, settings=machine_settings(6, 14))
