"""Reading the metadata tables: the controller's state view, every row validated.

Synchronous code; it runs inside a transaction the caller holds, on any :class:`SqlConnection`
(``sqlite3.Connection`` itself, or PostgreSQL's adapter that translates the ``?`` placeholders: the
statements are SQL both dialects accept). What differs between the databases (the KV key's column
type, bulk forms of a large commit's statements) comes from a :class:`Dialect`. A value read back
outside its domain raises :class:`~s3stream.errors.CorruptionError`. The tables:
:mod:`s3stream.metadata.sqlite_schema`; writing them: :mod:`s3stream.metadata.sql_apply`.
"""

from __future__ import annotations

import enum
import itertools
import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from s3stream.errors import CorruptionError
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
    Change,
    Counter,
)
from s3stream.metadata.controller import StreamHead, StreamSetRange
from s3stream.metadata.sqlite_schema import (
    LEASE_COLUMNS,
    NODE_COLUMNS,
    OBJECT_COLUMNS,
    RANGE_COLUMNS,
    SO_COLUMNS,
    STREAM_COLUMNS,
    schema_version,
)

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
        row = self._c.execute(f"SELECT {NODE_COLUMNS} FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
        return None if row is None else _node(row)

    def nodes(self) -> list[NodeInfo]:
        """Also on a file of schema version 1 or 2 opened read-only (no lease columns yet): every
        node is then an unleased session."""
        try:
            rows = self._c.execute(f"SELECT {NODE_COLUMNS} FROM nodes ORDER BY node_id").fetchall()
        except sqlite3.OperationalError:  # only SQLite: PostgreSQL is always migrated to the latest
            if schema_version(cast(sqlite3.Connection, self._c)) not in (1, 2):
                raise
            rows = self._c.execute(
                "SELECT node_id, node_epoch, -1, -1, -1 FROM nodes ORDER BY node_id"
            ).fetchall()
        return [_node(row) for row in rows]

    def lease(self, name: str) -> LeaseInfo | None:
        row = self._c.execute(f"SELECT {LEASE_COLUMNS} FROM leases WHERE name = ?", (name,)).fetchone()
        return None if row is None else _lease(row)

    def leases(self) -> list[LeaseInfo]:
        return [_lease(row) for row in self._c.execute(f"SELECT {LEASE_COLUMNS} FROM leases ORDER BY name")]

    def _streams(
        self, where: str, params: tuple[Any, ...], range_where: str = "", range_params: tuple[Any, ...] = ()
    ) -> list[StreamMetadata]:
        """Streams matching ``where``; their ranges come from the rows matching ``range_where``
        (which must cover them: all rows by default, or those of the only stream found)."""
        rows = self._c.execute(
            f"SELECT {STREAM_COLUMNS} FROM streams {where} ORDER BY stream_id", params
        ).fetchall()
        if not rows:
            return []
        ranges: dict[int, list[RangeMetadata]] = {}
        if len(rows) == 1:
            range_where, range_params = "WHERE stream_id = ?", (rows[0][0],)
        for r in self._c.execute(
            f"SELECT {RANGE_COLUMNS} FROM ranges {range_where} ORDER BY stream_id, range_index", range_params
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
            f"SELECT {OBJECT_COLUMNS} FROM objects WHERE object_id = ?", (object_id,)
        ).fetchone()
        return None if row is None else _object(row)

    def objects(self, states: frozenset[ObjectState] | None) -> list[S3ObjectMetadata]:
        if states is None:
            rows = self._c.execute(f"SELECT {OBJECT_COLUMNS} FROM objects ORDER BY object_id")
        else:
            marks = ", ".join("?" * len(states))
            rows = self._c.execute(
                f"SELECT {OBJECT_COLUMNS} FROM objects WHERE state IN ({marks}) ORDER BY object_id",
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
            f"SELECT {SO_COLUMNS} FROM stream_objects WHERE object_id = ?", (object_id,)
        ).fetchone()
        return None if row is None else _stream_object(row)

    def stream_objects_from(self, stream_id: StreamId, offset: int, limit: int) -> list[StreamObject]:
        rows = self._c.execute(
            f"SELECT {SO_COLUMNS} FROM stream_objects WHERE stream_id = ? AND end_offset > ? "
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
            f"SELECT {OBJECT_COLUMNS} FROM objects WHERE state = 1 AND expires_at_ms < ? ORDER BY object_id",
            (now_ms,),
        )
        return [_object(row) for row in rows]

    def destroyable(self, marked_before_ms: int, limit: int) -> list[S3ObjectMetadata]:
        rows = self._c.execute(
            f"SELECT {OBJECT_COLUMNS} FROM objects WHERE state = 3 AND marked_at_ms < ? "
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
