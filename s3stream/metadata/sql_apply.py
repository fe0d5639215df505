"""Writing the metadata tables: a transaction's changes as statements, runs of one kind batched.

Synchronous code; it runs inside a transaction the caller holds, on any
:class:`~s3stream.metadata.sql_view.SqlConnection` with its
:class:`~s3stream.metadata.sql_view.Dialect`. The tables: :mod:`s3stream.metadata.sqlite_schema`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any, cast

from s3stream.metadata import cluster_schema, placement_schema
from s3stream.metadata.changes import (
    AdvanceEndOffsets,
    Change,
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
from s3stream.metadata.sql_view import SQLITE_DIALECT, Dialect, SqlConnection
from s3stream.metadata.sqlite_schema import (
    LEASE_COLUMNS,
    NODE_COLUMNS,
    OBJECT_COLUMNS,
    RANGE_COLUMNS,
    SO_COLUMNS,
    STREAM_COLUMNS,
)

# -- applying changes ----------------------------------------------------------------------------

_UPSERT_OBJECT = (
    f"INSERT INTO objects ({OBJECT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (object_id) DO UPDATE SET "
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
        f"INSERT INTO nodes ({NODE_COLUMNS}) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (node_id) DO UPDATE SET node_epoch = excluded.node_epoch, "
        "lease_expires_at_ms = excluded.lease_expires_at_ms, heartbeat_at_ms = excluded.heartbeat_at_ms, "
        "registered_at_ms = excluded.registered_at_ms",
        lambda c: (c.node_id, c.node_epoch, c.lease_expires_at_ms, c.heartbeat_at_ms, c.registered_at_ms),
    ),
    PutLease: (
        f"INSERT INTO leases ({LEASE_COLUMNS}) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (name) DO UPDATE SET node_id = excluded.node_id, node_epoch = excluded.node_epoch, "
        "expires_at_ms = excluded.expires_at_ms",
        lambda c: (c.lease.name, c.lease.node_id, c.lease.node_epoch, c.lease.expires_at_ms),
    ),
    RemoveLease: ("DELETE FROM leases WHERE name = ?", lambda c: (c.name,)),
    PutStream: (
        f"INSERT INTO streams ({STREAM_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (stream_id) DO UPDATE SET "
        "epoch = excluded.epoch, state = excluded.state, start_offset = excluded.start_offset, "
        "end_offset = excluded.end_offset, tags = excluded.tags",
        _stream_params,
    ),
    PutRange: (
        f"INSERT INTO ranges ({RANGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) "
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
        f"INSERT INTO stream_objects ({SO_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (object_id) DO UPDATE SET "
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
