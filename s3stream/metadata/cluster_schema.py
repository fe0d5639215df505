"""The SQL of the cluster tables (schema version 5): ``node_runtime``, ``assignments``, ``takeovers``.

Tables documented in ``docs/format.md`` section 6 ("Cluster tables"); the statements run on SQLite and,
through the same rewrite as every other statement, on PostgreSQL
(:mod:`s3stream.metadata.postgres_schema`). :class:`~s3stream.metadata.sql_view.SqlView` reads
through :func:`node_runtimes`, :func:`assignments` and :func:`takeovers`; ``apply`` writes through
:data:`STATEMENTS`. Row values read back are validated: a value outside its domain raises
:class:`~s3stream.errors.CorruptionError`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from s3stream.errors import CorruptionError
from s3stream.ids import NodeId, StreamId
from s3stream.metadata.base import Assignment, NodeRuntime, TakeoverInfo, TakeoverState
from s3stream.metadata.changes import PutAssignment, PutNodeRuntime, PutTakeover, RemoveAssignment

MIGRATION: tuple[str, ...] = (
    """CREATE TABLE node_runtime (
        node_id INTEGER PRIMARY KEY, wal_path TEXT NOT NULL, wal_pending_bytes INTEGER NOT NULL,
        updated_at_ms INTEGER NOT NULL)""",
    """CREATE TABLE assignments (
        stream_id INTEGER PRIMARY KEY, to_node_id INTEGER NOT NULL, from_node_id INTEGER NOT NULL,
        requested_at_ms INTEGER NOT NULL)""",
    """CREATE TABLE takeovers (
        node_id INTEGER PRIMARY KEY, node_epoch INTEGER NOT NULL, fence_epoch INTEGER NOT NULL,
        wal_path TEXT NOT NULL, streams TEXT NOT NULL, state INTEGER NOT NULL,
        taker_node_id INTEGER NOT NULL, taker_node_epoch INTEGER NOT NULL, attempt INTEGER NOT NULL,
        created_at_ms INTEGER NOT NULL, updated_at_ms INTEGER NOT NULL, wal_end_offset INTEGER NOT NULL)""",
)
"""Schema version 5: the cluster's session state (never in the metadata copy's change log)."""


class _Conn(Protocol):
    def execute(self, sql: str, parameters: Any = ..., /) -> Any: ...


CLUSTER_TABLES = ("node_runtime", "assignments", "takeovers")


def forget_cluster_state(conn: _Conn) -> None:
    """Empty the cluster tables of a restored database: they are never in the copy's change log, so
    a snapshot's rows describe the moment of the snapshot, not the restored state; the restored
    node starts a new session and the cluster's nodes report and request afresh."""
    for table in CLUSTER_TABLES:
        conn.execute(f"DELETE FROM {table}")


_RUNTIME_COLUMNS = "node_id, wal_path, wal_pending_bytes, updated_at_ms"
_ASSIGNMENT_COLUMNS = "stream_id, to_node_id, from_node_id, requested_at_ms"
_TAKEOVER_COLUMNS = (
    "node_id, node_epoch, fence_epoch, wal_path, streams, state, taker_node_id, taker_node_epoch, "
    "attempt, created_at_ms, updated_at_ms, wal_end_offset"
)


def _int(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise CorruptionError(f"expected an integer, found {value!r:.80}", source=where)
    return value


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise CorruptionError(f"expected text, found {value!r:.80}", source=where)
    return value


def _runtime(row: Sequence[Any]) -> NodeRuntime:
    where = f"node_runtime row {row[0]!r}"
    return NodeRuntime(
        NodeId(_int(row[0], where)), _text(row[1], where), _int(row[2], where), _int(row[3], where)
    )


def _assignment(row: Sequence[Any]) -> Assignment:
    where = f"assignments row {row[0]!r}"
    v = [_int(x, where) for x in row]
    return Assignment(StreamId(v[0]), NodeId(v[1]), v[2], v[3])


def encode_streams(streams: Sequence[tuple[StreamId, int]]) -> str:
    """``takeovers.streams``: a JSON array of ``[stream id, stream epoch]`` pairs."""
    return json.dumps([[int(s), int(e)] for s, e in streams], separators=(",", ":"))


def decode_streams(text: object, where: str) -> tuple[tuple[StreamId, int], ...]:
    try:
        pairs = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        pairs = None
    if not isinstance(pairs, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(type(x) is int for x in p) for p in pairs
    ):
        raise CorruptionError(
            f"streams are not a JSON array of [id, epoch] pairs: {text!r:.80}", source=where
        )
    return tuple((StreamId(p[0]), p[1]) for p in pairs)


def _takeover(row: Sequence[Any]) -> TakeoverInfo:
    where = f"takeovers row {row[0]!r}"
    state = _int(row[5], where)
    try:
        takeover_state = TakeoverState(state)
    except ValueError:
        raise CorruptionError(f"TakeoverState has no value {state!r}", source=where) from None
    return TakeoverInfo(
        node_id=NodeId(_int(row[0], where)),
        node_epoch=_int(row[1], where),
        fence_epoch=_int(row[2], where),
        wal_path=_text(row[3], where),
        streams=decode_streams(row[4], where),
        state=takeover_state,
        taker_node_id=_int(row[6], where),
        taker_node_epoch=_int(row[7], where),
        attempt=_int(row[8], where),
        created_at_ms=_int(row[9], where),
        updated_at_ms=_int(row[10], where),
        wal_end_offset=_int(row[11], where),
    )


def node_runtimes(conn: _Conn, node_id: NodeId | None = None) -> list[NodeRuntime]:
    """Every runtime row by node id, or the one of ``node_id``."""
    if node_id is None:
        rows = conn.execute(f"SELECT {_RUNTIME_COLUMNS} FROM node_runtime ORDER BY node_id")
    else:
        rows = conn.execute(f"SELECT {_RUNTIME_COLUMNS} FROM node_runtime WHERE node_id = ?", (node_id,))
    return [_runtime(row) for row in rows]


def assignments(conn: _Conn, stream_id: StreamId | None = None) -> list[Assignment]:
    if stream_id is None:
        rows = conn.execute(f"SELECT {_ASSIGNMENT_COLUMNS} FROM assignments ORDER BY stream_id")
    else:
        rows = conn.execute(
            f"SELECT {_ASSIGNMENT_COLUMNS} FROM assignments WHERE stream_id = ?", (stream_id,)
        )
    return [_assignment(row) for row in rows]


def takeovers(conn: _Conn, node_id: NodeId | None = None) -> list[TakeoverInfo]:
    if node_id is None:
        rows = conn.execute(f"SELECT {_TAKEOVER_COLUMNS} FROM takeovers ORDER BY node_id")
    else:
        rows = conn.execute(f"SELECT {_TAKEOVER_COLUMNS} FROM takeovers WHERE node_id = ?", (node_id,))
    return [_takeover(row) for row in rows]


def _takeover_params(c: PutTakeover) -> tuple[Any, ...]:
    t = c.takeover
    return (
        t.node_id, t.node_epoch, t.fence_epoch, t.wal_path, encode_streams(t.streams), int(t.state),
        t.taker_node_id, t.taker_node_epoch, t.attempt, t.created_at_ms, t.updated_at_ms, t.wal_end_offset,
    )  # fmt: skip


def _upsert(table: str, columns: str, key: str) -> str:
    names = [c.strip() for c in columns.split(",")]
    updates = ", ".join(f"{n} = excluded.{n}" for n in names if n != key)
    marks = ", ".join("?" * len(names))
    return f"INSERT INTO {table} ({columns}) VALUES ({marks}) ON CONFLICT ({key}) DO UPDATE SET {updates}"


STATEMENTS: dict[type[Any], tuple[str, Callable[[Any], tuple[Any, ...]]]] = {
    PutNodeRuntime: (
        _upsert("node_runtime", _RUNTIME_COLUMNS, "node_id"),
        lambda c: (
            c.runtime.node_id,
            c.runtime.wal_path,
            c.runtime.wal_pending_bytes,
            c.runtime.updated_at_ms,
        ),
    ),
    PutAssignment: (
        _upsert("assignments", _ASSIGNMENT_COLUMNS, "stream_id"),
        lambda c: (
            c.assignment.stream_id,
            c.assignment.to_node_id,
            c.assignment.from_node_id,
            c.assignment.requested_at_ms,
        ),
    ),
    RemoveAssignment: ("DELETE FROM assignments WHERE stream_id = ?", lambda c: (c.stream_id,)),
    PutTakeover: (_upsert("takeovers", _TAKEOVER_COLUMNS, "node_id"), _takeover_params),
}
"""Change kind -> (statement, parameters), merged into the shared apply's table."""
