"""Pieces of a self-contained report page: escaping, number formats with units, tables, the stylesheet.

Everything from a ledger, a source or a config (ids, texts, details, names) goes through `escape`;
numbers a test must read back carry `data-metric` (the JSON key they come from) and `data-value` (the
exact JSON value), so the shown text can be formatted for people (1,234 documents, 2 min 05 s).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from html import escape, unescape
from typing import Any

from reindex import units
from reindex.units import decimal as decimal
from reindex.units import duration as duration
from reindex.units import integer as integer
from reindex.units import model_name as model_name
from reindex.units import ratio as ratio
from reindex.units import size as size
from reindex.units import usd as usd
from reindex.units import value as value

Cell = str  # already HTML


def text(value: Any) -> Cell:
    return escape(str(value))


def local_time(iso: str | None) -> Cell:
    """The instant in the reader's-machine local time, with the UTC instant in the element."""
    if not iso:
        return "–"
    shown = units.local_time(iso)
    return f'<time datetime="{escape(iso)}" title="{escape(iso)}">{escape(shown)}</time>'


def metric(key: str, raw: Any, shown: str | None = None, *, cell: Cell | None = None) -> Cell:
    """A number (or flag, or name) that `status --json` or `plan --json` also reports, under `key`:
    shown as `shown` (plain text) or `cell` (HTML), by default formatted from the raw value."""
    data = escape(json.dumps(raw, default=str))
    inner = cell if cell is not None else escape(shown if shown is not None else value(raw))
    return f'<span data-metric="{escape(key)}" data-value="{data}">{inner}</span>'


def badge(ok: bool | None, yes: str, no: str, unknown: str = "unknown") -> Cell:
    kind, label = ("unknown", unknown) if ok is None else (("ok", yes) if ok else ("bad", no))
    return f'<span class="badge {kind}">{escape(label)}</span>'


def table(headers: Sequence[str], rows: Iterable[Sequence[Cell]], numeric: Sequence[int] = ()) -> Cell:
    """Cells are HTML already (escape what goes in); columns in `numeric` are right-aligned."""
    head = "".join(
        f"<th{' class=num' if i in numeric else ''}>{escape(h)}</th>" for i, h in enumerate(headers)
    )
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=num' if i in numeric else ''}>{cell}</td>" for i, cell in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def facts(rows: Iterable[tuple[str, Cell]]) -> Cell:
    """A two-column list of label and value."""
    items = "".join(f"<dt>{escape(label)}</dt><dd>{cell}</dd>" for label, cell in rows)
    return f'<dl class="facts">{items}</dl>'


def card(label: str, cell: Cell, note: str = "") -> Cell:
    extra = f'<div class="note">{escape(note)}</div>' if note else ""
    return f'<div class="card"><div class="label">{escape(label)}</div><div class="big">{cell}</div>{extra}</div>'


def section(anchor: str, title: str, *body: Cell) -> Cell:
    return f'<section id="{escape(anchor)}"><h2>{escape(title)}</h2>{"".join(body)}</section>'


def document(title: str, subtitle: Cell, sections: Sequence[Cell]) -> str:
    nav = "".join(
        f'<a href="#{anchor}">{escape(label)}</a>'
        for anchor, label in (_anchor(s) for s in sections)
        if anchor
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body><main>"
        f'<header><h1>{escape(title)}</h1><p class="subtitle">{subtitle}</p><nav>{nav}</nav></header>'
        + "".join(sections)
        + "</main></body></html>\n"
    )


def _anchor(section_html: str) -> tuple[str, str]:
    """(id, heading) of a section made by `section`, for the table of contents."""
    if not section_html.startswith('<section id="'):
        return "", ""
    anchor = section_html[len('<section id="') : section_html.index('"', len('<section id="'))]
    heading = section_html[section_html.index("<h2>") + 4 : section_html.index("</h2>")]
    return anchor, unescape(heading)


STYLE = """
:root { --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --soft: #f6f8fa; --ok: #1a7f37; --bad: #cf222e;
  --warn: #9a6700; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: #fff;
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 32px 64px; }
header { border-bottom: 2px solid var(--line); margin-bottom: 8px; padding-bottom: 12px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 32px 0 12px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 16px; margin: 20px 0 8px; }
.subtitle { color: var(--muted); margin: 0 0 8px; }
nav a { margin-right: 16px; color: #0969da; text-decoration: none; font-size: 14px; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 13px; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(120px, 1fr)); gap: 12px; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; background: var(--soft); }
.card .label { color: var(--muted); font-size: 13px; }
.card .big { font-size: 20px; font-weight: 600; font-variant-numeric: tabular-nums; }
.card .note { color: var(--muted); font-size: 12px; }
table { border-collapse: collapse; width: 100%; margin: 8px 0 16px; font-size: 14px; }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: var(--soft); font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 4px 20px; margin: 8px 0 16px; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; font-variant-numeric: tabular-nums; overflow-wrap: anywhere; }
.badge { display: inline-block; padding: 1px 10px; border-radius: 12px; font-size: 13px; font-weight: 600; }
.badge.ok { background: #dafbe1; color: var(--ok); }
.badge.bad { background: #ffebe9; color: var(--bad); }
.badge.unknown { background: #fff8c5; color: var(--warn); }
.equation { font-size: 17px; padding: 10px 14px; background: var(--soft); border-radius: 8px;
  font-variant-numeric: tabular-nums; }
.charts { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; }
svg.chart { width: 100%; height: auto; border: 1px solid var(--line); border-radius: 8px; background: #fff; }
svg .chart-title { font-size: 14px; font-weight: 600; fill: var(--fg); }
svg .tick { font-size: 11px; fill: var(--muted); }
svg .axis-label { font-size: 12px; fill: var(--fg); }
svg .mean-label { font-size: 11px; fill: var(--bad); }
.note, .empty { color: var(--muted); }
.callout { border-left: 4px solid var(--warn); background: #fff8c5; padding: 8px 14px; border-radius: 4px; }
.example-text { min-width: 16em; max-width: 420px; overflow-wrap: anywhere; }
ol.ids { margin: 0; padding-left: 1.8em; font-size: 12px; overflow-wrap: anywhere; }
@media print { main { max-width: none; } nav { display: none; } }
"""
