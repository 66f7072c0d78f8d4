"""Mutation tests: corrupt a complete target one way at a time; cutover must refuse and leave the alias."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from reindex import commands
from reindex.config import Config, load
from reindex.errors import CutoverRefused, VerificationFailed
from reindex.flip import choreography, sync
from reindex.run.migration import open_migration
from reindex.state.records import Cutover
from reindex.state.sqlite import SqliteLedger

DOCS = 150


@dataclass(frozen=True)
class Setup:
    """A live target built from `old`, and a complete but not yet live target built from `new`."""

    dsn: str
    corpus: Path
    old: Config
    new: Config
    live: str
    target: str

    def sql(self, statement: str, params: list[Any] | None = None) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(statement.replace("{target}", f'"{self.target}"'), params)

    def alias_target(self) -> str | None:
        with open_migration(self.new) as m:
            return m.sink.alias(m.spec.alias).target


def write_config(path: Path, corpus: Path, dsn: str, seed: str) -> Config:
    path.write_text(
        f'[source]\nkind = "jsonl"\npath = "{corpus}"\n\n'
        f'[embedder]\nkind = "hash"\ndim = 16\nseed = "{seed}"\n\n'
        f'[target]\nkind = "pgvector"\ndsn = "{dsn}"\nalias = "docs"\n\n'
        f'[run]\nstate = "{path.parent / "state.db"}"\nshard_size = 64\n'
    )
    return load(path)


def append_document(corpus: Path, doc_id: str) -> None:
    with corpus.open("a") as out:
        out.write(json.dumps({"id": doc_id, "text": f"a late document {doc_id}"}) + "\n")


@pytest.fixture
def setup(tmp_path: Path, pg_dsn: str) -> Setup:
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("")
    for i in range(DOCS):
        append_document(corpus, f"d{i:04d}")
    old = write_config(tmp_path / "old.toml", corpus, pg_dsn, seed="old")
    new = write_config(tmp_path / "new.toml", corpus, pg_dsn, seed="new")
    live = commands.run(old).target
    commands.cutover(old)
    target = commands.run(new).target
    assert commands.verify(new).complete
    return Setup(pg_dsn, corpus, old, new, live, target)


def refused(setup: Setup) -> str:
    """Cut over onto the corrupted target: exit 3, and the alias still serves the old target."""
    with pytest.raises(VerificationFailed) as caught:
        commands.cutover(setup.new)
    assert caught.value.exit_code == 3
    assert setup.alias_target() == setup.live
    return str(caught.value)


Mutation = Callable[[Setup], None]
MUTATIONS: dict[str, tuple[Mutation, str]] = {
    "missing row": (lambda s: s.sql("DELETE FROM {target} WHERE id = 'd0007'"), "1 missing"),
    "stale row": (
        lambda s: s.sql("UPDATE {target} SET reindex_content_hash = 'x' WHERE id IN ('d0001', 'd0002')"),
        "2 stale",
    ),
    "orphaned row": (
        lambda s: s.sql(
            "INSERT INTO {target} (id, text, payload, embedding, reindex_fingerprint, reindex_content_hash)"
            " SELECT 'ghost', text, payload, embedding, reindex_fingerprint, reindex_content_hash"
            " FROM {target} WHERE id = 'd0003'"
        ),
        "1 orphaned",
    ),
    "zero vector": (
        lambda s: s.sql(
            "UPDATE {target} SET embedding = array_fill(0, ARRAY[16])::vector WHERE id = 'd0004'"
        ),
        "1 invalid",
    ),
    "mixed fingerprint": (
        lambda s: s.sql("UPDATE {target} SET reindex_fingerprint = 'someothermodel0' WHERE id = 'd0005'"),
        "1 vectors of other fingerprints ['someothermodel0']",
    ),
    "source changed after the run": (lambda s: append_document(s.corpus, "d9999"), "1 missing"),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_cutover_refuses_a_corrupted_target_and_the_alias_stays(setup: Setup, mutation: str) -> None:
    corrupt, expected = MUTATIONS[mutation]
    corrupt(setup)
    message = refused(setup)
    assert expected in message and setup.target in message


WINDOW: dict[str, tuple[str | None, str, str]] = {  # (done beforehand, written in the window, refusal)
    "foreign fingerprint": (
        None,
        "UPDATE {target} SET reindex_fingerprint = 'someothermodel0' WHERE id = 'd0005'",
        "1 vectors of other fingerprints ['someothermodel0']",
    ),
    # the column is NOT NULL: an operator has to loosen it first; an UPDATE that sets the hash itself keeps
    # what it sets (the trigger fills only a hash it was left to fill)
    "no content hash": (
        "ALTER TABLE {target} ALTER COLUMN reindex_content_hash DROP NOT NULL",
        "UPDATE {target} SET reindex_content_hash = NULL WHERE id = 'd0006'",
        "1 without content hash",
    ),
}


@pytest.mark.parametrize("write", list(WINDOW))
def test_cutover_sync_refuses_what_is_written_into_the_target_in_the_window_as_cutover_does(
    setup: Setup, monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    """Written straight into the target after each catch-up (the last one runs with the alias's writers
    held, not the target's): `cutover --sync` refuses it exactly as a plain cutover does."""
    before, statement, expected = WINDOW[write]
    if before is not None:
        setup.sql(before)
    original = sync.catch_up

    def intruding(m: Any, ledger: Any, **kwargs: Any) -> Any:
        report = original(m, ledger, **kwargs)
        setup.sql(statement)
        return report

    monkeypatch.setattr(choreography, "catch_up", intruding)
    with pytest.raises(VerificationFailed) as caught:
        commands.cutover(setup.new, sync=True)
    assert caught.value.exit_code == 3 and expected in str(caught.value)
    assert setup.alias_target() == setup.live
    monkeypatch.undo()
    assert expected in refused(setup)
    assert not commands.verify(setup.new).complete


def test_the_vector_column_type_forbids_a_wrong_dimension(setup: Setup) -> None:
    with pytest.raises(psycopg.errors.DataException, match="expected 16 dimensions, not 15"):
        setup.sql("UPDATE {target} SET embedding = array_fill(1, ARRAY[15])::vector WHERE id = 'd0006'")


def test_a_wrong_dimension_is_refused_once_the_column_is_loosened(setup: Setup) -> None:
    """An operator may drop the typmod (vector(16) -> vector) by hand; verify reads each row's dims."""
    setup.sql(
        "DO $$ BEGIN EXECUTE (SELECT string_agg(format('DROP INDEX %I', indexrelid::regclass::text), ';')"
        " FROM pg_index WHERE indrelid = '{target}'::regclass AND NOT indisprimary); END $$"
    )
    setup.sql("ALTER TABLE {target} ALTER COLUMN embedding TYPE vector")
    setup.sql("UPDATE {target} SET embedding = array_fill(1, ARRAY[15])::vector WHERE id = 'd0006'")
    assert "1 invalid" in refused(setup)


def test_force_moves_the_alias_onto_an_incomplete_target_and_says_so(setup: Setup) -> None:
    setup.sql("DELETE FROM {target} WHERE id = 'd0007'")
    moved = commands.cutover(setup.new, force=True)
    assert moved.changed and moved.forced and moved.previous == setup.live
    assert setup.alias_target() == setup.target
    last = history(setup)[-1]
    assert (last.new, last.forced, last.state) == (setup.target, True, "done")


def test_a_verified_cutover_is_not_marked_forced(setup: Setup) -> None:
    moved = commands.cutover(setup.new, force=True)
    assert moved.changed and not moved.forced and not history(setup)[-1].forced


def test_rollback_refuses_once_the_previous_target_is_pruned(setup: Setup) -> None:
    commands.cutover(setup.new)
    pruned = commands.prune(setup.new, keep=1)
    assert pruned.dropped == [setup.live] and pruned.kept == [setup.target]
    with pytest.raises(CutoverRefused, match="pruned") as caught:
        commands.rollback(setup.new)
    assert caught.value.exit_code == 4
    assert setup.alias_target() == setup.target


def history(setup: Setup) -> list[Cutover]:
    ledger = SqliteLedger(setup.new.run.state)
    try:
        return ledger.cutovers("docs")
    finally:
        ledger.close()
