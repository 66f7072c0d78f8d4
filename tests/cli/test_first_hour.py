"""A new user's first hour (issue 43), through the CLI: paths in a config are the config file's, a ledger is
never made up for an alias the tool has moved, and mistakes get one line and exit 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

from reindex.ui.cli import app
from tests.cli.test_cli import write_corpus

runner = CliRunner()


def cli(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def jsonl_project(name: str, ids: list[str], *, run: str = "") -> None:
    """docs.jsonl (row i: id ids[i], text "text number i ...") and <name>.toml into Qdrant local mode."""
    rows = (
        json.dumps({"id": doc_id, "text": f"text number {i} about things"}) for i, doc_id in enumerate(ids)
    )
    Path("docs.jsonl").write_text("\n".join(rows) + "\n")
    Path(f"{name}.toml").write_text(
        '[source]\nkind = "jsonl"\npath = "docs.jsonl"\n[embedder]\nkind = "hash"\ndim = 8\n'
        f'[target]\nkind = "qdrant"\npath = "store"\nalias = "{name}"\n[run]\nstate = "state.db"\n{run}'
    )


@pytest.fixture
def project(tmp_path: Path, pg_dsn: str, tiny_model: Path) -> Iterator[Path]:
    """kb/kb.toml with every path relative to kb/: its corpus, its model folder and its ledger."""
    kb = tmp_path / "kb"
    (kb / "data").mkdir(parents=True)
    write_corpus(kb / "data" / "docs.jsonl", 120)
    shutil.copytree(tiny_model, kb / "models" / "tiny")
    alias = f"first_hour_{tmp_path.name[-8:].replace('-', '_')}".lower()
    (kb / "kb.toml").write_text(
        '[source]\nkind = "jsonl"\npath = "data/docs.jsonl"\n\n'
        '[embedder]\nkind = "sentence-transformers"\nmodel = "models/tiny"\n\n'
        f'[target]\nkind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "{alias}"\n\n'
        '[run]\nstate = ".reindex/state.db"\nshard_size = 64\n'
    )
    yield kb
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for (name,) in conn.execute(
            "SELECT c.relname FROM pg_class c WHERE c.relname LIKE %s AND c.relkind IN ('r', 'v')",
            (alias + "%",),
        ).fetchall():
            kind = conn.execute("SELECT relkind FROM pg_class WHERE relname = %s", (name,)).fetchone()
            what = sql.SQL("VIEW") if kind and kind[0] == "v" else sql.SQL("TABLE")
            conn.execute(sql.SQL("DROP {} IF EXISTS {} CASCADE").format(what, sql.Identifier(name)))


def test_a_configs_relative_paths_are_the_config_files_wherever_the_command_runs(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "cron"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # cron, CI, an emergency rollback: not the project's folder
    config = str(project / "kb.toml")
    code, out, err = cli("run", "-c", config, "--json")
    assert code == 0, err
    assert (project / ".reindex" / "state.db").is_file()
    assert cli("cutover", "-c", config)[0] == 0
    code, out, err = cli("status", "-c", config, "--json")
    assert code == 0, err
    status = json.loads(out)
    assert status["is_live"] and status["written"] == 120
    assert not (elsewhere / ".reindex").exists()  # no empty ledger made up in the working directory
    code, out, _ = cli("verify", "-c", config)  # live now: the hint is not to cut over again
    assert code == 0 and "The alias already serves" in out and "Next: reindex cutover" not in out


def test_a_missing_ledger_for_an_alias_the_tool_moved_is_exit_2_naming_where_it_was_looked_for(
    project: Path,
) -> None:
    config = str(project / "kb.toml")
    assert cli("run", "-c", config)[0] == 0
    assert cli("cutover", "-c", config)[0] == 0
    shutil.move(project / ".reindex", project / "moved-away")
    expected = str(project / ".reindex" / "state.db")
    for verb in ("status", "rollback", "verify", "cutover"):
        code, out, err = cli(verb, "-c", config)
        assert code == 2, (verb, out, err)
        assert expected in err and "[run] state" in err, (verb, err)
        assert len(err.strip().splitlines()) == 1, err
    assert not (project / ".reindex").exists()


def test_a_dsn_given_where_a_variable_name_belongs_is_refused_and_never_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    secret = "postgresql://app:S3cretPassw0rd@db.example/app"
    for args in (
        ("init", "kb.toml", "--table", "notes", "--source-dsn-env", secret, "--model", "tiny"),
        ("init", "kb.toml", "--table", "notes", "--source-dsn-env", secret, "--model", "tiny", "--json"),
    ):
        code, out, err = cli(*args)
        assert code == 2, (out, err)
        assert "S3cretPassw0rd" not in out + err
        assert "name of an environment variable" in out + err
    (tmp_path / "kb.toml").write_text(
        '[source]\nkind = "jsonl"\npath = "docs.jsonl"\n\n[embedder]\nkind = "hash"\ndim = 8\n\n'
        f'[target]\nkind = "pgvector"\ndsn_env = "{secret}"\nalias = "notes"\n'
    )
    (tmp_path / "docs.jsonl").write_text('{"id": "a", "text": "hello"}\n')
    for verb in ("plan", "status"):
        code, out, err = cli(verb, "-c", str(tmp_path / "kb.toml"))
        assert code == 2 and "S3cretPassw0rd" not in out + err, (verb, out, err)
        assert "name of an environment variable" in err


def test_init_where_it_cannot_write_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs.jsonl").write_text('{"id": "a", "text": "hello"}\n')
    (tmp_path / "not-a-folder").write_text("a file")
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    readonly.chmod(0o555)
    places = ["not-a-folder/kb.toml"] + (
        [] if os.geteuid() == 0 else ["readonly/kb.toml"]
    )  # root writes anyway
    for place in places:
        for json_flag in ((), ("--json",)):
            code, out, err = cli(
                "init", place, "--file", "docs.jsonl", "--model", "tiny", "--target", "qdrant",
                "--target-path", "store", *json_flag,
            )  # fmt: skip
            assert code == 2, (out, err)
            assert "cannot write" in out + err and "Traceback" not in out + err
            assert "bug" not in out + err


def test_a_model_that_is_not_there_is_one_line_at_once_in_init_and_in_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model: Path
) -> None:
    """`--model models/minilm-265` (a typo of models/minilm-256): init names the folder it looked at and the
    one it may have meant; plan on a machine that cannot reach the model hub answers in seconds."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs.jsonl").write_text('{"id": "a", "text": "hello"}\n')
    shutil.copytree(tiny_model, tmp_path / "models" / "minilm-256")
    args = ("--file", "docs.jsonl", "--target", "qdrant", "--target-path", "store")
    code, _, err = cli("init", "kb.toml", "--model", "models/minilm-265", *args)
    assert code == 2 and not (tmp_path / "kb.toml").exists()
    assert f"no model folder at {tmp_path / 'models' / 'minilm-265'}" in err and "minilm-256" in err
    assert cli("init", "sub/kb.toml", "--model", "models/minilm-256", *args)[0] == 0
    assert 'model = "../models/minilm-256"' in (tmp_path / "sub" / "kb.toml").read_text()  # the config's own
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: the hub is unreachable
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    text = (tmp_path / "sub" / "kb.toml").read_text().replace("../models/minilm-256", "someone/not-a-model")
    (tmp_path / "sub" / "kb.toml").write_text(text)
    started = time.monotonic()
    code, _, err = cli("plan", "-c", str(tmp_path / "sub" / "kb.toml"))
    assert code == 2 and time.monotonic() - started < 30, err
    assert "Hugging Face hub cannot be reached" in err and len(err.strip().splitlines()) == 1, err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _out, err = cli("plan", "-c", str(tmp_path / "sub" / "kb.toml"))
    assert code == 2 and "HF_HUB_OFFLINE is set" in err


def test_a_run_killed_before_its_target_is_finalized_is_never_verified_complete(project: Path) -> None:
    """Every row written and recorded, the finalize (ANN index, the triggers that take the application's
    writes) not done: verify says not complete (exit 3) and names the rerun; the rerun finalizes."""
    config = str(project / "kb.toml")
    killed = subprocess.run(
        [sys.executable, "-m", "reindex", "run", "-c", config],
        env={**os.environ, "REINDEX_CRASH_AT": "before_finalize"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr
    code, out, err = cli("verify", "-c", config, "--json")
    report = json.loads(out)
    assert code == 3 and not report["complete"] and report["run_unfinished"], err
    assert report["missing"] == 0  # every row is there: only the finalize is missing
    assert cli("run", "-c", config)[0] == 0
    assert cli("verify", "-c", config)[0] == 0


def test_status_says_a_plain_table_alias_serves_its_own_vectors_not_nothing(
    tmp_path: Path, pg_dsn: str
) -> None:
    """Before the first cutover the alias is the application's table, which serves every vector it holds."""
    rows = ", ".join(f"({i}, 'quote {i}', '[1,2,3,{i}]')" for i in range(1, 21))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE quotes (id bigint PRIMARY KEY, body text NOT NULL, embedding vector(4))")
        conn.execute(f"INSERT INTO quotes (id, body, embedding) VALUES {rows}")
    path = tmp_path / "quotes.toml"
    path.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{pg_dsn}"\ntable = "quotes"\nid_column = "id"\ntext_column = "body"\n'
        f'[embedder]\nkind = "hash"\ndim = 8\n[target]\nkind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "quotes"\n'
        'mode = "column"\naccept = ["extra_column"]\n[run]\nstate = "state.db"\n'
    )
    code, out, err = cli("status", "-c", str(path))
    assert code == 0, err
    assert "quotes → quotes itself (the application's own table or collection)" in out
    code, out, _ = cli("status", "-c", str(path), "--json")
    assert json.loads(out)["alias_is_physical"] is True
    # plan's storage says the vectors served now stay until prune, on top of the new ones
    _, out, _ = cli("plan", "-c", str(path), "--json", "--no-calibrate")
    assert json.loads(out)["target_layout"]["old_vector_bytes"] > 0
    _, out, _ = cli("plan", "-c", str(path), "--no-calibrate")
    assert "copied beside the vectors" not in out  # mode column: the vectors go into the table itself


def test_an_id_column_that_is_not_unique_is_named_by_plan_and_counted_once_by_every_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 rows, 200 ids: 100 ids twice with different texts. Counted four ways before (200 unreadable, 200
    dead letters of which 100 conflicts, 100 in the dead-letter queue, 100 over the ceiling)."""
    monkeypatch.chdir(tmp_path)
    jsonl_project("dup", [f"d{i % 200}" for i in range(300)])
    _, out, _ = cli("plan", "-c", "dup.toml", "--json")
    plan = json.loads(out)
    assert (plan["unreadable_or_empty"], plan["id_conflicts"], plan["repeated_rows"]) == (0, 100, 100)
    assert "the id column is not unique" in cli("plan", "-c", "dup.toml")[1]
    code, out, _ = cli("run", "-c", "dup.toml", "--json")
    assert code == 0
    run = json.loads(out)
    assert (run["written"], run["dead_letters"], run["duplicates"]) == (100, 100, 100)
    _, out, _ = cli("dlq", "list", "-c", "dup.toml", "--json")
    assert len(json.loads(out)["dead_letters"]) == 100
    _, out, _ = cli("verify", "-c", "dup.toml", "--json")
    assert json.loads(out)["dead_letters"] == 100


def test_a_resumed_runs_summary_does_not_mix_the_runs_totals_with_this_invocations_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    jsonl_project("r", [f"d{i}" for i in range(2000)], run="shard_size = 250\nworkers = 1\n")
    killed = subprocess.run(
        [sys.executable, "-m", "reindex", "run", "-c", "r.toml"],
        env={**os.environ, "REINDEX_CRASH_AT": "after_write:3"},
        capture_output=True,
        timeout=300,
    )
    assert killed.returncode == -9
    code, out, _ = cli("run", "-c", "r.toml")
    assert code == 0
    assert "Run finished: 2,000 vectors in r__" in out and "this invocation read 1,500 documents" in out


def test_resolve_after_a_rollback_to_the_applications_own_vectors_names_the_model_compare_names(
    tmp_path: Path, pg_dsn: str
) -> None:
    """After a rollback the table serves the application's own vectors, which the tool never embedded: the
    model cannot be read from them, but `[compare] embedder` names it, and resolve says where it came from."""
    rows = [(i, f"line {i}", f"[1,2,3,{i}]") for i in range(1, 11)]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE lines (id bigint PRIMARY KEY, body text NOT NULL, embedding vector(4))")
        conn.cursor().executemany("INSERT INTO lines (id, body, embedding) VALUES (%s, %s, %s)", rows)
    base = (
        f'[source]\nkind = "postgres"\ndsn = "{pg_dsn}"\ntable = "lines"\ntext_column = "body"\n'
        f'[embedder]\nkind = "hash"\ndim = 8\n[target]\nkind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "lines"\n'
        'mode = "column"\naccept = ["extra_column"]\n[run]\nstate = "state.db"\n'
    )
    path = tmp_path / "lines.toml"
    path.write_text(base)
    for verb in ("run", "cutover", "rollback"):
        assert cli(verb, "-c", str(path))[0] == 0, verb
    code, out, err = cli("resolve", "-c", str(path))
    assert code == 0, err
    assert "unknown: not built by reindex; [compare] embedder can name it" in out

    path.write_text(base + '[compare]\nembedder = { kind = "hash", dim = 4, seed = "legacy" }\n')
    code, out, err = cli("resolve", "-c", str(path), "--json")
    resolved = json.loads(out)
    assert code == 0 and resolved["model_from"] == "config", err
    assert resolved["model"] == {"kind": "hash", "dim": 4, "seed": "legacy"}
    _, out, _ = cli("resolve", "-c", str(path))
    assert "as [compare] embedder names it (the tool did not build this index)" in out
    assert cli("cutover", "-c", str(path))[0] == 0  # forward again: the model is the one recorded
    _, out, _ = cli("resolve", "-c", str(path), "--json")
    assert json.loads(out)["model_from"] == "target"


def test_plans_storage_counts_the_documents_the_target_copies_beside_the_vectors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new table or collection holds each document's fields too, not only its vector (36 MB real against
    29.7 MiB planned, before): plan adds their size, measured on a sample of their JSON."""
    monkeypatch.chdir(tmp_path)
    jsonl_project("kb", [f"doc-{i}" for i in range(300)])
    lines = Path("docs.jsonl").read_text().splitlines()
    code, out, err = cli("plan", "-c", "kb.toml", "--json", "--no-calibrate")
    assert code == 0, err
    assert json.loads(out)["document_bytes_estimate"] == sum(len(line.encode()) for line in lines)
    _, out, _ = cli("plan", "-c", "kb.toml", "--no-calibrate")
    assert "of the documents' fields, copied beside the vectors" in out


def test_verify_and_cutover_after_a_run_name_the_model_without_loading_it(project: Path) -> None:
    """Each loaded the model to learn its identity (7 s for a 0.25 s check); the run remembered it, and
    a fresh process now answers without importing torch."""
    config = str(project / "kb.toml")
    assert cli("run", "-c", config)[0] == 0
    probe = (
        "import atexit, sys; atexit.register(lambda: print('torch loaded:', 'torch' in sys.modules,"
        " file=sys.stderr)); from reindex.ui.cli import app; app()"
    )
    for verb in ("verify", "cutover"):
        done = subprocess.run(
            [sys.executable, "-c", probe, verb, "-c", config, "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            env=os.environ | {"HF_HUB_OFFLINE": "1"},
        )
        assert done.returncode == 0, done.stderr
        assert "torch loaded: False" in done.stderr, (verb, done.stderr)
    code, out, _ = cli("status", "-c", config, "--json")
    assert code == 0 and json.loads(out)["is_live"]
