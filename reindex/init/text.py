"""A config as commented TOML, the way configs/*.toml read: what `reindex init` writes."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Mapping, Sequence

from reindex.offers import Entry, Value

COMMENT_COLUMN = 32  # inline comments line up here, as in configs/*.toml
WIDTH = 110  # the project's line length
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # not allowed in a TOML comment


def values(entries: Sequence[Entry]) -> dict[str, Value]:
    """The keys a section sets, examples left out: what the config loader will read."""
    return {entry.key: entry.value for entry in entries if not entry.is_example}


def render(header: Sequence[str], sections: Mapping[str, Sequence[Entry]]) -> str:
    lines = [*comment_lines(header), ""]
    for name, entries in sections.items():
        lines.append(f"[{name}]")
        for entry in entries:
            lines += _entry_lines(entry)
        lines.append("")
    return "\n".join(lines)


def comment_lines(texts: Sequence[str]) -> list[str]:
    """Each text as `# ` lines wrapped to the line length; an empty text is a bare `#`."""
    lines: list[str] = []
    for text in texts:
        wrapped = textwrap.wrap(
            _CONTROL.sub(" ", text),
            WIDTH - 2,
            subsequent_indent="  ",
            break_long_words=False,
            break_on_hyphens=False,
        )
        lines += [f"# {line}" for line in wrapped] or ["#"]
    return lines


def toml_value(value: Value) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    # A JSON string is a TOML basic string (the same escapes), except that TOML also wants DEL escaped.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _entry_lines(entry: Entry) -> list[str]:
    assignment = f"{entry.key} = {toml_value(entry.value)}"
    if entry.is_example:
        assignment = f"# {assignment}"
    if entry.comment:
        assignment = f"{assignment:<{COMMENT_COLUMN}} # {_CONTROL.sub(' ', entry.comment)}"
    return [*comment_lines(entry.above), assignment]
