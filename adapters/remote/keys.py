"""API keys: read only from the environment variable a config names, and kept out of every message."""

from __future__ import annotations

import re

from reindex.errors import ConfigError, environment

SECRET_PATTERN = re.compile(r"\bsk-[A-Za-z0-9_\-*]{4,}")


def api_key(key_env: str) -> str:
    """The API key from the environment variable the config names; never from the file."""
    key = environment(key_env, "api_key_env")
    if not key:
        hint = f"export {key_env}=<API key> (any non-empty value for a local server without keys)"
        raise ConfigError(f"the environment variable {key_env} is not set", hint=hint)
    return key


def redact(message: str, secret: str) -> str:
    """Remove the API key, and anything shaped like one, from a provider's message."""
    cleaned = message.replace(secret, "***") if secret else message
    return SECRET_PATTERN.sub("sk-***", cleaned)
