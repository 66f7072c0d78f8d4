"""`reindex init`: write a first, commented migration config from what the source shows.

    options ──► [source] ──survey (adapters/*_survey.py)──► id, text, old vectors, size, alias state
            ──► proposal: alias, [target] (the source's backend and connection by default), [embedder]
                (every kind the tool runs: embedders.py)
            ──► config_text: commented TOML, validated as `load` reads it, written only where no file is

Secrets go in as environment-variable names: a value is read to look at the source, never written.
The request is in request.py, the proposal per section in proposal.py, the TOML writing in text.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reindex import config as config_module
from reindex import registry
from reindex.errors import ConfigError
from reindex.init import embedders, proposal
from reindex.init.request import InitRequest as InitRequest
from reindex.init.text import render, values
from reindex.survey import Survey


@dataclass(frozen=True)
class InitReport:
    path: Path
    survey: Survey
    alias: str
    sections: dict[str, dict[str, Any]]  # what the file sets, by section
    notes: tuple[str, ...]

    @property
    def next_command(self) -> str:
        return f"reindex plan -c {self.path}"

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "found": self.survey.to_json(),
            "alias": self.alias,
            **self.sections,
            "notes": list(self.notes),
            "next": self.next_command,
        }

    def summary_lines(self) -> list[str]:
        """The few lines `reindex init` prints without --json."""
        target, embedder = self.sections["target"], self.sections["embedder"]
        return [
            f"found: {self.survey.describe()}",
            f"chose: {self.survey.choices()}",
            f"alias {self.alias} on {target['kind']}; embedder {embedder['kind']} {embedder['model']}",
            *(f"note: {note}" for note in self.notes),
            f"wrote {self.path}",
            f"next: {self.next_command}",
        ]


def init(path: Path, request: InitRequest) -> InitReport:
    """Look at the request's source and write a commented config for migrating it.

    Args:
        path: the file to write; an existing file is never overwritten (ConfigError, exit 2).
        request: the source, the target and the model, as the command line gave them.
    """
    _refuse_existing(path)
    source = proposal.source_values(request)
    survey: Survey = registry.resolve_survey(str(source["kind"]))(source, request.given)
    proposal.require_fields(survey)
    alias = request.alias or proposal.default_alias(survey)
    sections = {
        "source": proposal.source_entries(source, survey),
        "embedder": embedders.entries(request),
        "target": proposal.target_entries(request, source, alias, survey),
        "run": proposal.run_entries(alias),
    }
    text = render(_header(path, survey), sections)
    config_module.parse(text, path)  # exactly what `reindex plan -c` will load: never write anything else
    _write_new(path, text)
    written = {name: values(entries) for name, entries in sections.items()}
    placeholders = [
        f"[embedder] {key} is a placeholder: set it before `reindex run`"
        for key in embedders.placeholders(sections["embedder"])
    ]
    notes = (*survey.notes, *placeholders, *_unset_variables(written))
    return InitReport(path, survey, alias, written, notes)


def _unset_variables(sections: dict[str, dict[str, Any]]) -> list[str]:
    """Variables the file names that this environment lacks (the source's were read, so they are set)."""
    names = {
        sections[s][k] for s in ("target", "embedder") for k in ("dsn_env", "api_key_env") if k in sections[s]
    }
    return [
        f"{name} is not set here: set it where the migration runs"
        for name in sorted(names)
        if not os.environ.get(name)
    ]


# the file ------------------------------------------------------------------------------------------------


def _header(path: Path, survey: Survey) -> list[str]:
    return [
        "Written by `reindex init` from what the source showed; check the choices below, then run",
        f"  reindex plan -c {path}",
        "",
        f"Found: {survey.describe()}.",
        *survey.notes,
    ]


def _refuse_existing(path: Path) -> None:
    if path.exists():
        raise _exists(path)


def _write_new(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with path.open("x", encoding="utf-8") as out:  # "x": a file that appeared meanwhile is kept too
            out.write(text)
    except FileExistsError:
        raise _exists(path) from None


def _exists(path: Path) -> ConfigError:
    return ConfigError(
        f"{path} already exists; init never overwrites a config", hint="choose another file name"
    )
