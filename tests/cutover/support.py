"""What the cutover tests share: the application's own SQL, and the CLI as a deploy pipeline runs it."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from typer.testing import CliRunner

from reindex.ui.cli import app

runner = CliRunner()


def sql(dsn: str, *statements: str, role: str | None = None) -> list[tuple[Any, ...]]:
    """Run statements as the application would (optionally as one of its roles); the last one's rows."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if role is not None:
            conn.execute(f"SET ROLE {role}")
        rows: list[tuple[Any, ...]] = []
        for statement in statements:
            cursor = conn.execute(statement)
            rows = cursor.fetchall() if cursor.description else []
        return rows


def reindex(*args: str) -> tuple[int, str, str]:
    """One CLI call: its exit code, stdout and stderr."""
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def reindex_json(*args: str, code: int = 0) -> Any:
    exited, stdout, stderr = reindex(*args, "--json")
    assert exited == code, stdout + stderr
    return json.loads(stdout)
