"""A migration of a Postgres application table, killed at each named point of a shard and run again: the
target (the source's own columns, written by one bulk COPY per batch) ends with every column of every
row exactly as the source holds it, each vector a fresh embedding of its text, and no row twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector
from psycopg import sql
from psycopg.types.json import Jsonb

from reindex_adapters.testing.memory import HashEmbedder
from tests.durability.support import Tool, assert_crashed, fresh_vector

ROWS = 300
SHARD = 25
COLUMNS = sql.SQL(", ").join(map(sql.Identifier, ("id", "body", "meta", "seen", "tags", "score")))


def make_table(dsn: str) -> dict[int, str]:
    """An application table (10% of its rows repeat an earlier text, some columns NULL); id -> text."""
    rng = np.random.default_rng(11)
    texts = {i: f"article {i} about {['shards', 'vectors', 'aliases'][i % 3]}" for i in range(ROWS)}
    for i in rng.choice(ROWS, ROWS // 10, replace=False).tolist():
        texts[i] = texts[(i + 7) % ROWS]
    with psycopg.connect(dsn, autocommit=True) as conn:
        register_vector(conn)
        conn.execute(
            "CREATE TABLE articles (id bigint PRIMARY KEY, body text, meta jsonb, seen timestamptz,"
            " tags text[], score numeric, embedding vector(3))"
        )
        copy_in = sql.SQL("COPY articles ({}, embedding) FROM STDIN").format(COLUMNS)
        with conn.cursor().copy(copy_in) as copy:
            for i, text in texts.items():
                meta = None if i % 4 == 0 else Jsonb({"n": i, "tags": ["a", None]})
                seen = None if i % 5 == 0 else f"2026-01-01 00:00:{i % 60:02d}+00"
                tags = [] if i % 2 else [f"t{i}", "x y"]
                copy.write_row((i, text, meta, seen, tags, f"{i}.25", np.ones(3, dtype=np.float32)))
    return texts


def tool_for(tmp_path: Path, dsn: str) -> Tool:
    state, config = tmp_path / "state.db", tmp_path / "reindex.toml"
    config.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{dsn}"\ntable = "articles"\ntext_column = "body"\n'
        'vector_column = "embedding"\n\n'
        '[embedder]\nkind = "hash"\ndim = 16\nmax_tokens = 128\n\n'
        f'[target]\nkind = "pgvector"\ndsn = "{dsn}"\nalias = "articles_live"\n\n'
        f'[run]\nstate = "{state}"\nshard_size = {SHARD}\n'
    )
    return Tool(config, state)


def killed_then_rerun(tool: Tool, point: str) -> dict[str, Any]:
    """`run` killed at the third shard's `point`, run again to the end; then verify's report, complete."""
    code, _, err = tool.run("run", env={"REINDEX_CRASH_AT": f"{point}:3"})
    assert_crashed(code, err)
    code, _, err = tool.run("run")
    assert code == 0, err
    report: dict[str, Any] = tool.json("verify")
    assert report["complete"], report
    return report


def assert_fresh(vectors: list[tuple[Any, Any]], texts: dict[int, str]) -> None:
    """Each stored vector is a fresh embedding of its row's text."""
    embedder = HashEmbedder(dim=16, max_tokens=128)
    for doc_id, vector in vectors:
        got = np.asarray(vector, dtype=np.float32)
        np.testing.assert_allclose(
            got / np.linalg.norm(got), fresh_vector(embedder, texts[doc_id]), atol=1e-5
        )


@pytest.mark.parametrize("point", ["after_embed", "mid_write", "after_write"])
def test_a_table_migration_killed_at_a_shard_point_ends_with_every_column_and_vector_exact(
    tmp_path: Path, pg_dsn: str, point: str
) -> None:
    texts = make_table(pg_dsn)
    tool = tool_for(tmp_path, pg_dsn)
    report = killed_then_rerun(tool, point)
    target = sql.Identifier(report["target"])
    with psycopg.connect(pg_dsn) as conn:
        register_vector(conn)
        rows = sql.SQL("SELECT {} FROM {} ORDER BY id")
        source = conn.execute(rows.format(COLUMNS, sql.Identifier("articles"))).fetchall()
        stored = conn.execute(rows.format(COLUMNS, target)).fetchall()
        vectors = conn.execute(sql.SQL("SELECT id, embedding FROM {}").format(target)).fetchall()
        origins = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE reindex_origin IS NOT NULL").format(target)
        ).fetchone()
    assert stored == source  # every column of every row, NULLs and arrays included, and no row twice
    assert origins == (0,)
    assert_fresh(vectors, texts)
    status = tool.json("status")
    assert status["reconciled"] and status["state"] == "complete"


@pytest.mark.parametrize("point", ["after_embed", "mid_write", "after_write"])
def test_a_column_mode_migration_killed_at_a_shard_point_leaves_the_table_exact_and_ends_complete(
    tmp_path: Path, pg_dsn: str, point: str
) -> None:
    """`mode = "column"`, killed with SIGKILL at a shard point and run again: the application's columns are
    untouched, the new column holds a fresh embedding of every row's text, and the rows are the same rows."""
    texts = make_table(pg_dsn)
    state, config = tmp_path / "state.db", tmp_path / "reindex.toml"
    config.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{pg_dsn}"\ntable = "articles"\ntext_column = "body"\n\n'
        '[embedder]\nkind = "hash"\ndim = 16\nmax_tokens = 128\n\n'
        f'[target]\nkind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "articles"\nmode = "column"\n'
        'accept = ["extra_column"]\n\n'
        f'[run]\nstate = "{state}"\nshard_size = {SHARD}\n'
    )
    tool = Tool(config, state)
    rows = sql.SQL("SELECT {}, embedding::text FROM articles ORDER BY id").format(COLUMNS)
    with psycopg.connect(pg_dsn) as conn:
        before = conn.execute(rows).fetchall()
    report = killed_then_rerun(tool, point)
    column = sql.Identifier(f"embedding__{report['target'].split('__')[1]}")
    with psycopg.connect(pg_dsn) as conn:
        register_vector(conn)
        after = conn.execute(rows).fetchall()
        vectors = conn.execute(sql.SQL("SELECT id, {} FROM articles").format(column)).fetchall()
    assert after == before  # the application's own columns and vectors, every row, none twice
    assert_fresh(vectors, texts)
    assert tool.json("status")["reconciled"]
