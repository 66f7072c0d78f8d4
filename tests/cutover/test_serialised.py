"""Alias moves are serialised per alias, and an adoption interrupted after its intent can still roll back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from reindex import commands
from reindex.config import Config, load
from reindex.errors import CutoverRefused
from reindex.state.sqlite import SqliteLedger


def make_corpus(path: Path, n: int = 60) -> Path:
    path.write_text(
        "".join(json.dumps({"id": f"d{i:03d}", "text": f"document {i}"}) + "\n" for i in range(n))
    )
    return path


def write_config(tmp_path: Path, dsn: str, *, seed: str = "new") -> Config:
    path = tmp_path / f"{seed}.toml"
    path.write_text(
        f'[source]\nkind = "jsonl"\npath = "{make_corpus(tmp_path / "docs.jsonl")}"\n\n'
        f'[embedder]\nkind = "hash"\ndim = 16\nseed = "{seed}"\n\n'
        f'[target]\nkind = "pgvector"\ndsn = "{dsn}"\nalias = "docs"\naccept = ["table_statements", "column_order"]\n\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 25\n'
    )
    return load(path)


def cli(config: Config, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "reindex", *args, "-c", str(config.path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def served(dsn: str) -> str | None:
    """The table the `docs` view reads, or None when `docs` is not a view."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT DISTINCT t.relname FROM pg_class v JOIN pg_rewrite r ON r.ev_class = v.oid"
            " JOIN pg_depend d ON d.objid = r.oid AND d.classid = 'pg_rewrite'::regclass"
            " JOIN pg_class t ON t.oid = d.refobjid AND t.oid <> v.oid"
            " WHERE v.relname = 'docs' AND v.relkind = 'v'"
        ).fetchone()
    return row[0] if row else None


def test_a_cutover_while_another_holds_the_alias_lock_exits_4_and_moves_nothing(
    tmp_path: Path, pg_dsn: str
) -> None:
    config = write_config(tmp_path, pg_dsn)
    commands.run(config)
    other = SqliteLedger(config.run.state)
    try:
        with other.alias_lock("docs"):
            refused = cli(config, "cutover")
            assert refused.returncode == CutoverRefused.exit_code, refused.stderr
            assert "docs" in refused.stderr and "error:" in refused.stderr
            assert served(pg_dsn) is None
    finally:
        other.close()
    assert cli(config, "cutover").returncode == 0
    assert served(pg_dsn) == commands.status(config).target


def test_rollback_and_prune_wait_for_no_one_but_refuse_while_the_alias_is_locked(
    tmp_path: Path, pg_dsn: str
) -> None:
    config = write_config(tmp_path, pg_dsn)
    commands.run(config)
    commands.cutover(config)
    other = SqliteLedger(config.run.state)
    try:
        with other.alias_lock("docs"):
            for verb in (commands.rollback, commands.prune):
                with pytest.raises(CutoverRefused, match="docs"):
                    verb(config)
    finally:
        other.close()


def test_adoption_interrupted_after_the_move_still_rolls_back_to_the_adopted_table(
    tmp_path: Path, pg_dsn: str
) -> None:
    """The application read a plain table `docs`; the first cutover renames it `docs__adopted`. A crash
    after the move but before the history is settled must not lose the way back."""
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("CREATE TABLE docs (id text PRIMARY KEY, text text, embedding vector(8))")
        conn.execute("INSERT INTO docs VALUES ('d000', 'old', '[1,1,1,1,1,1,1,1]')")
    config = write_config(tmp_path, pg_dsn)
    commands.run(config)
    crashed = cli(config, "cutover", env={"REINDEX_CRASH_AT": "cutover_after_move"})
    assert crashed.returncode == -9, crashed.stderr
    assert served(pg_dsn) == commands.status(config).target
    back = cli(config, "rollback", "--json")
    assert back.returncode == 0, back.stderr
    assert json.loads(back.stdout)["target"] == "docs__adopted"
    assert served(pg_dsn) == "docs__adopted"


def test_status_and_rollback_of_a_second_model_never_build_the_embedder(
    tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = write_config(tmp_path, pg_dsn, seed="old"), write_config(tmp_path, pg_dsn, seed="new")
    commands.run(old)
    commands.cutover(old)
    commands.run(new)
    commands.cutover(new)

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("reindex_adapters.testing.memory.HashEmbedder.__init__", no_model)
    assert commands.status(new).is_live
    assert commands.dlq_list(new).total == 0
    moved = commands.rollback(new)
    assert moved.target == commands.status(old).target
    assert commands.prune(new, keep=2, dry_run=True).dropped == []
