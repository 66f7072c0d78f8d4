"""`reindex compare` and the quality gate end to end, on pgvector and Qdrant local through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

from reindex.config import load
from reindex.run.migration import open_ledger
from reindex.ui.cli import app

runner = CliRunner()
DOCS = 300


def invoke(*args: str) -> tuple[int, dict]:
    result = runner.invoke(app, [*args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def write_files(folder: Path) -> tuple[Path, Path, Path]:
    """A corpus, and BEIR queries (20 documents' own texts) judged relevant to exactly those documents."""
    texts = {
        f"d{i:04d}": f"document {i} on topic {i % 17} with {'many ' * (i % 9)}words" for i in range(DOCS)
    }
    corpus = folder / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in texts.items()))
    judged = list(texts)[:20]
    queries = folder / "queries.jsonl"
    queries.write_text(
        "".join(json.dumps({"_id": f"q{n}", "text": texts[d]}) + "\n" for n, d in enumerate(judged))
    )
    qrels = folder / "qrels.tsv"
    qrels.write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{n}\t{d}\t1\n" for n, d in enumerate(judged))
    )
    return corpus, queries, qrels


def configs(folder: Path, target: str, gate: str = "") -> tuple[Path, Path]:
    corpus, queries, qrels = write_files(folder)
    common = f'[source]\nkind = "jsonl"\npath = "{corpus}"\n\n[target]\n{target}\n\n[run]\nstate = "{folder / "s.db"}"\n'
    old = folder / "v1.toml"
    old.write_text(common + '\n[embedder]\nkind = "hash"\ndim = 24\n')
    new = folder / "v2.toml"
    new.write_text(
        common
        + '\n[embedder]\nkind = "hash"\ndim = 32\nseed = "v2"\n'
        + f'\n[compare]\nk = 10\nsample = 50\nqueries = "{queries}"\nqrels = "{qrels}"\n'
        + 'embedder = { kind = "hash", dim = 24 }\n'
        + gate
    )
    return old, new


TARGETS = {
    "pgvector": lambda dsn, folder: f'kind = "pgvector"\ndsn = "{dsn}"\nalias = "docs"',
    "qdrant": lambda dsn, folder: f'kind = "qdrant"\npath = "{folder / "qdrant"}"\nalias = "docs"',
}


@pytest.mark.parametrize("kind", sorted(TARGETS))
def test_compare_measures_neighbourhoods_ann_recall_and_judged_queries_then_gates_cutover(
    tmp_path: Path, pg_dsn: str, kind: str
) -> None:
    old, new = configs(tmp_path, TARGETS[kind](pg_dsn, tmp_path), gate="\n[gate]\nmin_overlap_at_k = 0.5\n")
    for config in (old, new):
        assert invoke("run", "-c", str(config))[0] == 0
    assert invoke("cutover", "-c", str(old))[0] == 0

    code, report = invoke("compare", "-c", str(new))
    assert code == 3, report  # random vectors of another seed share almost no neighbours
    assert report["sample"] == 50 and report["k"] == 10 and report["live"] == "docs__" + report["live"][6:]
    neighbours = report["neighbours"]
    assert 0 <= neighbours["overlap_at_k"] < 0.5 and 0 <= neighbours["rbo"] < 0.5
    worst = neighbours["examples"][0]
    assert len(neighbours["examples"]) == 5 and worst["id"] not in worst["new"] and len(worst["new"]) == 10
    assert worst["text"].startswith("document ")
    assert report["ann"]["recall_at_k"] >= 0.9 and report["ann"]["queries"] == 50
    judged = report["judged"]  # a query that is a document's text finds that document first, both models
    assert judged["queries"] == 20
    assert judged["new"] == judged["live"] == {"ndcg_at_10": 1.0, "recall_at_k": 1.0}
    assert report["gate"]["passed"] is False
    assert report["gate"]["failures"] == [
        f"overlap_at_k {neighbours['overlap_at_k']:.4f} < min_overlap_at_k 0.5"
    ]

    code, refused = invoke("cutover", "-c", str(new))
    assert code == 3 and "quality gate" in refused["error"]["message"]
    assert "overlap_at_k" in refused["error"]["message"] and "reindex compare" in refused["error"]["hint"]
    code, moved = invoke("cutover", "-c", str(new), "--force")
    assert code == 0 and moved["changed"] and moved["forced"]

    plan_id = invoke("status", "-c", str(new))[1]["plan_id"]
    ledger = open_ledger(load(new))
    try:
        checks = ledger.verifications(plan_id, "quality")
    finally:
        ledger.close()
    assert len(checks) == 3 and not any(c.passed for c in checks)  # compare, and the gate at each cutover
    assert checks[-1].report["gate"]["failures"] == report["gate"]["failures"]


def test_compare_catches_an_ann_index_that_misses_neighbours(tmp_path: Path, pg_dsn: str) -> None:
    _, new = configs(tmp_path, TARGETS["pgvector"](pg_dsn, tmp_path))
    assert invoke("run", "-c", str(new))[0] == 0
    code, good = invoke("compare", "-c", str(new))
    assert code == 0 and good["ann"]["recall_at_k"] >= 0.9 and good["neighbours"] is None  # nothing live yet
    target = good["target"]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # a coarse IVF index probing 1 list of 100
        for (index,) in conn.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = %s AND indexdef LIKE '%%hnsw%%'", [target]
        ).fetchall():
            conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(index)))
        conn.execute(
            sql.SQL(
                "CREATE INDEX ON {} USING ivfflat (embedding vector_cosine_ops) WITH (lists = 100)"
            ).format(sql.Identifier(target))
        )
    code, bad = invoke("compare", "-c", str(new))
    assert code == 0 and bad["ann"]["recall_at_k"] < 0.5  # no [gate] here: measured, not refused
