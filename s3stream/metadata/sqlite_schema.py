"""The metadata schema: its migrations and the column lists of its tables.

The tables are documented in ``docs/format.md`` section 6. Synchronous code; it runs on the store's
dedicated SQLite thread. The same tables serve PostgreSQL (:mod:`s3stream.metadata.postgres_schema`
turns these statements into its DDL). The statements that read and write them are
:mod:`s3stream.metadata.sql_view` (reads, validated) and :mod:`s3stream.metadata.sql_apply` (changes).
"""

from __future__ import annotations

import sqlite3

from s3stream.errors import ConflictError, CorruptionError, InvalidArgumentError
from s3stream.metadata import cluster_schema, placement_schema

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


# The columns of the tables, in the order the statements read and write them.
OBJECT_COLUMNS = (
    "object_id, state, size_bytes, prepared_at_ms, expires_at_ms, committed_at_ms, marked_at_ms, kind"
)
STREAM_COLUMNS = "stream_id, epoch, state, start_offset, end_offset, tags"
RANGE_COLUMNS = "stream_id, epoch, range_index, start_offset, end_offset, node_id"
SO_COLUMNS = "object_id, stream_id, start_offset, end_offset, size_bytes, data_time_ms"
NODE_COLUMNS = "node_id, node_epoch, lease_expires_at_ms, heartbeat_at_ms, registered_at_ms"
LEASE_COLUMNS = "name, node_id, node_epoch, expires_at_ms"
