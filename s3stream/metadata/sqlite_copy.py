"""The SQLite side of the metadata copy: the change log of each group commit, kept until it is copied.

Tables ``copy_state`` and ``pending_copy`` (``docs/format.md`` section 6; migration 4). The copy is
on for a database whose ``copy_state`` row exists (:func:`enable`); from then on every group commit
that changes anything writes ONE ``pending_copy`` row, inside its own transaction: its sequence
number (``copy_state.next_seq``, counting up from 1, never reused) and its changes
(:mod:`~s3stream.metadata.changelog`). Whoever opens the database writes these rows, so no
committed change can miss the copy; the replicator (:mod:`s3stream.metacopy.replicator`) uploads
them in sequence order and then deletes them (:func:`drop_pending`).

Invariant: the rows of ``pending_copy`` are exactly the groups with a sequence number above the
last one copied to the bucket (a log object or a snapshot covering it), in order, with no gap.

Synchronous code for the store's SQLite thread (inside the transaction the caller holds), except
:func:`snapshot_into`, which opens its own connection.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from s3stream.clock import wall_clock_ms
from s3stream.errors import CorruptionError
from s3stream.metadata.changelog import encode_group
from s3stream.metadata.changes import (
    Change,
    PutAssignment,
    PutLease,
    PutNode,
    PutNodeRuntime,
    PutTakeover,
    RemoveAssignment,
    RemoveLease,
)

SESSION_CHANGES = (
    PutNode,
    PutLease,
    RemoveLease,
    PutNodeRuntime,
    PutTakeover,
    PutAssignment,
    RemoveAssignment,
)
"""Node sessions, leases and the cluster's runtime state (node runtime, takeovers, assignments): the
liveness and coordination of running processes, not data.
They are left out of the change log (a snapshot still holds them): a heartbeat never waits for the
bucket, so an unreachable bucket cannot expire a node's lease, and a restored data dir starts a new
session anyway (its node epoch counts on from the restored one)."""


def copied_changes(changes: Sequence[Change]) -> list[Change]:
    """The changes of an operation that go to the copy: all but :data:`SESSION_CHANGES`."""
    return [change for change in changes if not isinstance(change, SESSION_CHANGES)]


COPY_ID_CHARS = 16
"""A copy id is this many lowercase hex digits (random), one key segment of the copy's objects."""
SNAPSHOT_NONE = -1
"""``copy_state.snapshot_seq`` before the first snapshot is in the bucket (a snapshot taken before
the first group commit covers sequence number 0)."""


@dataclass(frozen=True, slots=True)
class CopyState:
    """The copy's state in one database."""

    copy_id: str
    next_seq: int
    """The sequence number the next group commit gets."""
    last_commit_ms: int
    """Wall-clock ms of the last group commit (-1: none yet)."""
    snapshot_seq: int
    """The sequence number the newest snapshot uploaded covers (:data:`SNAPSHOT_NONE`: none yet)."""
    pending_first_seq: int | None
    """The oldest group not yet copied (None: every group is copied, or none was committed)."""

    @property
    def copied_seq(self) -> int:
        """The last group in the bucket: every group up to it is in the copy (-1: nothing is yet)."""
        if self.snapshot_seq == SNAPSHOT_NONE:
            return -1
        return (self.pending_first_seq if self.pending_first_seq is not None else self.next_seq) - 1


def _int(value: object, where: str) -> int:
    if not isinstance(value, int):
        raise CorruptionError(f"expected an integer, found {value!r}", source=where)
    return value


def next_seq(conn: sqlite3.Connection) -> int | None:
    """``copy_state.next_seq``; None when the copy is off."""
    row = conn.execute("SELECT next_seq FROM copy_state WHERE id = 0").fetchone()
    return None if row is None else _int(row[0], "copy_state.next_seq")


def record_group(conn: sqlite3.Connection, changes: Sequence[Change], *, now_ms: int) -> int:
    """Write one group commit's changes (inside its transaction); returns its sequence number, or the
    last one committed when ``changes`` is empty, or 0 when the copy is off."""
    seq = next_seq(conn)
    if seq is None:
        return 0
    if not changes:
        return seq - 1
    payload = encode_group(changes, committed_at_ms=now_ms)
    conn.execute("INSERT INTO pending_copy (seq, payload) VALUES (?, ?)", (seq, payload))
    conn.execute("UPDATE copy_state SET next_seq = ?, last_commit_ms = ? WHERE id = 0", (seq + 1, now_ms))
    return seq


def state(conn: sqlite3.Connection) -> CopyState | None:
    row = conn.execute(
        "SELECT copy_id, next_seq, last_commit_ms, snapshot_seq FROM copy_state WHERE id = 0"
    ).fetchone()
    if row is None:
        return None
    copy_id = row[0]
    if not isinstance(copy_id, str) or len(copy_id) != COPY_ID_CHARS:
        raise CorruptionError(f"copy_state.copy_id is not a copy id: {copy_id!r:.40}", source="copy_state")
    (first,) = conn.execute("SELECT min(seq) FROM pending_copy").fetchone()
    return CopyState(
        copy_id,
        _int(row[1], "copy_state.next_seq"),
        _int(row[2], "copy_state.last_commit_ms"),
        _int(row[3], "copy_state.snapshot_seq"),
        None if first is None else _int(first, "pending_copy.seq"),
    )


def enable(conn: sqlite3.Connection) -> CopyState:
    """Turn the copy on (a new random copy id) unless it is on; returns its state."""
    found = state(conn)
    if found is not None:
        return found
    copy_id = secrets.token_hex(COPY_ID_CHARS // 2)
    conn.execute(
        "INSERT INTO copy_state (id, copy_id, next_seq, last_commit_ms, snapshot_seq) VALUES (0, ?, 1, -1, ?)",
        (copy_id, SNAPSHOT_NONE),
    )
    return CopyState(copy_id, 1, -1, SNAPSHOT_NONE, None)


def pending(conn: sqlite3.Connection, *, bytes_max: int) -> list[tuple[int, bytes]]:
    """The oldest groups not yet copied, in order: as many as fit in ``bytes_max`` (at least one)."""
    out: list[tuple[int, bytes]] = []
    total = 0
    for seq, payload in conn.execute("SELECT seq, payload FROM pending_copy ORDER BY seq"):
        if not isinstance(payload, bytes):
            raise CorruptionError(f"pending_copy row {seq!r} holds no bytes", source="pending_copy")
        if out and total + len(payload) > bytes_max:
            break
        out.append((_int(seq, "pending_copy.seq"), payload))
        total += len(payload)
    return out


def drop_pending(
    conn: sqlite3.Connection, *, through_seq: int | None = None, snapshot_seq: int | None = None
) -> None:
    """Forget the groups up to ``through_seq`` (they are in a log object); record a new snapshot."""
    if through_seq is not None:
        conn.execute("DELETE FROM pending_copy WHERE seq <= ?", (through_seq,))
    if snapshot_seq is not None:
        conn.execute(
            "UPDATE copy_state SET snapshot_seq = max(snapshot_seq, ?) WHERE id = 0", (snapshot_seq,)
        )


def snapshot_into(path: str, target: str, *, busy_timeout_ms: int) -> int:
    """Write a consistent copy of the database at ``path`` to the new file ``target`` (``VACUUM
    INTO``: one read transaction, so it holds whole group commits only); returns the sequence
    number of the last group it holds, read from the copy itself. Blocking; its own connection, so
    commits go on meanwhile."""
    if os.path.exists(target):
        raise FileExistsError(target)
    conn = sqlite3.connect(path, timeout=busy_timeout_ms / 1000, isolation_level=None)
    try:
        conn.execute("VACUUM INTO ?", (target,))
    finally:
        conn.close()
    copy = sqlite3.connect(target, isolation_level=None)
    try:
        seq = next_seq(copy)
    finally:
        copy.close()
    if seq is None:
        raise CorruptionError("the snapshot holds no copy_state row: the copy is off", source=target)
    return seq - 1


def forget_copy(conn: sqlite3.Connection) -> None:
    """Drop the copy's state from a restored database (its new data dir starts a copy of its own)."""
    conn.execute("DELETE FROM pending_copy")
    conn.execute("DELETE FROM copy_state")


class GroupSeq:
    """The sequence number a group commit got (set before its COMMIT; 0 while the copy is off)."""

    __slots__ = ("seq",)

    def __init__(self) -> None:
        self.seq = 0


class CopyJournal:
    """Collects the changes of the operations of one group commit and writes them as one
    ``pending_copy`` row just before the COMMIT. Used on the store's SQLite thread only."""

    __slots__ = ("_changes", "_group")

    def __init__(self) -> None:
        self._changes: list[Change] = []
        self._group = GroupSeq()

    def begin(self) -> None:
        """A new group commit starts (whatever the last one collected is dropped: it failed or committed)."""
        self._changes = []
        self._group = GroupSeq()

    def add(self, changes: Sequence[Change]) -> GroupSeq:
        """An operation's changes, written (its savepoint released): part of this group commit."""
        self._changes.extend(changes)
        return self._group

    def before_commit(self, conn: sqlite3.Connection) -> None:
        self._group.seq = record_group(conn, self._changes, now_ms=wall_clock_ms())
