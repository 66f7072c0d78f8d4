"""The report page in a real headless browser, after a real migration (JSONL → pgvector, hash embedder).

One migration per module (v1 live behind the alias, v2 run and verified, with poison documents), and
one browser start per page: the page must render, draw its plots, escape what the source supplied, and
show the very figures `status --json` reports.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

from reindex.state.sqlite import SqliteLedger
from reindex.ui.cli import app

runner = CliRunner()
SECTIONS = ("summary", "coverage", "dead-letters", "throughput", "plan", "quality", "fingerprints")
QUALITY = {
    "k": 10,
    "sample": 200,
    "live": "docs__v1",
    "target": "docs__v2",
    "neighbours": {
        "overlap_at_k": 0.83,
        "rbo": 0.78,
        "examples": [
            {"id": "d0001", "text": "a <i>query</i> text", "overlap": 0.1, "live": ["d7"], "new": ["d9"]}
        ],
    },
    "ann": None,
    "judged": {"queries": 50, "k": 10, "new": {"ndcg_at_10": 0.61, "recall_at_k": 0.8}, "live": None},
    "gate": {"passed": True, "failures": []},
}


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@dataclass
class Migration:
    folder: Path
    v1: Path
    v2: Path
    status: dict[str, Any]
    before_compare: str  # the page before any quality check was recorded
    page: Path
    report_json: str


def write_corpus(path: Path) -> None:
    lines = [
        json.dumps({"id": f"d{i:04d}", "text": f"document {i} on topic {i % 13} {'more words ' * (i % 30)}"})
        for i in range(300)
    ]
    lines.insert(7, lines[6])  # the same id with the same text, in the same shard: folded
    lines += [
        json.dumps({"id": "<b>blank</b>", "text": "   "}),  # empty_text, with markup in its id
        '{"id": "broken", "text": ',  # invalid_json
        json.dumps({"id": "no-text", "title": "a document without its text field"}),  # missing_text
    ]
    path.write_text("\n".join(lines) + "\n")


def write_config(path: Path, corpus: Path, dsn: str, state: Path, embedder: str) -> Path:
    path.write_text(
        f'[source]\nkind = "jsonl"\npath = "{corpus}"\n\n[embedder]\n{embedder}\n\n'
        f'[target]\nkind = "pgvector"\ndsn = "{dsn}"\nalias = "docs"\nindex = "none"\n\n'
        f'[run]\nstate = "{state}"\nshard_size = 40\nmax_dead_letters = 10\n'
    )
    return path


@pytest.fixture(scope="module")
def migration(pg_server: str, tmp_path_factory: pytest.TempPathFactory) -> Migration:
    folder = tmp_path_factory.mktemp("report")
    name = f"report_{os.getpid()}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = pg_server.replace("/postgres?", f"/{name}?")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    corpus, state = folder / "docs.jsonl", folder / "state.db"
    write_corpus(corpus)
    v1 = write_config(folder / "v1.toml", corpus, dsn, state, 'kind = "hash"\ndim = 24\nseed = "v1"')
    v2 = write_config(folder / "v2.toml", corpus, dsn, state, 'kind = "hash"\ndim = 32\nseed = "v2"')
    for command in (("run", "-c", str(v1)), ("cutover", "-c", str(v1)), ("run", "-c", str(v2))):
        code, _, err = invoke(*command)
        assert code == 0, err
    assert invoke("verify", "-c", str(v2))[0] == 0

    before = folder / "before.html"
    code, _, err = invoke("report", "-c", str(v2), "--html", str(before), "--no-plan")
    assert code == 0, err
    code, out, err = invoke("status", "-c", str(v2), "--json")
    assert code == 0, err
    status = json.loads(out)
    ledger = SqliteLedger(state)  # as `reindex compare` records its check
    try:
        ledger.record_verification(status["plan_id"], True, QUALITY, kind="quality")
    finally:
        ledger.close()
    page = folder / "report.html"
    code, report_json, err = invoke("report", "-c", str(v2), "--html", str(page), "--json")
    assert code == 0, err
    return Migration(folder, v1, v2, status, before.read_text(), page, report_json)


class Dom(HTMLParser):
    """What the tests read back from the browser's DOM: metrics, plot points, headings, section ids."""

    def __init__(self, markup: str) -> None:
        super().__init__()
        self.metrics: list[tuple[str, Any, str]] = []
        self.polylines: list[str] = []
        self.sections: list[str] = []
        self.title = ""
        self._open: list[tuple[str, Any, list[str]]] = []
        self._in_title = False
        self.feed(markup)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "polyline":
            self.polylines.append(found.get("points") or "")
        if tag == "section" and found.get("id"):
            self.sections.append(str(found["id"]))
        self._in_title = tag == "title" and not self.title
        if "data-metric" in found:
            self._open.append((str(found["data-metric"]), json.loads(found["data-value"] or "null"), []))
        elif self._open and tag == "span":
            self._open.append(("", None, []))

    def handle_endtag(self, tag: str) -> None:
        if tag == "span" and self._open:
            key, value, text = self._open.pop()
            if key:
                self.metrics.append((key, value, "".join(text).strip()))
            elif self._open:
                self._open[-1][2].extend(text)

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        if self._open:
            self._open[-1][2].append(data)


def browse(page: Path, screenshot: Path) -> str:
    """The DOM after Chromium loaded and laid out the page, and a screenshot of its first 2,000 pixels."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail(
            "chromium is not installed: the report tests need a real headless browser. "
            "Run scripts/setup as root (it installs Debian's chromium), or `apt-get install chromium`."
        )
    profile = screenshot.parent / f"{screenshot.stem}-profile"
    done = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--window-size=1280,2000",
            f"--screenshot={screenshot}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert screenshot.stat().st_size > 10_000, "the screenshot is (nearly) empty"
    return done.stdout


def lookup(data: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        data = data[part]
    return data


def test_the_report_page_renders_in_a_browser_with_plots_and_the_figures_of_status(
    migration: Migration,
) -> None:
    dom = Dom(browse(migration.page, migration.folder / "report.png"))
    assert dom.title.startswith("Reindex report: docs → docs__")
    assert dom.sections == list(SECTIONS)
    assert len(dom.polylines) == 2 and all(len(p.split()) >= 5 for p in dom.polylines)

    keys = {key for key, _, _ in dom.metrics}
    assert {"documents", "written", "dead_letters", "duplicates", "shards_done", "source_documents"} <= keys
    assert {"reconciled", "state", "is_live", "alias", "alias_target", "target", "plan_id"} <= keys
    for key, shown_value, shown_text in dom.metrics:
        assert shown_value == lookup(migration.status, key), key
        if isinstance(shown_value, int) and not isinstance(shown_value, bool):
            assert re.fullmatch(r"[\d,]+( [a-z/]+)?", shown_text), (key, shown_text)
            assert shown_text.split()[0].replace(",", "") == str(shown_value), (key, shown_text)
    assert migration.status["dead_letters"] == 3 and migration.status["duplicates"] == 1


def test_the_page_escapes_what_the_source_supplied_and_shows_the_quality_check(migration: Migration) -> None:
    markup = migration.page.read_text()
    assert "<b>blank</b>" not in markup and "&lt;b&gt;blank&lt;/b&gt;" in markup
    assert "<i>query</i>" not in markup and "a &lt;i&gt;query&lt;/i&gt; text" in markup
    assert "gate passed" in markup and "0.830" in markup and "ANN recall not measured" in markup
    assert "not compared yet: run <code>reindex compare</code>" in migration.before_compare.lower()
    assert not any(needle in markup for needle in ("<script", "http://", "https://", "@import", "<link"))


def test_report_json_is_one_document_with_every_section(migration: Migration) -> None:
    data = json.loads(migration.report_json)
    assert set(data) >= {
        "generated_at", "status", "reconciliation", "coverage", "dead_letters", "throughput",
        "plan", "plan_vs_actual", "quality", "fingerprints", "alias_history",
    }  # fmt: skip
    status = {k: v for k, v in data["status"].items() if k != "workers"}
    assert status == {k: v for k, v in migration.status.items() if k != "workers"}
    assert data["coverage"]["complete"] is True and data["quality"]["passed"] is True
    assert data["reconciliation"]["reconciled"] and data["dead_letters"]["total"] == 3
    assert {r["reason"] for r in data["dead_letters"]["reasons"]} == {
        "empty_text", "invalid_json", "missing_text",
    }  # fmt: skip
    planned = {row["metric"]: row for row in data["plan_vs_actual"]}
    assert planned["documents"]["planned"] == planned["documents"]["actual"] == 304
    assert planned["tokens embedded"]["planned"] == planned["tokens embedded"]["actual"] > 0
    history = data["alias_history"]
    assert [c["action"] for c in history] == ["cutover"] and history[0]["at"].endswith("Z")
    assert data["fingerprints"]["alias_fingerprint"] != data["fingerprints"]["target_fingerprint"]

    code, text, _ = invoke("report", "-c", str(migration.v2), "--no-plan")
    assert code == 0 and "reconciliation: 304 documents in = 300 written + 3 dead-lettered" in text
    unwritable = migration.folder / "no-such-folder" / "report.html"
    code, _, err = invoke("report", "-c", str(migration.v2), "--no-plan", "--html", str(unwritable))
    assert code == 2 and err.startswith("error: cannot write the page")


def test_plan_html_is_the_dry_run_page_with_the_figures_of_plan_json(migration: Migration) -> None:
    page = migration.folder / "plan.html"
    code, out, err = invoke("plan", "-c", str(migration.v2), "--html", str(page), "--json")
    assert code == 0, err
    plan = json.loads(out)
    dom = Dom(browse(page, migration.folder / "plan.png"))
    assert dom.title.startswith("Reindex plan: docs → docs__")
    assert dom.sections == ["corpus", "time-and-cost", "storage", "target", "coverage"]
    keys = {key for key, _, _ in dom.metrics}
    assert {"documents", "tokens", "eta_headline_seconds", "vector_bytes", "target", "alias_target"} <= keys
    for key, shown_value, _ in dom.metrics:
        assert shown_value == plan[key], key


def test_the_throughput_chart_is_a_windowed_rate_that_no_burst_of_records_inflates() -> None:
    """Two workers record shards milliseconds apart: per shard that read 41,000 documents/s in a run of 72.
    Over equal windows of wall time, every point stays near the run's real pace."""
    from reindex.report import throughput
    from reindex.state.records import ShardRecord

    shards = []
    for seq in range(40):  # 100 documents every 2.8 s, but two records 1 ms apart each time
        at = 1000.0 + (seq // 2) * 2.8 + (seq % 2) * 0.001
        seconds = 2.8 if seq % 2 == 0 else 0.001
        shards.append(ShardRecord(seq, 100, 100, 1000, seconds, at + 2.8, f"w{seq % 2}"))
    t = throughput(shards)
    assert max(row["docs_per_second"] for row in t["shards"]) > 50_000  # what the old chart plotted
    rates = [w["docs_per_second"] for w in t["windows"]]
    assert len(rates) == 20 and max(rates) < 150 and sum(rates) / len(rates) == pytest.approx(71.4, rel=0.1)
