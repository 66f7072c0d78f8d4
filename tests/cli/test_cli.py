"""The CLI end to end on real backends: exit codes, JSON shapes, one-line errors on stderr."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

from reindex.run import processes
from reindex.ui.cli import app

runner = CliRunner()


def invoke(*args: str) -> tuple[int, dict | None, str]:
    result = runner.invoke(app, list(args))
    try:
        data = json.loads(result.stdout) if "--json" in args and result.stdout.strip() else None
    except json.JSONDecodeError:
        data = None
    return result.exit_code, data, result.stderr


def write_corpus(path: Path, n: int) -> Path:
    with path.open("w") as out:
        for i in range(n):
            text = f"document {i} is about topic {i % 17} and {'lengthy ' * (i % 40)}words"
            out.write(json.dumps({"id": f"d{i:04d}", "text": text, "lang": "en"}) + "\n")
        out.write(json.dumps({"id": "blank", "text": "  "}) + "\n")
    return path


def write_config(path: Path, *, source: str, embedder: str, target: str, state: Path) -> Path:
    path.write_text(
        f"[source]\n{source}\n\n[embedder]\n{embedder}\n\n[target]\n{target}\n\n"
        f'[run]\nstate = "{state}"\nshard_size = 64\n'
    )
    return path


@pytest.fixture
def configs(tmp_path: Path, pg_dsn: str, tiny_model: Path) -> tuple[Path, Path]:
    corpus = write_corpus(tmp_path / "docs.jsonl", 300)
    source = f'kind = "jsonl"\npath = "{corpus}"'
    target = f'kind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "docs"'
    state = tmp_path / "state.db"
    old = write_config(
        tmp_path / "v1.toml", source=source, embedder='kind = "hash"\ndim = 24', target=target, state=state
    )
    new = write_config(
        tmp_path / "v2.toml",
        source=source,
        embedder=f'kind = "sentence-transformers"\nmodel = "{tiny_model}"',
        target=target,
        state=state,
    )
    return old, new


def test_plan_run_verify_cutover_rollback_prune_on_pgvector(configs: tuple[Path, Path], pg_dsn: str) -> None:
    old, new = configs
    code, plan, _ = invoke("plan", "-c", str(new), "--json")
    assert code == 0 and plan is not None
    assert plan["documents"] == 301 and plan["embeddable"] == 300 and plan["tokens"] > 3000
    assert plan["target_exists"] is False and plan["eta_seconds"] is not None

    for config in (old, new):
        code, run, stderr = invoke("run", "-c", str(config), "--json")
        assert code == 0, stderr
        assert run is not None and run["written"] == 300 and run["dead_letters"] == 1 and run["reconciled"]
        code, report, _ = invoke("verify", "-c", str(config), "--json")
        assert code == 0 and report is not None and report["complete"]
        assert report["source_documents"] == 301 and report["target_vectors"] == 300
        assert report["dead_letters"] == 1 and report["missing"] == report["stale"] == 0

    assert invoke("cutover", "-c", str(old))[0] == 0
    code, moved, _ = invoke("cutover", "-c", str(new), "--json")
    assert code == 0 and moved is not None and moved["changed"]
    with psycopg.connect(pg_dsn) as conn:
        dims = conn.execute("SELECT DISTINCT vector_dims(embedding) FROM docs").fetchall()
    assert dims == [(32,)]

    code, status, _ = invoke("status", "-c", str(new), "--json")
    assert status is not None and status["is_live"] and status["reconciled"] and status["written"] == 300

    code, back, _ = invoke("rollback", "-c", str(new), "--json")
    assert code == 0 and back is not None and back["target"] == moved["previous"]
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT DISTINCT vector_dims(embedding) FROM docs").fetchall() == [(24,)]
    assert invoke("cutover", "-c", str(new))[0] == 0

    code, pruned, _ = invoke("prune", "-c", str(new), "--keep", "1", "--json")
    assert code == 0 and pruned is not None and pruned["dropped"] == [moved["previous"]]
    code, _, stderr = invoke("rollback", "-c", str(new))
    assert code == 4 and "pruned" in stderr


def test_plan_gives_the_eta_on_a_number_of_workers(configs: tuple[Path, Path]) -> None:
    _, new = configs
    code, one, _ = invoke("plan", "-c", str(new), "--json")
    # 5 shards: the workers a run would start here (one per core but one, a worker per 4 shards)
    workers = processes.workers_at(processes.default_workers(processes.cores()), 5)
    assert code == 0 and one is not None and one["workers"] == workers
    rate = one["worker_docs_per_second"] * one["workers"]
    # the pipeline rehearsed on the corpus's first shards (all 5 here) into a scratch table: its pace, and
    # the time before its pace (start, the first shards through every stage), once a run
    assert one["rehearsal_documents"] == 301 and one["eta_basis"].startswith("rehearsed on 301 documents")
    fill = one["rehearsal_fill_seconds"]
    assert one["eta_seconds_workers"] == pytest.approx(fill + 301 / rate, abs=0.1)
    code, fleet, _ = invoke("plan", "-c", str(new), "--json", "--workers", "16", "--worker-rate", "40000")
    assert code == 0 and fleet is not None
    assert (fleet["workers"], fleet["shards"], fleet["worker_docs_per_second"]) == (16, 5, 40000)
    assert fleet["eta_seconds_workers"] == pytest.approx(301 / 640_000, abs=0.1)
    assert fleet["ledger_shards_per_second"] == pytest.approx(640_000 / 64)
    assert invoke("plan", "-c", str(new), "--workers", "0")[0] == 2


def test_incomplete_target_fails_verify_and_refuses_cutover(configs: tuple[Path, Path], pg_dsn: str) -> None:
    _, new = configs
    assert invoke("run", "-c", str(new))[0] == 0
    code, plan, _ = invoke("plan", "-c", str(new), "--json", "--no-calibrate")
    target = plan["target"] if plan else ""
    with psycopg.connect(pg_dsn) as conn:
        table = sql.Identifier(target)
        conn.execute(sql.SQL("DELETE FROM {0} WHERE id IN (SELECT id FROM {0} LIMIT 3)").format(table))
        conn.execute(sql.SQL("UPDATE {} SET reindex_content_hash = 'x' WHERE id = 'd0007'").format(table))
    code, report, _ = invoke("verify", "-c", str(new), "--json")
    assert code == 3 and report is not None and (report["missing"], report["stale"]) == (3, 1)
    code, _, stderr = invoke("cutover", "-c", str(new))
    assert code == 3 and "3 missing" in stderr and "1 stale" in stderr and "reindex verify" in stderr
    code, _, stderr = invoke("cutover", "-c", str(new), "--force")
    assert code == 0 and "--force" in stderr
    assert invoke("status", "-c", str(new), "--json")[1]["history"][-1]["forced"] is True  # type: ignore[index]


def test_rerunning_a_finished_run_writes_nothing_new(configs: tuple[Path, Path]) -> None:
    old, _ = configs
    assert invoke("run", "-c", str(old))[0] == 0
    code, run, _ = invoke("run", "-c", str(old), "--json")
    assert code == 0 and run is not None and run["written"] == 300 and run["seconds"] < 30


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            '[source]\nkind = "jsonl"\npath = "x"\n[embedder]\nkind = "hash"\n[target]\nkind = "pgvector"\n'
            'dsn = "postgresql://nobody@127.0.0.1:1/x"\nalias = "docs"\naliass = "typo"\n',
            "unknown key 'aliass'",
        ),
        (
            '[source]\nkind = "mongo"\n[embedder]\nkind = "hash"\n[target]\nkind = "qdrant"\nalias = "a"\n',
            "unknown source kind 'mongo'",
        ),
        ('[source]\nkind = "jsonl"\npath = "x"\n[embedder]\nkind = "hash"\n', "missing section [target]"),
        (
            '[source]\nkind = "jsonl"\npath = "x"\n[embedder]\nkind = "hash"\n[target]\nkind = "pgvector"\n'
            'dsn = "postgresql://nobody:secret@127.0.0.1:1/x"\nalias = "docs"\n',
            "check [target] dsn",
        ),
    ],
)
def test_misconfiguration_is_one_line_and_exit_2(tmp_path: Path, body: str, message: str) -> None:
    (tmp_path / "x").write_text('{"id": "1", "text": "a"}\n')
    config = tmp_path / "bad.toml"
    config.write_text(body.replace('path = "x"', f'path = "{tmp_path / "x"}"'))
    code, _, stderr = invoke("status", "-c", str(config))
    assert code == 2
    assert message in stderr and "secret" not in stderr
    assert stderr.strip().count("\n") == 0 or len(stderr.strip().splitlines()) <= 2


def test_missing_config_file_is_exit_2(tmp_path: Path) -> None:
    code, _, stderr = invoke("plan", "-c", str(tmp_path / "nope.toml"))
    assert code == 2 and "not found" in stderr


def test_dead_letters_are_listed_and_retried_after_a_fix(tmp_path: Path, pg_dsn: str) -> None:
    corpus = tmp_path / "docs.jsonl"
    lines = [{"id": f"d{i}", "text": f"plain document {i}"} for i in range(40)]
    lines += [{"id": "long", "text": "word " * 50}, {"id": "blank", "text": ""}, {"id": "gone", "text": " "}]
    corpus.write_text("".join(json.dumps(line) + "\n" for line in lines))
    body = (
        f'[source]\nkind = "jsonl"\npath = "{corpus}"\n[embedder]\nkind = "hash"\nmax_tokens = 20\n'
        f'[target]\nkind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "docs"\n'
        f'[run]\nstate = "{tmp_path / "s.db"}"\nshard_size = 16\ntoo_long = "dead-letter"\n'
    )
    config = tmp_path / "c.toml"
    config.write_text(body)
    assert invoke("run", "-c", str(config))[0] == 0
    code, listed, _ = invoke("dlq", "list", "-c", str(config), "--json")
    assert code == 0 and listed is not None
    assert listed["reasons"] == {"too_long": 1, "empty_text": 2}

    config.write_text(body.replace('too_long = "dead-letter"', 'too_long = "truncate"'))
    lines[-2]["text"] = "now it has text"
    corpus.write_text("".join(json.dumps(line) + "\n" for line in lines[:-1]))  # "gone" vanished
    code, retried, _ = invoke("dlq", "retry", "-c", str(config), "--json")
    assert code == 0 and retried is not None
    assert (retried["retried"], retried["written"], retried["vanished"], retried["total"]) == (3, 2, 1, 0)
    code, status, _ = invoke("status", "-c", str(config), "--json")
    assert status is not None and status["reconciled"] and status["written"] == 42
    assert invoke("verify", "-c", str(config))[0] == 0


@pytest.mark.parametrize(
    ("key", "name", "message"),
    [
        ("alias", "docs/live", "'docs/live' has '/', which Qdrant refuses in collection and alias names"),
        ("name", "docs/v2", "'docs/v2' has '/', which Qdrant refuses in collection and alias names"),
        ("alias", "docs:live", "use e.g. 'docs_live'"),
        ("name", 'd<o>c"s|v?2*', "use e.g. 'd_o_c_s_v_2_'"),
        ("name", "docs\\v2", "use e.g. 'docs_v2'"),
        ("name", "..", "'..' is not a name Qdrant accepts"),
        ("alias", "a" * 222, "shorten it to 221 characters or fewer"),
        ("name", "n" * 256, "shorten it to 255 characters or fewer"),
    ],
)
def test_a_qdrant_name_qdrant_would_refuse_fails_plan_with_exit_2(
    tmp_path: Path, key: str, name: str, message: str
) -> None:
    """Caught at config time, before anything is read or built, not by `run` once the work is done."""
    corpus = write_corpus(tmp_path / "docs.jsonl", 5)
    target = f'kind = "qdrant"\npath = "{tmp_path / "qdrant"}"\nalias = "docs"'
    escaped = name.replace("\\", "\\\\").replace('"', '\\"')
    target = target.replace('alias = "docs"', f'alias = "{escaped}"') if key == "alias" else target
    config = write_config(
        tmp_path / "q.toml",
        source=f'kind = "jsonl"\npath = "{corpus}"',
        embedder='kind = "hash"\ndim = 8',
        target=target + (f'\nname = "{escaped}"' if key == "name" else ""),
        state=tmp_path / "state.db",
    )
    code, _, stderr = invoke("plan", "-c", str(config), "--no-calibrate")
    assert code == 2, stderr
    assert f"[target] {key}: " in stderr and message in stderr
    assert len(stderr.strip().splitlines()) == 1
    assert not (tmp_path / "state.db").exists() and not (tmp_path / "qdrant").exists()


def test_the_longest_qdrant_alias_runs_and_cuts_over(tmp_path: Path) -> None:
    """221 characters: its target (alias + 10) and its guard alias (alias + 34, hashed) fit in Qdrant's 255."""
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": f"document {i}"}) + "\n" for i in range(5)))
    config = write_config(
        tmp_path / "q.toml",
        source=f'kind = "jsonl"\npath = "{corpus}"',
        embedder='kind = "hash"\ndim = 8',
        target=f'kind = "qdrant"\npath = "{tmp_path / "qdrant"}"\nalias = "{"a" * 221}"',
        state=tmp_path / "state.db",
    )
    assert invoke("run", "-c", str(config))[0] == 0
    code, moved, _ = invoke("cutover", "-c", str(config), "--json")
    assert code == 0 and moved is not None and moved["changed"], moved


def test_whole_migration_into_qdrant_local_with_a_real_model(tmp_path: Path, tiny_model: Path) -> None:
    corpus = write_corpus(tmp_path / "docs.jsonl", 120)
    storage = tmp_path / "qdrant"
    config = write_config(
        tmp_path / "q.toml",
        source=f'kind = "jsonl"\npath = "{corpus}"',
        embedder=f'kind = "sentence-transformers"\nmodel = "{tiny_model}"',
        target=f'kind = "qdrant"\npath = "{storage}"\nalias = "docs"',
        state=tmp_path / "state.db",
    )
    code, run, stderr = invoke("run", "-c", str(config), "--json")
    assert code == 0 and run is not None and run["written"] == 120, stderr
    assert invoke("verify", "-c", str(config))[0] == 0
    code, moved, _ = invoke("cutover", "-c", str(config), "--json")
    assert code == 0 and moved is not None and moved["previous"] is None
    code, resolved, _ = invoke("resolve", "-c", str(config), "--json")
    assert code == 0 and resolved is not None and resolved["model"]["dim"] == 32
    assert resolved["target"] == moved["target"]

    from qdrant_client import QdrantClient

    from reindex_adapters.sentence_transformers import SentenceTransformerEmbedder

    query = SentenceTransformerEmbedder(str(tiny_model))
    text = json.loads(corpus.read_text().splitlines()[7])[
        "text"
    ]  # random weights: only identity is meaningful
    vector = query.embed(query.tokenize([text]))[0]
    client = QdrantClient(path=str(storage))
    try:
        hits = client.query_points("docs", query=vector.tolist(), limit=3, with_payload=True).points
    finally:
        client.close()
    assert hits[0].payload is not None and hits[0].payload["reindex_id"] == "d0007"


def test_json_is_one_document_for_every_outcome_errors_included(
    configs: tuple[Path, Path], tmp_path: Path
) -> None:
    old, _ = configs
    # before any run: verify gives the whole coverage shape (nothing built, all missing), not an error text
    code, report, _ = invoke("verify", "-c", str(old), "--json")
    assert code == 3 and report is not None and report["complete"] is False
    assert report["target_exists"] is False and report["missing"] == 301 and report["target_vectors"] == 0
    code, refused, _ = invoke("cutover", "-c", str(old), "--json")  # nothing ran: no target to flip to
    assert code == 3 and refused is not None
    assert refused["error"]["code"] == 3 and "nothing has run" in refused["error"]["message"]
    assert refused["error"]["hint"] == "run `reindex run` first"
    # a configuration error, a missing file and a usage error: JSON on stdout, with the exit code
    bad = tmp_path / "bad.toml"
    bad.write_text(old.read_text().replace('alias = "docs"', 'alias = "docs"\naliass = "typo"'))
    for args, expected in [
        (("status", "-c", str(bad)), "unknown key 'aliass'"),
        (("plan", "-c", str(tmp_path / "nope.toml")), "not found"),
        (("run",), "Missing option"),
        (("verify", "-c", str(old), "--sample", "-1"), "--sample"),
    ]:
        result = runner.invoke(app, [*args, "--json"])
        error = json.loads(result.stdout)["error"]
        assert result.exit_code == 2 == error["code"], result.stdout
        assert expected in error["message"] and set(error) == {"code", "message", "hint"}


def test_dlq_takes_its_config_before_or_after_the_verb(configs: tuple[Path, Path]) -> None:
    old, _ = configs
    assert invoke("run", "-c", str(old))[0] == 0
    before = invoke("dlq", "-c", str(old), "list", "--json")
    after = invoke("dlq", "list", "-c", str(old), "--json")
    assert before[0] == after[0] == 0 and before[1] == after[1] and after[1] is not None
    assert after[1]["reasons"] == {"empty_text": 1}
    code, missing, _ = invoke("dlq", "list", "--json")
    assert code == 2 and missing is not None and "--config" in missing["error"]["message"]


def test_a_fresh_database_gets_the_vector_extension_or_a_one_line_fix(tmp_path: Path, pg_server: str) -> None:
    corpus = write_corpus(tmp_path / "docs.jsonl", 20)
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute('CREATE DATABASE "fresh_ext"')
        conn.execute('CREATE DATABASE "fresh_noext"')
        conn.execute('CREATE ROLE "plain_role" LOGIN')
        conn.execute('GRANT ALL ON DATABASE "fresh_noext" TO "plain_role"')
    fresh = pg_server.replace("/postgres?", "/fresh_ext?")
    for name, dsn in [("ext", fresh), ("noext", _as_role(pg_server.replace("/postgres?", "/fresh_noext?")))]:
        config = write_config(
            tmp_path / f"{name}.toml",
            source=f'kind = "jsonl"\npath = "{corpus}"',
            embedder='kind = "hash"\ndim = 8',
            target=f'kind = "pgvector"\ndsn = "{dsn}"\nalias = "docs"',
            state=tmp_path / f"{name}.db",
        )
        code, _, stderr = invoke("run", "-c", str(config))
        if name == "ext":
            assert code == 0, stderr
            with psycopg.connect(fresh) as conn:
                assert conn.execute(
                    "SELECT count(*) FROM pg_extension WHERE extname = 'vector'"
                ).fetchone() == (1,)
        else:
            assert code == 2 and "cannot be created by this role" in stderr
            assert "CREATE EXTENSION vector" in stderr and len(stderr.strip().splitlines()) <= 2


def _as_role(dsn: str) -> str:
    """The DSN with user plain_role (pgserver trusts local connections)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(dsn)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"plain_role@{host}"))


def test_plan_warns_when_a_sqlite_ledger_would_carry_a_large_corpus(
    configs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past SQLITE_LEDGER_DOCUMENTS a SQLite ledger's cost per text grows with the run, where dedupe is
    run-wide (a row per text): plan names the fix. A free model's windowed dedupe writes no such rows."""
    from reindex.plan import estimate as planning

    old, _ = configs
    code, plan, _ = invoke("plan", "-c", str(old), "--json", "--no-calibrate")
    assert code == 0 and plan is not None and plan["ledger_advice"] is None
    monkeypatch.setattr(planning, "SQLITE_LEDGER_DOCUMENTS", 300)
    code, plan, _ = invoke("plan", "-c", str(old), "--json", "--no-calibrate")
    assert code == 0 and plan is not None and plan["ledger_advice"] is None  # dedupe = "auto": windowed
    old.write_text(old.read_text().replace('state = "', 'dedupe = "run"\nstate = "', 1))
    code, plan, _ = invoke("plan", "-c", str(old), "--json", "--no-calibrate")
    assert code == 0 and plan is not None
    assert plan["ledger_advice"].startswith("301 documents on a SQLite ledger")
    assert 'state = "postgresql://..."' in plan["ledger_advice"]
    result = runner.invoke(app, ["plan", "-c", str(old), "--no-calibrate"])
    assert result.exit_code == 0 and "warning: 301 documents on a SQLite ledger" in result.stdout
    monkeypatch.setenv("REINDEX_TEST_STATE", "postgresql://ledger.internal/reindex")
    text = old.read_text().replace('state = "', 'state_env = "REINDEX_TEST_STATE"\n# state = "')
    old.write_text(text)
    code, plan, _ = invoke("plan", "-c", str(old), "--json", "--no-calibrate")
    assert code == 0 and plan is not None and plan["ledger_advice"] is None
