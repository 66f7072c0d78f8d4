"""The source table's column rules on the pgvector target (issue 31, item 7): defaults, NOT NULL, CHECKs and
numbered keys (serial, identity), so an application's INSERT through the alias behaves as it did on the
table; and the numbering goes on across the migration window, rollback, prune and a second migration.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from reindex import commands
from reindex.config import Config, load
from reindex.errors import ConfigError
from reindex_adapters.testing.memory import HashEmbedder

ROWS = 40


def query(dsn: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement, params).fetchall()


def execute(dsn: str, statement: str, params: Any = None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement, params)


def embedded(body: str, dim: int) -> str:
    """The text's vector with the migration's model (the hash embedder), as pgvector reads it."""
    model = HashEmbedder(dim=dim)
    return str(model.embed(model.tokenize([body]))[0].tolist())


def insert(dsn: str, body: str, dim: int = 16) -> int:
    """The application's INSERT: its text and vector, everything else left to the table (or the view's)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO docs (body, embedding) VALUES (%s, %s::vector) RETURNING id",
            [body, embedded(body, dim)],
        ).fetchone()
    assert row is not None
    return int(row[0])


def config(tmp_path: Path, source_dsn: str, target_dsn: str, dim: int = 16) -> Config:
    path = tmp_path / f"docs-{dim}.toml"
    path.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{source_dsn}"\ntable = "docs"\ntext_column = "body"\n'
        f'[embedder]\nkind = "hash"\ndim = {dim}\n'
        f'[target]\nkind = "pgvector"\ndsn = "{target_dsn}"\nalias = "docs"\n'
        'accept = ["generated_columns", "table_statements", "column_order"]\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 25\n'
    )
    return load(path)


def make_docs(dsn: str, key: str) -> None:
    """The application's table, keyed by `key` (a serial or an identity), with the rules it relies on."""
    with psycopg.connect(dsn) as conn:
        conn.execute(
            f"CREATE TABLE docs (id {key} PRIMARY KEY,"
            " body text NOT NULL CHECK (length(body) > 0),"
            " topic text DEFAULT 'misc',"
            " added timestamptz NOT NULL DEFAULT now(),"
            " words int GENERATED ALWAYS AS (array_length(string_to_array(body, ' '), 1)) STORED,"  # no default
            " embedding vector(8) CHECK (vector_dims(embedding) = 8),"
            " CONSTRAINT topic_known CHECK (topic <> 'secret'))"
        )
        conn.execute(
            "INSERT INTO docs (body, topic, embedding) SELECT 'document ' || i, 't' || (i %% 3),"
            " array_fill(i::real, ARRAY[8])::vector FROM generate_series(1, %s) i",
            [ROWS],
        )


def test_an_insert_through_the_alias_gets_the_source_defaults_checks_and_not_nulls(
    tmp_path: Path, pg_dsn: str
) -> None:
    make_docs(pg_dsn, "bigserial")
    docs = config(tmp_path, pg_dsn, pg_dsn)
    assert commands.run(docs).reconciled
    assert commands.cutover(docs).previous == "docs__adopted"

    key = insert(pg_dsn, "a note written after the flip")
    assert key == ROWS + 1  # the target's own numbering, after the old table's keys
    assert query(pg_dsn, "SELECT topic, added IS NOT NULL FROM docs WHERE id = %s", [key]) == [("misc", True)]
    with pytest.raises(psycopg.errors.CheckViolation, match=r"docs__.*_body_check"):
        execute(pg_dsn, "INSERT INTO docs (body) VALUES ('')")
    with pytest.raises(psycopg.errors.NotNullViolation, match='"body"'):
        execute(pg_dsn, "INSERT INTO docs (topic) VALUES ('t1')")
    with pytest.raises(psycopg.errors.CheckViolation, match="topic_known"):
        execute(pg_dsn, "INSERT INTO docs (body, topic) VALUES ('x', 'secret')")
    insert(pg_dsn, "sixteen")  # the old vectors' check (8 dimensions) is not the new ones'
    coverage = commands.verify(docs)
    assert coverage.complete and coverage.target_vectors == ROWS + 2 and coverage.application_rows == 2


@pytest.mark.parametrize("key", ["bigserial", "bigint GENERATED ALWAYS AS IDENTITY"])
def test_numbering_goes_on_across_the_window_rollback_prune_and_a_second_migration(
    tmp_path: Path, pg_dsn: str, key: str
) -> None:
    make_docs(pg_dsn, key)
    first = config(tmp_path, pg_dsn, pg_dsn)
    assert commands.run(first).reconciled
    window = insert(pg_dsn, "written into the old table during the migration", dim=8)
    with psycopg.connect(pg_dsn) as conn:  # a key the old sequence gave out to a write that never landed
        abandoned = conn.execute("INSERT INTO docs (body) VALUES ('abandoned') RETURNING id").fetchone()
        conn.rollback()
    assert abandoned is not None and abandoned[0] > window
    moved = commands.cutover(first, sync=True)  # the window's row comes over with its key
    assert query(pg_dsn, "SELECT body FROM docs WHERE id = %s", [window]) == [
        ("written into the old table during the migration",)
    ]
    after_flip = insert(pg_dsn, "written through the alias")
    assert after_flip > abandoned[0]  # after the old sequence, not merely after the rows
    assert commands.verify(first).complete

    back = commands.rollback(first)
    assert back.target == "docs__adopted"
    during_rollback = insert(pg_dsn, "written into the old table again", dim=8)
    assert during_rollback > after_flip  # the old sequence went on after the target's keys
    assert commands.cutover(first, sync=True).target == moved.target
    assert insert(pg_dsn, "written through the alias again") > during_rollback

    second = config(tmp_path, pg_dsn, pg_dsn, dim=24)  # reads docs, now the view over the first target
    assert commands.run(second).reconciled
    assert commands.cutover(second, sync=True).previous == moved.target
    dropped = commands.prune(second, keep=1).dropped
    assert set(dropped) == {"docs__adopted", moved.target}
    assert query(pg_dsn, "SELECT count(*) FROM pg_class WHERE relkind = 'S'") == [(1,)]  # the live one's
    last = insert(pg_dsn, "written after the prune", dim=24)
    assert last == int(query(pg_dsn, "SELECT max(id) FROM docs")[0][0])
    assert commands.verify(second).complete


@pytest.fixture
def other_dsn(pg_server: str) -> Iterator[str]:
    """A second database on the same server, for a target apart from its source."""
    name = f"other_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = pg_server.replace("/postgres?", f"/{name}?")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    yield dsn
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_a_default_the_target_database_lacks_is_named_before_anything_is_written(
    tmp_path: Path, pg_dsn: str, other_dsn: str
) -> None:
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("CREATE FUNCTION house_topic() RETURNS text LANGUAGE sql AS $$ SELECT 'house' $$")
        conn.execute(
            "CREATE TABLE docs (id bigserial PRIMARY KEY, body text, topic text DEFAULT house_topic())"
        )
        conn.execute("INSERT INTO docs (body) VALUES ('one'), ('two')")
    with pytest.raises(ConfigError, match=r"house_topic\(\) does not exist") as refused:
        commands.run(config(tmp_path, pg_dsn, other_dsn))
    assert "create what they use there first" in (refused.value.hint or "")

    with psycopg.connect(other_dsn) as conn:  # once the target database has it, the same config runs
        conn.execute("CREATE FUNCTION house_topic() RETURNS text LANGUAGE sql AS $$ SELECT 'elsewhere' $$")
    docs = config(tmp_path, pg_dsn, other_dsn)
    assert commands.run(docs).reconciled
    commands.cutover(docs)
    ((key, topic),) = query(other_dsn, "INSERT INTO docs (body) VALUES ('three') RETURNING id, topic")
    assert (key, topic) == (3, "elsewhere")
