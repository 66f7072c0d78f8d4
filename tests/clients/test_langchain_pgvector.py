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
from psycopg import sql
from typer.testing import CliRunner

from reindex.fingerprint import content_hash
from reindex.ui.cli import app
from tests.clients.support import Hashed, accept_what_plan_names

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


def configure(tmp_path: Path, pg_dsn: str) -> Path:
    """The migration of LangChain's embedding table in place: the table is the source and the alias."""
    config = tmp_path / "notes.toml"
    config.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{pg_dsn}"\ntable = "langchain_pg_embedding"\n'
        'id_column = "id"\ntext_column = "document"\n\n'
        f'[embedder]\nkind = "hash"\ndim = {NEW_DIM}\n\n'
        f'[target]\nkind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "langchain_pg_embedding"\n'
        'accept = ["indexes", "foreign_keys", "table_statements", "column_order"]\n\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 50\n'
    )
    return config


def test_langchain_reads_and_writes_through_the_alias_before_and_after_cutover(
    tmp_path: Path, pg_dsn: str, engine: sqlalchemy.Engine
) -> None:
    old = store(engine, OLD_DIM)
    old.add_documents(documents(range(120)), ids=[f"n{i}" for i in range(120)])
    config = configure(tmp_path, pg_dsn)
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
    assert report["application_rows"] == 12  # 10 inserted, 2 upserted over the tool's rows
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
    assert invoke("verify", "-c", str(config))["application_rows"] == 12  # sync left them the app's

    new.delete(ids=["n209"])  # a DELETE through the view
    with psycopg.connect(pg_dsn) as conn:  # an UPDATE of text and vector, one of the text alone
        conn.execute(
            "UPDATE langchain_pg_embedding SET document = %s, embedding = %s::vector WHERE id = 'n6'",
            ["note 6 rewritten", str(new.embeddings.embed_query("note 6 rewritten"))],
        )
        conn.execute("UPDATE langchain_pg_embedding SET document = 'note 201 retyped' WHERE id = 'n201'")
    incomplete = runner.invoke(app, ["verify", "-c", str(config), "--json"])
    report = json.loads(incomplete.stdout)
    assert incomplete.exit_code == 3 and report["stale"] == 1  # n201's text under its old vector
    assert report["application_rows"] == 12  # n209 gone, n6 now the application's, n201 still its own
    assert invoke("sync", "-c", str(config))["changed"] == 1  # the tool re-embeds n201: its row now
    report = invoke("verify", "-c", str(config))
    assert report["complete"] and report["application_rows"] == 11
    assert invoke("inspect", "-c", str(config))["coverage"]["application_rows"] == 11
    shown = runner.invoke(app, ["verify", "-c", str(config)])
    assert shown.exit_code == 0 and "written by the application" in shown.stdout

    with pytest.raises(Exception, match="expected 24 dimensions"):  # an old-model write after the flip
        store(engine, OLD_DIM).add_documents(documents([900]), ids=["n900"])
    assert np.isfinite(new.similarity_search_with_score("note 1 about topic 1", k=1)[0][1])


def test_a_target_built_before_the_origin_column_counts_nothing_until_its_next_finalize(
    tmp_path: Path, pg_dsn: str, engine: sqlalchemy.Engine
) -> None:
    store(engine, OLD_DIM).add_documents(documents(range(30)), ids=[f"n{i}" for i in range(30)])
    config = configure(tmp_path, pg_dsn)
    target = invoke("run", "-c", str(config))["target"]
    with psycopg.connect(pg_dsn) as conn:  # the target as an earlier release built it
        conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN reindex_origin").format(sql.Identifier(target)))
    invoke("cutover", "-c", str(config))
    new = store(engine, NEW_DIM)
    new.add_documents(documents([100, 101]), ids=["n100", "n101"])  # the trigger still takes them
    report = invoke("verify", "-c", str(config))
    assert report["complete"] and report["application_rows"] is None  # unknown, not 0

    invoke("run", "-c", str(config))  # finalizes again: the column is added
    new.add_documents(documents([102]), ids=["n102"])
    report = invoke("verify", "-c", str(config))
    assert report["complete"] and report["application_rows"] == 1  # n100, n101 predate the column


def test_langchain_adds_through_the_alias_after_cutover_rollback_and_prune(
    tmp_path: Path, pg_dsn: str, engine: sqlalchemy.Engine
) -> None:
    store(engine, OLD_DIM).add_documents(documents(range(40)))  # LangChain picks the ids (uuid4)
    config = configure(tmp_path, pg_dsn)
    assert invoke("run", "-c", str(config))["written"] == 40
    target = invoke("cutover", "-c", str(config))["target"]

    store(engine, NEW_DIM).add_documents(documents(range(100, 103)))  # INSERTs with the ids it picks
    assert store(engine, NEW_DIM).similarity_search("note 101 about topic 3", k=1)[0].metadata == {"n": 101}
    report = invoke("verify", "-c", str(config))
    assert report["complete"] and report["target_vectors"] == 43 and report["application_rows"] == 3

    assert invoke("rollback", "-c", str(config))["target"] == "langchain_pg_embedding__adopted"
    store(engine, OLD_DIM).add_documents(documents([200]))  # the old model, the old table
    assert store(engine, OLD_DIM).similarity_search("note 200 about topic 4", k=1)[0].metadata == {"n": 200}
    assert invoke("cutover", "-c", str(config), "--sync")["target"] == target
    assert invoke("prune", "-c", str(config), "--keep", "1")["dropped"] == ["langchain_pg_embedding__adopted"]
    new = store(engine, NEW_DIM)
    new.add_documents(documents([300]))
    assert new.similarity_search("note 200 about topic 4", k=1)[0].metadata == {"n": 200}  # synced over
    assert new.similarity_search("note 300 about topic 6", k=1)[0].metadata == {"n": 300}
    report = invoke("verify", "-c", str(config))
    assert report["complete"] and report["stale"] == 0


def test_langchain_pgvector_migrated_with_the_config_init_writes(
    tmp_path: Path,
    pg_dsn: str,
    engine: sqlalchemy.Engine,
    tiny_model: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """init → plan → run → verify → cutover as init wrote it; then the unchanged application, given only the
    new model, finds its documents, adds new ones through the alias and finds them at once, and verify stays
    complete counting them."""
    from langchain_core.embeddings import Embeddings

    from reindex import registry
    from reindex.config import load

    class Tool(Embeddings):  # the new model as the application loads it: the migration's own embedder
        def __init__(self, model: object) -> None:
            self.model = model

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            vectors: list[list[float]] = self.model.embed(self.model.tokenize(texts)).tolist()  # type: ignore[attr-defined]
            return vectors

        def embed_query(self, text: str) -> list[float]:
            return self.embed_documents([text])[0]

    store(engine, OLD_DIM).add_documents(documents(range(40)))
    monkeypatch.setenv("REINDEX_SOURCE_DSN", pg_dsn)
    monkeypatch.chdir(tmp_path)
    made = invoke(
        "init", "notes.toml", "--table", "langchain_pg_embedding", "--source-dsn-env", "REINDEX_SOURCE_DSN",
        "--model", str(tiny_model),
    )  # fmt: skip
    assert (made["source"]["id_column"], made["source"]["text_column"]) == ("id", "document")
    # init chose the column mode (the table stays the table: its GIN index on cmetadata and its foreign key
    # to the collections stay); plan names what that mode changes, which the user accepts by name: one
    # column more while in flight, and the vector column, third of five, ends up last
    accepted = accept_what_plan_names(Path("notes.toml"))
    assert accepted == ["column_order", "extra_column"]
    invoke("plan", "-c", "notes.toml", "--no-calibrate")
    assert invoke("run", "-c", "notes.toml")["written"] == 40
    assert invoke("verify", "-c", "notes.toml")["complete"]
    assert invoke("cutover", "-c", "notes.toml")["changed"]

    model = Tool(registry.build("embedder", load(Path("notes.toml")).embedder))
    new = langchain_postgres.PGVector(model, connection=engine, collection_name="notes", use_jsonb=True)
    assert new.similarity_search("note 7 about topic 0", k=1)[0].metadata == {"n": 7}
    new.add_documents(documents(range(100, 103)))
    assert new.similarity_search("note 102 about topic 4", k=1)[0].metadata == {"n": 102}
    report = invoke("verify", "-c", "notes.toml")
    assert report["complete"] and report["target_vectors"] == 43 and report["application_rows"] == 3
    assert report["application_check"]["stale"] == 0
