"""`mode = "table"` over the application's own table (0.2's way: the source reads the alias, the first
cutover adopts the table, a view over a target table serves): a rollback keeps what the application wrote
through the alias while the newer target was live, names what the older model never embedded, and the
roll-forward serves it all again, with what the application wrote while rolled back. The application's own
statements, through the alias, at each step."""

from __future__ import annotations

from pathlib import Path

from tests.cutover.support import reindex_json, sql


def config(tmp_path: Path, dsn: str, dim: int) -> str:
    path = tmp_path / f"dim{dim}.toml"
    path.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{dsn}"\ntable = "live"\nid_column = "id"\n'
        'text_column = "body"\n'
        f'[embedder]\nkind = "hash"\ndim = {dim}\n'
        f'[target]\nkind = "pgvector"\ndsn = "{dsn}"\nalias = "live"\nmode = "table"\n'
        'accept = ["table_statements", "column_order"]\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 10\nmax_dead_letters = 1\n'
    )
    return str(path)


def served(dsn: str) -> dict[int, tuple[str, str, int | None]]:
    rows = sql(dsn, "SELECT id, body, tag, vector_dims(embedding) FROM live")
    return {i: (body, tag, dims) for i, body, tag, dims in rows}


def test_rollback_keeps_the_writes_made_while_the_newer_target_was_live(pg_dsn: str, tmp_path: Path) -> None:
    sql(
        pg_dsn,
        "CREATE TABLE live (id bigint PRIMARY KEY, body text NOT NULL, tag text)",
        "INSERT INTO live SELECT i, 'article ' || i, 't' || i FROM generate_series(1, 30) AS i",
        "INSERT INTO live VALUES (31, '', 'blank')",  # a dead letter: no target holds it
    )
    old, new = config(tmp_path, pg_dsn, 8), config(tmp_path, pg_dsn, 16)
    for path in (old, new):
        assert reindex_json("run", "-c", path)["reconciled"]
        reindex_json("cutover", "-c", path)
    sql(  # the application, through the alias, while the newer target is live
        pg_dsn,
        "INSERT INTO live (id, body, tag) VALUES (1000, 'added while new', 'x')",
        "INSERT INTO live (id, body, tag, embedding) VALUES (1001, 'added with a vector', 'x',"
        " array_fill(0.25, ARRAY[16])::vector)",
        "UPDATE live SET body = 'edited while new' WHERE id = 5",
        "UPDATE live SET tag = 'retagged' WHERE id = 6",
        "DELETE FROM live WHERE id = 7",
    )
    before = served(pg_dsn)

    back = reindex_json("rollback", "-c", new)
    assert (back["unserved"], back["unserved_ids"]) == (2, ["1001", "5"])  # had a vector, have none
    after = served(pg_dsn)
    assert {i: row[:2] for i, row in after.items()} == {i: row[:2] for i, row in before.items()}
    assert after[1001][2] is None and after[5][2] is None  # never embedded by the older model
    assert after[6] == ("article 6", "retagged", 8) and 7 not in after  # its vector kept; the delete kept
    assert 31 not in before and 31 not in after  # a dead letter of both runs, served by neither
    sql(pg_dsn, "INSERT INTO live (id, body, tag) VALUES (2000, 'added while old', 'y')")

    reindex_json("cutover", "-c", new, "--sync")
    forward = served(pg_dsn)
    assert set(forward) == set(after) | {2000}
    assert forward[5][0] == "edited while new" and forward[6][1] == "retagged"
    assert {dims for _, _, dims in forward.values()} == {16}
    assert reindex_json("verify", "-c", new)["complete"]


def test_rollback_to_the_adopted_table_keeps_its_dead_letters_and_the_writes_made_meanwhile(
    pg_dsn: str, tmp_path: Path
) -> None:
    sql(
        pg_dsn,
        "CREATE TABLE live (id bigint PRIMARY KEY, body text NOT NULL, tag text, embedding vector(8))",
        "INSERT INTO live SELECT i, 'article ' || i, 't' || i FROM generate_series(1, 10) AS i",
        "INSERT INTO live VALUES (11, '', 'blank')",  # a dead letter: the target never holds it
    )
    path = config(tmp_path, pg_dsn, 8)
    reindex_json("run", "-c", path)
    assert reindex_json("cutover", "-c", path)["previous"] == "live__adopted"
    assert 11 not in served(pg_dsn)
    sql(pg_dsn, "UPDATE live SET tag = 'retagged' WHERE id = 3", "DELETE FROM live WHERE id = 4")

    assert reindex_json("rollback", "-c", path)["target"] == "live__adopted"
    back = served(pg_dsn)
    assert back[11] == ("", "blank", None) and back[3][1] == "retagged" and 4 not in back
