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
