"""The PostgreSQL metadata schema: its migrations (derived from SQLite's) and the statement adapter.

One schema, two dialects. The tables, columns and indexes are SQLite's (``docs/format.md`` section
6.1); each SQLite migration statement becomes a PostgreSQL one by a fixed rewrite
(:func:`postgres_ddl`: ``INTEGER`` -> ``BIGINT``, ``BLOB`` -> ``BYTEA``, ``TEXT`` -> ``TEXT COLLATE "C"``
so that text orders by bytes as in SQLite, no ``WITHOUT ROWID``; the KV key is UTF-8 ``BYTEA``, as a
key may hold NUL, which PostgreSQL's text cannot), so a migration added for SQLite
carries over with the same version number. The statements that read and write rows are SQLite's too
(:class:`~s3stream.metadata.sql_view.SqlView`, :func:`~s3stream.metadata.sql_apply.apply`),
run through :class:`PgConnection`, which turns their ``?`` placeholders into psycopg's ``%s``.

Migrations run in one transaction holding an advisory lock keyed by the schema's name, so processes
opening a fresh schema at once create it exactly once; a schema newer than this code is refused with
:class:`~s3stream.errors.ConflictError` and left untouched. Synchronous code: it runs on the store's
worker threads.
"""

from __future__ import annotations

import functools
import re
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any, cast

import psycopg

from s3stream.errors import ConflictError, CorruptionError, InvalidArgumentError
from s3stream.ids import NodeId, StreamId
from s3stream.metadata import sqlite_schema
from s3stream.metadata.base import StreamState
from s3stream.metadata.changes import AdvanceEndOffsets, Change, PutStreamSetObject
from s3stream.metadata.sql_view import Dialect, SqlConnection, SqlCursor

LATEST_VERSION = sqlite_schema.LATEST_VERSION

MIGRATION_LOCK_CLASS = 0x5335_4D44
"""First key of the migration's advisory lock (``pg_advisory_xact_lock(class, hashtext(schema))``)."""

_DDL_REWRITES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^CREATE TABLE kv \(key TEXT\b"), "CREATE TABLE kv (key BYTEA"),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
    (re.compile(r"\bBLOB\b"), "BYTEA"),
    (re.compile(r"\bTEXT\b"), 'TEXT COLLATE "C"'),
    (re.compile(r"\)\s*WITHOUT ROWID\s*$"), ")"),
)

_CONTINUE_QUERY = (
    "SELECT count(*) FROM unnest(?::bigint[], ?::bigint[]) AS s(stream_id, start_offset) "
    "LEFT JOIN streams t ON t.stream_id = s.stream_id LEFT JOIN LATERAL (SELECT range_index, node_id "
    "FROM ranges WHERE stream_id = s.stream_id ORDER BY range_index DESC LIMIT 1) r ON true WHERE ("
    "t.state = ? AND t.start_offset < t.end_offset AND t.end_offset = s.start_offset "
    "AND r.range_index >= 0 AND r.node_id = ?) IS NOT TRUE"
)
"""SQLite's query over two arrays (one statement for any number of spans) and without its ``typeof``
checks: PostgreSQL's columns are typed (BIGINT NOT NULL)."""
_ADVANCE_STREAMS = (
    "UPDATE streams AS t SET end_offset = v.end_offset "
    "FROM unnest(?::bigint[], ?::bigint[]) AS v(stream_id, end_offset) WHERE t.stream_id = v.stream_id"
)
_ADVANCE_RANGES = (
    "UPDATE ranges AS r SET end_offset = v.end_offset FROM (SELECT u.stream_id, u.end_offset, "
    "(SELECT max(range_index) FROM ranges WHERE stream_id = u.stream_id) AS range_index "
    "FROM unnest(?::bigint[], ?::bigint[]) AS u(stream_id, end_offset)) AS v "
    "WHERE r.stream_id = v.stream_id AND r.range_index = v.range_index"
)
_INSERT_STREAM_SET_RANGES = (
    "INSERT INTO stream_set_ranges (object_id, stream_id, start_offset, end_offset, size_bytes) "
    "SELECT ?, * FROM unnest(?::bigint[], ?::bigint[], ?::bigint[], ?::bigint[])"
)


def _all_continue_at_end(
    conn: SqlConnection, node_id: NodeId, spans: Sequence[tuple[StreamId, int, int]]
) -> bool:
    stream_ids = [s for s, _, _ in spans]
    starts = [start for _, start, _ in spans]
    (others,) = conn.execute(
        _CONTINUE_QUERY, (stream_ids, starts, int(StreamState.OPENED), node_id)
    ).fetchone()
    return bool(others == 0)


def _flush(conn: SqlConnection, run: list[Change]) -> bool:
    """A large commit's writes as one statement per table (arrays), not one per stream."""
    if isinstance(run[0], AdvanceEndOffsets):
        for advance in cast("list[AdvanceEndOffsets]", run):
            ids, ends = list(advance.stream_ids), list(advance.end_offsets)
            conn.execute(_ADVANCE_STREAMS, (ids, ends))
            conn.execute(_ADVANCE_RANGES, (ids, ends))
        return True
    if isinstance(run[0], PutStreamSetObject):
        for change in cast("list[PutStreamSetObject]", run):
            sso = change.stream_set_object
            conn.execute("DELETE FROM stream_set_objects WHERE object_id = ?", (sso.object_id,))
            conn.execute(
                "INSERT INTO stream_set_objects (object_id, node_id, order_id, data_time_ms, size_bytes) "
                "VALUES (?, ?, ?, ?, ?)",
                (sso.object_id, sso.node_id, sso.order_id, sso.data_time_ms, sso.size_bytes),
            )
            if sso.ranges:
                rows = [(r.stream_id, r.start_offset, r.end_offset, r.size_bytes) for r in sso.ranges]
                conn.execute(_INSERT_STREAM_SET_RANGES, (sso.object_id, *map(list, zip(*rows, strict=True))))
        return True
    return False


def _kv_key(key: str) -> bytes:
    return key.encode()


POSTGRES_DIALECT = Dialect(
    "postgresql", kv_key=_kv_key, all_continue_at_end=_all_continue_at_end, flush=_flush
)
"""KV keys are UTF-8 BYTEA: a key may hold NUL, which PostgreSQL's TEXT cannot."""


def postgres_ddl(statement: str) -> str:
    """The PostgreSQL form of one SQLite migration statement."""
    for pattern, replacement in _DDL_REWRITES:
        statement = pattern.sub(replacement, statement)
    return statement


MIGRATIONS: tuple[tuple[str, ...], ...] = tuple(
    tuple(postgres_ddl(statement) for statement in version) for version in sqlite_schema.MIGRATIONS
)
_VERSION_TABLE = postgres_ddl(sqlite_schema._VERSION_TABLE)


@functools.lru_cache(maxsize=1024)
def placeholders(sql: str) -> str:
    """``sql`` with psycopg's placeholders: ``%`` escaped, each ``?`` -> ``%s`` (the shared
    statements hold no ``?`` inside a string literal)."""
    return sql.replace("%", "%%").replace("?", "%s")


class PgConnection:
    """A psycopg connection seen as a :class:`~s3stream.metadata.sql_view.SqlConnection`."""

    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def execute(self, sql: str, parameters: Any = None, /) -> SqlCursor:
        if parameters is None:
            return self.conn.execute(sql.encode())  # bytes: psycopg does not look for placeholders
        return self.conn.execute(placeholders(sql), parameters)

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> object:
        rows = list(parameters)
        if rows:
            with self.conn.cursor() as cursor:
                cursor.executemany(placeholders(sql), rows)
        return None


def current_schema(conn: psycopg.Connection[Any]) -> str:
    """The schema new tables go to (the first existing one on ``search_path``)."""
    row = conn.execute("SELECT current_schema()").fetchone()
    if row is None or row[0] is None:
        path = conn.execute("SHOW search_path").fetchone()
        raise InvalidArgumentError(
            f"no schema on the search_path ({path[0] if path else '?'}) exists: create it first "
            "(CREATE SCHEMA ...) or name an existing one in options=-csearch_path%3D<schema>"
        )
    return str(row[0])


def schema_version(conn: psycopg.Connection[Any]) -> int | None:
    """The stored schema version; None for a schema without s3stream tables (inside a transaction)."""
    schema = current_schema(conn)
    tables = {
        str(row[0])
        for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))
    }
    if "schema_version" in tables:
        row = conn.execute("SELECT version FROM schema_version WHERE id = 0").fetchone()
        if row is None or not isinstance(row[0], int):
            raise CorruptionError("schema_version has no version row", source=f"{schema}.schema_version")
        return int(row[0])
    if tables:
        raise InvalidArgumentError(
            f"schema {schema!r} has tables but no schema_version: not an s3stream metadata schema"
        )
    return None


def migrate(conn: psycopg.Connection[Any], *, target_version: int = LATEST_VERSION) -> int:
    """Bring the schema to ``target_version`` in one transaction under the migration lock; returns
    the version found before. ``conn`` is in autocommit mode (no transaction open)."""
    assert 0 <= target_version <= LATEST_VERSION
    conn.execute("BEGIN")
    try:
        schema = current_schema(conn)
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (MIGRATION_LOCK_CLASS, schema))
        found = schema_version(conn)
        if found is None:
            conn.execute(_VERSION_TABLE.encode())
            conn.execute(b"INSERT INTO schema_version (id, version) VALUES (0, 0)")
            found = 0
        if found > LATEST_VERSION:
            raise ConflictError(
                f"the metadata schema is version {found}, newer than this s3stream knows ({LATEST_VERSION}): "
                "upgrade s3stream to open it"
            )
        for version in range(found + 1, target_version + 1):
            for statement in MIGRATIONS[version - 1]:
                conn.execute(statement.encode())
        if target_version > found:
            conn.execute("UPDATE schema_version SET version = %s WHERE id = 0", (target_version,))
        conn.execute("COMMIT")
    except BaseException:
        if not conn.closed:
            conn.execute("ROLLBACK")
        raise
    return found


def schema_columns(conn: psycopg.Connection[Any]) -> dict[str, tuple[tuple[str, bool], ...]]:
    """Each table of the current schema: its columns (name, not null) in order."""
    schema = current_schema(conn)
    shape: dict[str, list[tuple[str, bool]]] = {}
    for table, column, nullable in conn.execute(
        "SELECT table_name, column_name, is_nullable FROM information_schema.columns "
        "WHERE table_schema = %s ORDER BY table_name, ordinal_position",
        (schema,),
    ):
        shape.setdefault(str(table), []).append((str(column), nullable == "NO"))
    return {table: tuple(columns) for table, columns in shape.items()}


@functools.cache
def expected_columns() -> dict[str, tuple[tuple[str, bool], ...]]:
    """:func:`schema_columns` of the latest schema: SQLite's, as its migrations build it (a primary
    key column counts as NOT NULL, as PostgreSQL makes it)."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        sqlite_schema.migrate(conn)
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {
            table: tuple(
                (str(name), bool(notnull) or pk > 0)
                for name, notnull, pk in conn.execute(
                    'SELECT name, "notnull", pk FROM pragma_table_info(?) ORDER BY cid', (table,)
                )
            )
            for table in tables
        }
    finally:
        conn.close()


def check_schema_shape(
    conn: psycopg.Connection[Any], expected: dict[str, tuple[tuple[str, bool], ...]]
) -> None:
    """CorruptionError unless the tables and their columns are ``expected`` (SQLite's, built by the
    same migrations): a table or column dropped or altered by hand fails here, not in a later write."""
    found = schema_columns(conn)
    if found != expected:
        names = sorted(name for name in set(found) | set(expected) if found.get(name) != expected.get(name))
        raise CorruptionError(
            f"the metadata schema is not the one its version {LATEST_VERSION} defines (differs in: "
            f"{', '.join(names[:5])})",
            source=current_schema(conn),
        )
