"""`reindex init` on real sources: the file it writes loads, `reindex plan` runs on it, secrets stay out."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from qdrant_client import QdrantClient, models
from typer.testing import CliRunner

from reindex import commands
from reindex.config import load
from reindex.ui.cli import app

runner = CliRunner()
DOCUMENTS = 40


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def unwrapped(path: str) -> str:
    """The file's text with comment marks and line breaks taken out: wrapped comments read as one line."""
    return " ".join(Path(path).read_text().replace("#", " ").split())


def planned(config: str, code: int = 0) -> dict:
    exited, stdout, stderr = invoke("plan", "-c", config, "--json", "--no-calibrate")
    assert exited == code, stdout + stderr
    return json.loads(stdout)


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative paths in the written file ([run] state, a local store) resolve here."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def source_dsn(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("REINDEX_SOURCE_DSN", pg_dsn)
    return pg_dsn


def make_docs(dsn: str) -> None:
    """An application's table: a key, a short title, a body, and 8-d vectors under a cosine HNSW index."""
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE docs (id bigint PRIMARY KEY, title text, body text, embedding vector(8))")
        conn.execute(
            "INSERT INTO docs SELECT i, 'title ' || i, 'document ' || i || ' about topic ' || (i %% 5),"
            " array_fill(i::real, ARRAY[8])::vector FROM generate_series(1, %s) i",
            [DOCUMENTS],
        )
        conn.execute("CREATE INDEX ON docs USING hnsw (embedding vector_cosine_ops)")


def init_table(table: str, model: Path, *extra: str) -> tuple[int, str, str]:
    return invoke(
        "init",
        f"{table}.toml",
        "--table",
        table,
        "--source-dsn-env",
        "REINDEX_SOURCE_DSN",
        "--model",
        str(model),
        *extra,
    )


def test_a_postgres_table_becomes_a_commented_config_that_plan_reads(
    source_dsn: str, tiny_model: Path
) -> None:
    make_docs(source_dsn)
    code, stdout, stderr = init_table("docs", tiny_model)
    assert code == 0, stderr
    assert "found: table docs, 40 rows; current vectors: embedding vector(8), cosine" in stdout
    assert "wrote docs.toml" in stdout and "next: reindex plan -c docs.toml" in stdout

    assert source_dsn not in Path("docs.toml").read_text()
    text = unwrapped("docs.toml")
    assert "Found: table docs, 40 rows; current vectors: embedding vector(8), cosine." in text
    assert "docs is a plain table today, and stays the table applications use" in text
    assert 'also found: "title" (8 characters on average); --text-column picks another' in text
    config = load(Path("docs.toml"))
    assert config.tables["source"] == {
        "kind": "postgres",
        "dsn_env": "REINDEX_SOURCE_DSN",
        "table": "docs",
        "id_column": "id",
        "text_column": "body",
        "vector_column": "embedding",
    }
    assert config.tables["target"] == {
        "kind": "pgvector",
        "dsn_env": "REINDEX_SOURCE_DSN",
        "alias": "docs",
        "mode": "column",
    }
    assert config.tables["embedder"] == {
        "kind": "sentence-transformers",
        "model": str(tiny_model),
        "normalize": True,
    }

    # The plain table keeps everything in the column mode but one column more while in flight: plan names
    # that and exits 2 until the config accepts it, for which the written file has the line, commented out.
    plan = planned("docs.toml", code=2)
    assert plan["documents"] == DOCUMENTS and plan["alias"] == "docs" and plan["alias_is_physical"]
    assert [loss["key"] for loss in plan["losses"]] == ["extra_column"]
    assert 'accept = ["extra_column"] column mode adds one column while in flight' in text


def test_a_view_an_earlier_migration_made_is_recognised_as_the_alias(
    source_dsn: str, tiny_model: Path
) -> None:
    make_docs(source_dsn)
    Path("first.toml").write_text(
        '[source]\nkind = "postgres"\ndsn_env = "REINDEX_SOURCE_DSN"\ntable = "docs"\n'
        '[embedder]\nkind = "hash"\ndim = 8\n'
        '[target]\nkind = "pgvector"\ndsn_env = "REINDEX_SOURCE_DSN"\nalias = "docs"\n'
        'accept = ["table_statements", "column_order"]\n'
        '[run]\nstate = "first.db"\n'
    )
    first = load(Path("first.toml"))
    assert commands.run(first).reconciled
    served = commands.cutover(first).target

    code, stdout, stderr = init_table("docs", tiny_model, "--json")
    assert code == 0, stderr
    report = json.loads(stdout)
    found = report["found"]
    assert found["relation"] == "view" and found["documents"] == DOCUMENTS
    assert found["is_alias"] and found["alias"]["target"] == served and found["alias"]["fingerprint"]
    assert found["id"] == {"field": "id", "reason": "the primary key", "others": []}  # the target's key
    assert found["text"]["field"] == "body" and found["text"]["others"] == ["title"]
    assert set(found["text_lengths"]) == {"title", "body"}  # the bookkeeping columns are no documents' text
    assert found["vector"]["field"] == "embedding" and found["dim"] == 8
    assert report["path"] == "docs.toml" and report["next"] == "reindex plan -c docs.toml"
    assert report["source"]["table"] == "docs" and report["target"]["alias"] == "docs"
    assert "is already an alias: a view an earlier migration made over" in " ".join(report["notes"])

    plan = planned("docs.toml")
    assert plan["documents"] == DOCUMENTS and plan["alias_target"] == served


def langchain_store(folder: Path) -> None:
    """As langchain-qdrant stores chunks (unnamed vector, uuid ids, page_content + metadata), behind an alias."""
    client = QdrantClient(path=str(folder))
    client.create_collection(
        "lc_v1", vectors_config=models.VectorParams(size=4, distance=models.Distance.COSINE)
    )
    points = [
        models.PointStruct(
            id=str(uuid.uuid5(uuid.NAMESPACE_DNS, f"chunk{i}")),
            vector=[1.0, float(i), 0.5, 0.0],
            payload={
                "page_content": f"chunk {i} of a guide to vector search",
                "metadata": {"source": f"doc{i}.md"},
            },
        )
        for i in range(DOCUMENTS)
    ]
    client.upsert("lc_v1", points, wait=True)
    create = models.CreateAlias(collection_name="lc_v1", alias_name="docs")
    client.update_collection_aliases(
        change_aliases_operations=[models.CreateAliasOperation(create_alias=create)]
    )
    client.close()


def test_a_langchain_qdrant_collection_behind_an_alias(tiny_model: Path) -> None:
    langchain_store(Path("store"))
    code, stdout, stderr = invoke(
        "init",
        "qdrant.toml",
        "--collection",
        "docs",
        "--source-path",
        "store",
        "--model",
        str(tiny_model),
        "--json",
    )
    assert code == 0, stderr
    found = json.loads(stdout)["found"]
    assert (found["relation"], found["documents"], found["dim"], found["distance"]) == (
        "alias",
        40,
        4,
        "cosine",
    )
    assert found["is_alias"] and found["alias"] == {"target": "lc_v1", "fingerprint": None}
    assert found["text"] == {
        "field": "page_content",
        "reason": "a well-known name",
        "others": ["metadata.source"],
    }
    config = load(Path("qdrant.toml"))
    assert config.tables["source"] == {
        "kind": "qdrant",
        "path": str(Path.cwd() / "store"),  # written relative; read as the config file's
        "collection": "docs",
        "text_field": "page_content",
    }
    assert config.tables["target"] == {"kind": "qdrant", "path": str(Path.cwd() / "store"), "alias": "docs"}
    assert 'path = "store"' in Path("qdrant.toml").read_text()
    plan = planned("qdrant.toml")
    assert plan["documents"] == DOCUMENTS and plan["alias_target"] == "lc_v1"

    # The collection itself, read by name: Qdrant cannot put an alias over it, and the file says what to do.
    code, stdout, stderr = invoke(
        "init", "plain.toml", "--collection", "lc_v1", "--source-path", "store", "--model", str(tiny_model)
    )
    assert code == 0, stderr
    assert "lc_v1 is a collection, and Qdrant cannot put an alias over one" in " ".join(stdout.split())
    assert "(e.g. lc_v1_live -> lc_v1)" in unwrapped("plain.toml")


def write_export(path: Path) -> None:
    rows = [
        {
            "doc_id": f"d{i}",
            "title": f"t{i}",
            "content": f"exported row {i} with its text",
            "embedding": [0.5] * 6,
        }
        for i in range(DOCUMENTS)
    ]
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows) + "\n")


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_an_export_file_goes_to_the_target_it_is_given(
    suffix: str, pg_dsn: str, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REINDEX_TARGET_DSN", pg_dsn)
    write_export(Path(f"export{suffix}"))
    code, _, stderr = invoke("init", "export.toml", "--file", f"export{suffix}", "--model", str(tiny_model))
    kind = suffix.removeprefix(".")
    assert code == 2 and f"a {kind} source needs a target" in stderr and not Path("export.toml").exists()
    assert "--target pgvector --target-dsn-env" in stderr and "--target qdrant --target-url" in stderr

    code, _, stderr = invoke(
        "init", "export.toml", "--file", f"export{suffix}", "--model", str(tiny_model),
        "--target", "pgvector", "--target-dsn-env", "REINDEX_TARGET_DSN",
    )  # fmt: skip
    assert code == 0, stderr
    config = load(Path("export.toml"))
    kind = suffix.lstrip(".")
    assert config.tables["source"] == {
        "kind": kind,
        "path": str(Path.cwd() / f"export{suffix}"),  # written relative; read as the config file's
        "id_field": "doc_id",
        "text_field": "content",
    }
    assert config.tables["target"] == {"kind": "pgvector", "dsn_env": "REINDEX_TARGET_DSN", "alias": "export"}
    assert "embedding looks like old vectors (6 floats)" in unwrapped("export.toml")
    assert planned("export.toml")["documents"] == DOCUMENTS


def test_a_provider_model_gets_the_openai_kind_and_its_key_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    write_export(Path("export.jsonl"))
    code, stdout, stderr = invoke(
        "init", "openai.toml", "--file", "export.jsonl", "--model", "text-embedding-3-small",
        "--target", "qdrant", "--target-path", "store",
    )  # fmt: skip
    assert code == 0, stderr
    assert load(Path("openai.toml")).tables["embedder"] == {
        "kind": "openai",
        "model": "text-embedding-3-small",
        "api_key_env": "OPENAI_API_KEY",
    }
    assert "note: OPENAI_API_KEY is not set here" in stdout


def test_ambiguous_text_columns_pick_the_longest_and_name_the_others(
    source_dsn: str, tiny_model: Path
) -> None:
    with psycopg.connect(source_dsn) as conn:
        conn.execute(
            "CREATE TABLE notes (ref text PRIMARY KEY, headline text, summary text, author varchar(40))"
        )
        conn.execute(
            "INSERT INTO notes SELECT 'n' || i, 'headline ' || i, repeat('a longer summary ', 4), 'ann'"
            " FROM generate_series(1, 10) i"
        )
        conn.execute("CREATE TABLE loose (label text, words text)")

    code, _, stderr = init_table("notes", tiny_model)
    assert code == 0, stderr
    text = unwrapped("notes.toml")
    assert 'id_column = "ref"' in text and 'text_column = "summary"' in text
    assert "the longest average text in a sample (68 characters)" in text
    assert (
        'also found: "headline" (10 characters on average), "author" (3 characters on average);'
        " --text-column picks another"
    ) in text

    code, _, stderr = invoke(
        "init", "headline.toml", "--table", "notes", "--source-dsn-env", "REINDEX_SOURCE_DSN",
        "--model", str(tiny_model), "--text-column", "headline",
    )  # fmt: skip
    assert code == 0, stderr
    assert load(Path("headline.toml")).tables["source"]["text_column"] == "headline"

    code, _, stderr = init_table("loose", tiny_model)
    assert code == 2 and "no usable id column in table loose" in stderr and "--id-column NAME" in stderr
    assert not Path("loose.toml").exists()


def test_an_existing_file_is_never_overwritten() -> None:
    Path("docs.toml").write_text("# mine\n")
    code, stdout, stderr = invoke("init", "docs.toml", "--file", "docs.jsonl", "--model", "m")
    assert code == 2 and "docs.toml already exists" in stderr and "choose another file name" in stderr
    code, stdout, stderr = invoke("init", "docs.toml", "--file", "docs.jsonl", "--model", "m", "--json")
    assert code == 2 and json.loads(stdout)["error"]["message"].startswith("docs.toml already exists")
    assert Path("docs.toml").read_text() == "# mine\n"


@pytest.mark.parametrize(
    "dsn", ["postgresql://app:s3cret@db.example/docs", "host=db.example dbname=docs password=s3cret"]
)
def test_a_dsn_with_a_password_on_the_command_line_is_refused(dsn: str) -> None:
    code, stdout, stderr = invoke("init", "docs.toml", "--table", "docs", "--source-dsn", dsn, "--model", "m")
    assert code == 2 and "--source-dsn holds a password" in stderr and "--source-dsn-env" in stderr
    assert "s3cret" not in stdout + stderr and not Path("docs.toml").exists()


def test_a_missing_environment_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REINDEX_NOWHERE", raising=False)
    code, stdout, _ = invoke(
        "init",
        "docs.toml",
        "--table",
        "docs",
        "--source-dsn-env",
        "REINDEX_NOWHERE",
        "--model",
        "m",
        "--json",
    )
    error = json.loads(stdout)["error"]
    assert code == 2 and error["code"] == 2 and "REINDEX_NOWHERE is not set" in error["message"]
    assert not Path("docs.toml").exists()


# a model each kind takes; the local kinds any name (init does not load it)
EMBEDDER_MODELS = {
    "sentence-transformers": "sentence-transformers/all-MiniLM-L6-v2",
    "vllm": "BAAI/bge-m3",
    "openai": "text-embedding-3-small",
    "openai-batch": "text-embedding-3-large",
    "azure-openai": "text-embedding-3-small",
    "gemini-batch": "gemini-embedding-001",
    "mistral-batch": "mistral-embed",
    "bedrock-batch": "amazon.titan-embed-text-v2:0",
    "voyage-batch": "voyage-3.5",
    "voyage": "voyage-3.5-lite",
    "cohere-batch": "embed-english-v3.0",
    "cohere": "embed-v4.0",
}


def test_init_offers_every_built_in_kind_the_tool_runs() -> None:
    """Every built-in kind describes itself to `init` (its class's `offer`), and a model is claimed by at most
    one kind (a kind added later must be added to EMBEDDER_MODELS too)."""
    from reindex import registry

    assert set(registry.embedder_offers()) >= set(registry.EMBEDDERS) == set(EMBEDDER_MODELS)
    assert set(registry.source_offers()) >= set(registry.SOURCES)
    assert set(registry.target_offers()) >= set(registry.SINKS)
    claimed = [model for offer in registry.embedder_offers().values() for model in offer.claims]
    assert len(claimed) == len(set(claimed))


@pytest.mark.parametrize("kind", sorted(EMBEDDER_MODELS))
def test_every_embedder_kind_is_written_with_its_required_keys_and_validates(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reindex import registry
    from reindex.errors import validate

    write_export(Path("export.jsonl"))
    code, stdout, stderr = invoke(
        "init", f"{kind}.toml", "--file", "export.jsonl", "--model", EMBEDDER_MODELS[kind], "--embedder", kind,
        "--target", "qdrant", "--target-path", "store", "--json",
    )  # fmt: skip
    assert code == 0, stdout + stderr
    report = json.loads(stdout)
    section = load(Path(f"{kind}.toml")).tables["embedder"]
    assert section["kind"] == kind and section["model"] == EMBEDDER_MODELS[kind]
    adapter = registry.resolve("embedder", kind)
    validate("embedder", adapter.Config, dict(section))  # every required key is there, none unknown
    required = {name for name, f in adapter.Config.model_fields.items() if f.is_required()}
    assert required <= set(section)
    if kind in ("azure-openai", "bedrock-batch"):  # values init cannot know are named as placeholders
        assert any("is a placeholder: set it before `reindex run`" in note for note in report["notes"])
    text = Path(f"{kind}.toml").read_text()
    if "api_key_env" in section:
        assert section["api_key_env"].endswith("API_KEY") and "never written here" in text


@pytest.mark.parametrize(
    ("model", "kind"),
    [
        ("mistral-embed", "mistral-batch"),
        ("voyage-3.5", "voyage-batch"),
        ("embed-english-v3.0", "cohere-batch"),
        ("embed-v4.0", "cohere"),  # Embed Jobs do not take it: the online kind
        ("all-MiniLM-L6-v2", "sentence-transformers"),
    ],
)
def test_a_model_a_provider_sells_gets_that_providers_kind(model: str, kind: str) -> None:
    write_export(Path("export.jsonl"))
    code, _, stderr = invoke(
        "init", "m.toml", "--file", "export.jsonl", "--model", model, "--target", "qdrant", "--target-path", "s",
    )  # fmt: skip
    assert code == 0, stderr
    assert load(Path("m.toml")).embedder.kind == kind


def test_an_unknown_embedder_kind_and_a_key_for_bedrock_are_refused() -> None:
    write_export(Path("export.jsonl"))
    args = ("--file", "export.jsonl", "--target", "qdrant", "--target-path", "s")
    code, _, stderr = invoke("init", "a.toml", *args, "--model", "m", "--embedder", "bert")
    assert code == 2 and "not a kind the tool runs" in stderr and "voyage-batch" in stderr
    code, _, stderr = invoke(
        "init", "b.toml", *args, "--model", "amazon.titan-embed-text-v2:0", "--api-key-env", "AWS_KEY"
    )
    assert code == 2 and "boto3" in stderr


def test_a_kind_named_by_its_offer_alone_writes_what_its_own_option_writes(
    source_dsn: str, tiny_model: Path
) -> None:
    """`--source KIND --source-set KEY=VALUE` is how a plugin's kind is proposed: on a built-in kind it writes
    the same [source] as --table does, plus any other key given (typed as TOML reads it)."""
    make_docs(source_dsn)
    code, _, stderr = init_table("docs", tiny_model)
    assert code == 0, stderr
    code, _, stderr = invoke(
        "init", "generic.toml", "--source", "postgres", "--source-set", "table=docs",
        "--source-set", "dsn_env=REINDEX_SOURCE_DSN", "--source-set", "page_size=500", "--model", str(tiny_model),
    )  # fmt: skip
    assert code == 0, stderr
    by_option, generic = load(Path("docs.toml")), load(Path("generic.toml"))
    assert generic.tables["source"] == {**by_option.tables["source"], "page_size": 500}
    assert generic.tables["target"] == by_option.tables["target"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--table", "docs", "--source-url", "http://q:6333"),
            "--source-url is not an option of a postgres source",
        ),
        (
            ("--file", "docs.jsonl", "--source-dsn", "host=x"),
            "--source-dsn is not an option of a jsonl source",
        ),
        (("--file", "docs.csv"), "--file docs.csv: no source kind reads a .csv"),
        (
            ("--source", "memory", "--source-set", "documents=3"),
            "--source 'memory' is not a kind init proposes",
        ),
        (("--table", "docs", "--collection", "docs"), "name one source, not --table and --collection"),
        (("--source", "postgres", "--source-set", "dsn_env=X"), "a postgres source needs its table"),
        (("--table", "docs", "--source-set", "oops"), "--source-set 'oops' is not KEY=VALUE"),
        (
            (
                "--collection",
                "docs",
                "--source-path",
                "store",
                "--target",
                "pgvector",
                "--target-url",
                "http://x",
            ),
            "--target-url is not an option of a pgvector target",
        ),
    ],
)
def test_an_option_the_kind_does_not_take_is_refused_by_name(args: tuple[str, ...], message: str) -> None:
    """Each kind says which options it takes (its offer); another one is one line naming it, exit 2, no file."""
    Path("store").mkdir()
    code, _, stderr = invoke("init", "x.toml", *args, "--model", "m")
    assert code == 2 and message in stderr, stderr
    assert not Path("x.toml").exists()
