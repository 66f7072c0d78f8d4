"""Two roles in one database, as real teams have them (issue 43): a migrator that does not own the
application's table, after another role already migrated there. What it lacks is named by `plan`, before
anything is embedded; what the tool shares across migrations (the trigger function of a schema) never
breaks the second role."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from typer.testing import CliRunner

from reindex.ui.cli import app

runner = CliRunner()
_suffix = itertools.count()


def cli(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def run_sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


@pytest.fixture
def roles(pg_dsn: str) -> Iterator[tuple[str, str, str, str]]:
    """(owner, migrator, owner's DSN, migrator's DSN): roles are the cluster's, so named uniquely."""
    n = f"{os.getpid()}_{next(_suffix)}"
    owner, migrator = f"app_{n}", f"mig_{n}"
    rows = ", ".join(f"({i}, 'note {i} about topic {i % 7}')" for i in range(1, 61))
    run_sql(
        pg_dsn,
        f"CREATE ROLE {owner} LOGIN",
        f"CREATE ROLE {migrator} LOGIN",
        f"GRANT CREATE ON SCHEMA public TO {owner}, {migrator}",
        f"SET ROLE {owner}",
        "CREATE TABLE first_notes (id bigint PRIMARY KEY, body text NOT NULL)",
        f"INSERT INTO first_notes VALUES {rows}",
        "CREATE TABLE notes (id bigint PRIMARY KEY, body text NOT NULL)",
        f"INSERT INTO notes VALUES {rows}",
        "RESET ROLE",
        f"GRANT SELECT ON notes TO {migrator}",
    )
    as_role = lambda role: pg_dsn.replace("postgresql://postgres:", f"postgresql://{role}:", 1)  # noqa: E731
    yield owner, migrator, as_role(owner), as_role(migrator)
    run_sql(
        pg_dsn, f"DROP OWNED BY {owner}, {migrator} CASCADE", f"DROP ROLE {owner}", f"DROP ROLE {migrator}"
    )


def config(path: Path, dsn: str, table: str, alias: str, mode: str) -> str:
    path.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{dsn}"\ntable = "{table}"\nid_column = "id"\ntext_column = "body"\n'
        '[embedder]\nkind = "hash"\ndim = 8\n'
        f'[target]\nkind = "pgvector"\ndsn = "{dsn}"\nalias = "{alias}"\nmode = "{mode}"\n'
        f'[run]\nstate = "{path.with_suffix(".db")}"\nshard_size = 16\n'
    )
    return str(path)


def test_a_second_role_migrates_where_another_role_already_did(
    roles: tuple[str, str, str, str], tmp_path: Path
) -> None:
    _, _, owner_dsn, migrator_dsn = roles
    first = config(tmp_path / "first.toml", owner_dsn, "first_notes", "first_search", "table")
    for verb in ("run", "cutover"):
        assert cli(verb, "-c", first)[0] == 0
    second = config(tmp_path / "second.toml", migrator_dsn, "notes", "notes_search", "table")
    code, out, err = cli("run", "-c", second)
    assert code == 0, err  # it failed at finalize: "must be owner of function reindex_fill_content_hash"
    assert cli("verify", "-c", second)[0] == 0
    assert cli("cutover", "-c", second)[0] == 0
    # the application writes through both aliases, and each row gets its bookkeeping from the shared trigger
    run_sql(owner_dsn, "INSERT INTO first_search (id, body) VALUES (1000, 'a note written after the flip')")
    code, out, _ = cli("verify", "-c", first, "--json")
    assert code == 3 and json.loads(out)["missing"] == 0  # the new row is stale: the model never embedded it


def test_plan_names_the_privileges_a_column_migration_lacks_before_anything_is_embedded(
    roles: tuple[str, str, str, str], tmp_path: Path
) -> None:
    owner, migrator, _, migrator_dsn = roles
    path = config(tmp_path / "mine.toml", migrator_dsn, "notes", "notes", "column")
    code, out, err = cli("plan", "-c", path)
    assert code == 2, (out, err)
    assert "The tool's role lacks" in out and "OWNER TO" in out
    code, out, err = cli("plan", "-c", path, "--json")
    assert code == 2, out
    fixes = [p["fix"] for p in json.loads(out)["privileges"]]  # quoted as Postgres reads them: paste as is
    assert fixes == [
        f'ALTER TABLE "public"."notes" OWNER TO "{migrator}"; or GRANT "{owner}" TO "{migrator}"'
    ]
    code, _, err = cli("run", "-c", path)
    assert code == 2 and "privileges" in err  # refused before the first document is embedded
