"""A Postgres source named like the alias (issue 10, defect 9; configs/postgres-to-pgvector.toml does this).

After the first cutover the source `docs` is the view over the target: the bookkeeping columns stay out of
the documents, application edits through the view show up as stale, and the next migration from the same
config builds a clean target, cuts over and rolls back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from reindex import commands
from reindex.config import Config, load

DOCUMENTS = 120


def query(dsn: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement).fetchall()


def make_docs(dsn: str) -> None:
    """The application's plain table, read by name today."""
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE docs (id bigint PRIMARY KEY, body text NOT NULL, topic text)")
        conn.execute(
            "INSERT INTO docs SELECT i, 'document ' || i || ' about ' || (i %% 7), 't' || (i %% 7)"
            " FROM generate_series(1, %s) i",
            [DOCUMENTS],
        )


def config(tmp_path: Path, dsn: str, embedder: str) -> Config:
    path = tmp_path / f"docs-{abs(hash(embedder)):x}.toml"
    path.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{dsn}"\ntable = "docs"\nid_column = "id"\ntext_column = "body"\n'
        f"[embedder]\n{embedder}\n"
        f'[target]\nkind = "pgvector"\ndsn = "{dsn}"\nalias = "docs"\naccept = ["table_statements", "column_order"]\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 50\n'
    )
    return load(path)


def columns_of(dsn: str, relation: str) -> list[str]:
    return [
        name
        for (name,) in query(
            dsn,
            f"SELECT attname FROM pg_attribute WHERE attrelid = '{relation}'::regclass"
            " AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        )
    ]


def test_a_source_named_like_the_alias_survives_cutover_edits_and_a_second_migration(
    tmp_path: Path, pg_dsn: str
) -> None:
    make_docs(pg_dsn)
    first = config(tmp_path, pg_dsn, 'kind = "hash"\ndim = 16')
    assert commands.run(first).reconciled
    assert commands.verify(first).complete
    adopted = commands.cutover(first)
    assert adopted.previous == "docs__adopted" and adopted.target.startswith("docs__")
    assert query(pg_dsn, "SELECT relkind::text FROM pg_class WHERE relname = 'docs'") == [("v",)]

    # The application keeps writing through the view: verify sees the stale vector, sync repairs it.
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("UPDATE docs SET body = 'rewritten by the application' WHERE id = 7")
    stale = commands.verify(first)
    assert not stale.complete and (stale.stale, stale.missing, stale.orphaned) == (1, 0, 0)
    assert commands.sync(first).changed == 1
    assert commands.verify(first).complete

    # A second migration from the same config, another model: the source is now the view over the target.
    second = config(tmp_path, pg_dsn, 'kind = "hash"\ndim = 24\nseed = "second"')
    assert commands.run(second).reconciled
    coverage = commands.verify(second)
    assert coverage.complete and coverage.source_documents == DOCUMENTS
    moved = commands.cutover(second)
    assert moved.previous == adopted.target and moved.target != adopted.target
    new_columns = columns_of(pg_dsn, moved.target)
    bookkeeping = ["reindex_fingerprint", "reindex_content_hash", "reindex_origin"]
    assert new_columns == ["id", "body", "topic", "embedding", *bookkeeping]  # none of the view's twice
    assert query(pg_dsn, "SELECT body, vector_dims(embedding) FROM docs WHERE id = 7") == [
        ("rewritten by the application", 24)
    ]

    back = commands.rollback(second)
    assert back.target == adopted.target
    assert query(pg_dsn, "SELECT vector_dims(embedding) FROM docs WHERE id = 7") == [(16,)]
    assert commands.verify(first).complete


def test_dead_letters_keep_counting_after_the_flip_onto_a_view_named_like_the_source(
    tmp_path: Path, pg_dsn: str
) -> None:
    """After the first cutover the source `docs` is the view over the target, which holds no dead letter:
    verify and `dlq retry` go on judging them by the table the run read (`docs__adopted`)."""
    from reindex_adapters.testing.memory import HashEmbedder

    make_docs(pg_dsn)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("UPDATE docs SET body = '   ' WHERE id = 3")
    first = config(tmp_path, pg_dsn, 'kind = "hash"\ndim = 16')
    assert commands.run(first).reconciled
    assert commands.verify(first).dead_letters == 1
    commands.cutover(first)

    after = commands.verify(first)
    assert after.complete and after.dead_letters == 1 and after.source_documents == DOCUMENTS
    retried = commands.dlq_retry(first)
    assert (retried.vanished, retried.total) == (0, 1)
    assert commands.verify(first).dead_letters == 1

    text = "a text at last"  # the application writes the document through the view, with the new model
    vector = "[" + ",".join(map(str, HashEmbedder(dim=16).vector(text).tolist())) + "]"
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("INSERT INTO docs (id, body, topic, embedding) VALUES (3, %s, 't3', %s)", [text, vector])
    fixed = commands.verify(first)
    assert fixed.complete and fixed.dead_letters == 0 and fixed.application_rows == 1
