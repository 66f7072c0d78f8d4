"""The Postgres source: a keyset scan of a table or view (`WHERE id > cursor ORDER BY id LIMIT n`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from reindex.columns import Documents
from reindex.offers import SourceOffer
from reindex.ports import Column, Record, Sink, SourceSchema
from reindex_adapters.postgres import offers
from reindex_adapters.postgres import rules as postgres_rules
from reindex_adapters.postgres.catalog import qualified_name, read_source_shape, server_identity
from reindex_adapters.postgres.connection import Database, DsnConfig, database_of, first_value, identifier
from reindex_adapters.postgres.sink import PgvectorSink

if TYPE_CHECKING:
    from psycopg import sql


class PostgresSource:
    """Reads a table or view page by page (`WHERE id > cursor ORDER BY id LIMIT n`): memory stays flat."""

    offer: ClassVar[SourceOffer] = offers.SOURCE  # what `reindex init` writes for it

    shareable = True  # several processes may open it at once (reindex.run.processes)

    class Config(DsnConfig):
        kind: Literal["postgres"]
        table: str
        id_column: str = "id"
        text_column: str = "body"
        vector_column: str | None = None
        page_size: int = Field(default=1000, ge=1)

    def __init__(
        self,
        dsn: str,
        *,
        table: str,
        id_column: str = "id",
        text_column: str = "body",
        vector_column: str | None = None,
        page_size: int = 1000,
    ) -> None:
        self._db = Database(dsn, "source", vectors=False)
        self.table = table
        self.page_size = page_size
        self._columns = (id_column, text_column, vector_column)
        with self._db.setup() as conn:
            self._shape = read_source_shape(conn, table, id_column, text_column, vector_column)
            columns = [Column(a.name, a.type) for a in self._shape.columns]
            self._rules = postgres_rules.read_rules(conn, self._shape.oid, columns)
            relation = qualified_name(conn, self._shape.oid)
            self._identity = f"postgres:{server_identity(conn)}/{relation}#{id_column},{text_column}"

    @classmethod
    def from_config(cls, config: Config) -> PostgresSource:
        return cls(
            config.resolved_dsn("source"),
            table=config.table,
            id_column=config.id_column,
            text_column=config.text_column,
            vector_column=config.vector_column,
            page_size=config.page_size,
        )

    def schema(self) -> SourceSchema:
        shape = self._shape
        return SourceSchema(
            id_field=shape.key.name,
            text_field=shape.text.name,
            vector_field=shape.vector.name if shape.vector else None,
            columns=tuple(self._rules.columns[a.name] for a in shape.columns),
            distance=shape.distance,
            checks=self._rules.checks,
        )

    def count(self) -> int | None:
        from psycopg import sql

        with self._db.errors():
            row = self._db.connection().execute(
                sql.SQL("SELECT count(*) FROM {}").format(identifier(self.table))
            )
            return int(first_value(row.fetchone()))

    def scan(self, after: str | None = None) -> Iterator[Record]:
        while True:
            page = self._page(after)
            yield from page
            if len(page) < self.page_size:
                return
            after = page[-1].id

    def scan_documents(self, after: str | None, size: int) -> Iterator[Documents]:
        """Shards of `size` rows as columns, one keyset query each: the ids and texts taken from the rows
        column-wise and each payload made by one `dict(zip(...))`, with no Record per row."""
        while True:
            rows = self._rows(after, size)
            if not rows:
                return
            docs = self._documents(rows)
            yield docs
            if len(rows) < size:
                return
            after = docs.last_position

    def scan_range(self, after: str | None, last: str) -> Documents:
        """Every row with a key after `after` up to `last` included, as columns: a planned shard's rows as
        they are now (rows inserted into the range since it was planned included, deleted ones gone), so a
        table the application keeps writing to is read as the one-process pipeline reads it (`sync` catches
        up what changed behind the cursor). `last_position` is `last` whatever the range holds now."""
        from psycopg import sql

        key = self._shape.key
        bounds = [sql.SQL("{} <= %s::{}").format(key.ident, key.cast)]
        if after is not None:
            bounds.insert(0, sql.SQL("{} > %s::{}").format(key.ident, key.cast))
        query = self._select() + sql.SQL("WHERE ") + sql.SQL(" AND ").join(bounds)
        query += sql.SQL(" ORDER BY {}").format(key.ident)
        params = [after, last] if after is not None else [last]
        with self._db.errors():
            rows = self._db.connection().execute(query, params).fetchall()
        if not rows:
            fields = (self._shape.key.name, self._shape.text.name)
            return Documents([], [], [], fields, last_position=last)
        return replace(self._documents(rows), last_position=last)

    def _documents(self, rows: list[tuple[Any, ...]]) -> Documents:
        """Rows as columns: ids and texts taken column-wise, each payload one `dict(zip(...))`."""
        names = [a.name for a in self._shape.columns]
        key, text = names.index(self._shape.key.name), names.index(self._shape.text.name)
        columns = list(zip(*rows, strict=True))
        ids = list(map(str, columns[key]))
        texts = columns[text]
        plain = set(map(type, texts)) == {str}
        listed = list(texts) if plain else ["" if t is None else str(t) for t in texts]
        payloads: list[Mapping[str, Any]] = [dict(zip(names, row, strict=True)) for row in rows]
        fields = (self._shape.key.name, self._shape.text.name)
        return Documents(ids, listed, payloads, fields, last_position=ids[-1])

    def shard_bounds(self, after: str | None, size: int) -> Iterator[tuple[str, int]]:
        """(last id, rows) of each shard of `size` rows after id `after`, in one query over the ids only:
        keyset boundaries a cluster's workers read in parallel (`WHERE id > after ... LIMIT size`)."""
        from psycopg import sql

        key = self._shape.key
        where = sql.SQL("WHERE {} > %s::{}").format(key.ident, key.cast) if after is not None else sql.SQL("")
        query = sql.SQL(
            "SELECT k, n FROM (SELECT {k} AS k, row_number() OVER (ORDER BY {k}) AS n, count(*) OVER () AS total"
            " FROM {t} {w}) AS numbered WHERE n %% %s = 0 OR n = total ORDER BY n"
        ).format(k=key.ident, t=identifier(self.table), w=where)
        params = [after, size] if after is not None else [size]
        with self._db.errors():
            rows = self._db.connection().execute(query, params).fetchall()
        previous = 0
        for last, number in rows:
            yield str(last), int(number) - previous
            previous = int(number)

    def identity(self) -> str:
        """`postgres:<system identifier>/<database>/<schema>.<table>#<id>,<text>`: no DSN, no knobs."""
        return self._identity

    def fetch(self, ids: Sequence[str]) -> Iterator[Record]:
        from psycopg import sql

        key = self._shape.key
        where = sql.SQL("WHERE {} = ANY(%s::{}[]) ORDER BY {}").format(key.ident, key.cast, key.ident)
        with self._db.errors():
            rows = self._db.connection().execute(self._select() + where, [list(ids)]).fetchall()
        return iter([self._record(row) for row in rows])

    def reading(self, sink: Sink, alias: str, previous: str) -> PostgresSource | None:
        """This source over `previous` when it reads the alias (the view) or `previous` itself, in the
        sink's own database: the table the application wrote to until the flip (`reindex.prove.served`)."""
        if not isinstance(sink, PgvectorSink) or sink.serves_in_place or self.table not in (alias, previous):
            return None
        if database_of(sink.identity()) != database_of(self._identity):
            return None
        return self.over(previous)

    def over(self, index: str) -> PostgresSource:
        """This source's columns over another table or view of the same database (its own connection)."""
        id_column, text_column, vector_column = self._columns
        return PostgresSource(
            self._db.dsn,
            table=index,
            id_column=id_column,
            text_column=text_column,
            vector_column=vector_column,
            page_size=self.page_size,
        )

    def close(self) -> None:
        self._db.close()

    def _page(self, after: str | None) -> list[Record]:
        return [self._record(row) for row in self._rows(after, self.page_size)]

    def _rows(self, after: str | None, limit: int) -> list[tuple[Any, ...]]:
        """Up to `limit` rows after key `after`, in key order."""
        from psycopg import sql

        key = self._shape.key
        where = (
            sql.SQL("WHERE {} > %s::{} ").format(key.ident, key.cast) if after is not None else sql.SQL("")
        )
        order = sql.SQL("ORDER BY {} LIMIT %s").format(key.ident)
        params = [after, limit] if after is not None else [limit]
        with self._db.errors():
            return self._db.connection().execute(self._select() + where + order, params).fetchall()

    def _select(self) -> sql.Composed:
        from psycopg import sql

        names = sql.SQL(", ").join(a.ident for a in self._shape.columns)
        return sql.SQL("SELECT {} FROM {} ").format(names, identifier(self.table))

    def _record(self, row: tuple[Any, ...]) -> Record:
        payload = {a.name: value for a, value in zip(self._shape.columns, row, strict=True)}
        text = payload[self._shape.text.name]
        return Record(
            id=str(payload[self._shape.key.name]), text="" if text is None else str(text), payload=payload
        )
