"""`reindex init`: write a first, commented migration config from what the source shows.

    options ──► [source] ──survey (the kind's `offer`)──► id, text, old vectors, size, alias state
            ──► proposal: alias, [target] (the source's backend and connection by default), [embedder]
                (every kind the tool runs: embedders.py)
            ──► config_text: commented TOML, validated as `load` reads it, written only where no file is

Secrets go in as environment-variable names: a value is read to look at the source, never written.
The request is in request.py, the proposal per section in proposal.py, the TOML writing in text.py.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reindex import config as config_module
from reindex import registry
from reindex.capabilities import NamesPaths
from reindex.errors import ConfigError, environment
from reindex.init import embedders, proposal
from reindex.init.request import InitRequest as InitRequest
from reindex.init.text import render, values
from reindex.offers import Entry, Value
from reindex.registry import Role
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
    base = path.absolute().parent
    request = _model_path(request, base)
    offer, source = proposal.source_values(request)
    target_kind, target_offer = proposal.target_offer(request, source, offer)
    source = _paths("source", source, _absolute)  # given from here; written relative to the file, below
    looked_at = config_module.anchor({"source": source}, base)["source"]  # as `load` will read them
    survey = registry.survey(offer)(looked_at, request.given)
    proposal.require_fields(survey, offer)
    alias = request.alias or proposal.default_alias(survey, offer)
    target = proposal.target_entries(request, target_kind, target_offer, source, alias, survey)
    sections = {
        "source": proposal.source_entries(
            _paths("source", source, lambda p: _relative(p, base)), survey, offer
        ),
        "embedder": embedders.entries(request),
        "target": _relative_entries("target", target, base),
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


def settings(option_name: str, pairs: list[str]) -> dict[str, Value]:
    """`KEY=VALUE` pairs as TOML would read the value (`500` a number, `true` a boolean), else as text."""
    found: dict[str, Value] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"{option_name} {pair!r} is not KEY=VALUE", hint=f"e.g. {option_name} page_size=500"
            )
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
        found[key.strip()] = value if isinstance(value, str | int | float | bool) else text
    return found


def _unset_variables(sections: dict[str, dict[str, Any]]) -> list[str]:
    """Variables the file names (keys ending in `_env`) that this environment lacks (the source's were read,
    so they are set)."""
    names = {
        str(value)
        for s in ("target", "embedder")
        for key, value in sections[s].items()
        if key.endswith("_env")
    }
    return [
        f"{name} is not set here: set it where the migration runs"
        for name in sorted(names)
        if not environment(name, "dsn_env or api_key_env")
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


def _model_path(request: InitRequest, base: Path) -> InitRequest:
    """A model given as a folder, as the config will hold it: relative to the config file's folder. It must
    be there: a typo is one line now, not a minute of model-hub retries at `plan`."""
    model = request.model
    if _names_a_folder(model):
        found = Path(model).expanduser()
        if not found.is_dir():
            raise _no_model_folder(found)
        model = _relative(found, base)
    return dataclasses.replace(request, model=model)


def _paths(role: Role, section: dict[str, Any], change: Callable[[str], str]) -> dict[str, Any]:
    """`section` with `change` applied to the keys its kind's Config reads as paths."""
    paths = _path_keys(role, str(section["kind"]))
    return {key: change(str(value)) if key in paths else value for key, value in section.items()}


def _absolute(path: str) -> str:
    return path if path.startswith(":") else str(Path(path).expanduser().absolute())


def _relative_entries(role: Role, entries: list[Entry], base: Path) -> list[Entry]:
    """The path keys of a section as the config holds them: relative to its folder (`load` reads them so,
    wherever it runs)."""
    kind = next(str(entry.value) for entry in entries if entry.key == "kind")
    paths = _path_keys(role, kind)
    return [
        dataclasses.replace(entry, value=_relative(str(entry.value), base))
        if entry.key in paths and not entry.is_example
        else entry
        for entry in entries
    ]


def _path_keys(role: Role, kind: str) -> tuple[str, ...]:
    adapter = registry.resolve(role, kind)
    return adapter.Config.PATHS if isinstance(adapter.Config, NamesPaths) else ()


def _names_a_folder(model: str) -> bool:
    """A model given as a path: written as one, there, or under a folder that is there ("models/x")."""
    path = Path(model).expanduser()
    written = model.startswith(("./", "../", "~", "/"))
    return written or path.exists() or (len(path.parts) > 1 and path.parent.is_dir())


def _no_model_folder(path: Path) -> ConfigError:
    near = difflib.get_close_matches(
        path.name, [p.name for p in path.parent.iterdir()] if path.parent.is_dir() else []
    )
    hint = (
        f"did you mean {path.parent / near[0]}?"
        if near
        else "give the folder of a saved model, or a Hugging Face name"
    )
    return ConfigError(f"no model folder at {path.absolute()}", hint=hint)


def _relative(path: Path | str, base: Path) -> str:
    if str(path).startswith(":"):  # ":memory:"
        return str(path)
    return os.path.relpath(Path(path).expanduser().absolute(), base)


def _refuse_existing(path: Path) -> None:
    if path.exists():
        raise _exists(path)


def _write_new(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("x", encoding="utf-8") as out:  # "x": a file that appeared meanwhile is kept too
            out.write(text)
    except FileExistsError:
        if path.exists():
            raise _exists(path) from None
        raise _unwritable(path, f"{path.parent} is not a folder") from None
    except OSError as exc:  # a read-only folder, a full disk, a parent that is a file
        raise _unwritable(path, exc.strerror or type(exc).__name__) from None


def _unwritable(path: Path, why: str) -> ConfigError:
    return ConfigError(f"cannot write {path}: {why}", hint="write the config to a folder you can write to")


def _exists(path: Path) -> ConfigError:
    return ConfigError(
        f"{path} already exists; init never overwrites a config", hint="choose another file name"
    )
