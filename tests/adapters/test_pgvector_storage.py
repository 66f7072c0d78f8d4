"""pgvector storage types through the CLI: a 3,072-d model gets halfvec and an HNSW index by default, bit
stores signs (with or without the full vector for re-ranking), and what pgvector cannot index is refused by
`plan` with exit 2 before anything is embedded. Verify, sync, compare, cutover and rollback run on each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import Bit, HalfVector, register_vector
from typer.testing import CliRunner

from reindex.ui.cli import app
from reindex_adapters.testing.memory import HashEmbedder

runner = CliRunner()
DOCS = 120


def invoke(*args: str) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, [*args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def text(i: int) -> str:
    return f"document {i} on topic {i % 13} with {'several ' * (i % 5)}words"


def config(folder: Path, dsn: str, *, dim: int, target: str = "", seed: str = "", name: str = "c") -> Path:
    corpus = folder / "docs.jsonl"
    if not corpus.exists():
        corpus.write_text(
            "".join(json.dumps({"id": f"d{i:03d}", "text": text(i)}) + "\n" for i in range(DOCS))
        )
    path = folder / f"{name}.toml"
    path.write_text(
        f'[source]\nkind = "jsonl"\npath = "{corpus}"\n\n'
        f'[embedder]\nkind = "hash"\ndim = {dim}\nseed = "{seed}"\n\n'
        f'[target]\nkind = "pgvector"\ndsn = "{dsn}"\nalias = "docs"\n{target}\n\n'
        f'[run]\nstate = "{folder / "state.db"}"\nshard_size = 50\n'
        "\n[compare]\nk = 5\nsample = 30\n"
    )
    return path


def vector(dim: int, i: int, seed: str = "") -> np.ndarray:
    model = HashEmbedder(dim=dim, seed=seed)
    return model.embed(model.tokenize([text(i)]))[0]


def nearest(dsn: str, statement: str, value: Any) -> tuple[str, str]:
    """The id the alias serves first, through its index (no sequential scan), and the plan's text."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        register_vector(conn)
        conn.execute("SET enable_seqscan = off")
        (found,) = conn.execute(statement, [value]).fetchone() or (None,)
        explain = "\n".join(row[0] for row in conn.execute("EXPLAIN " + statement, [value]).fetchall())
    return str(found), explain


def test_a_3072_dimension_model_is_stored_as_halfvec_with_an_hnsw_index_and_served_through_the_alias(
    tmp_path: Path, pg_dsn: str
) -> None:
    path = config(tmp_path, pg_dsn, dim=3072)
    code, plan = invoke("plan", "-c", str(path), "--no-calibrate")
    storage = plan["storage"]
    assert code == 0 and storage["type"] == "halfvec" and storage["precision"] == "float16"
    assert storage["index"].startswith("hnsw (halfvec_cosine_ops") and "2,000" in storage["note"]
    assert storage["bytes_per_vector"] == 8 + 2 * 3072 and plan["vector_bytes"] == DOCS * (8 + 2 * 3072)
    assert plan["index_bytes_estimate"] > plan["vector_bytes"]

    code, run = invoke("run", "-c", str(path))
    assert code == 0 and run["written"] == DOCS and run["index_seconds"] is not None
    code, verified = invoke("verify", "-c", str(path), "--sample", "20")
    assert code == 0 and verified["complete"] and verified["sample"]["min_cosine"] >= 0.999
    assert invoke("cutover", "-c", str(path))[0] == 0
    with psycopg.connect(pg_dsn) as conn:
        (definition,) = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexdef LIKE '%hnsw%'"
        ).fetchone() or ("",)
        (column,) = conn.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attname = 'embedding'",
            [run["target"]],
        ).fetchone() or ("",)
    assert "halfvec_cosine_ops" in definition and column == "halfvec(3072)"
    code, resolved = invoke("resolve", "-c", str(path))
    assert code == 0 and resolved["precision"] == "float16"  # what the application casts its queries to
    for probe in (0, 41, 119):  # each probe document finds itself first, through the index
        found, explain = nearest(
            pg_dsn, "SELECT id FROM docs ORDER BY embedding <=> %s LIMIT 1", HalfVector(vector(3072, probe))
        )
        assert found == f"d{probe:03d}" and "Index Scan" in explain


def test_models_up_to_2000_dimensions_stay_vector(tmp_path: Path, pg_dsn: str) -> None:
    for dim in (384, 1536):
        code, plan = invoke("plan", "-c", str(config(tmp_path, pg_dsn, dim=dim)), "--no-calibrate")
        assert code == 0 and plan["storage"]["type"] == "vector" and plan["storage"]["default"]
        assert plan["storage"]["index"].startswith("hnsw (vector_cosine_ops")
        assert plan["target"] == "docs__" + plan["fingerprint"][:8]  # the name targets always had


@pytest.mark.parametrize(
    ("target", "dim", "message", "fix"),
    [
        ('storage = "vector"', 3072, "takes vector up to 2,000 dimensions", 'storage = "halfvec"'),
        ('storage = "halfvec"', 5000, "takes halfvec up to 4,000", 'storage = "bit"'),
        ("full_vector = true", 384, "needs storage = 'bit'", "remove full_vector"),
        ('storage = "halfvec"\nindex = "none"', 17000, "stores halfvec up to 16,000", 'storage = "bit"'),
    ],
)
def test_what_pgvector_cannot_store_or_index_is_refused_by_plan_with_the_fix(
    tmp_path: Path, pg_dsn: str, target: str, dim: int, message: str, fix: str
) -> None:
    code, refused = invoke(
        "plan", "-c", str(config(tmp_path, pg_dsn, dim=dim, target=target)), "--no-calibrate"
    )
    assert code == 2 and message in refused["error"]["message"] and fix in refused["error"]["hint"]


def test_a_server_with_pgvector_older_than_0_7_is_told_to_update_before_halfvec(
    tmp_path: Path, pg_dsn: str
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("DROP EXTENSION vector")
        conn.execute("CREATE EXTENSION vector VERSION '0.6.2'")  # what pgserver's wheel bundles
    code, refused = invoke("run", "-c", str(config(tmp_path, pg_dsn, dim=3072)))
    assert code == 2 and "needs pgvector 0.7.0 or newer" in refused["error"]["message"]
    assert (
        "0.6.2" in refused["error"]["message"] and "ALTER EXTENSION vector UPDATE" in refused["error"]["hint"]
    )
    code, plan = invoke("plan", "-c", str(config(tmp_path, pg_dsn, dim=384)), "--no-calibrate")
    assert code == 0 and plan["storage"]["type"] == "vector"  # vector needs nothing newer


def test_bit_storage_is_verified_compared_cut_over_synced_and_rolled_back(
    tmp_path: Path, pg_dsn: str
) -> None:
    """A halfvec index is live; the next model is stored as bits. compare reads both, cutover flips to the
    bits, sync carries a source edit and removes a row that is no document, rollback returns."""
    live = config(tmp_path, pg_dsn, dim=64, target='storage = "halfvec"', name="live")
    bits = config(tmp_path, pg_dsn, dim=256, target='storage = "bit"', seed="v2", name="bits")
    code, plan = invoke("plan", "-c", str(bits), "--no-calibrate")
    assert code == 0 and plan["storage"]["type"] == "bit" and plan["storage"]["bytes_per_vector"] == 8 + 32
    assert plan["storage"]["index"].startswith("hnsw (bit_hamming_ops")
    assert plan["target"] != "docs__" + plan["fingerprint"][:8]  # the stored precision names the target
    for path in (live, bits):
        assert invoke("run", "-c", str(path))[0] == 0
    assert invoke("cutover", "-c", str(live))[0] == 0
    code, verified = invoke("verify", "-c", str(bits), "--sample", "30")
    assert code == 0 and verified["complete"] and verified["sample"]["min_cosine"] == 1.0
    code, compared = invoke("compare", "-c", str(bits))
    assert code == 0 and compared["ann"]["recall_at_k"] >= 0.9 and compared["neighbours"] is not None
    code, moved = invoke("cutover", "-c", str(bits))
    assert code == 0 and moved["changed"]

    found, explain = nearest(
        pg_dsn, "SELECT id FROM docs ORDER BY embedding <~> %s LIMIT 1", Bit(vector(256, 33, "v2") > 0)
    )
    assert found == "d033" and "Index Scan" in explain
    with psycopg.connect(pg_dsn) as conn:
        register_vector(conn)
        conn.execute(
            "INSERT INTO docs (id, text, payload, embedding) VALUES ('app1', %s, '{}', %s)",
            [text(9), Bit(vector(256, 9, "v2") > 0)],
        )
    corpus = tmp_path / "docs.jsonl"  # the source edits one document
    lines = corpus.read_text().splitlines()
    lines[5] = json.dumps({"id": "d005", "text": "rewritten by the application"})
    corpus.write_text("\n".join(lines) + "\n")
    code, verified = invoke("verify", "-c", str(bits))
    assert code == 3 and verified["stale"] == 1 and verified["orphaned"] == 1  # the JSONL file is the truth
    assert invoke("sync", "-c", str(bits))[0] == 0
    code, verified = invoke("verify", "-c", str(bits), "--sample", "30")
    assert code == 0 and verified["complete"] and verified["target_vectors"] == DOCS  # app1 is no document
    code, inspected = invoke("inspect", "-c", str(bits))
    assert code == 0, inspected
    code, back = invoke("rollback", "-c", str(bits))
    assert code == 0 and back["target"] == invoke("status", "-c", str(live))[1]["target"]


def test_bits_with_the_full_vector_kept_are_searched_by_hamming_and_re_ranked(
    tmp_path: Path, pg_dsn: str
) -> None:
    path = config(tmp_path, pg_dsn, dim=96, target='storage = "bit"\nfull_vector = true')
    code, plan = invoke("plan", "-c", str(path), "--no-calibrate")
    assert code == 0 and plan["storage"]["type"] == "bit + vector"
    assert plan["storage"]["bytes_per_vector"] == (8 + 12) + (8 + 4 * 96)
    assert "binary_quantize" in plan["storage"]["index"]
    assert invoke("run", "-c", str(path))[0] == 0
    code, verified = invoke("verify", "-c", str(path), "--sample", "20")
    assert code == 0 and verified["complete"] and verified["sample"]["min_cosine"] >= 0.999  # full precision
    code, compared = invoke("compare", "-c", str(path))
    assert code == 0 and compared["ann"]["recall_at_k"] >= 0.95  # candidates by bits, re-ranked exactly
    with psycopg.connect(pg_dsn) as conn:
        (definition,) = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexdef LIKE '%hnsw%'"
        ).fetchone() or ("",)
    assert "binary_quantize(embedding)" in definition and "bit_hamming_ops" in definition
