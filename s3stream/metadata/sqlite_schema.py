"""The SQLite metadata schema: its migrations and every statement run against it.

The tables are documented in ``docs/format.md`` section 6. Synchronous code; it runs on the store's
dedicated SQLite thread, inside a transaction the caller holds. Row values read back are validated:
a value outside its domain raises :class:`~s3stream.errors.CorruptionError`.

The statements are shared with PostgreSQL (:mod:`s3stream.metadata.postgres_schema`): :class:`SqlView`
and :func:`apply` run on any :class:`SqlConnection` (``?`` placeholders, SQL both dialects accept);
what differs (the KV key's column type, bulk forms of a large commit's statements) comes from a
:class:`Dialect`.
"""

from __future__ import annotations

import enum
import itertools
import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from s3stream.errors import ConflictError, CorruptionError, InvalidArgumentError
from s3stream.ids import NodeId, ObjectId, StreamId
from s3stream.metadata import cluster_schema, placement_schema
from s3stream.metadata.base import (
    Assignment,
    LeaseInfo,
    NodeInfo,
    NodeRuntime,
    ObjectKind,
    ObjectState,
    RangeMetadata,
    S3ObjectMetadata,
    StreamMetadata,
    StreamObject,
    StreamOffsetRange,
    StreamSetObject,
    StreamState,
    TakeoverInfo,
)
from s3stream.metadata.changes import (
    AdvanceEndOffsets,
    Change,
    Counter,
    PutKv,
    PutLease,
    PutNode,
    PutObject,
    PutRange,
    PutStream,
    PutStreamObject,
    PutStreamSetObject,
    RemoveKv,
    RemoveLease,
    RemoveObject,
    RemoveRange,
    RemoveStream,
    RemoveStreamObject,
    RemoveStreamSetObject,
    SetCounter,
)
from s3stream.metadata.controller import StreamHead, StreamSetRange

E = TypeVar("E", bound=enum.Enum)


class SqlCursor(Protocol):
    """The part of a DB-API cursor the shared statements use."""

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class SqlConnection(Protocol):
    """What :class:`SqlView` and :func:`apply` need of a connection: ``sqlite3.Connection`` itself,
    or an adapter (PostgreSQL's translates the ``?`` placeholders)."""

    def execute(self, sql: str, parameters: Any = ..., /) -> SqlCursor: ...

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> object: ...


MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # version 1: streams, ranges, nodes, objects and their StreamSet / stream object indexes
    (
        "CREATE TABLE counters (name TEXT PRIMARY KEY, next_value INTEGER NOT NULL) WITHOUT ROWID",
        "CREATE TABLE nodes (node_id INTEGER PRIMARY KEY, node_epoch INTEGER NOT NULL)",
        """CREATE TABLE streams (
            stream_id INTEGER PRIMARY KEY, epoch INTEGER NOT NULL, state INTEGER NOT NULL,
            start_offset INTEGER NOT NULL, end_offset INTEGER NOT NULL, tags TEXT NOT NULL)""",
        """CREATE TABLE ranges (
            stream_id INTEGER NOT NULL REFERENCES streams (stream_id) ON DELETE CASCADE,
            range_index INTEGER NOT NULL, epoch INTEGER NOT NULL, start_offset INTEGER NOT NULL,
            end_offset INTEGER NOT NULL, node_id INTEGER NOT NULL,
            PRIMARY KEY (stream_id, range_index)) WITHOUT ROWID""",
        """CREATE TABLE objects (
            object_id INTEGER PRIMARY KEY, state INTEGER NOT NULL, size_bytes INTEGER NOT NULL,
            prepared_at_ms INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL,
            committed_at_ms INTEGER NOT NULL, marked_at_ms INTEGER NOT NULL, kind INTEGER)""",
        """CREATE TABLE stream_set_objects (
            object_id INTEGER PRIMARY KEY REFERENCES objects (object_id), node_id INTEGER NOT NULL,
            order_id INTEGER NOT NULL, data_time_ms INTEGER NOT NULL, size_bytes INTEGER NOT NULL)""",
        "CREATE INDEX stream_set_objects_by_node ON stream_set_objects (node_id, order_id, object_id)",
        """CREATE TABLE stream_set_ranges (
            object_id INTEGER NOT NULL REFERENCES stream_set_objects (object_id) ON DELETE CASCADE,
            stream_id INTEGER NOT NULL, start_offset INTEGER NOT NULL, end_offset INTEGER NOT NULL,
            size_bytes INTEGER NOT NULL, PRIMARY KEY (object_id, stream_id)) WITHOUT ROWID""",
        "CREATE INDEX stream_set_ranges_by_stream ON stream_set_ranges (stream_id, end_offset)",
        """CREATE TABLE stream_objects (
            object_id INTEGER PRIMARY KEY REFERENCES objects (object_id),
            stream_id INTEGER NOT NULL REFERENCES streams (stream_id) ON DELETE CASCADE,
            start_offset INTEGER NOT NULL, end_offset INTEGER NOT NULL, size_bytes INTEGER NOT NULL,
            data_time_ms INTEGER NOT NULL)""",
        "CREATE INDEX stream_objects_by_stream ON stream_objects (stream_id, start_offset, object_id)",
    ),
    # version 2: KV pairs; partial indexes for the object lifecycle (expiry and deletion)
    (
        "CREATE TABLE kv (key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID",
        "CREATE INDEX objects_prepared ON objects (expires_at_ms) WHERE state = 1",
        "CREATE INDEX objects_destroyed ON objects (marked_at_ms, object_id) WHERE state = 3",
    ),
    # version 3: node sessions' leases; named leases (the maintenance election)
    (
        "ALTER TABLE nodes ADD COLUMN lease_expires_at_ms INTEGER NOT NULL DEFAULT -1",
        "ALTER TABLE nodes ADD COLUMN heartbeat_at_ms INTEGER NOT NULL DEFAULT -1",
        "ALTER TABLE nodes ADD COLUMN registered_at_ms INTEGER NOT NULL DEFAULT -1",
        """CREATE TABLE leases (
            name TEXT NOT NULL PRIMARY KEY, node_id INTEGER NOT NULL, node_epoch INTEGER NOT NULL,
            expires_at_ms INTEGER NOT NULL)""",
    ),
    # version 4: the metadata copy in the bucket (s3stream.metadata.sqlite_copy)
    (
        """CREATE TABLE copy_state (
            id INTEGER PRIMARY KEY CHECK (id = 0), copy_id TEXT NOT NULL, next_seq INTEGER NOT NULL,
            last_commit_ms INTEGER NOT NULL, snapshot_seq INTEGER NOT NULL)""",
        "CREATE TABLE pending_copy (seq INTEGER PRIMARY KEY, payload BLOB NOT NULL)",
    ),
    # version 5: the cluster: node runtime, assignments, takeovers (s3stream.metadata.cluster_schema)
    cluster_schema.MIGRATION,
    # version 6: object placement over several buckets (s3stream.metadata.placement_schema)
    placement_schema.MIGRATION,
)
LATEST_VERSION = len(MIGRATIONS)

_VERSION_TABLE = (
    "CREATE TABLE schema_version (id INTEGER PRIMARY KEY CHECK (id = 0), version INTEGER NOT NULL)"
)


def schema_version(conn: sqlite3.Connection) -> int | None:
    """The stored schema version; None for a database without s3stream tables."""
    if conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    ).fetchone():
        row = conn.execute("SELECT version FROM schema_version WHERE id = 0").fetchone()
        if row is None or not isinstance(row[0], int):
            raise CorruptionError("schema_version has no version row", source="schema_version")
        return int(row[0])
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table'").fetchone():
        raise InvalidArgumentError(
            "the database has tables but no schema_version: not an s3stream metadata database"
        )
    return None


def _check_not_newer(found: int) -> None:
    if found > LATEST_VERSION:
        raise ConflictError(
            f"the metadata schema is version {found}, newer than this s3stream knows ({LATEST_VERSION}): "
            "upgrade s3stream to open it"
        )


def migrate(conn: sqlite3.Connection, *, target_version: int = LATEST_VERSION) -> int:
    """Bring the schema to ``target_version`` in one transaction; returns the version found before.

    The version is read first in a read transaction: a database already at (or past) the target is
    left without taking the write lock, so opening beside busy writers does not wait for them. Only
    a migration takes the write lock (``BEGIN IMMEDIATE``), and reads the version again under it
    (another opener may have migrated in between). A database newer than this code refuses with
    :class:`ConflictError` and is left untouched.
    """
    assert 0 <= target_version <= LATEST_VERSION
    conn.execute("BEGIN")
    try:
        current = schema_version(conn)
    finally:
        conn.execute("ROLLBACK")
    if current is not None:
        _check_not_newer(current)
        if current >= target_version:
            return current
    conn.execute("BEGIN IMMEDIATE")
    try:
        found = schema_version(conn)
        if found is None:
            conn.execute(_VERSION_TABLE)
            conn.execute("INSERT INTO schema_version (id, version) VALUES (0, 0)")
            found = 0
        _check_not_newer(found)
        for version in range(found + 1, target_version + 1):
            for statement in MIGRATIONS[version - 1]:
                conn.execute(statement)
        if target_version > found:
            conn.execute("UPDATE schema_version SET version = ? WHERE id = 0", (target_version,))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return found


# -- decoding rows (validated: bytes from disk) ---------------------------------------------------


def _enum(kind: type[E], value: object, where: str) -> E:
    try:
        return kind(value)
    except ValueError:
        raise CorruptionError(f"{kind.__name__} has no value {value!r}", source=where) from None


def _int(value: object, where: str) -> int:
    if not isinstance(value, int):
        raise CorruptionError(f"expected an integer, found {value!r}", source=where)
    return value


def _tags(text: object, stream_id: int) -> dict[str, str]:
    where = f"streams.tags of stream {stream_id}"
    try:
        tags = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        tags = None
    if not isinstance(tags, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in tags.items()
    ):
        raise CorruptionError(f"tags are not a JSON object of strings: {text!r:.80}", source=where)
    return tags


def _object(row: Sequence[Any]) -> S3ObjectMetadata:
    where = f"objects row {row[0]!r}"
    ints = [_int(v, where) for v in row[:7]]
    return S3ObjectMetadata(
        object_id=ObjectId(ints[0]),
        state=_enum(ObjectState, ints[1], where),
        size_bytes=ints[2],
        prepared_at_ms=ints[3],
        expires_at_ms=ints[4],
        committed_at_ms=ints[5],
        marked_at_ms=ints[6],
        kind=None if row[7] is None else _enum(ObjectKind, row[7], where),
    )


_OBJECT_COLUMNS = (
    "object_id, state, size_bytes, prepared_at_ms, expires_at_ms, committed_at_ms, marked_at_ms, kind"
)
_STREAM_COLUMNS = "stream_id, epoch, state, start_offset, end_offset, tags"
_IDS_PER_QUERY = 500
"""Stream ids bound per ``IN (...)`` lookup (SQLite's variable limit is 999 on old builds)."""
_HEADS_QUERY = (
    "SELECT s.stream_id, s.state, s.start_offset, s.end_offset, coalesce(r.range_index, -1), "
    "coalesce(r.node_id, -1) FROM streams s LEFT JOIN ranges r ON r.stream_id = s.stream_id AND "
    "r.range_index = (SELECT max(range_index) FROM ranges WHERE stream_id = s.stream_id) "
    "WHERE s.stream_id IN ({})"
)
""":meth:`SqlView.stream_heads`: each stream with its last range (-1, -1 when it has none)."""
_SPANS_PER_QUERY = 300
"""Spans bound per :meth:`SqlView.all_continue_at_end` query (3 variables each, under 999)."""
_CONTINUE_QUERY = (
    "WITH s(stream_id, start_offset, end_offset) AS (VALUES {}) SELECT count(*) FROM s "
    "LEFT JOIN streams t ON t.stream_id = s.stream_id LEFT JOIN ranges r ON r.stream_id = s.stream_id "
    "AND r.range_index = (SELECT max(range_index) FROM ranges WHERE stream_id = s.stream_id) WHERE ("
    "typeof(t.state) = 'integer' AND t.state = ? AND typeof(t.start_offset) = 'integer' "
    "AND typeof(t.end_offset) = 'integer' AND t.start_offset < t.end_offset AND t.end_offset = s.start_offset "
    "AND typeof(r.range_index) = 'integer' AND r.range_index >= 0 "
    "AND typeof(r.node_id) = 'integer' AND r.node_id = ?) IS NOT 1"
)
""":meth:`SqlView.all_continue_at_end`: the spans that are not the common case (0: all are)."""


@dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between the databases the shared statements run on (SQLite's by default)."""

    name: str
    kv_key: Callable[[str], Any] = str
    """A KV key as the ``kv`` table's key column holds it."""
    all_continue_at_end: (
        Callable[[SqlConnection, NodeId, Sequence[tuple[StreamId, int, int]]], bool] | None
    ) = None
    """Replaces :meth:`SqlView.all_continue_at_end`'s query (same answer)."""
    flush: Callable[[SqlConnection, list[Change]], bool] | None = None
    """Writes a run of changes of one kind in its own way and returns True, or returns False to
    leave them to the shared statements."""


SQLITE_DIALECT = Dialect("sqlite")
_STREAM_STATE_VALUES = frozenset(int(s) for s in StreamState)
_RANGE_COLUMNS = "stream_id, epoch, range_index, start_offset, end_offset, node_id"
_SO_COLUMNS = "object_id, stream_id, start_offset, end_offset, size_bytes, data_time_ms"


_NODE_COLUMNS = "node_id, node_epoch, lease_expires_at_ms, heartbeat_at_ms, registered_at_ms"
_LEASE_COLUMNS = "name, node_id, node_epoch, expires_at_ms"


def _node(row: Sequence[Any]) -> NodeInfo:
    where = f"nodes row {row[0]!r}"
    v = [_int(x, where) for x in row]
    return NodeInfo(NodeId(v[0]), v[1], v[2], v[3], v[4])


def _lease(row: Sequence[Any]) -> LeaseInfo:
    where = f"leases row {row[0]!r:.80}"
    if not isinstance(row[0], str):
        raise CorruptionError(f"a lease name is not text: {row[0]!r:.80}", source=where)
    v = [_int(x, where) for x in row[1:]]
    return LeaseInfo(row[0], NodeId(v[0]), v[1], v[2])


def _range(row: Sequence[Any]) -> RangeMetadata:
    where = f"ranges row of stream {row[0]!r}"
    v = [_int(x, where) for x in row]
    return RangeMetadata(StreamId(v[0]), v[1], v[2], v[3], v[4], NodeId(v[5]))


def _stream_object(row: Sequence[Any]) -> StreamObject:
    where = f"stream_objects row {row[0]!r}"
    v = [_int(x, where) for x in row]
    return StreamObject(ObjectId(v[0]), StreamId(v[1]), v[2], v[3], v[4], v[5])


class SqlView:
    """The controller's StateView over one connection (inside the caller's transaction)."""

    __slots__ = ("_c", "_dialect")

    def __init__(self, conn: SqlConnection, dialect: Dialect = SQLITE_DIALECT) -> None:
        self._c = conn
        self._dialect = dialect

    def node_epoch(self, node_id: NodeId) -> int | None:
        row = self._c.execute("SELECT node_epoch FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
        return None if row is None else _int(row[0], f"nodes row {node_id}")

    def node(self, node_id: NodeId) -> NodeInfo | None:
        row = self._c.execute(f"SELECT {_NODE_COLUMNS} FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
        return None if row is None else _node(row)

    def nodes(self) -> list[NodeInfo]:
        """Also on a file of schema version 1 or 2 opened read-only (no lease columns yet): every
        node is then an unleased session."""
        try:
            rows = self._c.execute(f"SELECT {_NODE_COLUMNS} FROM nodes ORDER BY node_id").fetchall()
        except sqlite3.OperationalError:  # only SQLite: PostgreSQL is always migrated to the latest
            if schema_version(cast(sqlite3.Connection, self._c)) not in (1, 2):
                raise
            rows = self._c.execute(
                "SELECT node_id, node_epoch, -1, -1, -1 FROM nodes ORDER BY node_id"
            ).fetchall()
        return [_node(row) for row in rows]

    def lease(self, name: str) -> LeaseInfo | None:
        row = self._c.execute(f"SELECT {_LEASE_COLUMNS} FROM leases WHERE name = ?", (name,)).fetchone()
        return None if row is None else _lease(row)

    def leases(self) -> list[LeaseInfo]:
        return [_lease(row) for row in self._c.execute(f"SELECT {_LEASE_COLUMNS} FROM leases ORDER BY name")]

    def _streams(
        self, where: str, params: tuple[Any, ...], range_where: str = "", range_params: tuple[Any, ...] = ()
    ) -> list[StreamMetadata]:
        """Streams matching ``where``; their ranges come from the rows matching ``range_where``
        (which must cover them: all rows by default, or those of the only stream found)."""
        rows = self._c.execute(
            f"SELECT {_STREAM_COLUMNS} FROM streams {where} ORDER BY stream_id", params
        ).fetchall()
        if not rows:
            return []
        ranges: dict[int, list[RangeMetadata]] = {}
        if len(rows) == 1:
            range_where, range_params = "WHERE stream_id = ?", (rows[0][0],)
        for r in self._c.execute(
            f"SELECT {_RANGE_COLUMNS} FROM ranges {range_where} ORDER BY stream_id, range_index", range_params
        ):
            ranges.setdefault(r[0], []).append(_range(r))
        out = []
        for row in rows:
            where_row = f"streams row {row[0]!r}"
            stream_id = _int(row[0], where_row)
            out.append(
                StreamMetadata(
                    stream_id=StreamId(stream_id),
                    epoch=_int(row[1], where_row),
                    state=_enum(StreamState, row[2], where_row),
                    start_offset=_int(row[3], where_row),
                    end_offset=_int(row[4], where_row),
                    ranges=tuple(ranges.get(stream_id, ())),
                    tags=_tags(row[5], stream_id),
                )
            )
        return out

    def stream(self, stream_id: StreamId) -> StreamMetadata | None:
        found = self._streams("WHERE stream_id = ?", (stream_id,))
        return found[0] if found else None

    def stream_heads(self, stream_ids: Sequence[StreamId]) -> dict[StreamId, StreamHead]:
        found: dict[StreamId, StreamHead] = {}
        ids = sorted(set(stream_ids))
        for start in range(0, len(ids), _IDS_PER_QUERY):
            chunk = tuple(ids[start : start + _IDS_PER_QUERY])
            statement = _HEADS_QUERY.format(",".join("?" * len(chunk)))
            for row in self._c.execute(statement, chunk):
                stream_id, state, start_offset, end_offset, range_index, node_id = row
                if not (  # bytes from disk: checked, never assumed
                    type(stream_id) is int and type(state) is int and type(start_offset) is int
                    and type(end_offset) is int and type(range_index) is int and type(node_id) is int
                ):  # fmt: skip
                    bad = next(v for v in row if type(v) is not int)
                    raise CorruptionError(
                        f"expected an integer, found {bad!r}", source=f"streams row {row[0]!r}"
                    )
                if state not in _STREAM_STATE_VALUES:
                    raise CorruptionError(
                        f"StreamState has no value {state!r}", source=f"streams row {stream_id!r}"
                    )
                found[StreamId(stream_id)] = StreamHead(state, start_offset, end_offset, range_index, node_id)
        return found

    def all_continue_at_end(self, node_id: NodeId, spans: Sequence[tuple[StreamId, int, int]]) -> bool:
        if self._dialect.all_continue_at_end is not None:
            return self._dialect.all_continue_at_end(self._c, node_id, spans)
        opened = int(StreamState.OPENED)
        for start in range(0, len(spans), _SPANS_PER_QUERY):
            chunk = spans[start : start + _SPANS_PER_QUERY]
            statement = _CONTINUE_QUERY.format(",".join(["(?, ?, ?)"] * len(chunk)))
            (others,) = self._c.execute(
                statement, (*itertools.chain.from_iterable(chunk), opened, node_id)
            ).fetchone()
            if others:
                return False
        return True

    def opened_streams(self) -> list[StreamMetadata]:
        return self._streams("WHERE state = ?", (int(StreamState.OPENED),))

    def streams(self) -> list[StreamMetadata]:
        return self._streams("", ())

    def object(self, object_id: ObjectId) -> S3ObjectMetadata | None:
        row = self._c.execute(
            f"SELECT {_OBJECT_COLUMNS} FROM objects WHERE object_id = ?", (object_id,)
        ).fetchone()
        return None if row is None else _object(row)

    def objects(self, states: frozenset[ObjectState] | None) -> list[S3ObjectMetadata]:
        if states is None:
            rows = self._c.execute(f"SELECT {_OBJECT_COLUMNS} FROM objects ORDER BY object_id")
        else:
            marks = ", ".join("?" * len(states))
            rows = self._c.execute(
                f"SELECT {_OBJECT_COLUMNS} FROM objects WHERE state IN ({marks}) ORDER BY object_id",
                tuple(int(s) for s in states),
            )
        return [_object(row) for row in rows]

    def _stream_set_objects(self, where: str, params: tuple[Any, ...]) -> list[StreamSetObject]:
        heads = self._c.execute(
            "SELECT object_id, node_id, order_id, data_time_ms, size_bytes FROM stream_set_objects "
            f"{where} ORDER BY order_id, object_id",
            params,
        ).fetchall()
        out = []
        for head in heads:
            where_row = f"stream_set_objects row {head[0]!r}"
            v = [_int(x, where_row) for x in head]
            ranges = tuple(
                StreamOffsetRange(
                    StreamId(_int(r[0], where_row)),
                    _int(r[1], where_row),
                    _int(r[2], where_row),
                    _int(r[3], where_row),
                )
                for r in self._c.execute(
                    "SELECT stream_id, start_offset, end_offset, size_bytes FROM stream_set_ranges "
                    "WHERE object_id = ? ORDER BY stream_id",
                    (v[0],),
                )
            )
            out.append(StreamSetObject(ObjectId(v[0]), NodeId(v[1]), v[2], v[3], v[4], ranges))
        return out

    def stream_set_object(self, object_id: ObjectId) -> StreamSetObject | None:
        found = self._stream_set_objects("WHERE object_id = ?", (object_id,))
        return found[0] if found else None

    def stream_set_objects(self, node_id: NodeId) -> list[StreamSetObject]:
        return self._stream_set_objects("WHERE node_id = ?", (node_id,))

    def stream_object(self, object_id: ObjectId) -> StreamObject | None:
        row = self._c.execute(
            f"SELECT {_SO_COLUMNS} FROM stream_objects WHERE object_id = ?", (object_id,)
        ).fetchone()
        return None if row is None else _stream_object(row)

    def stream_objects_from(self, stream_id: StreamId, offset: int, limit: int) -> list[StreamObject]:
        rows = self._c.execute(
            f"SELECT {_SO_COLUMNS} FROM stream_objects WHERE stream_id = ? AND end_offset > ? "
            "ORDER BY start_offset, object_id LIMIT ?",
            (stream_id, offset, limit),
        )
        return [_stream_object(row) for row in rows]

    def stream_set_ranges_from(
        self, node_id: NodeId, stream_id: StreamId, offset: int, *, after: tuple[int, int] | None, limit: int
    ) -> list[StreamSetRange]:
        after_order, after_id = after if after is not None else (-(1 << 63), -(1 << 63))
        rows = self._c.execute(
            "SELECT s.object_id, s.order_id, s.size_bytes, r.start_offset, r.end_offset, r.size_bytes "
            "FROM stream_set_ranges AS r JOIN stream_set_objects AS s ON s.object_id = r.object_id "
            "WHERE r.stream_id = ? AND r.end_offset > ? AND s.node_id = ? "
            "AND (s.order_id, s.object_id) > (?, ?) ORDER BY s.order_id, s.object_id LIMIT ?",
            (stream_id, offset, node_id, after_order, after_id, limit),
        )
        out = []
        for row in rows:
            v = [_int(x, f"stream_set_ranges row {row[0]!r}") for x in row]
            out.append(
                StreamSetRange(ObjectId(v[0]), v[1], v[2], StreamOffsetRange(stream_id, v[3], v[4], v[5]))
            )
        return out

    def expired_prepared(self, now_ms: int) -> list[S3ObjectMetadata]:
        rows = self._c.execute(
            f"SELECT {_OBJECT_COLUMNS} FROM objects WHERE state = 1 AND expires_at_ms < ? ORDER BY object_id",
            (now_ms,),
        )
        return [_object(row) for row in rows]

    def destroyable(self, marked_before_ms: int, limit: int) -> list[S3ObjectMetadata]:
        rows = self._c.execute(
            f"SELECT {_OBJECT_COLUMNS} FROM objects WHERE state = 3 AND marked_at_ms < ? "
            "ORDER BY marked_at_ms, object_id LIMIT ?",
            (marked_before_ms, limit),
        )
        return [_object(row) for row in rows]

    def next_id(self, counter: Counter) -> int:
        row = self._c.execute("SELECT next_value FROM counters WHERE name = ?", (counter.value,)).fetchone()
        return 0 if row is None else _int(row[0], f"counters row {counter.value}")

    def kv(self, key: str) -> bytes | None:
        row = self._c.execute("SELECT value FROM kv WHERE key = ?", (self._dialect.kv_key(key),)).fetchone()
        if row is None:
            return None
        if not isinstance(row[0], bytes):
            raise CorruptionError(
                f"kv value is not a blob: {type(row[0]).__name__}", source=f"kv row {key!r:.80}"
            )
        return row[0]

    # -- cluster (s3stream.metadata.cluster_schema) ----------------------------------------------
    def node_runtime(self, node_id: NodeId) -> NodeRuntime | None:
        found = cluster_schema.node_runtimes(self._c, node_id)
        return found[0] if found else None

    def node_runtimes(self) -> list[NodeRuntime]:
        return cluster_schema.node_runtimes(self._c)

    def assignment(self, stream_id: StreamId) -> Assignment | None:
        found = cluster_schema.assignments(self._c, stream_id)
        return found[0] if found else None

    def assignments(self) -> list[Assignment]:
        return cluster_schema.assignments(self._c)

    def takeover(self, node_id: NodeId) -> TakeoverInfo | None:
        found = cluster_schema.takeovers(self._c, node_id)
        return found[0] if found else None

    def takeovers(self) -> list[TakeoverInfo]:
        return cluster_schema.takeovers(self._c)

    def placements(self, object_ids: Sequence[ObjectId]) -> dict[ObjectId, tuple[int, ...]]:
        return placement_schema.placements(self._c, object_ids)

    def bucket_usage(self, unplaced_bucket_id: int) -> dict[int, tuple[int, int]]:
        return placement_schema.bucket_usage(self._c, unplaced_bucket_id)


# -- applying changes ----------------------------------------------------------------------------

_UPSERT_OBJECT = (
    f"INSERT INTO objects ({_OBJECT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (object_id) DO UPDATE SET "
    "state = excluded.state, size_bytes = excluded.size_bytes, prepared_at_ms = excluded.prepared_at_ms, "
    "expires_at_ms = excluded.expires_at_ms, committed_at_ms = excluded.committed_at_ms, "
    "marked_at_ms = excluded.marked_at_ms, kind = excluded.kind"
)


def _object_params(change: PutObject) -> tuple[Any, ...]:
    o = change.object
    kind = None if o.kind is None else int(o.kind)
    return (
        o.object_id,
        int(o.state),
        o.size_bytes,
        o.prepared_at_ms,
        o.expires_at_ms,
        o.committed_at_ms,
        o.marked_at_ms,
        kind,
    )


def _stream_params(c: PutStream) -> tuple[Any, ...]:
    tags = json.dumps(dict(c.tags), sort_keys=True, separators=(",", ":"))
    return (c.stream_id, c.epoch, int(c.state), c.start_offset, c.end_offset, tags)


def _range_params(c: PutRange) -> tuple[Any, ...]:
    r = c.range
    return (r.stream_id, r.epoch, r.range_index, r.start_offset, r.end_offset, r.node_id)


def _so_params(c: PutStreamObject) -> tuple[Any, ...]:
    s = c.stream_object
    return (s.object_id, s.stream_id, s.start_offset, s.end_offset, s.size_bytes, s.data_time_ms)


# change kind -> (statement, parameters); consecutive changes of one kind run as one executemany
_SIMPLE: dict[type[Any], tuple[str, Callable[[Any], tuple[Any, ...]]]] = {
    SetCounter: (
        "INSERT INTO counters (name, next_value) VALUES (?, ?) "
        "ON CONFLICT (name) DO UPDATE SET next_value = excluded.next_value",
        lambda c: (c.counter.value, c.next_value),
    ),
    PutNode: (
        f"INSERT INTO nodes ({_NODE_COLUMNS}) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (node_id) DO UPDATE SET node_epoch = excluded.node_epoch, "
        "lease_expires_at_ms = excluded.lease_expires_at_ms, heartbeat_at_ms = excluded.heartbeat_at_ms, "
        "registered_at_ms = excluded.registered_at_ms",
        lambda c: (c.node_id, c.node_epoch, c.lease_expires_at_ms, c.heartbeat_at_ms, c.registered_at_ms),
    ),
    PutLease: (
        f"INSERT INTO leases ({_LEASE_COLUMNS}) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (name) DO UPDATE SET node_id = excluded.node_id, node_epoch = excluded.node_epoch, "
        "expires_at_ms = excluded.expires_at_ms",
        lambda c: (c.lease.name, c.lease.node_id, c.lease.node_epoch, c.lease.expires_at_ms),
    ),
    RemoveLease: ("DELETE FROM leases WHERE name = ?", lambda c: (c.name,)),
    PutStream: (
        f"INSERT INTO streams ({_STREAM_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (stream_id) DO UPDATE SET "
        "epoch = excluded.epoch, state = excluded.state, start_offset = excluded.start_offset, "
        "end_offset = excluded.end_offset, tags = excluded.tags",
        _stream_params,
    ),
    PutRange: (
        f"INSERT INTO ranges ({_RANGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (stream_id, range_index) DO UPDATE SET epoch = excluded.epoch, "
        "start_offset = excluded.start_offset, end_offset = excluded.end_offset, node_id = excluded.node_id",
        _range_params,
    ),
    RemoveRange: (
        "DELETE FROM ranges WHERE stream_id = ? AND range_index = ?",
        lambda c: (c.stream_id, c.range_index),
    ),
    PutObject: (_UPSERT_OBJECT, _object_params),
    RemoveObject: ("DELETE FROM objects WHERE object_id = ?", lambda c: (c.object_id,)),
    RemoveStreamSetObject: ("DELETE FROM stream_set_objects WHERE object_id = ?", lambda c: (c.object_id,)),
    PutStreamObject: (
        f"INSERT INTO stream_objects ({_SO_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (object_id) DO UPDATE SET "
        "stream_id = excluded.stream_id, start_offset = excluded.start_offset, end_offset = excluded.end_offset, "
        "size_bytes = excluded.size_bytes, data_time_ms = excluded.data_time_ms",
        _so_params,
    ),
    RemoveStreamObject: ("DELETE FROM stream_objects WHERE object_id = ?", lambda c: (c.object_id,)),
    PutKv: (
        "INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        lambda c: (c.key, c.value),
    ),
    RemoveKv: ("DELETE FROM kv WHERE key = ?", lambda c: (c.key,)),
    **cluster_schema.STATEMENTS,
    **placement_schema.STATEMENTS,
}


def apply(conn: SqlConnection, changes: Iterable[Change], dialect: Dialect = SQLITE_DIALECT) -> None:
    """Write the changes in order (inside the caller's transaction)."""
    run: list[Change] = []
    for change in changes:
        if run and type(run[-1]) is not type(change):
            _flush(conn, run, dialect)
            run = []
        run.append(change)
    if run:
        _flush(conn, run, dialect)


def _flush(conn: SqlConnection, run: list[Change], dialect: Dialect) -> None:
    if dialect.flush is not None and dialect.flush(conn, run):
        return
    kind = type(run[0])
    simple = _SIMPLE.get(kind)
    if simple is not None:
        statement, params = simple
        rows = [params(c) for c in run]
        if kind in (PutKv, RemoveKv):
            rows = [(dialect.kv_key(row[0]), *row[1:]) for row in rows]
        conn.executemany(statement, rows)
        return
    if kind is AdvanceEndOffsets:
        for advance in cast("list[AdvanceEndOffsets]", run):
            ids, ends = advance.stream_ids, advance.end_offsets
            conn.executemany(
                "UPDATE streams SET end_offset = ? WHERE stream_id = ?", zip(ends, ids, strict=True)
            )
            conn.executemany(
                "UPDATE ranges SET end_offset = ? WHERE stream_id = ? AND range_index = "
                "(SELECT max(range_index) FROM ranges WHERE stream_id = ?)",
                zip(ends, ids, ids, strict=True),
            )
        return
    for change in run:
        if isinstance(change, RemoveStream):
            conn.execute("DELETE FROM stream_objects WHERE stream_id = ?", (change.stream_id,))
            conn.execute("DELETE FROM ranges WHERE stream_id = ?", (change.stream_id,))
            conn.execute("DELETE FROM streams WHERE stream_id = ?", (change.stream_id,))
        elif isinstance(change, PutStreamSetObject):
            sso = change.stream_set_object
            conn.execute("DELETE FROM stream_set_objects WHERE object_id = ?", (sso.object_id,))
            conn.execute(
                "INSERT INTO stream_set_objects (object_id, node_id, order_id, data_time_ms, size_bytes) "
                "VALUES (?, ?, ?, ?, ?)",
                (sso.object_id, sso.node_id, sso.order_id, sso.data_time_ms, sso.size_bytes),
            )
            conn.executemany(
                "INSERT INTO stream_set_ranges (object_id, stream_id, start_offset, end_offset, size_bytes) "
                "VALUES (?, ?, ?, ?, ?)",
                [
                    (sso.object_id, r.stream_id, r.start_offset, r.end_offset, r.size_bytes)
                    for r in sso.ranges
                ],
            )
        else:  # pragma: no cover - every kind is handled above
            raise AssertionError(f"unhandled change {change!r}")
