"""The typer app: parse → commands.<verb>() → render. With progress.py (what a verb shows while it works),
the only place that prints or exits.

Results go to stdout (`--json` for pipelines), progress and errors to stderr (consoles.py).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.markup import escape
from typer.core import TyperGroup

from reindex import commands, units
from reindex import config as config_module
from reindex import init as init_module
from reindex import report as report_module
from reindex.errors import ConfigError, NoRouteFits, ReindexError, VerificationFailed
from reindex.report import html as report_html
from reindex.report import plan_html
from reindex.ui import terminal
from reindex.ui.consoles import err, out
from reindex.ui.progress import _status, progress_bar, signals_stop

T = TypeVar("T")
_JSON: ContextVar[bool] = ContextVar("json_output", default=False)  # this invocation was given --json


class _Verbs(TyperGroup):
    """The command group. Given `--json`, every outcome is exactly one JSON document on stdout: the
    result, or `{"error": {"code", "message", "hint"}}` with the exit code, usage errors included."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        if out.no_color or not out.is_terminal:
            _plain_help(self)
        as_json = "--json" in argv
        token = _JSON.set(as_json)
        try:
            if not as_json:
                return super().main(argv, prog_name, complete_var, standalone_mode, **extra)
            try:
                code = super().main(argv, prog_name, complete_var, False, **extra)
            except typer.TyperException as exc:  # a usage error: parsed before any verb ran
                context = getattr(exc, "ctx", None)
                verb = context.command_path.partition(" ")[2] if context is not None else ""
                hint = f"see `reindex {verb} --help`".replace("  ", " ")
                code = _error_json(exc.exit_code, exc.format_message(), hint)
            except typer.Abort:
                code = _error_json(1, "aborted", None)
            code = code if isinstance(code, int) else 0
            if standalone_mode:
                sys.exit(code)
            return code
        finally:
            _JSON.reset(token)


def _plain_help(command: Any) -> None:
    """Help and usage errors as click's plain text, without rich's boxes (NO_COLOR, pipes, logs)."""
    command.rich_markup_mode = None
    for sub in getattr(command, "commands", {}).values():
        _plain_help(sub)


app = typer.Typer(
    cls=_Verbs,
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    pretty_exceptions_show_locals=False,  # locals of a crashed frame can hold DSNs and API keys
    help="Re-embed a corpus into a fresh index, prove full coverage, and flip a read alias atomically. "
    "Exit codes: 0 done; 1 failed; 2 usage or configuration; 3 verification or quality gate failed "
    "(cutover refused for it); 4 cutover refused for another reason (alias moved, lock busy, nothing to "
    "roll back); 75 interrupted, rerun to resume. With --json, errors are JSON on stdout too.",
)


def _version(value: bool) -> None:
    if value:
        out.print(f"reindex {metadata.version('reindex-embeddings')}", highlight=False, markup=False)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    pass


ConfigOption = Annotated[Path, typer.Option("--config", "-c", help="the migration's TOML file")]
JsonOption = Annotated[bool, typer.Option("--json", help="print the result as JSON on stdout")]
HtmlOption = Annotated[
    Path | None, typer.Option("--html", help="also write a self-contained HTML page to this file")
]


def _guarded(action: Callable[[], T]) -> T:
    """Run a verb; a ReindexError becomes `error: <message>` on stderr (with --json, the error document on
    stdout) and its exit code. With --json, an unexpected exception is a JSON error with exit code 1 too."""
    try:
        return action()
    except ReindexError as exc:
        if os.environ.get("REINDEX_DEBUG"):
            raise
        _fail(exc.exit_code, exc.message, exc.hint)
    except Exception as exc:
        if not _JSON.get() or os.environ.get("REINDEX_DEBUG"):
            raise
        hint = "this is a bug: rerun with REINDEX_DEBUG=1 for the traceback and report it"
        _fail(1, f"{type(exc).__name__}: {exc}", hint)


def _fail(code: int, message: str, hint: str | None) -> NoReturn:
    if _JSON.get():
        _error_json(code, message, hint)
    else:
        line = f"{message} ({hint})" if hint else message
        err.print(f"[bold red]error:[/] {escape(line)}", highlight=False)
    raise typer.Exit(code)


def _error_json(code: int, message: str, hint: str | None) -> int:
    """Print the one JSON document of a failed verb; return its exit code."""
    out.print_json(json.dumps({"error": {"code": code, "message": message, "hint": hint}}))
    return code


def _load(path: Path) -> config_module.Config:
    return _guarded(lambda: config_module.load(path))


def _render(result: Any, as_json: bool, verb: str, config: Path) -> None:
    """The verb's result: its whole JSON document with --json, else a summary for a person."""
    if as_json:
        out.print_json(json.dumps(result.to_json(), default=str))
        return
    terminal.show(out, verb, result, str(config))


@app.command()
def plan(
    config: ConfigOption,
    as_json: JsonOption = False,
    calibrate: Annotated[bool, typer.Option(help="time a small sample to estimate the ETA")] = True,
    rehearse: Annotated[
        bool,
        typer.Option(help="time the run's first shards into a scratch target, dropped after (free models)"),
    ] = True,
    workers: Annotated[
        int | None, typer.Option(min=1, help="ETA on this many workers (default: [ray] actors, or 1)")
    ] = None,
    worker_rate: Annotated[
        float | None,
        typer.Option(min=0.001, help="documents/s per worker, e.g. a GPU's rate (default: calibrated here)"),
    ] = None,
    html: HtmlOption = None,
) -> None:
    """Dry run: documents, tokens, ETA, storage, target and alias state, coverage, routes and their cost.
    Changes nothing (it keeps its estimate beside the ledger, for the report; its rehearsal's scratch target
    is dropped); exit 4 when no route meets [run] deadline and max_cost_usd."""
    cfg = _load(config)
    with _status("counting documents and tokens", as_json):
        report = _guarded(
            lambda: commands.plan(
                cfg,
                calibrate=calibrate,
                rehearse=rehearse,
                workers=workers,
                worker_docs_per_second=worker_rate,
            )
        )
    if html is not None:
        _write_page(html, plan_html.plan_page(report, str(config), units.now()))
    _render(report, as_json, "plan", config)
    if report.refused:
        raise typer.Exit(ConfigError.exit_code)
    if report.route is not None and report.route["name"] is None:
        raise typer.Exit(NoRouteFits.exit_code)


@app.command()
def run(
    config: ConfigOption,
    as_json: JsonOption = False,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="forget this migration's progress and rebuild its target")
    ] = False,
) -> None:
    """Backfill the target from the source. Rerun the same command to resume (exit 75 = interrupted)."""
    cfg = _load(config)
    stop = threading.Event()
    with signals_stop(stop), progress_bar(as_json) as (on_start, on_progress):
        report = _guarded(
            lambda: commands.run(cfg, stop=stop, on_start=on_start, on_progress=on_progress, fresh=fresh)
        )
    _render(report, as_json, "run", config)
    if not report.reconciled:
        err.print("[bold red]error:[/] the run does not reconcile; see `reindex status`")
        raise typer.Exit(1)


@app.command()
def status(config: ConfigOption, as_json: JsonOption = False) -> None:
    """Shards written, reconciliation, dead letters by reason, where the alias points, cutover history."""
    cfg = _load(config)
    _render(_guarded(lambda: commands.status(cfg)), as_json, "status", config)


@app.command()
def report(
    config: ConfigOption,
    as_json: JsonOption = False,
    html: HtmlOption = None,
    with_plan: Annotated[
        bool, typer.Option("--plan/--no-plan", help="recompute the plan to compare (loads the model)")
    ] = True,
    calibrate: Annotated[bool, typer.Option(help="time a small sample for the planned duration")] = True,
) -> None:
    """Coverage, dead letters, throughput, plan against actual, quality and alias history in one page."""
    cfg = _load(config)
    with _status("gathering the report", as_json):
        result = _guarded(lambda: report_module.build(cfg, plan=with_plan, calibrate=calibrate))
    if html is not None:
        _write_page(html, report_html.page(result))
    if as_json:
        out.print_json(json.dumps(result.to_json(), default=str))
        return
    for line in result.summary_lines():
        out.print(line, highlight=False, markup=False)


def _write_page(path: Path, page: str) -> None:
    _guarded(lambda: report_module.write(path, page))
    err.print(f"wrote {escape(str(path))}", highlight=False)


SampleOption = Annotated[
    int, typer.Option(min=0, help="also re-embed N random documents; require cosine >= 0.999 with stored")
]


@app.command()
def verify(config: ConfigOption, as_json: JsonOption = False, sample: SampleOption = 0) -> None:
    """Compare source and target by exact ids and content hashes. Exit 0 complete, 3 not."""
    cfg = _load(config)
    report = _guarded(lambda: commands.verify(cfg, sample=sample))
    _render(report, as_json, "verify", config)
    if not report.complete:
        raise typer.Exit(VerificationFailed.exit_code)


@app.command()
def compare(config: ConfigOption, as_json: JsonOption = False) -> None:
    """Before cutover: the new target against the live index (neighbourhoods, ANN recall, judged queries
    from [compare]); exit 3 when a [gate] threshold is not met."""
    cfg = _load(config)
    with _status("comparing the new target with the live index", as_json):
        report = _guarded(lambda: commands.compare(cfg))
    _render(report, as_json, "compare", config)
    if not report.passed:
        raise typer.Exit(VerificationFailed.exit_code)


@app.command()
def cutover(
    config: ConfigOption,
    as_json: JsonOption = False,
    force: Annotated[bool, typer.Option(help="promote even if verify fails (recorded)")] = False,
    catch_up: Annotated[
        bool, typer.Option("--sync", help="catch up with source changes right before the flip")
    ] = False,
    sample: SampleOption = 0,
) -> None:
    """Verify, then flip the alias to this target atomically. Refuses (exit 3) unless complete."""
    cfg = _load(config)
    if force:
        err.print(
            "[bold yellow]warning:[/] --force: the alias may serve an incomplete or mixed target; "
            "this is recorded in the history"
        )
    move = _guarded(lambda: commands.cutover(cfg, force=force, sync=catch_up, sample=sample))
    _render(move, as_json, "cutover", config)


@app.command()
def rollback(config: ConfigOption, as_json: JsonOption = False) -> None:
    """Point the alias back at the target the last move replaced."""
    cfg = _load(config)
    _render(_guarded(lambda: commands.rollback(cfg)), as_json, "rollback", config)


@app.command()
def prune(
    config: ConfigOption,
    as_json: JsonOption = False,
    keep: Annotated[int, typer.Option(min=1, help="targets to keep, the live one included")] = 2,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="list what would be dropped")] = False,
) -> None:
    """Drop old targets of this alias that no alias serves, keeping the newest N."""
    cfg = _load(config)
    _render(_guarded(lambda: commands.prune(cfg, keep=keep, dry_run=dry_run)), as_json, "prune", config)


@app.command()
def inspect(
    config: ConfigOption,
    as_json: JsonOption = False,
    target: Annotated[str | None, typer.Option(help="a target to inspect instead of the alias")] = None,
) -> None:
    """Coverage of what the alias serves now (or --target), even for an index this tool did not build."""
    cfg = _load(config)
    _render(_guarded(lambda: commands.inspect(cfg, target=target)), as_json, "inspect", config)


@app.command()
def resolve(
    config: ConfigOption,
    alias: Annotated[str | None, typer.Argument(help="default: [target] alias")] = None,
    as_json: JsonOption = False,
) -> None:
    """Which target and embedding model serve the alias: choose the query encoder from this."""
    cfg = _load(config)
    _render(_guarded(lambda: commands.resolve(cfg, alias)), as_json, "resolve", config)


@app.command()
def sync(config: ConfigOption, as_json: JsonOption = False) -> None:
    """Re-embed what changed in the source since the run and delete what vanished (repeatable)."""
    cfg = _load(config)
    _render(_guarded(lambda: commands.sync(cfg)), as_json, "sync", config)


@app.command("init")
def init_config(
    path: Annotated[Path, typer.Argument(help="the config file to write; an existing one is never replaced")],
    model: Annotated[
        str,
        typer.Option(
            help="the new model: a Hugging Face name, a local path, or a provider's model name",
            rich_help_panel="Embedder",
        ),
    ],
    table: Annotated[
        str | None,
        typer.Option(help="Postgres source: the table or view applications read", rich_help_panel="Source"),
    ] = None,
    source_dsn_env: Annotated[
        str | None, typer.Option(help="the variable holding the source DSN", rich_help_panel="Source")
    ] = None,
    source_dsn: Annotated[
        str | None, typer.Option(help="a source DSN without a password", rich_help_panel="Source")
    ] = None,
    collection: Annotated[
        str | None, typer.Option(help="Qdrant source: the collection or alias", rich_help_panel="Source")
    ] = None,
    source_url: Annotated[
        str | None, typer.Option(help="the source Qdrant server", rich_help_panel="Source")
    ] = None,
    source_path: Annotated[
        str | None, typer.Option(help="the source Qdrant local storage folder", rich_help_panel="Source")
    ] = None,
    source_api_key_env: Annotated[
        str | None, typer.Option(help="the variable holding the Qdrant API key", rich_help_panel="Source")
    ] = None,
    file: Annotated[
        Path | None, typer.Option(help="file source: a .jsonl or .parquet export", rich_help_panel="Source")
    ] = None,
    source: Annotated[
        str | None,
        typer.Option(
            help="the source's kind, for one without its own option (a plugin's); default: from the option given",
            rich_help_panel="Source",
        ),
    ] = None,
    source_set: Annotated[
        list[str] | None,
        typer.Option(
            help="KEY=VALUE: any [source] key (a plugin's name and connection), repeatable",
            rich_help_panel="Source",
        ),
    ] = None,
    target: Annotated[
        str | None,
        typer.Option(
            help="pgvector, qdrant or a plugin's kind (default: the source's backend)",
            rich_help_panel="Target",
        ),
    ] = None,
    target_dsn_env: Annotated[
        str | None, typer.Option(help="default: the source's", rich_help_panel="Target")
    ] = None,
    target_dsn: Annotated[
        str | None, typer.Option(help="without a password", rich_help_panel="Target")
    ] = None,
    target_url: Annotated[
        str | None, typer.Option(help="default: the source's", rich_help_panel="Target")
    ] = None,
    target_path: Annotated[
        str | None, typer.Option(help="default: the source's", rich_help_panel="Target")
    ] = None,
    target_api_key_env: Annotated[
        str | None, typer.Option(help="default: the source's", rich_help_panel="Target")
    ] = None,
    target_set: Annotated[
        list[str] | None,
        typer.Option(help="KEY=VALUE: any [target] key, repeatable", rich_help_panel="Target"),
    ] = None,
    alias: Annotated[
        str | None, typer.Option(help="default: the name applications read now", rich_help_panel="Target")
    ] = None,
    embedder: Annotated[
        str | None,
        typer.Option(
            help="any embedder kind the tool runs, e.g. openai-batch, voyage-batch, bedrock-batch"
            " (default: from --model)",
            rich_help_panel="Embedder",
        ),
    ] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option(help="provider kinds (default: the provider's usual name)", rich_help_panel="Embedder"),
    ] = None,
    id_column: Annotated[
        str | None,
        typer.Option(
            "--id-column", "--id-field", help="instead of the detected one", rich_help_panel="Fields"
        ),
    ] = None,
    text_column: Annotated[
        str | None,
        typer.Option(
            "--text-column", "--text-field", help="instead of the detected one", rich_help_panel="Fields"
        ),
    ] = None,
    vector_column: Annotated[
        str | None,
        typer.Option(
            "--vector-column", "--vector-name", help="instead of the detected one", rich_help_panel="Fields"
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Write a commented config from what the source shows: id, text and vector fields, size, alias state."""
    named = {"table": table, "collection": collection, "file": str(file) if file is not None else None}
    connection = {
        "dsn_env": source_dsn_env,
        "dsn": source_dsn,
        "url": source_url,
        "path": source_path,
        "api_key_env": source_api_key_env,
    }
    target_connection = {
        "dsn_env": target_dsn_env,
        "dsn": target_dsn,
        "url": target_url,
        "path": target_path,
        "api_key_env": target_api_key_env,
    }
    request = init_module.InitRequest(
        model=model,
        source={key: value for key, value in {**named, **connection}.items() if value is not None},
        source_settings=_guarded(lambda: init_module.settings("--source-set", source_set or [])),
        source_kind=source,
        target=target,
        target_options={key: value for key, value in target_connection.items() if value is not None},
        target_settings=_guarded(lambda: init_module.settings("--target-set", target_set or [])),
        alias=alias,
        embedder=embedder,
        api_key_env=api_key_env,
        id_field=id_column,
        text_field=text_column,
        vector_field=vector_column,
    )
    report = _guarded(lambda: init_module.init(path, request))
    if as_json:
        out.print_json(json.dumps(report.to_json(), default=str))
        return
    for line in report.summary_lines():
        out.print(line, highlight=False, markup=False)


dlq = typer.Typer(no_args_is_help=True, help="Dead letters: documents that could not be embedded.")
app.add_typer(dlq, name="dlq")
DlqConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="the migration's TOML file (before or after the verb)")
]


@dlq.callback()
def dlq_group(ctx: typer.Context, config: DlqConfigOption = None) -> None:
    """Dead letters: documents that could not be embedded."""
    ctx.obj = config  # `reindex dlq -c FILE list` as well as `reindex dlq list -c FILE`


def _dlq_config(ctx: typer.Context, config: Path | None) -> config_module.Config:
    path = config or ctx.obj
    if path is None:
        _fail(2, "missing option '--config' / '-c'", "reindex dlq list -c FILE (or reindex dlq -c FILE list)")
    return _load(path)


@dlq.command("list")
def dlq_list(ctx: typer.Context, config: DlqConfigOption = None, as_json: JsonOption = False) -> None:
    """List dead letters with their reasons."""
    cfg = _dlq_config(ctx, config)
    _render(_guarded(lambda: commands.dlq_list(cfg)), as_json, "dlq list", config or ctx.obj)


@dlq.command("retry")
def dlq_retry(ctx: typer.Context, config: DlqConfigOption = None, as_json: JsonOption = False) -> None:
    """Re-read dead-lettered documents from the source and try again (after a fix or a policy change)."""
    cfg = _dlq_config(ctx, config)
    _render(_guarded(lambda: commands.dlq_retry(cfg)), as_json, "dlq retry", config or ctx.obj)


def main() -> None:
    app()
