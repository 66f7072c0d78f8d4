"""What a slow-to-load embedder is, remembered from its last load: a verb that only needs the model's
identity (`verify`, `cutover`: the target's name, the plan id, the fingerprint to check) does not load it.

Issue 43 measured 7 s to load a local model for a 0.25 s check. An adapter that can name everything its
`info` depends on without loading (`ports.KnowsIdentity`: the config, the model's files by name, size and
modification time, the library versions) gets its `info` written here after each load, under that key. A
verb that asks for a lazy embedder then gets `Unloaded`: the remembered `info`, and the real embedder
built on the first use of anything else, whose `info` must then equal the remembered one (else the verb
stops: its target and plan id were named from it).

The cache is a folder of small JSON files: `$REINDEX_CACHE_DIR`, else `$XDG_CACHE_HOME/reindex/identities`,
else `~/.cache/reindex/identities`. A folder that cannot be written only costs the next verb a load.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reindex import registry
from reindex.errors import ConfigError, validate
from reindex.ports import EmbedderInfo, KnowsIdentity, Section

CACHE_ENV = "REINDEX_CACHE_DIR"


def build_embedder(section: Mapping[str, Any] | Section, *, lazy: bool = False) -> Any:
    """The embedder an `[embedder]` section names (a config's, validated already, or a table); with `lazy`,
    `Unloaded` where its identity is remembered."""
    kind = section.kind if isinstance(section, Section) else str(section.get("kind", ""))
    adapter = registry.resolve("embedder", kind)
    config = (
        section
        if isinstance(section, adapter.Config)
        else validate("embedder", adapter.Config, dict(section))
    )
    key = adapter.identity_key(config) if isinstance(adapter, KnowsIdentity) else None
    if lazy and key is not None and (info := recall(key)) is not None:
        return Unloaded(adapter, config, info, key)
    embedder = adapter.from_config(config)
    if key is not None:
        remember(key, embedder.info)
    return embedder


class Unloaded:
    """An embedder not loaded yet: its remembered `info`, and on the first use of anything else the real
    one. Its class says what it has: a method is there and loads it when called, a class constant is read
    from the class, an annotated instance attribute loads it, and any other name is absent, so a protocol
    check (`isinstance(e, DeferredEmbedder)`) loads nothing."""

    def __init__(self, adapter: Any, config: Any, info: EmbedderInfo, key: str) -> None:
        self.info = info
        self._adapter, self._config, self._key = adapter, config, key
        self._loaded: Any = None

    def loaded(self) -> Any:
        if self._loaded is None:
            embedder = self._adapter.from_config(self._config)
            if embedder.info.describe() != self.info.describe():
                forget(self._key)
                raise ConfigError(
                    f"model {self.info.model!r} is not what it was when last loaded (fingerprint"
                    f" {embedder.info.fingerprint}, remembered {self.info.fingerprint})",
                    hint="run the command again: it now names the target from the model as it is",
                )
            self._loaded = embedder
        return self._loaded

    def __getattr__(self, name: str) -> Any:
        declared = getattr(self._adapter, name, _ABSENT)
        if declared is _ABSENT:
            if not any(name in getattr(c, "__annotations__", {}) for c in self._adapter.__mro__):
                raise AttributeError(name)
            return getattr(self.loaded(), name)  # an instance attribute: only a loaded one has it
        if not callable(declared):
            return declared  # a class constant
        return _Deferred(self, name)  # a method: the model is loaded when it is called


_ABSENT = object()


class _Deferred:
    """A method of an embedder not loaded yet: calling it loads the embedder, then calls its method."""

    def __init__(self, owner: Unloaded, name: str) -> None:
        self._owner, self._name = owner, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._owner.loaded(), self._name)(*args, **kwargs)


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "reindex" / "identities"


def recall(key: str) -> EmbedderInfo | None:
    try:
        raw = json.loads((cache_dir() / f"{key}.json").read_text())
        return EmbedderInfo(**raw)
    except (OSError, ValueError, TypeError):
        return None


def remember(key: str, info: EmbedderInfo) -> None:
    """Written whole or not at all (a rename); a folder that cannot be written is left alone."""
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as stream:
            json.dump(info.describe(), stream)
        Path(stream.name).replace(folder / f"{key}.json")
    except OSError:
        return


def forget(key: str) -> None:
    (cache_dir() / f"{key}.json").unlink(missing_ok=True)
