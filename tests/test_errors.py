"""Errors cross process boundaries (a Ray worker's failure is raised on the driver) whole: type, message,
hint, exit code and extra attributes."""

from __future__ import annotations

import pickle

import pytest

from reindex.errors import BackendError, LeaseLost, MissingDependency, ReindexError, RowsRejected


@pytest.mark.parametrize(
    "error",
    [
        BackendError("the source changed", hint="run --fresh"),
        MissingDependency("ray", extra="ray"),
        RowsRejected("refused", reason="sink_rejected:22021"),
        LeaseLost("lease lost", hint="rerun"),
    ],
)
def test_an_error_survives_pickling_with_its_hint_and_attributes(error: ReindexError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert (str(copy), copy.hint, copy.exit_code) == (str(error), error.hint, error.exit_code)
    assert copy.__dict__ == error.__dict__
