"""What `reindex init` proposes for each section of a first config, from the request and the survey.

Every choice per kind is the kind's own (its `offer`, reindex/offers.py): which option names a source, its
connection and the check that refuses secrets, the keys its survey fills, a target's connection and what it
adds. [source] keeps what the survey chose (with the alternatives as comments), [target] defaults to the
source's backend and connection, [embedder] follows the model's name (embedders.py). Secrets are refused as
values: only the names of environment variables are written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reindex import registry
from reindex.errors import ConfigError
from reindex.offers import ConnectionOffer, Entry, SourceOffer, TargetContext, TargetOffer, Value, option
from reindex.survey import Choice, Survey, quoted

if TYPE_CHECKING:
    from reindex.init.request import InitRequest


def default_alias(survey: Survey, offer: SourceOffer) -> str:
    """The name applications read now: the table or view, the collection or alias; a file's stem."""
    return Path(survey.name).stem if offer.suffixes else survey.name


# [source] ----------------------------------------------------------------------------------------------


def source_values(request: InitRequest) -> tuple[SourceOffer, dict[str, Any]]:
    """The kind's offer, and the [source] it writes: kind, connection, name, settings; secrets refused."""
    offers = registry.source_offers()
    kind = request.source_kind or _kind_named(request, offers)
    if kind not in offers:
        known = ", ".join(registry.public("source", offers))
        raise ConfigError(f"--source {kind!r} is not a kind init proposes", hint=f"one of: {known}")
    offer = offers[kind]
    connection = offer.connection.options if offer.connection else ()
    takes = (*([offer.option] if offer.option else []), *connection)
    _refuse_others("source", kind, request.source, takes, f"--source-set {offer.name_key}=NAME")
    settings = dict(request.source_settings)
    name = (request.source.get(offer.option) if offer.option else None) or settings.pop(offer.name_key, None)
    if offer.option and name is None:
        name = settings.pop(offer.option, None)
    if name is None:
        way = f"--{option(offer.option)} NAME" if offer.option else f"--source-set {offer.name_key}=NAME"
        raise ConfigError(f"a {kind} source needs its {offer.name_key}", hint=f"pass {way}")
    written = _connection("source", offer.connection, request.source, settings)
    return offer, {"kind": kind, **written, offer.name_key: str(name), **settings}


def _kind_named(request: InitRequest, offers: Mapping[str, SourceOffer]) -> str:
    """The kind whose own option names the source (--table: postgres); a file's suffix picks among the file
    kinds. A kind with no option of its own is named with --source."""
    given = {**request.source_settings, **request.source}
    options = list(dict.fromkeys(offer.option for offer in offers.values() if offer.option))
    named = [name for name in options if name in request.source]
    if len(named) != 1:
        public = set(registry.public("source", offers))
        ways = [
            f"--{option(name)} NAME ({', '.join(k for k, o in offers.items() if o.option == name and k in public)})"
            for name in options
        ]
        not_these = f", not {' and '.join(f'--{option(name)}' for name in named)}" if named else ""
        raise ConfigError(
            "name one source" + not_these,
            hint=", ".join(ways) + ", or --source KIND with --source-set KEY=VALUE",
        )
    kinds = [kind for kind, offer in offers.items() if offer.option == named[0]]
    kinds = registry.public("source", kinds) or kinds  # a test double is never picked by a bare option
    if len(kinds) == 1:
        return kinds[0]
    value = str(given[named[0]])
    suffix = Path(value).suffix.lower()
    by_suffix = [kind for kind in kinds if suffix in offers[kind].suffixes]
    if len(by_suffix) == 1:
        return by_suffix[0]
    suffixes = [s for kind in kinds for s in offers[kind].suffixes]
    if not suffixes:
        raise ConfigError(
            f"--{option(named[0])} names a source of several kinds ({', '.join(kinds)})",
            hint="pass --source KIND",
        )
    raise ConfigError(
        f"--{option(named[0])} {value}: no source kind reads a {suffix or 'file without a suffix'}",
        hint=f"name a {', '.join(suffixes[:-1])} or {suffixes[-1]} file"
        if len(suffixes) > 1
        else f"name a {suffixes[0]} file",
    )


def source_entries(source: Mapping[str, Any], survey: Survey, offer: SourceOffer) -> list[Entry]:
    size = f"{survey.relation}, {survey.documents:,} {survey.units}" if survey.documents is not None else ""
    comments = offer.connection.comments if offer.connection else {}
    entries = [
        Entry(key, value, size if key == offer.name_key else comments.get(key, ""))
        for key, value in source.items()
    ]
    if offer.id_key is not None:
        entries.append(_choice_entry(offer.id_key, survey.id, survey, survey.id.reason))
    length = survey.text_lengths.get(survey.text.field or "")
    text_reason = survey.text.reason + (f", {length:,.0f} characters on average" if length else "")
    entries.append(_choice_entry(offer.text_key, survey.text, survey, text_reason))
    if offer.vector_key is not None and survey.vector.field is not None:
        kept = f"the current vectors {survey.vector_type}: the target keeps the name"
        entries.append(_choice_entry(offer.vector_key, survey.vector, survey, kept))
    return entries


def _choice_entry(key: str, choice: Choice, survey: Survey, comment: str) -> Entry:
    """`key = "chosen"  # comment`, with the other candidates and the option that picks one above it."""
    assert choice.field is not None
    above: tuple[str, ...] = ()
    if choice.others:
        others = ", ".join(_with_length(name, survey) for name in choice.others)
        above = (f"also found: {others}; --{option(key)} picks another",)
    return Entry(key, choice.field, comment, above)


def require_fields(survey: Survey, offer: SourceOffer) -> None:
    noun, where = offer.noun, f"{survey.relation} {survey.name}"
    if offer.id_key is not None and survey.id.field is None:
        raise ConfigError(
            f"no usable id {noun} in {where}: {survey.id.reason}",
            hint=f"pass --{option(offer.id_key)} NAME, a {noun} whose values are unique",
        )
    if survey.text.field is None:
        raise ConfigError(f"no text {noun} found in {where}", hint=f"pass --{option(offer.text_key)} NAME")


# [target], [run] ([embedder]: embedders.py) ----------------------------------------------------------------------------


def target_offer(
    request: InitRequest, source: Mapping[str, Any], offer: SourceOffer
) -> tuple[str, TargetOffer]:
    """The target's kind (given, else the source's backend) and its offer, its options checked before
    anything is read."""
    offers = registry.target_offers()
    kind = request.target or offer.target
    if kind is None:
        raise ConfigError(f"a {source['kind']} source needs a target", hint=_target_hint(offers))
    if kind not in offers:
        raise ConfigError(f"unknown target kind {kind!r}", hint=_target_hint(offers))
    _refuse_others("target", kind, request.target_options, offers[kind].connection.options)
    return kind, offers[kind]


def target_entries(
    request: InitRequest,
    kind: str,
    target: TargetOffer,
    source: Mapping[str, Any],
    alias: str,
    survey: Survey,
) -> list[Entry]:
    own = bool(request.target_options) or any(
        key in request.target_settings for key in target.connection.options
    )
    context = TargetContext(source, survey, alias, own_connection=own)
    return [
        Entry("kind", kind),
        *_target_connection(request, target, source, own),
        Entry("alias", alias, "the name applications read"),
        Entry(
            "name",
            f"{alias}__v2",
            'default "<alias>__<fingerprint8>"; never the alias itself',
            is_example=True,
        ),
        *target.entries(context),
        *(
            Entry(key, value)
            for key, value in request.target_settings.items()
            if key not in target.connection.options
        ),
    ]


def _target_hint(offers: Mapping[str, TargetOffer]) -> str:
    ways = [
        f"--target {kind} --target-{option(offers[kind].connection.options[0])} ..."
        for kind in registry.public("target", offers)
    ]
    return ", or ".join(ways)


def _target_connection(
    request: InitRequest, target: TargetOffer, source: Mapping[str, Any], own: bool
) -> list[Entry]:
    """The target's connection as given; none given: the source's own, on the same backend."""
    connection = target.connection
    if not own and source["kind"] == target.shares_with:
        same = f"{connection.same}"
        return [Entry(key, value, same) for key, value in source.items() if key in connection.options]
    settings = dict(request.target_settings)
    written = _connection("target", connection, request.target_options, settings)
    return [Entry(key, value, connection.comments.get(key, "")) for key, value in written.items()]


def _connection(
    role: str, connection: ConnectionOffer | None, named: Mapping[str, str], settings: dict[str, Value]
) -> dict[str, str]:
    """The connection keys written for `role`, checked by the kind (which refuses secrets as values); keys
    given through --ROLE-set are taken out of `settings`."""
    if connection is None:
        return {}
    given = {
        key: named.get(key) if key in named else (str(settings.pop(key)) if key in settings else None)
        for key in connection.options
    }
    return connection.check(role, given)


def run_entries(alias: str) -> list[Entry]:
    state = re.sub(r"[^A-Za-z0-9_.-]", "_", alias)
    return [
        Entry("state", f".reindex/{state}.db", "the ledger (SQLite); a postgresql:// URL shares it"),
        Entry("shard_size", 1000, "documents per resumable unit"),
        Entry(
            "too_long",
            "dead-letter",
            'the default, "truncate", cuts a text at the model\'s limit (plan counts them); this keeps it out whole',
            is_example=True,
        ),
    ]


def _refuse_others(
    role: str, kind: str, given: Mapping[str, Any], takes: Sequence[str], none: str = ""
) -> None:
    """ConfigError naming the first option given that a kind of `role` does not take, and those it does."""
    refused = [key for key in given if key not in takes]
    if refused:
        spelled = ", ".join(_spelling(role, key) for key in takes) or none
        raise ConfigError(
            f"{_spelling(role, refused[0])} is not an option of a {kind} {role}",
            hint=f"its options: {spelled}",
        )


def _spelling(role: str, key: str) -> str:
    """How the command line names a key: a source's name by its own option (--table), else --ROLE-KEY."""
    names = {offer.option for offer in registry.source_offers().values() if offer.option}
    return f"--{option(key)}" if role == "source" and key in names else f"--{role}-{option(key)}"


def _with_length(name: str, survey: Survey) -> str:
    length = survey.text_lengths.get(name)
    return quoted(name) + (f" ({length:,.0f} characters on average)" if length is not None else "")
