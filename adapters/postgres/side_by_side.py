"""The pgvector sink in `mode = "column"`: new vectors side by side in the application's own table.

Where the source and the target are one Postgres table, the table stays the table: `prepare` adds the column
`<vector>__<suffix>` (nullable, no default: a catalog change), `write` fills it through a COPY stage and one
guarded `UPDATE ... FROM` per batch, `finalize` builds its HNSW index `CONCURRENTLY` (writers go on), and the
flip renames two columns in one short transaction under `lock_timeout`. Row security, constraints, indexes,
triggers, grants, generated columns, foreign keys, views over the table, partitions, COPY and ALTER TABLE
stay what they were, because nothing replaces the table (fidelity.py names what the column mode may not
keep). `rollback` renames them back; what the application wrote meanwhile is in the table, never elsewhere.

The alias half (what the table serves, the flip, rollback's unserved, targets, drop, the 0.2 move-back) is
column_alias.py, mixed in.

The content hash of the text each vector was embedded from lives in a table of the target's name beside the
application's (column_targets.py), so the application's table gains one column, and only while a migration
is in flight. A vector is written only where the row's text still hashes to what was embedded: a text the
application changes meanwhile keeps no vector of its old text, and verify finds the hash stale until sync.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from reindex.errors import ConfigError
from reindex.ports import IndexEntry, Loss, Rows, TargetInfo, TargetSpec, Vectors
from reindex_adapters.postgres import column_index, column_write, fidelity
from reindex_adapters.postgres import column_targets as columns
from reindex_adapters.postgres.column_alias import ColumnAlias
from reindex_adapters.postgres.connection import first_value, identifier
from reindex_adapters.postgres.ddl import target_meta
from reindex_adapters.postgres.reads import cursor_names
from reindex_adapters.postgres.sink import MODES, retry_locked
from reindex_adapters.postgres.storage import Storage, check_server, choose
from reindex_adapters.postgres.write import rejections

if TYPE_CHECKING:
    from psycopg import sql

    from reindex_adapters.postgres.connection import Connection


_COUNT_SQL = "SELECT count(*) FROM {} WHERE {} IS NOT NULL"


class PgvectorColumnSink(ColumnAlias):
    """Targets are columns of the alias's own table; the served one is named like the vector column."""

    serves_in_place = True  # the source table is the alias: it holds every write before and after a flip

    # identity ------------------------------------------------------------------------------------------

    def losses(self, spec: TargetSpec) -> list[Loss]:
        """What the table has that the column mode would not keep (fidelity.py, mode column)."""
        identifier(spec.alias)
        with self._db.errors():
            conn = self._db.connection()
            oid = self._table_oid(conn, spec.alias)
            vector = self._served_column(conn, oid, spec.source.vector_field)
            return fidelity.losses(conn, oid, spec.source.id_field, vector, self.accept, column=True)

    def layout(self, spec: TargetSpec) -> dict[str, Any]:
        """What `plan` states of the mode: where the new vectors go and how the flip moves them."""
        vector = spec.source.vector_field or "embedding"
        column = columns.unserved_name(vector, spec.alias, spec.name)
        book = columns.bookkeeping_table(spec.alias, spec.name)
        line = (
            f"mode column: the new vectors go in {spec.alias}.{column} beside {vector}, their text hashes in"
            f" {book}; the flip renames the two columns"
        )
        summary = [line]
        kept = self._old_vectors_bytes(spec.alias, vector)
        if kept:
            summary.append(
                f"the vectors served now ({vector}, about {_mib(kept)} MiB with its indexes) stay in the table for"
                " rollback until `reindex prune`: the storage above comes on top of them"
            )
        return {
            "mode": "column",
            "table": spec.alias,
            "column": column,
            "hashes": book,
            "old_vector_bytes": kept,
            "summary": summary,
        }

    def _old_vectors_bytes(self, alias: str, vector: str) -> int:
        """The served vector column's bytes, estimated without a scan (one value's size times the planner's
        row count, or a count where the table was never analyzed), and its indexes' size."""
        from psycopg import sql

        with self._db.errors():
            conn = self._db.connection()
            oid = conn.execute(
                "SELECT to_regclass(%s)::oid::int8", [identifier(alias).as_string(conn)]
            ).fetchone()
            if oid is None or oid[0] is None:
                return 0
            has = conn.execute(
                "SELECT 1 FROM pg_attribute WHERE attrelid = %s AND attname = %s AND NOT attisdropped",
                [oid[0], vector],
            ).fetchone()
            if has is None:
                return 0
            one = conn.execute(
                sql.SQL("SELECT pg_column_size({0}) FROM {1} WHERE {0} IS NOT NULL LIMIT 1").format(
                    sql.Identifier(vector), identifier(alias)
                )
            ).fetchone()
            rows = conn.execute("SELECT reltuples::int8 FROM pg_class WHERE oid = %s", [oid[0]]).fetchone()
            estimate = int((rows or [0])[0])
            if estimate <= 0:
                counted = conn.execute(
                    sql.SQL("SELECT count(*) FROM {}").format(identifier(alias))
                ).fetchone()
                estimate = int((counted or [0])[0])
            values = [int(one[0]) * estimate if one and one[0] else 0]
            indexes = conn.execute(
                "SELECT coalesce(sum(pg_relation_size(i.indexrelid)), 0)::int8 FROM pg_index i"
                " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
                " WHERE i.indrelid = %s AND a.attname = %s",
                [oid[0], vector],
            ).fetchone()
            return int((values or [0])[0]) + int((indexes or [0])[0])

    def scratch(self, spec: TargetSpec, token: str) -> TargetSpec | None:
        """None: a target here is a column of the application's own table, never written to rehearse."""
        return None

    def scratches(self) -> list[str]:
        return []

    def prepare(self, spec: TargetSpec) -> None:
        """Add the target's column and its bookkeeping table (idempotent); refuse first what the table has
        that the column mode would not keep, unless accepted."""
        identifier(spec.name)
        self._layouts.pop(spec.name, None)
        storage = choose(self.storage, self.full_vector, spec.dim, index=self.build_index)
        if storage.kind == "bit":
            raise ConfigError(
                'mode = "column" stores vector or halfvec, not bit',
                hint='set [target] storage or mode = "table"',
            )
        self.refuse_missing_privileges(spec)
        fidelity.refuse_unaccepted(self.losses(spec), spec.alias, column=True)
        retry_locked(self, lambda: self._add_column(spec, storage), spec.alias)

    def _add_column(self, spec: TargetSpec, storage: Storage) -> None:
        """One short transaction: the hash table and the column (ADD COLUMN waits at most lock_timeout)."""
        from psycopg import sql

        vector = spec.source.vector_field or "embedding"
        name = columns.unserved_name(vector, spec.alias, spec.name)
        book = columns.bookkeeping_table(spec.alias, spec.name)
        with self._db.transaction() as conn:
            oid = self._table_oid(conn, spec.alias)
            found = columns.find(conn, spec.alias, spec.name)
            if found is not None:
                self._check_same(conn, spec, book)
                return
            check_server(conn, storage)
            key = self._key_type(conn, oid, spec.source.id_field)
            self._key_type(conn, oid, spec.source.text_field)  # the source is this table: its text is here
            conn.execute("SELECT set_config('lock_timeout', %s, true)", [f"{self.lock_timeout_ms}ms"])
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (id {} PRIMARY KEY, content_hash text NOT NULL,"
                    " vector_digest text NOT NULL)"
                ).format(identifier(book), sql.SQL(key))
            )
            meta = target_meta(spec, storage, vector) | {"mode": "column"}
            conn.execute(
                sql.SQL("COMMENT ON TABLE {} IS {}").format(identifier(book), sql.Literal(json.dumps(meta)))
            )
            table = identifier(spec.alias)
            conn.execute(
                sql.SQL("ALTER TABLE {} ADD COLUMN {}").format(table, storage.column_sql(name, spec.dim))
            )
            columns.mark(conn, table, name, spec.name, False, {})

    def _check_same(self, conn: Connection, spec: TargetSpec, book: str) -> None:
        meta = self._book_meta(conn, book)
        found = (meta.get("fingerprint"), meta.get("dim"))
        if found != (spec.fingerprint, spec.dim):
            raise ConfigError(
                f"target {spec.name!r} exists with fingerprint {found[0]} and dim {found[1]}",
                hint="choose another [target] name",
            )

    # writing -------------------------------------------------------------------------------------------

    def write(self, target: str, rows: Rows) -> None:
        """COPY (id, content hash, vector) into a stage, then one UPDATE of the rows whose text still hashes
        to what was embedded, and their hashes upserted beside; rows gone or changed meanwhile are left."""
        from psycopg import sql

        if not rows.records:
            return
        layout = self._layout(target)
        assert layout.vector is not None
        text = sql.Identifier(str(layout.meta["text_field"]))
        statement = sql.SQL(
            "WITH moved AS (UPDATE {t} AS d SET {v} = s.v::{type} FROM reindex_column_stage AS s"
            " WHERE d.{k} = s.id::{cast} AND {hash} = s.h RETURNING d.{k} AS id, s.h AS h, {digest} AS g)"
            " INSERT INTO {book} (id, content_hash, vector_digest) SELECT id, h, g FROM moved"
            " ON CONFLICT (id) DO UPDATE SET content_hash = excluded.content_hash,"
            " vector_digest = excluded.vector_digest"
        ).format(
            digest=column_write.digest(layout, sql.SQL("d.{}").format(layout.vector.ident)),
            t=layout.ident,
            v=layout.vector.ident,
            type=sql.SQL(layout.vector.type),
            k=layout.key.ident,
            cast=layout.key.cast,
            hash=columns.content_hash_sql(sql.SQL("d.{}").format(text)),
            book=identifier(self._built(layout, target)),
        )
        payload = column_write.stage_payload(
            [r.id for r in rows.records], list(rows.content_hashes), layout.storage, rows.vectors
        )
        with self._db.transaction() as conn, rejections(target):
            conn.execute(
                sql.SQL(
                    "CREATE TEMP TABLE reindex_column_stage (id text, h text, v {}) ON COMMIT DROP"
                ).format(sql.SQL(layout.storage.column))
            )
            with conn.cursor().copy("COPY reindex_column_stage FROM STDIN (FORMAT BINARY)") as copy:
                copy.write(payload)
            conn.execute(statement)

    def delete(self, target: str, ids: Sequence[str]) -> None:
        """Clear the target's vector of these documents (never their rows: they are the application's)."""
        from psycopg import sql

        layout = self._layout(target)
        assert layout.vector is not None
        with self._db.transaction() as conn:
            conn.execute(
                sql.SQL("UPDATE {} SET {} = NULL WHERE {} = ANY(%s::{}[]) AND {} IS NOT NULL").format(
                    layout.ident, layout.vector.ident, layout.key.ident, layout.key.cast, layout.vector.ident
                ),
                [list(ids)],
            )
            conn.execute(
                sql.SQL("DELETE FROM {} WHERE id = ANY(%s::{}[])").format(
                    identifier(self._built(layout, target)), layout.key.cast
                ),
                [list(ids)],
            )

    def finalize(self, spec: TargetSpec) -> None:
        """Build the column's HNSW index CONCURRENTLY (the application writes on), then VACUUM ANALYZE the
        table: the fill left a dead version of every row it wrote, and an autovacuum that starts on them
        later would make the flip's lock wait for it to yield (a second, measured, with writers queued)."""
        from psycopg import sql

        layout = self._layout(spec.name)
        self.index_seconds = None
        if self.build_index and layout.vector is not None:
            method = self.hnsw_method(layout, spec.dim, spec.source.distance)
            index = f"{columns.split_last(spec.name)[:57]}_hnsw"
            with self._db.errors():
                conn = self._db.connection()
                self.index_seconds = column_index.build_concurrently(
                    conn, layout, index, method, self.maintenance_work_mem
                )
        with self._db.errors():
            self._db.connection().execute(sql.SQL("VACUUM (ANALYZE) {}").format(layout.ident))

    # reading -------------------------------------------------------------------------------------------

    def describe(self, target: str) -> TargetInfo | None:
        from psycopg import sql

        identifier(target)
        with self._db.errors():
            conn = self._db.connection()
            layout = self._find_layout(conn, target)
            if layout is None:
                return None
            assert layout.vector is not None
            count = first_value(
                conn.execute(sql.SQL(_COUNT_SQL).format(layout.ident, layout.vector.ident)).fetchone()
            )
        meta = layout.meta
        return TargetInfo(
            target,
            int(count),
            layout.vector.typmod if layout.vector.typmod > 0 else None,
            meta.get("fingerprint"),
            meta.get("model"),
            plan_id=meta.get("plan_id") or None,
            nonce=meta.get("nonce") or None,
        )

    def scan_index(self, target: str, dim: int) -> Iterator[IndexEntry]:
        """Every stored vector with the hash of the text it was embedded from; a vector with none there
        (the application wrote it through the alias) gets its text's hash, marked derived, for `adopt`."""
        from psycopg import sql

        layout = self._layout(target)
        assert layout.vector is not None
        storage, vector = layout.storage, layout.vector.ident
        book = self._book(layout, target)
        text = sql.SQL("d.{}").format(sql.Identifier(str(layout.meta.get("text_field") or "text")))
        if book is None:  # the application's own vectors (`<alias>__adopted`): no bookkeeping
            digest: sql.Composable = sql.SQL("NULL::text, false")
            join: sql.Composable = sql.SQL("")
        else:  # a vector whose digest is not the one the tool stored: the application wrote it
            written = column_write.digest(layout, sql.SQL("d.{}").format(vector))
            digest = sql.SQL(
                "CASE WHEN b.vector_digest = {g} THEN b.content_hash ELSE {h} END,"
                " b.vector_digest IS DISTINCT FROM {g}"
            ).format(g=written, h=columns.content_hash_sql(text))
            join = sql.SQL(" LEFT JOIN {} AS b ON b.id = d.{}").format(identifier(book), layout.key.ident)
        query = sql.SQL(
            "SELECT d.{k}::text, {digest}, CASE WHEN {dims} <> %s THEN 'dimension' WHEN {zero} THEN 'zero' END"
            " FROM {t} AS d{join} WHERE d.{v} IS NOT NULL"
        ).format(
            k=layout.key.ident,
            digest=digest,
            dims=storage.dims_sql(sql.SQL("d.{}").format(vector)),
            zero=storage.zero_sql(sql.SQL("d.{}").format(vector)),
            t=layout.ident,
            join=join,
            v=vector,
        )
        fingerprint = layout.meta.get("fingerprint")
        with (
            self._db.transaction() as conn,
            conn.cursor(name=f"reindex_scan_{next(cursor_names)}") as cursor,
        ):
            cursor.itersize = 5000
            cursor.execute(query, [dim])
            for key, digest_value, derived, problem in cursor:
                application = bool(derived) if book is not None else None
                yield IndexEntry(key, digest_value, fingerprint, problem, application, derived=bool(derived))

    def fetch_matching(self, target: str, expected: Mapping[str, str]) -> dict[str, Vectors]:
        from psycopg import sql

        layout = self._layout(target)
        book = self._book(layout, target)
        if layout.vector is None or book is None or not expected:
            return {}
        query = sql.SQL(
            "SELECT d.{k}::text, d.{v} FROM {t} AS d JOIN {b} AS b ON b.id = d.{k}"
            " JOIN unnest(%s::{cast}[], %s::text[]) AS e(id, content_hash)"
            " ON d.{k} = e.id AND b.content_hash = e.content_hash WHERE d.{v} IS NOT NULL"
        ).format(
            k=layout.key.ident,
            v=layout.vector.ident,
            t=layout.ident,
            b=identifier(book),
            cast=layout.key.cast,
        )
        with self._db.errors():
            conn = self._db.connection()
            rows = conn.execute(query, [list(expected), list(expected.values())], binary=True).fetchall()
        return {key: layout.storage.read(value) for key, value in rows if value is not None}

    def adopt(self, target: str, hashes: Mapping[str, str], fingerprint: str) -> int:
        """Record the hashes of vectors the application wrote (verify re-embedded and accepted them), with
        the digest of the vector as it is now: a later write of the application's is told apart again."""
        from psycopg import sql

        layout = self._layout(target)
        book = self._book(layout, target)
        if book is None or layout.vector is None or not hashes:
            return 0
        with self._db.transaction() as conn:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {b} (id, content_hash, vector_digest)"
                    " SELECT e.id, e.h, {g} FROM unnest(%s::{cast}[], %s::text[]) AS e(id, h)"
                    " JOIN {t} AS d ON d.{k} = e.id WHERE d.{v} IS NOT NULL"
                    " ON CONFLICT (id) DO UPDATE SET content_hash = excluded.content_hash,"
                    " vector_digest = excluded.vector_digest"
                ).format(
                    b=identifier(book),
                    g=column_write.digest(layout, sql.SQL("d.{}").format(layout.vector.ident)),
                    cast=layout.key.cast,
                    t=layout.ident,
                    k=layout.key.ident,
                    v=layout.vector.ident,
                ),
                [list(hashes), list(hashes.values())],
            )
        return len(hashes)


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f}"


MODES["column"] = PgvectorColumnSink
