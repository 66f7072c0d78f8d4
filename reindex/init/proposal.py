"""What `reindex init` proposes for each section of a first config, from the request and the survey.

[source] keeps what the survey chose (with the alternatives as comments), [target] defaults to the source's
backend and connection, [embedder] follows the model's name. Secrets are refused as values: only the names
of environment variables are written.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from reindex.errors import ConfigError
from reindex.init.text import Entry
from reindex.survey import UNITS, Choice, Survey, quoted

if TYPE_CHECKING:
    from reindex.init.request import InitRequest

TARGET_KINDS = ("pgvector", "qdrant")
_SAME_BACKEND = {"postgres": "pgvector", "qdrant": "qdrant"}  # the default target of a source kind
_FILE_KINDS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
# [source] keys naming the id, the text and the old vectors, per source kind (None: the kind has no such key)
_KEYS: dict[str, tuple[str | None, str, str | None]] = {
    "postgres": ("id_column", "text_column", "vector_column"),
    "qdrant": (None, "text_field", "vector_name"),  # documents are keyed by the point id
    "jsonl": ("id_field", "text_field", None),
    "parquet": ("id_field", "text_field", None),
}
_NOUNS = {"postgres": "column", "parquet": "column", "jsonl": "field", "qdrant": "payload field"}
_PASSWORD_PARAMETER = re.compile(r"(?:^|[\s?&])(?:ssl)?password\s*=\s*[^\s&]", re.IGNORECASE)


def default_alias(survey: Survey) -> str:
    """The name applications read now: the table or view, the collection or alias; a file's stem."""
    return Path(survey.name).stem if survey.kind in ("jsonl", "parquet") else survey.name


def has_password(dsn: str) -> bool:
    """A password in a URL's user info, or a `password=` query parameter or libpq keyword."""
    try:
        if "://" in dsn and urlsplit(dsn).password:
            return True
    except ValueError:  # a malformed URL: the adapter's own DSN check names the problem later
        return False
    return _PASSWORD_PARAMETER.search(dsn) is not None


# [source] ----------------------------------------------------------------------------------------------


def source_values(request: InitRequest) -> dict[str, Any]:
    """The [source] connection and name, refusing secrets given as values."""
    named = [
        option
        for option, value in (
            ("--table", request.table),
            ("--collection", request.collection),
            ("--file", request.file),
        )
        if value is not None
    ]
    if len(named) != 1:
        raise ConfigError(
            "name one source" + (f", not {' and '.join(named)}" if named else ""),
            hint="--table NAME (Postgres), --collection NAME (Qdrant) or --file PATH (JSONL, Parquet)",
        )
    if request.table is not None:
        connection = _postgres("source", request.source_dsn_env, request.source_dsn)
        return {"kind": "postgres", **connection, "table": request.table}
    if request.collection is not None:
        connection = _qdrant("source", request.source_url, request.source_path, request.source_api_key_env)
        return {"kind": "qdrant", **connection, "collection": request.collection}
    assert request.file is not None
    return {"kind": _file_kind(request.file), "path": str(request.file)}


def source_entries(source: dict[str, Any], survey: Survey) -> list[Entry]:
    size = (
        f"{survey.relation}, {survey.documents:,} {UNITS[survey.kind]}"
        if survey.documents is not None
        else ""
    )
    name_key = {"postgres": "table", "qdrant": "collection"}.get(survey.kind, "path")
    entries = [
        Entry(key, value, size if key == name_key else _connection_comment(key))
        for key, value in source.items()
    ]
    id_key, text_key, vector_key = _KEYS[survey.kind]
    if id_key is not None:
        entries.append(_choice_entry(id_key, survey.id, survey, survey.id.reason))
    length = survey.text_lengths.get(survey.text.field or "")
    text_reason = survey.text.reason + (f", {length:,.0f} characters on average" if length else "")
    entries.append(_choice_entry(text_key, survey.text, survey, text_reason))
    if vector_key is not None and survey.vector.field is not None:
        kept = f"the current vectors {survey.vector_type}: the target keeps the name"
        entries.append(_choice_entry(vector_key, survey.vector, survey, kept))
    return entries


def _choice_entry(key: str, choice: Choice, survey: Survey, comment: str) -> Entry:
    """`key = "chosen"  # comment`, with the other candidates and the option that picks one above it."""
    assert choice.field is not None
    above: tuple[str, ...] = ()
    if choice.others:
        others = ", ".join(_with_length(name, survey) for name in choice.others)
        above = (f"also found: {others}; --{_option(key)} picks another",)
    return Entry(key, choice.field, comment, above)


def require_fields(survey: Survey) -> None:
    id_key, text_key, _ = _KEYS[survey.kind]
    noun, where = _NOUNS[survey.kind], f"{survey.relation} {survey.name}"
    if id_key is not None and survey.id.field is None:
        raise ConfigError(
            f"no usable id {noun} in {where}: {survey.id.reason}",
            hint=f"pass --{_option(id_key)} NAME, a {noun} whose values are unique",
        )
    if survey.text.field is None:
        raise ConfigError(f"no text {noun} found in {where}", hint=f"pass --{_option(text_key)} NAME")


def _file_kind(path: Path) -> str:
    kind = _FILE_KINDS.get(path.suffix.lower())
    if kind is None:
        raise ConfigError(
            f"--file {path}: not a JSONL or Parquet file", hint="name a .jsonl or .parquet file"
        )
    return kind


# [target], [run] ([embedder]: embedders.py) ----------------------------------------------------------------------------


def target_entries(
    request: InitRequest, source: dict[str, Any], alias: str, survey: Survey | None = None
) -> list[Entry]:
    kind = request.target or _SAME_BACKEND.get(str(source["kind"]))
    if kind is None:
        raise ConfigError(
            "a file source needs a target",
            hint="--target pgvector --target-dsn-env NAME, or --target qdrant --target-url URL",
        )
    if kind not in TARGET_KINDS:
        raise ConfigError(f"unknown target kind {kind!r}", hint="--target pgvector or --target qdrant")
    in_place = (
        kind == "pgvector"
        and source["kind"] == "postgres"
        and survey is not None
        and survey.relation in ("table", "partitioned table")
        and alias == survey.name
        and not _other_database(request)
    )
    accept = [
        Entry(
            "accept",
            ("extra_column",) if in_place else ("table_statements", "column_order"),
            "column mode adds one column while in flight: uncomment to accept it (plan refuses until then)"
            if in_place
            else "what the cutover may not keep of the table; `reindex plan` lists what it finds",
            is_example=True,
        )
    ]
    if in_place:  # the application's own table: the new vectors side by side in it (docs/backends.md)
        accept.insert(0, Entry("mode", "column", "the table stays the table: the flip renames two columns"))
    return [
        Entry("kind", kind),
        *_target_connection(request, kind, source),
        Entry("alias", alias, "the name applications read"),
        Entry(
            "name",
            f"{alias}__v2",
            'default "<alias>__<fingerprint8>"; never the alias itself',
            is_example=True,
        ),
        *(accept if kind == "pgvector" else []),
    ]


def _other_database(request: InitRequest) -> bool:
    """A target connection given apart from the source's: not the source's table (a fresh table there)."""
    return request.target_dsn_env is not None or request.target_dsn is not None


def _target_connection(request: InitRequest, kind: str, source: dict[str, Any]) -> list[Entry]:
    """The target's connection as given; none given: the source's own, on the same backend."""
    if kind == "pgvector":
        if request.target_dsn_env is None and request.target_dsn is None and source["kind"] == "postgres":
            return [
                Entry(k, v, "the source's database") for k, v in source.items() if k in ("dsn", "dsn_env")
            ]
        connection = _postgres("target", request.target_dsn_env, request.target_dsn)
    else:
        if request.target_url is None and request.target_path is None and source["kind"] == "qdrant":
            same = ("url", "path", "api_key_env")
            return [Entry(k, v, "the source's Qdrant") for k, v in source.items() if k in same]
        connection = _qdrant("target", request.target_url, request.target_path, request.target_api_key_env)
    return [Entry(key, value, _connection_comment(key)) for key, value in connection.items()]


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


# connections and secrets ---------------------------------------------------------------------------------


def _postgres(role: str, dsn_env: str | None, dsn: str | None) -> dict[str, str]:
    if (dsn_env is None) == (dsn is None):
        raise ConfigError(
            f"name the {role} database once: --{role}-dsn-env NAME (a variable holding the DSN)",
            hint=f"export REINDEX_{role.upper()}_DSN=postgresql://... then --{role}-dsn-env REINDEX_{role.upper()}_DSN",
        )
    if dsn is None:
        return {"dsn_env": str(dsn_env)}
    if has_password(dsn):
        raise ConfigError(
            f"--{role}-dsn holds a password, which must not go into the file",
            hint=f"export REINDEX_{role.upper()}_DSN='<the DSN>' and pass --{role}-dsn-env REINDEX_{role.upper()}_DSN",
        )
    return {"dsn": dsn}


def _qdrant(role: str, url: str | None, path: str | None, api_key_env: str | None) -> dict[str, str]:
    if (url is None) == (path is None):
        raise ConfigError(
            f"name the {role} Qdrant once",
            hint=f"--{role}-url URL (a server) or --{role}-path FOLDER (local storage)",
        )
    if url is not None and has_password(url):
        raise ConfigError(
            f"--{role}-url holds a password", hint=f"pass the API key as --{role}-api-key-env NAME"
        )
    connection = {"url": url} if url is not None else {"path": str(path)}
    return connection | ({"api_key_env": api_key_env} if api_key_env else {})


def _connection_comment(key: str) -> str:
    return {
        "dsn_env": "the DSN is read from this variable, never written here",
        "dsn": "no password here: libpq finds it (.pgpass, PGPASSWORD)",
        "api_key_env": "the API key is read from this variable, never written here",
        "path": "Qdrant local storage",
    }.get(key, "")


def _option(key: str) -> str:
    return key.replace("_", "-")


def _with_length(name: str, survey: Survey) -> str:
    length = survey.text_lengths.get(name)
    return quoted(name) + (f" ({length:,.0f} characters on average)" if length is not None else "")
