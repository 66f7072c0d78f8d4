"""How a backend describes itself to `reindex init`: what it offers to write in each section of a config.

A kind that `init` should propose declares one of these on its adapter class, as the class attribute
`offer`; the core keeps no table per kind. `init` reads them through the registry: a source's survey, its
keys and its connection options, a target's connection and the entries it adds, an embedder's keys and the
models a bare `--model` picks it for. A kind without an `offer` runs like any other; `init` does not
propose it. `docs/extending.md` shows one of each.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from reindex.survey import Survey

_PASSWORD_PARAMETER = re.compile(r"(?:^|[\s?&])(?:ssl)?password\s*=\s*[^\s&]", re.IGNORECASE)


Value = str | int | float | bool | tuple[str, ...]  # what a TOML key written by `init` holds


@dataclass(frozen=True)
class Entry:
    """One key of a section, with what a reader should know about it."""

    key: str
    value: Value
    comment: str = ""
    above: tuple[str, ...] = ()  # whole comment lines before the key: alternatives, caveats
    is_example: bool = False  # written commented out: an option worth knowing, not set
    fill_in: bool = False  # a placeholder the user must replace (an Azure resource, a Bedrock role)


Given = Mapping[
    str, str | None
]  # a role's connection options as the command line gave them (None: not given)


@dataclass(frozen=True)
class ConnectionOffer:
    """How a backend is reached: the options `init` takes for it (`--source-KEY`, `--target-KEY`, one per
    config key) and the check that turns what was given into the keys written, refusing secrets as values."""

    options: tuple[str, ...]  # config keys, e.g. ("dsn_env", "dsn"); init's options are --{role}-{key}
    check: Callable[[str, Given], dict[str, str]]  # (role, given) -> the keys written; ConfigError if wrong
    comments: Mapping[str, str] = field(default_factory=dict)  # the comment written beside each key
    same: str = "the source's"  # how the comment names a connection shared with the source


@dataclass(frozen=True)
class SourceOffer:
    """What `init` needs to write a [source] of this kind from what its survey finds."""

    # "module:function" reading the source as the config names it, (section, Overrides) -> Survey: named, not
    # imported, since a survey reads the source class that declares this offer
    survey: str
    name_key: str  # the [source] key naming what is read ("table", "collection", "path")
    text_key: str  # the [source] keys that name the text, the id and the old vectors (None: no such key)
    id_key: str | None = None
    vector_key: str | None = None
    noun: str = "field"  # what the source calls a field: "column", "payload field"
    connection: ConnectionOffer | None = None
    # a built-in's own option for that name (--table, --collection, --file), which also picks the kind; None:
    # the kind is named with --source KIND and the name with --source-set NAME_KEY=...
    option: str | None = None
    suffixes: tuple[str, ...] = ()  # a file kind: the suffixes it reads; the file's stem is the alias
    target: str | None = None  # the target kind on the same backend: the default --target


@dataclass(frozen=True)
class TargetContext:
    """What a target's offer may look at to choose its entries."""

    source: Mapping[str, Any]  # the [source] section init writes
    survey: Survey
    alias: str
    own_connection: bool  # a connection was given for the target (not the source's, shared)


@dataclass(frozen=True)
class TargetOffer:
    """What `init` needs to write a [target] of this kind."""

    connection: ConnectionOffer
    shares_with: str | None = None  # a source kind whose connection a target of this kind can reuse
    entries: Callable[[TargetContext], list[Entry]] = lambda _: []  # written after kind, connection, alias


@dataclass(frozen=True)
class EmbedderOffer:
    """What `init` needs to write an [embedder] of this kind for a model."""

    entries: Callable[[str, str], list[Entry]]  # (model, the key's variable) -> the section's entries
    key_env: str | None = None  # the provider's usual variable for its key; None: the kind takes no key
    no_key: str = "a local model has no key"  # why --api-key-env is refused where key_env is None
    claims: Collection[str] = ()  # models a bare --model picks this kind for (each claimed by one kind)


@runtime_checkable
class OffersSource(Protocol):
    offer: ClassVar[SourceOffer]


@runtime_checkable
class OffersTarget(Protocol):
    offer: ClassVar[TargetOffer]


@runtime_checkable
class OffersEmbedder(Protocol):
    offer: ClassVar[EmbedderOffer]


def has_password(value: str) -> bool:
    """A password in a URL's user info, or a `password=` query parameter or libpq keyword."""
    try:
        if "://" in value and urlsplit(value).password:
            return True
    except ValueError:  # a malformed URL: the adapter's own check names the problem later
        return False
    return _PASSWORD_PARAMETER.search(value) is not None


def key_entry(variable: str) -> Entry:
    """`api_key_env`: the name of the variable holding a provider's key, never the key."""
    return Entry("api_key_env", variable, "the key is read from this variable, never written here")


def provider_entries(kind: str, other: str, *examples: Entry) -> Callable[[str, str], list[Entry]]:
    """A provider kind that needs only its model and its key: the other tier named, options as examples."""

    def entries(model: str, variable: str) -> list[Entry]:
        return [Entry("kind", kind, other), Entry("model", model), key_entry(variable), *examples]

    return entries


def local_entries(kind: str, other: str, *examples: Entry) -> Callable[[str, str], list[Entry]]:
    """A model run here: its name or folder, normalised, with the options that change its vectors."""

    def entries(model: str, _: str) -> list[Entry]:
        return [
            Entry("kind", kind, other),
            Entry("model", model, "a Hugging Face name, or a folder relative to this file"),
            Entry("normalize", True),
            Entry(
                "prompt",
                "passage: ",
                "a prefix some models expect (e5, bge); part of the fingerprint",
                is_example=True,
            ),
            Entry("max_tokens", 256, "default: the model's limit", is_example=True),
            *examples,
        ]

    return entries


def option(key: str) -> str:
    """The command-line spelling of a config key: `dsn_env` -> `dsn-env`."""
    return key.replace("_", "-")
