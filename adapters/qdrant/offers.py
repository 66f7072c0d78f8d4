"""What `reindex init` writes for Qdrant: a collection (or an alias) as the [source], and as the [target].

A server by its URL (an API key by the name of its variable) or local storage by its folder; a URL holding
a password is refused, so it never lands in the file.
"""

from __future__ import annotations

from reindex.errors import ConfigError
from reindex.offers import ConnectionOffer, Given, SourceOffer, TargetOffer, has_password


def _connection(role: str, given: Given) -> dict[str, str]:
    url, path, api_key_env = given.get("url"), given.get("path"), given.get("api_key_env")
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


CONNECTION = ConnectionOffer(
    ("url", "path", "api_key_env"),
    _connection,
    {
        "api_key_env": "the API key is read from this variable, never written here",
        "path": "Qdrant local storage",
    },
    same="the source's Qdrant",
)


SOURCE = SourceOffer(
    "reindex_adapters.qdrant.survey:survey",
    option="collection",
    name_key="collection",
    text_key="text_field",
    vector_key="vector_name",  # documents are keyed by the point id: no id key
    noun="payload field",
    connection=CONNECTION,
    target="qdrant",
)
TARGET = TargetOffer(CONNECTION, shares_with="qdrant")
