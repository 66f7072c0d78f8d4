"""The error tree. Every failure the CLI reports is one of these; `exit_code` is what pipelines see.

ReindexError                      1  failed (bug or unrecoverable backend error)
├── ConfigError                   2  bad config, unknown kind, invalid name, unreachable backend
│   └── MissingDependency         2  an optional extra is not installed
├── VerificationFailed            3  coverage incomplete or vectors invalid (cutover refused)
├── CutoverRefused                4  alias not where expected, lock not obtained, nothing to roll back
├── AlreadyRunning                1  another run of the same migration holds its lease
├── Interrupted                  75  SIGTERM/SIGINT or retry budget spent: rerun to continue
│   └── TransientError           75  a backend fault worth retrying (connection drop, timeout, 429)
└── BackendError                  1  a backend failed in a way retrying will not fix
"""

from __future__ import annotations


class ReindexError(Exception):
    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


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


class AlreadyRunning(ReindexError):
    exit_code = 1


class Interrupted(ReindexError):
    exit_code = 75


class TransientError(Interrupted):
    """A fault that may pass: retried in one place (reindex.retry), then surfaced as resumable."""


class BackendError(ReindexError):
    exit_code = 1
