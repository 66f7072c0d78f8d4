"""A whole migration of a SQLite table through the real command line, the `sqlite` kind reached only through
its entry points: init, plan, run, verify, cutover (the alias view serves the new vectors), rollback."""

from __future__ import annotations

import json
import sqlite3
import tomllib
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from reindex.ui.cli import app

runner = CliRunner()
DOCUMENTS = 30


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def succeeded(*args: str, code: int = 0) -> dict:
    exited, stdout, stderr = invoke(*args, "--json")
    assert exited == code, f"{args}: exit {exited}\n{stdout}\n{stderr}"
    return json.loads(stdout)


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative paths in the written file ([run] state, the SQLite file) resolve here."""
    monkeypatch.chdir(tmp_path)


def make_docs(path: Path) -> None:
    """An application's table: a key, a short title and a body."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE docs (id INTEGER PRIMARY KEY, title TEXT, body TEXT)")
        conn.executemany(
            "INSERT INTO docs VALUES (?, ?, ?)",
            [
                (i, f"title {i}", f"document {i} is a longer body about topic {i % 5} and more words")
                for i in range(1, DOCUMENTS + 1)
            ],
        )
    conn.close()


def served(path: Path, name: str) -> dict[str, np.ndarray]:
    """Every vector the table or view `name` holds, by document id."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute(f'SELECT id, vector FROM "{name}"').fetchall()
    conn.close()
    return {doc_id: np.frombuffer(blob, dtype="<f4") for doc_id, blob in rows}


def view_over(path: Path, alias: str) -> str:
    with sqlite3.connect(path) as conn:
        (sql,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'view' AND name = ?", (alias,)
        ).fetchone()
    conn.close()
    return str(sql)


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def init_sqlite(model: Path, *extra: str, config: str = "c.toml") -> tuple[int, str, str]:
    return invoke(
        "init", config, "--source", "sqlite", "--source-set", "path=docs.db", "--source-set", "table=docs",
        "--model", str(model), *extra,
    )  # fmt: skip


def old_model_config(written: str) -> str:
    """The same migration with the free `hash` model: the index the application serves before the new model."""
    head, _, rest = written.partition("[embedder]")
    _, _, tail = rest.partition("\n[target]")
    return f'{head}[embedder]\nkind = "hash"\ndim = 24\n\n[target]{tail}'


def test_a_sqlite_table_is_migrated_verified_cut_over_and_rolled_back(
    tmp_path: Path, tiny_model: Path
) -> None:
    db = tmp_path / "docs.db"
    make_docs(db)
    exited, stdout, stderr = init_sqlite(tiny_model, "--alias", "docs_vectors", "--json")
    assert exited == 0, stdout + stderr
    found = json.loads(stdout)
    assert (found["found"]["documents"], found["found"]["units"]) == (DOCUMENTS, "rows")
    assert (found["found"]["id"]["field"], found["found"]["text"]["field"]) == ("id", "body")
    assert found["found"]["text"]["others"] == ["title"]
    written = tomllib.loads(Path("c.toml").read_text())
    assert written["source"] == {
        "kind": "sqlite", "path": "docs.db", "table": "docs", "id_column": "id", "text_column": "body",
    }  # fmt: skip
    assert written["target"] == {"kind": "sqlite", "path": "docs.db", "alias": "docs_vectors"}

    # the index the application reads today: the same table under the free `hash` model, cut over first
    Path("old.toml").write_text(old_model_config(Path("c.toml").read_text()))
    old = succeeded("run", "-c", "old.toml")
    assert (old["written"], old["reconciled"]) == (DOCUMENTS, True)
    assert succeeded("cutover", "-c", "old.toml")["previous"] is None
    old_vectors = served(db, "docs_vectors")
    assert len(old_vectors) == DOCUMENTS and {len(v) for v in old_vectors.values()} == {24}

    plan = succeeded("plan", "-c", "c.toml", "--no-calibrate")
    assert (plan["documents"], plan["embeddable"], plan["dim"]) == (DOCUMENTS, DOCUMENTS, 32)
    assert (plan["alias_target"], plan["alias_is_physical"]) == (old["target"], False)
    assert plan["target"].startswith("docs_vectors__") and not plan["target_exists"]

    run = succeeded("run", "-c", "c.toml")
    assert (run["target"], run["written"], run["dead_letters"], run["reconciled"]) == (
        plan["target"], DOCUMENTS, 0, True,
    )  # fmt: skip

    verified = succeeded("verify", "-c", "c.toml", "--sample", "5")
    assert verified["complete"] and not verified["is_live"]
    counts = ("source_documents", "target_vectors", "missing", "stale", "orphaned", "invalid_vectors")
    assert [verified[key] for key in counts] == [DOCUMENTS, DOCUMENTS, 0, 0, 0, 0]
    assert verified["fingerprints"] == {plan["fingerprint"]: DOCUMENTS}

    moved = succeeded("cutover", "-c", "c.toml")
    assert (moved["alias"], moved["target"], moved["previous"], moved["changed"]) == (
        "docs_vectors", run["target"], old["target"], True,
    )  # fmt: skip
    new_vectors = served(db, run["target"])
    assert same(served(db, "docs_vectors"), new_vectors)  # every document, the new model's vector
    assert sorted(new_vectors, key=int) == [str(i) for i in range(1, DOCUMENTS + 1)]
    assert {len(v) for v in new_vectors.values()} == {32}
    assert run["target"] in view_over(db, "docs_vectors")
    status = succeeded("status", "-c", "c.toml")
    assert (status["alias_target"], status["is_live"]) == (run["target"], True)
    assert [(h["old"], h["new"]) for h in status["history"]][-1] == (old["target"], run["target"])

    back = succeeded("rollback", "-c", "c.toml")
    assert (back["target"], back["previous"], back["changed"]) == (old["target"], run["target"], True)
    assert same(served(db, "docs_vectors"), old_vectors)
    assert succeeded("status", "-c", "c.toml")["alias_target"] == old["target"]


def test_a_missing_table_is_named_with_its_fix(tmp_path: Path, tiny_model: Path) -> None:
    make_docs(tmp_path / "docs.db")
    exited, stdout, stderr = invoke(
        "init", "c.toml", "--source", "sqlite", "--source-set", "path=docs.db", "--source-set", "table=doc",
        "--model", str(tiny_model),
    )  # fmt: skip
    assert exited == 2, stdout + stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "no table 'doc'" in lines[0] and "its tables: docs" in lines[0]
    assert "--source-set table=NAME" in lines[0]
    assert not Path("c.toml").exists()


def test_a_missing_file_is_named_with_its_fix(tmp_path: Path, tiny_model: Path) -> None:
    exited, stdout, stderr = invoke(
        "init", "c.toml", "--source", "sqlite", "--source-set", "path=nowhere.db", "--source-set", "table=docs",
        "--model", str(tiny_model), "--json",
    )  # fmt: skip
    assert exited == 2, stdout + stderr
    error = json.loads(stdout)["error"]
    assert error["code"] == 2 and "no SQLite file at" in error["message"] and "nowhere.db" in error["message"]
    assert "path=FILE" in error["hint"]
    assert not (tmp_path / "nowhere.db").exists()  # never created by looking


def test_a_table_dropped_after_init_stops_plan_with_exit_2(tmp_path: Path, tiny_model: Path) -> None:
    make_docs(tmp_path / "docs.db")
    assert init_sqlite(tiny_model, "--alias", "docs_vectors")[0] == 0
    with sqlite3.connect(tmp_path / "docs.db") as conn:
        conn.execute("ALTER TABLE docs RENAME TO articles")
    conn.close()
    exited, stdout, stderr = invoke("plan", "-c", "c.toml", "--no-calibrate")
    assert exited == 2, stdout + stderr
    (line,) = stderr.strip().splitlines()
    assert "no table 'docs'" in line and "its tables: articles" in line and "set [source] table" in line


def test_the_default_alias_names_the_source_table_and_the_cutover_refuses_to_replace_it(
    tmp_path: Path, tiny_model: Path
) -> None:
    """Without --alias, init proposes the table's own name (what applications read now); this sink adopts no
    table, so the run leaves the table alone and the cutover refuses, naming the fix."""
    db = tmp_path / "docs.db"
    make_docs(db)
    assert init_sqlite(tiny_model)[0] == 0
    assert tomllib.loads(Path("c.toml").read_text())["target"]["alias"] == "docs"
    assert succeeded("plan", "-c", "c.toml", "--no-calibrate")["alias_is_physical"] is True
    assert succeeded("run", "-c", "c.toml")["reconciled"]
    refused = succeeded("cutover", "-c", "c.toml", code=4)["error"]
    assert "did not create" in refused["message"] and "[target] alias" in refused["hint"]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT type FROM sqlite_master WHERE name = 'docs'").fetchone() == ("table",)
        assert conn.execute("SELECT count(*) FROM docs").fetchone() == (DOCUMENTS,)
    conn.close()
