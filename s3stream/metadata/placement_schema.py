"""The SQL of the ``object_buckets`` table (schema version 6): which buckets hold an object.

Documented in ``docs/format.md`` section 6 ("Object placement"); the statements run on SQLite and,
through the same rewrite as every other statement, on PostgreSQL. Row values read back are validated:
a value outside its domain raises :class:`~s3stream.errors.CorruptionError`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from s3stream.errors import CorruptionError
from s3stream.ids import ObjectId
from s3stream.metadata.base import ObjectState
from s3stream.metadata.changes import PutPlacement, RemovePlacements

MIGRATION: tuple[str, ...] = (
    """CREATE TABLE object_buckets (
        object_id INTEGER NOT NULL, bucket_id INTEGER NOT NULL,
        PRIMARY KEY (object_id, bucket_id))""",
)
"""Schema version 6: object placement over several buckets (copied to the bucket like objects)."""

_IDS_PER_QUERY = 500
"""Object ids per ``IN (...)`` list (SQLite's default limit is 999 host parameters)."""


class _Conn(Protocol):
    def execute(self, sql: str, parameters: Any = ..., /) -> Any: ...


def _int(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise CorruptionError(f"expected an integer >= 0, found {value!r:.80}", source=where)
    return value


def placements(conn: _Conn, object_ids: Sequence[ObjectId]) -> dict[ObjectId, tuple[int, ...]]:
    """The recorded buckets of each object that has rows, bucket ids ascending."""
    found: dict[ObjectId, list[int]] = {}
    unique = sorted(set(object_ids))
    for start in range(0, len(unique), _IDS_PER_QUERY):
        chunk = unique[start : start + _IDS_PER_QUERY]
        marks = ", ".join("?" * len(chunk))
        rows = conn.execute(
            f"SELECT object_id, bucket_id FROM object_buckets WHERE object_id IN ({marks}) "
            "ORDER BY object_id, bucket_id",
            tuple(chunk),
        )
        for row in rows:
            object_id = ObjectId(_int(row[0], "object_buckets"))
            found.setdefault(object_id, []).append(_int(row[1], f"object_buckets row {object_id}"))
    return {object_id: tuple(ids) for object_id, ids in found.items()}


def bucket_usage(conn: _Conn, unplaced_bucket_id: int) -> dict[int, tuple[int, int]]:
    """``{bucket id: (objects, bytes)}`` over COMMITTED objects; an object without rows counts for
    ``unplaced_bucket_id``, one with several rows for each of its buckets."""
    usage: dict[int, tuple[int, int]] = {}
    rows = conn.execute(
        "SELECT b.bucket_id, COUNT(*), CAST(COALESCE(SUM(o.size_bytes), 0) AS BIGINT) FROM objects o "
        "LEFT JOIN object_buckets b ON b.object_id = o.object_id WHERE o.state = ? GROUP BY b.bucket_id",
        (int(ObjectState.COMMITTED),),
    )
    for row in rows:
        bucket_id = unplaced_bucket_id if row[0] is None else _int(row[0], "object_buckets")
        count, size = usage.get(bucket_id, (0, 0))
        usage[bucket_id] = (count + _int(row[1], "object_buckets"), size + _int(row[2], "object_buckets"))
    return usage


STATEMENTS: dict[type[Any], tuple[str, Callable[[Any], tuple[Any, ...]]]] = {
    PutPlacement: (
        "INSERT INTO object_buckets (object_id, bucket_id) VALUES (?, ?) ON CONFLICT DO NOTHING",
        lambda c: (c.object_id, c.bucket_id),
    ),
    RemovePlacements: ("DELETE FROM object_buckets WHERE object_id = ?", lambda c: (c.object_id,)),
}
"""Change kind -> (statement, parameters), merged into the shared apply's table."""
