"""Numbers for people: thousands separators, units, durations, money and local times.

The terminal output and the HTML pages format with these; JSON keeps the raw values, and every instant
in JSON is an ISO-8601 UTC string (`iso_utc`).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import PurePath
from typing import Any

NONE = "–"


def iso_utc(epoch: float | None) -> str | None:
    """ISO-8601 in UTC, to the second: what the JSON carries for every instant."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def now() -> str:
    return iso_utc(datetime.now(UTC).timestamp()) or ""


def local_time(iso: str | None) -> str:
    """An ISO-8601 instant in this machine's time zone: `2026-12-01 17:45:03 CET`."""
    if not iso:
        return NONE
    return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def integer(value: int | None, unit: str = "") -> str:
    if value is None:
        return NONE
    return f"{value:,}" + (f" {unit}" if unit else "")


def count(value: int, singular: str, plural: str | None = None) -> str:
    """`1 document`, `5,287 documents`."""
    return f"{value:,} {singular if value == 1 else plural or singular + 's'}"


def decimal(value: float | None, digits: int = 1, unit: str = "") -> str:
    if value is None:
        return NONE
    return f"{value:,.{digits}f}" + (f" {unit}" if unit else "")


def rate(per_second: float | None, unit: str) -> str:
    """`6,500 documents/s`, `15.7 documents/s`: a decimal only where it carries information."""
    if per_second is None:
        return NONE
    return f"{per_second:,.0f} {unit}/s" if per_second >= 100 else f"{per_second:,.1f} {unit}/s"


def duration(seconds: float | None) -> str:
    """0.51 s, 4.2 s, 56 s, 4 min 05 s, 2 h 07 min: precise when short, readable when long."""
    if seconds is None:
        return NONE
    if seconds < 1:
        return f"{seconds:.2f} s"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest:02d} s"
    hours, rest = divmod(round(seconds) // 60, 60)
    return f"{hours:,} h {rest:02d} min"


def usd(value: float | None) -> str:
    """Money with its currency; four places below a dollar, where embedding bills usually are."""
    if value is None:
        return NONE
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


def size(count: int | None) -> str:
    """Bytes in binary units: 512 B, 7.7 MiB, 1.2 GiB."""
    if count is None:
        return NONE
    amount = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if amount < 1024 or unit == "TiB":
            return f"{amount:,.0f} {unit}" if unit == "B" else f"{amount:,.1f} {unit}"
        amount /= 1024
    raise AssertionError("unreachable")


def ratio(value: float | None) -> str:
    return NONE if value is None else f"{value:.1%}"


def value(item: Any) -> str:
    """Any JSON value a report may hold, readably (floats to three places, lists comma-separated)."""
    if isinstance(item, bool):
        return "yes" if item else "no"
    if isinstance(item, int):
        return f"{item:,}"
    if isinstance(item, float):
        return f"{item:,.3f}"
    if item is None:
        return NONE
    if isinstance(item, list):
        return ", ".join(value(v) for v in item)
    if isinstance(item, dict):
        return json.dumps(item, default=str)
    return str(item)


def model_name(model: dict[str, Any] | None) -> str:
    """`sentence-transformers · all-MiniLM-L6-v2 · 384 dimensions` (the HTML pages' short form)."""
    if not model:
        return NONE
    parts = [str(model.get("kind") or ""), short_model(str(model.get("model") or ""))]
    dim = model.get("dim")
    return " · ".join(p for p in parts if p) + (f" · {dim:,} dimensions" if dim else "")


def model_line(model: dict[str, Any] | None) -> str:
    """The model on one line: name, kind, dimension, precision, fingerprint."""
    if not model:
        return "unknown (no fingerprint recorded)"
    options = model.get("options") or {}
    parts = [f"{short_model(str(model.get('model') or '?'))} ({model.get('kind', '?')})"]
    if model.get("dim"):
        parts.append(f"{model['dim']:,} dimensions")
    precision = options.get("precision") or options.get("dtype")
    if precision:
        parts.append(str(precision))
    if model.get("fingerprint"):
        parts.append(f"fingerprint {model['fingerprint']}")
    return " · ".join(parts)


def short_model(name: str) -> str:
    """A model id as written (`BAAI/bge-small-en-v1.5`); a local path by its last two parts."""
    if not name.startswith(("/", "~", ".")) and name.count("/") <= 1:
        return name
    parts = PurePath(name).parts
    return "…/" + "/".join(parts[-2:]) if len(parts) > 2 else name


def served(target: str | None, is_physical: bool, alias: str) -> str:
    """What an alias serves, in words: a target, the application's own table or collection of that name
    (an index the tool has not moved yet still serves every vector it holds), or nothing."""
    if target:
        return target
    if is_physical:
        return f"{alias} itself (the application's own table or collection)"
    return "nothing yet (no such alias)"
