"""The error tree. Every failure the CLI reports is one of these; `exit_code` is what pipelines see.

ReindexError                      1  failed (bug or unrecoverable backend error)
├── ConfigError                   2  bad config, unknown kind, invalid name, unreachable backend
│   └── MissingDependency         2  an optional extra is not installed
├── VerificationFailed            3  coverage incomplete or vectors invalid (cutover refused)
├── CutoverRefused                4  alias not where expected, lock not obtained, nothing to roll back
├── NoRouteFits                   4  `plan`: no route meets [run] deadline and max_cost_usd
├── AlreadyRunning                1  another run of the same migration holds its lease
├── Interrupted                  75  SIGTERM/SIGINT or retry budget spent: rerun to continue
│   ├── TransientError           75  a backend fault worth retrying (connection drop, timeout, 429)
│   ├── BudgetRefused            75  max_cost_usd refused tokens a shard needs after it started: it stops unrecorded
│   └── LeaseLost                75  another run took the migration's lease: this one stops, writes nothing more
└── BackendError                  1  a backend failed in a way retrying will not fix
    └── RowsRejected              1  the backend refused some rows for their content: isolated, dead-lettered
"""

from __future__ import annotations

import os
import re
from typing import TypeVar

from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)


class ReindexError(Exception):
    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message

    def __reduce__(self) -> tuple[object, ...]:
        """Pickle with the hint and every attribute (a Ray worker's error reaches the driver whole)."""
        return (_rebuilt, (type(self), dict(self.__dict__)))


def _rebuilt(cls: type[ReindexError], state: dict[str, object]) -> ReindexError:
    error = cls.__new__(cls)
    Exception.__init__(error, state.get("message", ""))
    error.__dict__.update(state)
    return error


class ConfigError(ReindexError):
    exit_code = 2


class MissingDependency(ConfigError):
    def __init__(self, package: str, *, extra: str) -> None:
        super().__init__(
            f"{package} is not installed",
            hint=f"pip install 'reindex-embeddings[{extra}]'",
        )
        self.extra = extra


class VerificationFailed(ReindexError):
    exit_code = 3


class CutoverRefused(ReindexError):
    exit_code = 4


class NoRouteFits(ReindexError):
    """`plan` refuses: no route gives the configured vectors within the deadline and the budget."""

    exit_code = 4


class AlreadyRunning(ReindexError):
    exit_code = 1


class Interrupted(ReindexError):
    exit_code = 75


class BudgetRefused(Interrupted):
    """`[run] max_cost_usd` refused the tokens of copies a shard must embed itself (their owner no longer
    stores their text) after it had sent its own: the shard stops unrecorded, and a rerun does it."""


class TransientError(Interrupted):
    """A fault that may pass: retried in one place (reindex.retry), then surfaced as resumable."""


class LeaseLost(Interrupted):
    """The lease this run held was lost (its connection dropped, another run fenced it off).

    Raised by a fenced ledger write or by the lease watchdog; the rerun resumes from the ledger.
    """


class BackendError(ReindexError):
    exit_code = 1


class RowsRejected(BackendError):
    """A sink refused a batch for the content of its rows (e.g. Postgres SQLSTATE class 22: a NUL byte
    in a text). Never retried as is: the pipeline bisects the batch and dead-letters each row that is
    refused alone, with `reason` (``sink_rejected:<code>``)."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


# The checks every config section and adapter shares: adapters import them from here, never the kernel.


def validate(section_name: str, model: type[Model], section: dict[str, object]) -> Model:
    """`section` as `model`; a ConfigError naming the offending key otherwise."""
    try:
        return model.model_validate(section)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(f"[{section_name}]", exc)) from None


def describe_validation_error(where: str, exc: ValidationError) -> str:
    """One line naming the offending key, e.g. `[target] unknown key 'aliass'`."""
    first = exc.errors()[0]
    key = ".".join(str(part) for part in first["loc"]) or "(section)"
    if first["type"] == "extra_forbidden":
        return f"{where} unknown key {key!r}"
    if first["type"] == "missing":
        return f"{where} missing required key {key!r}"
    return f"{where} {key}: {first['msg'].removeprefix('Value error, ')}"  # a validator's own message


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def environment(name: str, option: str) -> str | None:
    """The value of the environment variable `name`, which the config's `option` names (`dsn_env`,
    `api_key_env`, `state_env`). Anything but a variable's name, most often the DSN or key itself pasted
    where its variable's name belongs, is refused without being repeated: it may hold a password."""
    if not ENV_NAME.fullmatch(name):
        raise ConfigError(
            f"{option} takes the name of an environment variable, and what it was given is not one (not"
            " repeated here: it may hold a password)",
            hint=f'export the value as a variable, e.g. APP_DSN, and set {option} = "APP_DSN"',
        )
    return os.environ.get(name)
