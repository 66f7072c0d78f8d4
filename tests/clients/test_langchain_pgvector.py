"""A LangChain `PGVector` collection (langchain-postgres) migrated in place: the application reads *and*
writes through the alias before and after cutover, with the model it uses on each side of the flip."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import langchain_postgres
import numpy as np
import psycopg
import pytest
import sqlalchemy
from langchain_core.documents import Document
from typer.testing import CliRunner

from reindex.cli import app
from reindex.fingerprint import content_hash
from tests.clients.support import Hashed

runner = CliRunner()
OLD_DIM, NEW_DIM = 16, 24


def invoke(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def engine(pg_dsn: str) -> Iterator[sqlalchemy.Engine]:
    """The application's SQLAlchemy engine, disposed at the end (its pooled connections closed)."""
    built = sqlalchemy.create_engine(pg_dsn.replace("postgresql://", "postgresql+psycopg://", 1))
    yield built
    built.dispose()


def store(engine: sqlalchemy.Engine, dim: int) -> langchain_postgres.PGVector:
    return langchain_postgres.PGVector(
        Hashed(dim), connection=engine, collection_name="notes", use_jsonb=True
    )


def documents(ids: Sequence[int], version: str = "") -> list[Document]:
    return [Document(f"note {i} about topic {i % 7}{version}", metadata={"n": i}) for i in ids]


def test_langchain_reads_and_writes_through_the_alias_before_and_after_cutover(
    tmp_path: Path, pg_dsn: str, engine: sqlalchemy.Engine
) -> None:
    old = store(engine, OLD_DIM)
    old.add_documents(documents(range(120)), ids=[f"n{i}" for i in range(120)])
    config = tmp_path / "notes.toml"
    config.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{pg_dsn}"\ntable = "langchain_pg_embedding"\n'
        'id_column = "id"\ntext_column = "document"\n\n'
        f'[embedder]\nkind = "hash"\ndim = {NEW_DIM}\n\n'
        f'[target]\nkind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "langchain_pg_embedding"\n\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 50\n'
    )
    assert invoke("run", "-c", str(config))["written"] == 120
    old.add_documents(documents([500]), ids=["n500"])  # still the old index: written before the flip
    assert old.similarity_search("note 7 about topic 0", k=1)[0].metadata == {"n": 7}
    assert invoke("cutover", "-c", str(config), "--sync")["changed"]

    new = store(engine, NEW_DIM)  # the application switches its model with the alias
    assert new.similarity_search("note 7 about topic 0", k=1)[0].metadata == {"n": 7}
    assert new.similarity_search("note 500 about topic 3", k=1)[0].metadata == {"n": 500}
    new.add_documents(documents(range(200, 210)), ids=[f"n{i}" for i in range(200, 210)])  # INSERTs
    new.add_documents(documents([3, 4], version=" (edited)"), ids=["n3", "n4"])  # ON CONFLICT DO UPDATE
    new.delete(ids=["n5"])
    assert new.similarity_search("note 204 about topic 1", k=1)[0].metadata == {"n": 204}
    assert new.similarity_search("note 3 about topic 3 (edited)", k=1)[0].page_content.endswith("(edited)")

    report = invoke("verify", "-c", str(config), "--sample", "40")  # re-embeds 40 rows: the app's too
    assert report["complete"] and report["target_vectors"] == 130 and report["stale"] == 0
    assert report["application_rows"] is None  # the trigger's rows look like the tool's (README)
    plan = invoke("plan", "-c", str(config), "--no-calibrate")
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            "SELECT document, reindex_fingerprint, reindex_content_hash FROM langchain_pg_embedding"
            " WHERE id IN ('n3', 'n200')"
        ).fetchall()
    assert len(rows) == 2
    for text, stamped, digest in rows:  # filled in the database, as the tool computes them
        assert stamped == plan["fingerprint"] and digest == content_hash(text)
    caught_up = invoke("sync", "-c", str(config))
    assert caught_up["added"] == caught_up["changed"] == caught_up["deleted"] == 0  # nothing to redo

    with pytest.raises(Exception, match="expected 24 dimensions"):  # an old-model write after the flip
        store(engine, OLD_DIM).add_documents(documents([900]), ids=["n900"])
    assert np.isfinite(new.similarity_search_with_score("note 1 about topic 1", k=1)[0][1])
