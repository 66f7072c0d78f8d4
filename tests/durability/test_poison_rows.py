"""Rows a target refuses for their content end as dead letters; every other document lands (defect 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reindex import commands
from reindex.config import load
from tests.durability.support import Tool


def write_corpus(path: Path) -> None:
    lines = [{"id": f"d{i:03d}", "text": f"clean document number {i}"} for i in range(120)]
    lines[37] = {"id": "d037", "text": "a NUL \u0000 inside the text"}
    lines[81] = {"id": "d081", "text": "clean text, poisoned payload", "meta": "bad \u0000 value"}
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def write_config(tmp_path: Path, target: str, *, ceiling: int = 5) -> Path:
    corpus = tmp_path / "docs.jsonl"
    write_corpus(corpus)
    path = tmp_path / "poison.toml"
    path.write_text(
        f'[source]\nkind = "jsonl"\npath = "{corpus}"\n\n'
        f'[embedder]\nkind = "hash"\ndim = 16\n\n'
        f"[target]\n{target}\n\n"
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 50\nmax_dead_letters = {ceiling}\n'
    )
    return path


def test_a_nul_byte_that_postgres_cannot_store_is_dead_lettered_and_the_rest_lands(
    tmp_path: Path, pg_dsn: str
) -> None:
    config = write_config(tmp_path, f'kind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "docs"')
    tool = Tool(config, tmp_path / "state.db")
    code, out, err = tool.run("run", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["documents"] == 120 and report["written"] == 118 and report["reconciled"]
    letters = {d["doc_id"]: d["reason"] for d in commands.dlq_list(load(config)).dead_letters}
    assert letters == {"d037": "sink_rejected:22021", "d081": "sink_rejected:22P05"}
    coverage = commands.verify(load(config))
    assert coverage.complete and coverage.missing == 0 and coverage.dead_letters == 2


def test_qdrant_stores_the_nul_byte_losslessly(tmp_path: Path) -> None:
    config = write_config(tmp_path, f'kind = "qdrant"\npath = "{tmp_path / "qdrant"}"\nalias = "docs"')
    report = commands.run(load(config))
    assert report.written == 120 and report.dead_letters == 0
    assert commands.verify(load(config)).complete


@pytest.mark.parametrize("ceiling", [0, 1])
def test_refused_rows_past_the_ceiling_keep_verify_incomplete(
    tmp_path: Path, pg_dsn: str, ceiling: int
) -> None:
    config = load(
        write_config(tmp_path, f'kind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "docs"', ceiling=ceiling)
    )
    commands.run(config)
    coverage = commands.verify(config)
    assert not coverage.complete and coverage.over_ceiling
    assert "max_dead_letters" in coverage.problems()
