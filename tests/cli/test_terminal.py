"""What people read: every verb's summary on real backends, plain when piped, and its JSON complete."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from reindex import units
from reindex.commands import RunReport, StatusReport
from reindex.ui import terminal
from reindex.ui.cli import app
from tests.cli.test_cli import write_config

runner = CliRunner()
BOX = re.compile(r"[─━│┃┌┐└┘├┤┬┴┼╭╮╰╯═║]")
EPOCH = re.compile(r"\b1[6-9]\d{8}(\.\d+)?\b")  # a Unix time in seconds, as JSON used to carry
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def human(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout


def as_json(*args: str) -> tuple[int, dict]:
    result = runner.invoke(app, [*args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def readable(text: str) -> str:
    """The checks every human output passes: plain (a pipe), no JSON, no epoch floats, no trailing blanks."""
    assert text.strip(), "no output"
    assert not BOX.search(text), text
    assert "{" not in text and '": ' not in text, text
    assert not EPOCH.search(text), text
    assert all(line == line.rstrip() for line in text.splitlines()), text
    return text


@pytest.fixture
def configs(tmp_path: Path, pg_dsn: str) -> tuple[Path, Path]:
    corpus = tmp_path / "docs.jsonl"
    with corpus.open("w") as out:
        for i in range(1_300):
            out.write(json.dumps({"id": f"d{i:05d}", "text": f"document {i} about topic {i % 23}"}) + "\n")
        out.write(json.dumps({"id": "blank", "text": "   "}) + "\n")
    source = f'kind = "jsonl"\npath = "{corpus}"'
    target = f'kind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "docs"'
    state = tmp_path / "state.db"
    old = write_config(
        tmp_path / "v1.toml", source=source, embedder='kind = "hash"\ndim = 24', target=target, state=state
    )
    new = write_config(
        tmp_path / "v2.toml", source=source, embedder='kind = "hash"\ndim = 32', target=target, state=state
    )
    return old, new


def test_every_verb_reads_as_sentences_and_tables_with_units_and_json_keeps_every_field(
    configs: tuple[Path, Path],
) -> None:
    old, new = configs
    for args in (("run", "-c", str(old)), ("cutover", "-c", str(old))):
        assert human(*args)[0] == 0

    code, text = human("plan", "-c", str(new))
    assert code == 0, text
    readable(text)
    code, plan = as_json("plan", "-c", str(new))
    assert f"Plan: embed 1,301 documents into {plan['target']} for alias docs" in text
    assert "1,300 to embed, 1 unreadable or empty" in text
    assert f"hash) · 32 dimensions · fingerprint {plan['fingerprint']}" in text  # the model on one line
    assert "KiB of vectors" in text and "documents/s" in text and "Nothing was changed." in text
    assert "tokens counted exactly: the model's own tokenizer" in text and plan["token_counts"]["exact"]
    assert re.search(
        r"^warning: `reindex cutover` will change what alias docs serves \(now docs__", text, re.M
    )
    assert "site-packages" not in text and "options" not in text

    code, text = human("run", "-c", str(new))
    assert code == 0, text
    readable(text)
    assert "1,301 in = 1,300 written + 1 dead-lettered + 0 duplicate ids folded (reconciled)" in text
    assert re.search(r"^warning: 1 dead letter \(1 [\w-]+\): `reindex dlq list -c ", text, re.M)
    assert f"Next: reindex verify -c {new}" in text

    code, text = human("status", "-c", str(new))
    readable(text)
    code, status = as_json("status", "-c", str(new))
    assert f"{status['target']}: complete, not live" in text
    assert "Alias history" in text and "cutover" in text
    assert all(ISO.match(move["at"]) for move in status["history"]), status["history"]
    stamp = units.local_time(status["history"][0]["at"])
    assert stamp in text  # local time, to the second, with its zone

    code, text = human("verify", "-c", str(new))
    assert code == 0
    readable(text)
    assert "Complete: every one of 1,301 source documents has a current vector" in text
    assert "or a dead letter (1)" in text

    code, text = human("compare", "-c", str(new))
    assert code == 0, text
    readable(text)
    assert "against the live index docs__" in text and "overlap@10, live vs new" in text
    assert re.search(
        r"^Quality of docs__\w+ against .* k = 10, cosine distance$", text, re.M
    )  # never wrapped
    assert "No [gate] thresholds set" in text

    code, text = human("cutover", "-c", str(new))
    assert code == 0
    readable(text)
    assert re.search(r"^Alias docs now serves docs__\w+ \(was docs__\w+\)\.$", text, re.M)
    assert f"Roll back with: reindex rollback -c {new}" in text

    code, text = human("rollback", "-c", str(new))
    assert code == 0 and "Alias docs rolled back to" in readable(text)
    code, text = human("cutover", "-c", str(new))
    assert code == 0

    code, text = human("inspect", "-c", str(new))
    assert code == 0 and ", served by alias docs" in readable(text)
    assert "has 1 missing" in text and re.search(
        r"^missing\s+1\s+blank$", text, re.M
    )  # inspect reads no ledger
    code, text = human("resolve", "-c", str(new))
    assert code == 0 and "hash) · 32 dimensions · fingerprint" in readable(text)

    code, text = human("prune", "-c", str(new), "--keep", "1", "--dry-run")
    assert code == 0 and re.search(r"^Would drop docs__\w+\.$", readable(text), re.M)
    assert f"Drop them: reindex prune -c {new}" in text

    code, text = human("dlq", "list", "-c", str(new))
    readable(text)
    assert "1 dead letter: documents that could not be embedded" in text and "blank" in text
    code, text = human("dlq", "retry", "-c", str(new))
    assert code == 0 and "Retried 1 dead letter: 0 written, 0 gone from the source, 1 still dead" in readable(
        text
    )

    code, text = human("sync", "-c", str(new))
    assert code == 0 and "no changes" in readable(text)


def test_an_incomplete_target_names_each_problem_with_examples_and_exits_3(
    configs: tuple[Path, Path],
) -> None:
    _, new = configs
    code, text = human("verify", "-c", str(new))
    assert code == 3 and "Not complete:" in readable(text) and "does not exist yet" in text
    assert human("run", "-c", str(new))[0] == 0
    corpus = new.parent / "docs.jsonl"
    lines = corpus.read_text().splitlines()
    lines[0] = json.dumps({"id": "d00000", "text": "rewritten since the run"})
    lines.append(json.dumps({"id": "new-1", "text": "added since the run"}))
    corpus.write_text("\n".join(lines[:1] + lines[2:]) + "\n")  # d00001 deleted

    code, text = human("verify", "-c", str(new))
    assert code == 3
    readable(text)
    assert re.search(r"^Not complete: docs__\w+ has 1 missing, 1 stale, 1 orphaned$", text, re.M)
    assert re.search(r"^missing\s+1\s+new-1$", text, re.M) and re.search(
        r"^orphaned.*\s1\s+d00001$", text, re.M
    )
    code, text = human("cutover", "-c", str(new))
    assert (
        code == 3
        and "not complete (1 missing, 1 stale, 1 orphaned)"
        in text + runner.invoke(app, ["cutover", "-c", str(new)]).stderr
    )


def test_a_terminal_gets_light_rules_and_no_color_or_a_pipe_gets_none() -> None:
    status: dict[str, Any] = {
        "plan_id": "p",
        "vanished": 0,
        "alias_is_physical": False,
        "target": "docs__new",
        "state": "complete",
        "documents": 12_345,
        "written": 12_340,
        "dead_letters": 5,
        "duplicates": 0,
        "reconciled": True,
        "shards_done": 13,
        "source_documents": 12_345,
        "alias": "docs",
        "alias_target": "docs__old",
        "is_live": False,
        "dead_letter_reasons": {"empty": 5},
        "history": [
            {
                "id": 1,
                "alias": "docs",
                "old": None,
                "new": "docs__old",
                "fingerprint": "f",
                "action": "cutover",
                "forced": False,
                "state": "done",
                "at": "2026-12-01T10:00:00Z",
            },
        ],
        "workers": [],
    }

    def shown(*, force_terminal: bool, no_color: bool = False) -> str:
        with open(os.devnull, "w") as sink:
            console = Console(
                width=100, record=True, file=sink, force_terminal=force_terminal, no_color=no_color
            )
            terminal.show(console, "status", StatusReport(**status), "m.toml")
            return console.export_text()

    fancy = shown(force_terminal=True)
    assert BOX.search(fancy) and "12,345 in = 12,340 written + 5 dead-lettered" in fancy
    for plain in (shown(force_terminal=True, no_color=True), shown(force_terminal=False)):
        assert not BOX.search(plain) and "12,345 in = 12,340 written" in plain
        assert "warning: 5 dead letters (5 empty): `reindex dlq list -c m.toml`" in plain


def test_units_read_as_people_write_them() -> None:
    assert [units.duration(s) for s in (0.42, 4.24, 56.2, 125, 7_800)] == [
        "0.42 s",
        "4.2 s",
        "56 s",
        "2 min 05 s",
        "2 h 10 min",
    ]
    assert [units.size(b) for b in (512, 8_120_832, 3 * 2**30)] == ["512 B", "7.7 MiB", "3.0 GiB"]
    assert units.usd(0.006) == "$0.0060" and units.usd(1234.5) == "$1,234.50"
    assert units.count(1, "document") == "1 document" and units.count(1_300, "document") == "1,300 documents"
    assert units.iso_utc(1_796_141_073.75) == "2026-12-01T16:04:33Z"
    model = {
        "kind": "sentence-transformers",
        "model": "/opt/venv/lib/python3.11/site-packages/org_model/model",
        "dim": 384,
        "fingerprint": "f7aa3864a90a98c4",
        "options": {"precision": "bf16", "weights": "7e54b3"},
    }
    assert units.model_line(model) == (
        "…/org_model/model (sentence-transformers) · 384 dimensions · bf16 · fingerprint f7aa3864a90a98c4"
    )
    assert units.short_model("BAAI/bge-small-en-v1.5") == "BAAI/bge-small-en-v1.5"


def test_version_and_shell_completion_come_from_the_installed_command() -> None:
    command = str(Path(sys.executable).parent / "reindex")
    version = subprocess.run([command, "--version"], capture_output=True, text=True, check=True).stdout
    assert version.strip() == f"reindex {metadata.version('reindex-embeddings')}"
    env = {**os.environ, "_REINDEX_COMPLETE": "complete_bash", "COMP_WORDS": "reindex cu", "COMP_CWORD": "1"}
    done = subprocess.run([command], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.split() == ["cutover"]
    # Without this typer ignores "bash" and asks shellingham for the shell this runs under, which fails
    # ("Shell  not supported") where no shell is among the ancestors (a pytest-xdist worker, a CI runner).
    shown = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    script = subprocess.run([command, "--show-completion", "bash"], capture_output=True, text=True, env=shown)
    assert script.returncode == 0, script.stderr + script.stdout
    assert "_REINDEX_COMPLETE=complete_bash" in script.stdout


def test_help_and_usage_errors_are_plain_text_in_a_pipe() -> None:
    command = str(Path(sys.executable).parent / "reindex")
    help_text = subprocess.run([command, "--help"], capture_output=True, text=True, check=True).stdout
    assert "Usage: reindex" in help_text and "cutover" in help_text and not BOX.search(help_text)
    error = subprocess.run([command, "plan"], capture_output=True, text=True)
    assert (
        error.returncode == 2 and "Missing option '--config'" in error.stderr and not BOX.search(error.stderr)
    )


def test_a_remote_model_run_shows_its_requests_and_429s_not_padding() -> None:
    run: dict[str, Any] = {
        "plan_id": "p", "target": "docs__new", "documents": 1_301, "written": 1_300, "dead_letters": 1,
        "duplicates": 0, "reused": 0, "tokens": 8_000, "truncated": 0, "seconds": 2.2,
        "docs_per_second": 650.0, "tokens_per_second": 4_000.0, "padding_fraction": None,
        "model_busy_fraction": None, "reconciled": True, "dead_letter_reasons": {"provider_rejected:x": 1},
        "billed_tokens": 8_000, "cost_usd": 0.00016, "finalize_seconds": 0.5, "index_seconds": 0.3,
        "requests": 24, "retries": 1, "rate_limited": 1, "requests_per_second": 10.9,
        "tokens_per_minute": 218_000.0,
    }  # fmt: skip
    with open(os.devnull, "w") as sink:
        console = Console(width=100, record=True, file=sink, force_terminal=False)
        terminal.show(console, "run", RunReport(**run), "m.toml")
        text = readable(console.export_text())
    assert "24 sent (1 retries, 1 answered 429), 10.9 requests/s, 218,000 tokens/min" in text
    assert "padding" not in text and "busy" not in text and "$0.0002 for 8,000 billed tokens" in text


def test_plan_says_when_token_counts_are_estimates_and_how() -> None:
    """A provider whose tokenizer is not published (Titan): the plan's tokens, cost and cuts are estimates."""
    from reindex.plan.estimate import PlanReport

    report = PlanReport(documents=10, embeddable=10, unique_texts=10, tokens=125, target="t", alias="a")
    report.token_counts = {"exact": False, "basis": "estimate: cl100k_base x 1.25 (not published)"}
    with open(os.devnull, "w") as sink:
        console = Console(width=120, record=True, file=sink)
        terminal.show(console, "plan", report, "m.toml")
        text = console.export_text()
    assert "tokens estimated, cl100k_base x 1.25 (not published): cost and cuts may differ" in text
