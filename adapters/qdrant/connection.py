"""Qdrant connections: the settings, one client per storage folder or URL, names Qdrant accepts, and client
errors turned into the error tree with every api key masked.

Local mode allows one client per storage folder, so `from_config` shares one client per folder (or URL).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from pydantic import ConfigDict, model_validator

from reindex.errors import (
    BackendError,
    ConfigError,
    MissingDependency,
    ReindexError,
    TransientError,
    environment,
)
from reindex.ports import Section

if TYPE_CHECKING:
    from qdrant_client import QdrantClient

NAME_MAX = 255  # Qdrant's limit on collection and alias names
# What a Qdrant server refuses in a new collection's name (its `validate_collection_name`), as qdrant-client's
# local mode does: it keeps each collection in a folder named after it. An alias is read as a collection name.
_NAME_REFUSED = '<>:"/\\|?*\0\x1f'


class Connection(Section):
    model_config = ConfigDict(extra="forbid", frozen=True)
    PATHS: ClassVar[tuple[str, ...]] = ("path",)  # relative to the config file (reindex.config.anchor)
    url: str | None = None
    path: str | None = None  # a local storage folder, or ":memory:"
    api_key_env: str | None = None

    @model_validator(mode="after")
    def _one_location(self) -> Connection:
        if (self.url is None) == (self.path is None):
            raise ValueError("set exactly one of url (a Qdrant server) or path (local storage)")
        return self


def creatable(name: str, longest: int, why: str) -> str:
    """`name` if Qdrant accepts it for a collection or alias the tool creates; else a ValueError naming the fix."""
    refused = sorted(set(name) & set(_NAME_REFUSED))
    if refused:
        fixed = "".join("_" if c in _NAME_REFUSED else c for c in name)
        raise ValueError(
            f"{name!r} has {', '.join(map(repr, refused))}, which Qdrant refuses in collection and alias"
            f" names: use e.g. {fixed!r}"
        )
    if name in (".", ".."):
        raise ValueError(f"{name!r} is not a name Qdrant accepts: use letters or digits")
    if len(name) > longest:
        raise ValueError(
            f"{name[:16]!r}... is {len(name)} characters long: shorten it to {longest} characters or fewer"
            f" ({why})"
        )
    return name


# ---- clients: one per storage folder or URL, shared by the source and the sink of one run ----


@dataclass
class _Shared:
    client: QdrantClient
    users: int = 0


clients: dict[str, _Shared] = {}
_clients_lock = threading.Lock()


def acquire(config: Connection) -> tuple[QdrantClient, str]:
    key = _client_key(config)
    with _clients_lock:
        if key not in clients:
            clients[key] = _Shared(_open(config))
        shared = clients[key]
        shared.users += 1
        return shared.client, key


def release(key: str | None) -> None:
    if key is None:
        return
    with _clients_lock:
        shared = clients[key]
        shared.users -= 1
        if shared.users == 0:
            del clients[key]
            shared.client.close()


def _client_key(config: Connection) -> str:
    if config.url is not None:
        return f"url:{config.url}|{config.api_key_env or ''}"
    assert config.path is not None
    return "path::memory:" if config.path == ":memory:" else f"path:{Path(config.path).resolve()}"


def _open(config: Connection) -> QdrantClient:
    try:
        from qdrant_client import QdrantClient
    except ImportError:
        raise MissingDependency("qdrant-client", extra="qdrant") from None
    if config.url is None:
        assert config.path is not None
        return _open_local(QdrantClient, config.path)
    client = QdrantClient(url=config.url, api_key=_api_key(config.api_key_env), check_compatibility=False)
    try:
        with translated():
            client.get_collections()
    except ReindexError as exc:
        client.close()
        raise ConfigError(
            f"cannot reach Qdrant at {_redacted(config.url)}: {exc.message}",
            hint="check the url, the server, and api_key_env",
        ) from exc
    return client


def _open_local(factory: type[QdrantClient], path: str) -> QdrantClient:
    """Open local storage; unreadable storage fails loudly and is never treated as empty."""
    if path != ":memory:":
        _refuse_headless_storage(Path(path))
        _refuse_locked_storage(Path(path))
    try:
        return factory(location=":memory:") if path == ":memory:" else factory(path=path)
    except RuntimeError as exc:
        if "already accessed" not in str(exc):
            raise BackendError(f"cannot open Qdrant storage {path}: {exc}") from exc
        raise _locked(path) from exc
    except (ValueError, KeyError, TypeError, OSError, sqlite3.Error) as exc:
        raise BackendError(
            f"Qdrant storage {path} is unreadable ({type(exc).__name__}: {exc})",
            hint="restore the folder from a backup; it is never treated as empty",
        ) from exc


def _refuse_locked_storage(folder: Path) -> None:
    """Probe the lock first: a client refused by it leaks its lock file handle."""
    import portalocker

    lock_path = folder / ".lock"
    if not lock_path.exists():
        return
    with lock_path.open("r+") as handle:
        try:
            portalocker.lock(handle, portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING)
        except portalocker.exceptions.LockException:
            raise _locked(folder) from None
        portalocker.unlock(handle)


def _locked(folder: Path | str) -> ConfigError:
    return ConfigError(
        f"another process holds the Qdrant storage folder {folder}",
        hint="stop it, or use a Qdrant server (url) for concurrent access",
    )


def _refuse_headless_storage(folder: Path) -> None:
    collections = folder / "collection"
    if not (folder / "meta.json").exists() and collections.is_dir() and any(collections.iterdir()):
        raise BackendError(
            f"Qdrant storage {folder} has collections but no meta.json",
            hint="restore meta.json from a backup; it is never treated as empty",
        )


def _api_key(env: str | None) -> str | None:
    if env is None:
        return None
    value = environment(env, "api_key_env")
    if not value:
        raise ConfigError(f"environment variable {env} is not set", hint="export it or change api_key_env")
    _secrets.add(value)
    return value


_secrets: set[str] = set()  # every api key read: masked in every message the translator builds


def _masked(text: str) -> str:
    for secret in _secrets:
        text = text.replace(secret, "[redacted]")
    return text


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    return f"{parts.scheme.lower()}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{path}"


def location(client: QdrantClient) -> str:
    """The server URL the client talks to (host lowercased, port explicit, no credentials or query),
    or the absolute local storage path; `:memory:<id>` for a store that dies with its client."""
    options = client.init_options
    if options.get("path") is not None:
        return str(Path(options["path"]).resolve())
    if options.get("location") == ":memory:":
        return f":memory:{id(client):x}"
    uri = getattr(client._client, "rest_uri", None) or options.get("url") or options.get("location")
    return _redacted(str(uri))


def is_local(client: QdrantClient) -> bool:
    options = client.init_options
    return options.get("path") is not None or options.get("location") == ":memory:"


@contextmanager
def translated() -> Iterator[None]:
    """Turn client errors into the error tree, with every api key masked in the message.

    An original error that carries a key is not chained either: a printed traceback would show it.
    """
    try:
        yield
    except Exception as exc:
        error = _translate(exc)
        if error is None:
            raise
        masked = _scrubbed(error)
        raise masked from (exc if masked is error else None)


def _translate(exc: Exception) -> ReindexError | None:
    """Local mode raises ValueError/RuntimeError, a server UnexpectedResponse and transport errors."""
    from qdrant_client.common.client_exceptions import ResourceExhaustedResponse
    from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

    if isinstance(exc, UnexpectedResponse):
        return _from_status(exc.status_code, _server_message(exc))
    if isinstance(exc, ResourceExhaustedResponse):
        return TransientError(
            f"Qdrant is rate limiting: {exc.message}", hint=f"retry after {exc.retry_after_s}s"
        )
    if isinstance(exc, ResponseHandlingException):
        if isinstance(exc.source, ValueError):
            return BackendError(f"unexpected Qdrant response: {exc.source}")
        return TransientError(f"Qdrant request failed: {type(exc.source).__name__}: {exc.source}")
    if isinstance(exc, ValueError):
        if "not found" in str(exc):
            return ConfigError(f"Qdrant: {exc}", hint="check the collection or alias name")
        return BackendError(f"Qdrant rejected the request: {exc}")
    if isinstance(exc, RuntimeError | sqlite3.Error):
        return BackendError(f"Qdrant local storage failed: {exc}")
    if isinstance(exc, ConnectionError | TimeoutError):
        return TransientError(f"Qdrant connection failed: {exc}")
    return None


def _scrubbed(error: ReindexError) -> ReindexError:
    message, hint = _masked(error.message), None if error.hint is None else _masked(error.hint)
    if (message, hint) == (error.message, error.hint):
        return error
    return type(error)(message, hint=hint)


def _from_status(status: int | None, message: str) -> ReindexError:
    if status in (401, 403):
        return ConfigError(f"Qdrant refused the credentials ({status}): {message}", hint="check api_key_env")
    if status == 404:
        return ConfigError(f"Qdrant: {message}", hint="check the collection or alias name")
    if status is None or status in (408, 429) or status >= 500:
        return TransientError(f"Qdrant server error {status}: {message}")
    return BackendError(f"Qdrant rejected the request ({status}): {message}")


def _server_message(exc: Any) -> str:
    try:
        return str(exc.structured()["status"]["error"])
    except (ValueError, KeyError, TypeError):
        return str(exc.reason_phrase)
