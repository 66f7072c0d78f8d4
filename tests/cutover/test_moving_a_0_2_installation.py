"""A 0.2 installation (a view over a target table; the application's table renamed `docs__adopted`) moves
into `mode = "column"` with one `cutover`: the application's table is the table again, with every row the
application wrote through the view, serving the same vectors, and every statement it ran before 0.2's
cutover behaves as it did then (the multi-tenant application of test_column_mode.py). From there the column
mode migrates, rolls back (to 0.2's vectors) and roll forwards like any table's.
"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from reindex_adapters.postgres import restore
from tests.cutover.support import reindex, reindex_json, sql
from tests.cutover.test_column_mode import COLUMNS, NEW, OLD, behaves, owner_dsn, vector
from tests.durability.support import Tool, assert_crashed

__all__ = ["owner_dsn"]  # the fixture, shared

MID = 12  # the model 0.2 migrated to


def config(tmp_path: Path, dsn: str, name: str, *, dim: int, mode: str, accept: list[str]) -> Path:
    """One config per step; all share the state (the alias history)."""
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{dsn}"\ntable = "docs"\nid_column = "id"\ntext_column = "body"\n'
        f'[embedder]\nkind = "hash"\ndim = {dim}\n'
        f'[target]\nkind = "pgvector"\ndsn = "{dsn}"\nalias = "docs"\nmode = "{mode}"\n'
        f"accept = {json.dumps(accept)}\n"
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 10\n'
    )
    return path


def installed_by_0_2(tmp_path: Path, dsn: str) -> tuple[str, str]:
    """What 0.2 left: `mode = "table"` (every loss accepted, as 0.2 never asked), cut over; its config
    and the target the view serves."""
    path = config(tmp_path, dsn, "table", dim=MID, mode="table", accept=[])
    plan = reindex_json("plan", "-c", str(path), "--no-calibrate", code=2)
    accept = sorted(loss["key"] for loss in plan["losses"])
    path = config(tmp_path, dsn, "table", dim=MID, mode="table", accept=accept)
    assert reindex_json("run", "-c", str(path))["reconciled"]
    moved = reindex_json("cutover", "-c", str(path))
    assert moved["previous"] == "docs__adopted"
    return str(path), str(moved["target"])


def write_through_the_view(dsn: str, tag: str, dim: int = MID) -> None:
    """What the application did under 0.2: an insert, an edit of a text, a delete, through the view."""
    sql(
        dsn,
        f"INSERT INTO docs (body, tenant, url, embedding) VALUES ('{tag} added', 'tenant_a', '{tag}-v',"
        f" '{vector(f'{tag} added', dim)}')",
        f"UPDATE docs SET body = '{tag} edited' WHERE url = 'u5'",
        "DELETE FROM docs WHERE url = 'u7'",
    )


def test_one_cutover_moves_a_0_2_view_back_into_the_application_table(
    owner_dsn: str, pg_dsn: str, tmp_path: Path
) -> None:
    _, served = installed_by_0_2(tmp_path, owner_dsn)
    write_through_the_view(pg_dsn, "v02")
    rows_before = sql(pg_dsn, "SELECT id, body, url, tenant FROM docs ORDER BY id")
    column = str(config(tmp_path, owner_dsn, "column", dim=NEW, mode="column", accept=["extra_column"]))

    code, _, stderr = reindex("run", "-c", column)
    assert code == 2 and "reindex cutover" in stderr  # the view first goes back into the table
    moved = reindex_json("cutover", "-c", column)
    assert (moved["action"], moved["target"], moved["changed"]) == ("restore", served, True)

    assert sql(pg_dsn, "SELECT relkind::text FROM pg_class WHERE relname = 'docs'") == [("r",)]
    assert sql(pg_dsn, "SELECT to_regclass('docs__adopted')") == [(None,)]
    assert sql(pg_dsn, "SELECT id, body, url, tenant FROM docs ORDER BY id") == rows_before
    assert sql(pg_dsn, "SELECT DISTINCT vector_dims(embedding) FROM docs WHERE embedding IS NOT NULL") == [
        (MID,)
    ]
    # a row added through the view gets its generated column from the table again
    assert sql(pg_dsn, "SELECT tsv <> ''::tsvector FROM docs WHERE url = 'v02-v'") == [(True,)]
    assert sql(pg_dsn, "SELECT count(*) FROM pg_class WHERE relname LIKE 'docs_reindex_%'") == [(0,)]
    behaves(pg_dsn, MID, "restored")  # row security, ON CONFLICT, indexes, triggers, grants, views, keys

    mid_column = str(config(tmp_path, owner_dsn, "mid", dim=MID, mode="column", accept=["extra_column"]))
    status = reindex_json("status", "-c", mid_column)
    assert (status["alias_target"], status["is_live"]) == (served, True)
    reindex_json("sync", "-c", mid_column)  # the texts the application edited under 0.2
    assert reindex_json("verify", "-c", mid_column)["complete"]

    # the column mode from here: a new model, cut over, rolled back to 0.2's vectors, rolled forward
    assert reindex_json("run", "-c", column)["reconciled"]
    assert reindex_json("cutover", "-c", column, "--sync")["previous"] == served
    behaves(pg_dsn, NEW, "after")
    back = reindex_json("rollback", "-c", column)
    assert back["target"] == served and back["unserved"] == 4  # what "after" added is named, and kept
    assert sql(pg_dsn, "SELECT vector_dims(embedding) FROM docs WHERE url = 'u1'") == [(MID,)]
    assert reindex_json("cutover", "-c", column, "--sync")["target"] != served
    assert reindex_json("verify", "-c", column)["complete"]
    reindex_json("prune", "-c", column, "--keep", "1")
    names = [
        row[0]
        for row in sql(
            pg_dsn,
            "SELECT attname FROM pg_attribute WHERE attrelid = 'docs'::regclass"
            " AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        )
    ]
    assert names == COLUMNS


def test_writes_through_the_view_while_it_moves_back_are_all_kept(
    owner_dsn: str, pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The application writes between the copy and the last transaction: the trigger's log carries them."""
    installed_by_0_2(tmp_path, owner_dsn)
    built_index = restore._index

    def index_while_the_application_writes(*args: object) -> None:
        write_through_the_view(pg_dsn, "during")
        sql(pg_dsn, "UPDATE docs SET tenant = 'tenant_b' WHERE url = 'u2'")
        built_index(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(restore, "_index", index_while_the_application_writes)
    column = str(config(tmp_path, owner_dsn, "column", dim=NEW, mode="column", accept=["extra_column"]))
    reindex_json("cutover", "-c", column)
    rows = {url: (body, tenant) for url, body, tenant in sql(pg_dsn, "SELECT url, body, tenant FROM docs")}
    assert rows["during-v"] == ("during added", "tenant_a")
    assert rows["u5"][0] == "during edited" and rows["u2"][1] == "tenant_b" and "u7" not in rows
    added = sql(pg_dsn, "SELECT vector_dims(embedding) FROM docs WHERE url = 'during-v'")
    assert added == [(MID,)]  # the vector written through the view came along


def test_a_0_2_installation_that_cannot_move_back_whole_is_refused_and_left_working(
    owner_dsn: str, pg_dsn: str, tmp_path: Path
) -> None:
    installed_by_0_2(tmp_path, owner_dsn)
    sql(pg_dsn, "CREATE VIEW on_the_alias AS SELECT id FROM docs")
    column = str(config(tmp_path, owner_dsn, "column", dim=NEW, mode="column", accept=["extra_column"]))
    code, _, stderr = reindex("cutover", "-c", column)
    assert code == 2 and "on_the_alias" in stderr
    sql(pg_dsn, "DROP VIEW on_the_alias", "ALTER TABLE docs__adopted RENAME TO docs__gone")
    code, _, stderr = reindex("cutover", "-c", column)
    assert code == 2 and "'docs__adopted' is gone" in stderr and 'keep mode = "table"' in stderr
    sql(pg_dsn, "ALTER TABLE docs__gone RENAME TO docs__adopted", "CREATE TABLE docs__older (id bigint)")
    code, _, stderr = reindex("cutover", "-c", column)
    assert code == 2 and "docs__older" in stderr  # it would be left behind: named, not dropped
    assert sql(pg_dsn, "SELECT relkind::text FROM pg_class WHERE relname = 'docs'") == [("v",)]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM docs").fetchone() == (30,)


def test_a_move_back_killed_before_its_last_commit_leaves_0_2_serving_and_finishes_when_run_again(
    owner_dsn: str, pg_dsn: str, tmp_path: Path
) -> None:
    _, served = installed_by_0_2(tmp_path, owner_dsn)
    column = config(tmp_path, owner_dsn, "column", dim=NEW, mode="column", accept=["extra_column"])
    tool = Tool(column, tmp_path / "state.db")
    code, _, err = tool.run("cutover", env={"REINDEX_CRASH_AT": "cutover_before_commit"})
    assert_crashed(code, err)
    assert sql(pg_dsn, "SELECT relkind::text FROM pg_class WHERE relname = 'docs'") == [("v",)]
    write_through_the_view(pg_dsn, "killed")  # the application goes on through the view meanwhile
    rows_before = sql(pg_dsn, "SELECT id, body, url FROM docs ORDER BY id")
    assert reindex_json("cutover", "-c", str(column))["target"] == served
    assert sql(pg_dsn, "SELECT id, body, url FROM docs ORDER BY id") == rows_before
    behaves(pg_dsn, MID, "finished")


def test_a_0_2_view_rolled_back_to_the_application_table_becomes_that_table_again(
    owner_dsn: str, pg_dsn: str, tmp_path: Path
) -> None:
    table, served = installed_by_0_2(tmp_path, owner_dsn)
    reindex_json("rollback", "-c", table)  # the view reads docs__adopted, the application's own vectors
    write_through_the_view(pg_dsn, "rolled", OLD)
    rows_before = sql(pg_dsn, "SELECT id, body, url, tenant FROM docs ORDER BY id")
    column = str(config(tmp_path, owner_dsn, "column", dim=NEW, mode="column", accept=["extra_column"]))
    code, _, stderr = reindex("cutover", "-c", column)
    assert code == 2 and served in stderr  # the 0.2 target would be left behind: named
    sql(pg_dsn, f"DROP TABLE {served}")

    moved = reindex_json("cutover", "-c", column)
    assert (moved["action"], moved["target"]) == ("restore", "docs")
    assert sql(pg_dsn, "SELECT relkind::text FROM pg_class WHERE relname = 'docs'") == [("r",)]
    assert sql(pg_dsn, "SELECT id, body, url, tenant FROM docs ORDER BY id") == rows_before
    assert sql(pg_dsn, "SELECT count(*) FROM pg_class WHERE relname LIKE 'docs_reindex_%'") == [(0,)]
    behaves(pg_dsn, OLD, "back")
    assert reindex_json("run", "-c", column)["reconciled"]  # the column mode from here
    assert reindex_json("cutover", "-c", column)["previous"] == "docs__adopted"
