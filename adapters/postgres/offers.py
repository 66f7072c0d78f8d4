"""What `reindex init` writes for Postgres: a table or view as the [source], pgvector as the [target].

The connection is a DSN given by the name of the variable holding it (`--source-dsn-env`), or a DSN without
a password (`--source-dsn`: a socket, .pgpass, PGPASSWORD); a password on the command line is refused, so it
never lands in the file.
"""

from __future__ import annotations

from reindex.errors import ConfigError
from reindex.offers import (
    ConnectionOffer,
    Entry,
    Given,
    SourceOffer,
    TargetContext,
    TargetOffer,
    has_password,
)


def _connection(role: str, given: Given) -> dict[str, str]:
    dsn_env, dsn = given.get("dsn_env"), given.get("dsn")
    variable = f"REINDEX_{role.upper()}_DSN"
    if (dsn_env is None) == (dsn is None):
        raise ConfigError(
            f"name the {role} database once: --{role}-dsn-env NAME (a variable holding the DSN)",
            hint=f"export {variable}=postgresql://... then --{role}-dsn-env {variable}",
        )
    if dsn is None:
        return {"dsn_env": str(dsn_env)}
    if has_password(dsn):
        raise ConfigError(
            f"--{role}-dsn holds a password, which must not go into the file",
            hint=f"export {variable}='<the DSN>' and pass --{role}-dsn-env {variable}",
        )
    return {"dsn": dsn}


CONNECTION = ConnectionOffer(
    ("dsn_env", "dsn"),
    _connection,
    {
        "dsn_env": "the DSN is read from this variable, never written here",
        "dsn": "no password here: libpq finds it (.pgpass, PGPASSWORD)",
    },
    same="the source's database",
)


SOURCE = SourceOffer(
    "reindex_adapters.postgres.survey:survey",
    option="table",
    name_key="table",
    id_key="id_column",
    text_key="text_column",
    vector_key="vector_column",
    noun="column",
    connection=CONNECTION,
    target="pgvector",
)


def _target_entries(context: TargetContext) -> list[Entry]:
    """The application's own table (the alias is the table read, in the same database): column mode, which
    keeps the table; anything else: a fresh table behind a view, and what the cutover may not keep of it."""
    in_place = (
        context.source.get("kind") == "postgres"
        and context.survey.relation in ("table", "partitioned table")
        and context.alias == context.survey.name
        and not context.own_connection
    )
    accept = Entry(
        "accept",
        ("extra_column",) if in_place else ("table_statements", "column_order"),
        "column mode adds one column while in flight: uncomment to accept it (plan refuses until then)"
        if in_place
        else "what the cutover may not keep of the table; `reindex plan` lists what it finds",
        is_example=True,
    )
    if in_place:  # the application's own table: the new vectors side by side in it (docs/backends.md)
        return [Entry("mode", "column", "the table stays the table: the flip renames two columns"), accept]
    return [accept]


TARGET = TargetOffer(CONNECTION, shares_with="postgres", entries=_target_entries)
