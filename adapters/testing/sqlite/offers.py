"""What `reindex init` writes for SQLite: a table of a file as the [source], and that file as the [target].

`--source sqlite --source-set path=FILE --source-set table=NAME` (or `--source-path FILE`); a sqlite target
shares the source's file unless `--target-path` names another.
"""

from __future__ import annotations

from reindex.errors import ConfigError
from reindex.offers import ConnectionOffer, Given, SourceOffer, TargetOffer


def _connection(role: str, given: Given) -> dict[str, str]:
    path = given.get("path")
    if path is None:
        raise ConfigError(
            f"name the {role} SQLite file", hint=f"--{role}-set path=FILE or --{role}-path FILE"
        )
    return {"path": str(path)}


CONNECTION = ConnectionOffer(("path",), _connection, {"path": "the SQLite file"}, same="the source's file")

SOURCE = SourceOffer(
    "reindex_adapters.testing.sqlite.survey:survey",
    name_key="table",
    id_key="id_column",
    text_key="text_column",
    noun="column",
    connection=CONNECTION,
    target="sqlite",
)
TARGET = TargetOffer(CONNECTION, shares_with="sqlite")
