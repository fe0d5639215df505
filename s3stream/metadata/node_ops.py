"""Node sessions and named leases: database-issued node epochs, lease renewal, fencing, elections.

A *session* is ``(node_id, node_epoch)``. :func:`open_node` issues the epoch (the stored one + 1),
so the database, not a wall clock, orders a node's sessions, and a new session fences every older
one of the same node. A session is *valid* at time ``now_ms`` (the store's clock) when its epoch is
the node's current one and its lease has not expired (``now_ms < lease_expires_at_ms``; an unleased
session, ``-1``, never expires). An expired session is never revived: the node must open again.

A named lease (the maintenance election) is *held* by a session while that session is valid and
``now_ms < expires_at_ms``; one not held may be taken by any valid session.

A :class:`Guard` is what a bound store checks at the start of each of its write transactions
(:meth:`~s3stream.metadata.store.TransactionalStore.bind_node`, ``bind_lease``): the session is valid
and, for a lease guard, holds the lease; else FencedError(NODE_FENCED) and nothing is written.
Decision record: ``docs/decisions/0024-node-epochs-leases-and-fencing.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from s3stream.errors import (
    ConflictError,
    ErrorCode,
    FencedError,
    InvalidArgumentError,
    UnavailableError,
)
from s3stream.ids import NodeId
from s3stream.metadata.base import LeaseInfo, NodeInfo, NodeRuntime, TakeoverState
from s3stream.metadata.changes import PutLease, PutNode, PutNodeRuntime, RemoveLease
from s3stream.metadata.controller import OFFSET_MAX, StateView, Txn, check_int, check_node

LEASE_MS_MAX = 24 * 3600 * 1000
"""Longest lease one call may grant (node leases and named leases)."""
LEASE_NAME_CHARS_MAX = 256
NO_LEASE = -1
"""``lease_expires_at_ms`` of an unleased session (registered by ``register_node``)."""
WAL_PATH_CHARS_MAX = 4096
"""Longest WAL path a node may record in its runtime row."""
IN_FLIGHT = frozenset({TakeoverState.PENDING, TakeoverState.RUNNING})
"""The states of a takeover still in progress (at most one row cluster-wide)."""


@dataclass(frozen=True, slots=True)
class Guard:
    """What a bound store requires of each write transaction: a valid session, and the lease
    ``lease_name`` held by it unless that is None."""

    node_id: NodeId
    node_epoch: int
    lease_name: str | None = None


def check_lease_name(name: object) -> None:
    if not isinstance(name, str) or not 1 <= len(name) <= LEASE_NAME_CHARS_MAX:
        raise InvalidArgumentError(
            f"a lease name is a str of 1..{LEASE_NAME_CHARS_MAX} chars, got {name!r:.80}"
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(f"a lease name must be encodable as UTF-8, got {name!r:.80}") from exc


def _check_lease_ms(lease_ms: int) -> None:
    check_int("lease_ms", lease_ms, low=1, high=LEASE_MS_MAX)


def _expired(expires_at_ms: int, now_ms: int) -> bool:
    return expires_at_ms != NO_LEASE and now_ms >= expires_at_ms


def session_valid(info: NodeInfo | None, node_epoch: int, now_ms: int) -> bool:
    """Whether ``node_epoch`` is the current epoch of the node ``info`` and its lease runs."""
    return (
        info is not None and info.node_epoch == node_epoch and not _expired(info.lease_expires_at_ms, now_ms)
    )


def session_check(view: StateView, node_id: NodeId, node_epoch: int, now_ms: int) -> NodeInfo:
    """The node's row if the session is valid; else FencedError (an unknown node has no session)."""
    info = view.node(node_id)
    if info is None:
        raise FencedError(f"node {node_id} is not registered: no session", code=ErrorCode.NODE_FENCED)
    if info.node_epoch != node_epoch:
        raise FencedError(
            f"node {node_id} session epoch {node_epoch} is not the current epoch {info.node_epoch}",
            code=ErrorCode.NODE_FENCED,
        )
    if _expired(info.lease_expires_at_ms, now_ms):
        raise FencedError(
            f"node {node_id} epoch {node_epoch}: its lease expired at {info.lease_expires_at_ms} ms "
            f"(now {now_ms} ms)",
            code=ErrorCode.NODE_FENCED,
        )
    return info


def _held(view: StateView, lease: LeaseInfo | None, now_ms: int) -> bool:
    if lease is None or now_ms >= lease.expires_at_ms:
        return False
    return session_valid(view.node(lease.node_id), lease.node_epoch, now_ms)


def check_guard(view: StateView, guard: Guard, now_ms: int) -> None:
    """Raise unless the guard's session is valid and holds its lease (inside the write transaction)."""
    session_check(view, guard.node_id, guard.node_epoch, now_ms)
    if guard.lease_name is None:
        return
    lease = view.lease(guard.lease_name)
    if lease is None or (lease.node_id, lease.node_epoch) != (guard.node_id, guard.node_epoch):
        raise FencedError(
            f"node {guard.node_id} epoch {guard.node_epoch} does not hold the lease {guard.lease_name!r}",
            code=ErrorCode.NODE_FENCED,
        )
    if now_ms >= lease.expires_at_ms:
        raise FencedError(
            f"node {guard.node_id} epoch {guard.node_epoch}: the lease {guard.lease_name!r} expired at "
            f"{lease.expires_at_ms} ms (now {now_ms} ms)",
            code=ErrorCode.NODE_FENCED,
        )


# -- node sessions -------------------------------------------------------------------------------


def check_wal_path(wal_path: object) -> None:
    if not isinstance(wal_path, str) or len(wal_path) > WAL_PATH_CHARS_MAX:
        raise InvalidArgumentError(
            f"a WAL path is a str of at most {WAL_PATH_CHARS_MAX} chars, got {wal_path!r:.80}"
        )
    try:
        wal_path.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(f"a WAL path must be encodable as UTF-8, got {wal_path!r:.80}") from exc


def open_node(txn: Txn, *, node_id: NodeId, lease_ms: int, now_ms: int, wal_path: str = "") -> NodeInfo:
    """A new session (and the node's runtime row with ``wal_path``); refused, writing nothing, while a
    takeover of the node is in flight: the taker replays its WAL, which a new session would write."""
    check_int("node_id", node_id, low=0)
    _check_lease_ms(lease_ms)
    check_wal_path(wal_path)
    takeover = txn.view.takeover(node_id)
    if takeover is not None and takeover.state in IN_FLIGHT:
        raise UnavailableError(
            f"node {node_id} is being taken over (state {takeover.state.name}, taker "
            f"{takeover.taker_node_id}): open it again once the takeover is done",
            code=ErrorCode.NODE_TAKEOVER_IN_PROGRESS,
        )
    stored = txn.view.node(node_id)
    if stored is not None and stored.node_epoch >= OFFSET_MAX:
        raise ConflictError(f"node {node_id} has no node epoch left", code=ErrorCode.STREAM_INNER_ERROR)
    epoch = 1 if stored is None else max(stored.node_epoch + 1, 1)
    info = NodeInfo(node_id, epoch, now_ms + lease_ms, now_ms, now_ms)
    txn.write(PutNode(node_id, epoch, info.lease_expires_at_ms, now_ms, now_ms))
    txn.write(PutNodeRuntime(NodeRuntime(node_id, wal_path, -1, now_ms)))
    return info


def heartbeat(
    txn: Txn, *, node_id: NodeId, node_epoch: int, lease_ms: int, now_ms: int, wal_pending_bytes: int = -1
) -> NodeInfo:
    """Renew a valid session's lease (an unleased session gets a lease from now on) and record
    ``wal_pending_bytes`` in the node's runtime row (its WAL path kept)."""
    check_node(node_id, node_epoch)
    _check_lease_ms(lease_ms)
    check_int("wal_pending_bytes", wal_pending_bytes, low=-1)
    info = session_check(txn.view, node_id, node_epoch, now_ms)
    renewed = NodeInfo(node_id, node_epoch, now_ms + lease_ms, now_ms, info.registered_at_ms)
    txn.write(PutNode(node_id, node_epoch, renewed.lease_expires_at_ms, now_ms, info.registered_at_ms))
    runtime = txn.view.node_runtime(node_id)
    wal_path = "" if runtime is None else runtime.wal_path
    txn.write(PutNodeRuntime(NodeRuntime(node_id, wal_path, wal_pending_bytes, now_ms)))
    return renewed


def close_node(txn: Txn, *, node_id: NodeId, node_epoch: int, now_ms: int) -> None:
    """End a valid session now and release its leases; a fenced session (or an unknown node) is
    left as it is."""
    check_node(node_id, node_epoch)
    info = txn.view.node(node_id)
    if info is None or not session_valid(info, node_epoch, now_ms):
        return
    txn.write(PutNode(node_id, node_epoch, now_ms, info.heartbeat_at_ms, info.registered_at_ms))
    for lease in txn.view.leases():
        if (lease.node_id, lease.node_epoch) == (node_id, node_epoch):
            txn.write(RemoveLease(lease.name))


# -- named leases ----------------------------------------------------------------------------------


def acquire_lease(
    txn: Txn, *, name: str, node_id: NodeId, node_epoch: int, lease_ms: int, now_ms: int
) -> LeaseInfo:
    """Take or renew the lease unless another valid session holds it; returns the holder after."""
    check_lease_name(name)
    check_node(node_id, node_epoch)
    _check_lease_ms(lease_ms)
    view = txn.view
    session_check(view, node_id, node_epoch, now_ms)
    current = view.lease(name)
    mine = current is not None and (current.node_id, current.node_epoch) == (node_id, node_epoch)
    if current is not None and not mine and _held(view, current, now_ms):
        return current
    lease = LeaseInfo(name, node_id, node_epoch, now_ms + lease_ms)
    txn.write(PutLease(lease))
    return lease


def release_lease(txn: Txn, *, name: str, node_id: NodeId, node_epoch: int) -> None:
    check_lease_name(name)
    check_node(node_id, node_epoch)
    current = txn.view.lease(name)
    if current is not None and (current.node_id, current.node_epoch) == (node_id, node_epoch):
        txn.write(RemoveLease(name))


def get_lease(view: StateView, name: str, *, now_ms: int) -> LeaseInfo | None:
    check_lease_name(name)
    lease = view.lease(name)
    return lease if _held(view, lease, now_ms) else None
