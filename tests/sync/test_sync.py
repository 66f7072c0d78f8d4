"""Catch-up sync against a live Postgres source, alias resolution, inspection of foreign indexes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from reindex import commands
from reindex.config import load
from reindex.errors import VerificationFailed
from tests.durability.support import Tool


def make_source(dsn: str, n: int) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "CREATE TABLE articles (id bigint PRIMARY KEY, body text, topic text, embedding vector(3))"
        )
        conn.execute(
            "INSERT INTO articles SELECT i, 'article number ' || i || ' on topic ' || (i %% 9),"
            " 't' || (i %% 9), '[1,0,0]' FROM generate_series(1, %s) i",
            [n],
        )


def write_config(
    tmp_path: Path, dsn: str, *, embedder: str = 'kind = "hash"\ndim = 16', latency: float = 0
) -> Path:
    path = tmp_path / "sync.toml"
    path.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{dsn}"\ntable = "articles"\ntext_column = "body"\n'
        f"[embedder]\n{embedder}\nlatency_ms = {latency}\n"
        if "hash" in embedder
        else f'[source]\nkind = "postgres"\ndsn = "{dsn}"\ntable = "articles"\ntext_column = "body"\n'
        f"[embedder]\n{embedder}\n"
    )
    path.write_text(
        path.read_text() + f'[target]\nkind = "pgvector"\ndsn = "{dsn}"\nalias = "articles_live"\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 100\n'
    )
    return path


def change_source(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "INSERT INTO articles SELECT i, 'late article ' || i, 'new', '[1,0,0]'"
            " FROM generate_series(100001, 100040) i"
        )
        conn.execute("UPDATE articles SET body = body || ' (edited)' WHERE id % 50 = 0")
        conn.execute("DELETE FROM articles WHERE id % 77 = 0")


def test_sync_catches_inserts_updates_and_deletes_made_during_a_run(tmp_path: Path, pg_dsn: str) -> None:
    make_source(pg_dsn, 3000)
    config = write_config(tmp_path, pg_dsn, latency=15)
    process = subprocess.Popen(
        [sys.executable, "-m", "reindex", "run", "-c", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    tool = Tool(config, tmp_path / "state.db")
    while tool.ledger_written()[0] < 3 and process.poll() is None:
        time.sleep(0.02)
    change_source(pg_dsn)  # while the run is in flight: some changes land behind its cursor
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    cfg = load(config)
    with pytest.raises(VerificationFailed):
        commands.cutover(cfg)
    report = commands.sync(cfg)
    assert report.changed > 0 and report.deleted > 0 and report.added + report.changed + report.deleted > 0
    assert commands.verify(cfg).complete
    again = commands.sync(cfg)
    assert (again.added, again.changed, again.deleted, again.repaired) == (0, 0, 0, 0)
    change_source_after = "UPDATE articles SET body = 'rewritten' WHERE id = 1"
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(change_source_after)
    moved = commands.cutover(cfg, sync=True)
    assert moved.changed and commands.verify(cfg).complete


def test_resolve_names_the_model_serving_the_alias(tmp_path: Path, pg_dsn: str) -> None:
    make_source(pg_dsn, 50)
    cfg = load(write_config(tmp_path, pg_dsn))
    commands.run(cfg)
    commands.cutover(cfg)
    resolved = commands.resolve(cfg)
    assert resolved.target and resolved.target.startswith("articles_live__")
    assert resolved.model is not None and resolved.model["kind"] == "hash" and resolved.model["dim"] == 16
    assert resolved.fingerprint == resolved.model["fingerprint"]
    with psycopg.connect(pg_dsn) as conn:
        comment = conn.execute("SELECT obj_description('articles_live'::regclass, 'pg_class')").fetchone()
    assert comment is not None and resolved.fingerprint in comment[0]


def test_inspect_reports_an_index_this_tool_did_not_build(tmp_path: Path, pg_dsn: str) -> None:
    make_source(pg_dsn, 30)
    with psycopg.connect(pg_dsn) as conn:  # the application's own table, read by name today
        conn.execute("CREATE TABLE articles_live AS SELECT * FROM articles WHERE id <= 25")
        conn.execute("ALTER TABLE articles_live ADD PRIMARY KEY (id)")
    cfg = load(write_config(tmp_path, pg_dsn))
    report = commands.inspect(cfg)
    assert report.alias_is_physical and not report.built_by_reindex
    assert report.coverage.missing == 5 and report.coverage.fingerprints == {"none": 25}


def test_verify_sample_reembeds_and_catches_a_wrong_vector(
    tmp_path: Path, pg_dsn: str, tiny_model: Path
) -> None:
    make_source(pg_dsn, 40)
    cfg = load(
        write_config(tmp_path, pg_dsn, embedder=f'kind = "sentence-transformers"\nmodel = "{tiny_model}"')
    )
    commands.run(cfg)
    good = commands.verify(cfg, sample=40)
    assert good.complete and good.sample is not None and good.sample["min_cosine"] >= 0.999
    target = good.target
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(
            f'UPDATE "{target}" SET embedding = (SELECT embedding FROM "{target}" WHERE id = 2) WHERE id = 1'
        )
    bad = commands.verify(cfg, sample=40)
    assert not bad.complete and bad.sample is not None and bad.sample["failures"] == 1
