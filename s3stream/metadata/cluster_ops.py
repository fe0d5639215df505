"""Cluster metadata operations: stream ownership between nodes, reassignments and takeovers.

The model (``docs/architecture.md``, "Cluster metadata: ownership, assignments, takeovers"; decision
``docs/decisions/0031-cluster-metadata.md``):

* The *owner* of a stream is the node of its last range while the stream is OPENED.
* An *assignment* row ``(stream, to node, from node)`` asks the owner to let the stream go and the
  target to open it; the target's open removes the row in the same transaction. One row per stream:
  a later request overwrites it (a request back to the owner too: the row then targets the owner).
  A row whose target has no valid session is redirected by the controller
  (:func:`redirect_assignments`) to its from node if alive, else the next live node.
* A *takeover* row (one per dead node) records the fencing of a lapsed node session and the
  snapshot of the streams it held OPENED, and which live node (the taker) replays its WAL. At most one
  takeover cluster-wide is PENDING or RUNNING.

Invariants kept here, each inside the one transaction of its operation:

* A stream OPENED by a node whose session is valid is opened by no other node except through
  :func:`takeover_streams`, which a RUNNING takeover of a fenced owner allows.
* :func:`start_takeover` fences before anything else can happen: the node epoch moves past the
  lapsed session (with an expired lease), so no later write of that session commits.
* The taker is named in the takeover row with its node epoch: a taker whose session lapsed and was
  replaced (:func:`reassign_takeover`) can neither take streams nor finish.

Pure decisions over a :class:`~s3stream.metadata.controller.StateView`, like the other ``*_ops``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from s3stream.errors import (
    ConflictError,
    ErrorCode,
    InvalidArgumentError,
    NotFoundError,
    NotOwnerError,
    UnavailableError,
)
from s3stream.ids import NodeId, StreamId
from s3stream.metadata import stream_ops
from s3stream.metadata.base import (
    Assignment,
    RangeMetadata,
    StreamMetadata,
    StreamState,
    TakeoverInfo,
    TakeoverState,
)
from s3stream.metadata.changes import (
    PutAssignment,
    PutNode,
    PutRange,
    PutTakeover,
    RemoveAssignment,
)
from s3stream.metadata.controller import (
    GET_LIMIT_MAX,
    OFFSET_MAX,
    StateView,
    Txn,
    check_int,
    check_node,
    put_stream,
)
from s3stream.metadata.node_ops import IN_FLIGHT, session_check, session_valid

REASSIGN_STREAMS_MAX = GET_LIMIT_MAX
"""Streams one request_reassign call may name."""


def owner_of(stream: StreamMetadata) -> int:
    """The node owning the stream: its last range's node while OPENED; -1 when CLOSED."""
    if stream.state != StreamState.OPENED or not stream.ranges:
        return -1
    return int(stream.ranges[-1].node_id)


def held_by(stream: StreamMetadata, node_id: int) -> bool:
    """Whether ``node_id`` holds the stream open (:func:`owner_of` is that node)."""
    return owner_of(stream) == node_id >= 0


def node_alive(view: StateView, node_id: int, now_ms: int) -> bool:
    """Whether the node has a valid session at ``now_ms`` (its current epoch's lease runs)."""
    if node_id < 0:
        return False
    info = view.node(NodeId(node_id))
    return info is not None and session_valid(info, info.node_epoch, now_ms)


def in_flight_takeover(view: StateView, node_id: NodeId) -> TakeoverInfo | None:
    takeover = view.takeover(node_id)
    return takeover if takeover is not None and takeover.state in IN_FLIGHT else None


# -- ownership checks of open_stream ---------------------------------------------------------------


def refuse_opened_elsewhere(view: StateView, stream: StreamMetadata, node_id: NodeId, now_ms: int) -> None:
    """For an open by ``node_id`` of a stream OPENED by another node: NotOwnerError naming that node
    while its session is valid, else UnavailableError(NODE_TAKEOVER_IN_PROGRESS) (retriable: the
    controller fences it and a taker closes the stream)."""
    owner = owner_of(stream)
    assert owner != -1
    assert owner != node_id
    if node_alive(view, owner, now_ms):
        raise NotOwnerError(f"stream {stream.stream_id} is open on node {owner}", owner_node_id=owner)
    raise UnavailableError(
        f"stream {stream.stream_id} is open on node {owner}, whose session lapsed: it is being taken over",
        code=ErrorCode.NODE_TAKEOVER_IN_PROGRESS,
    )


def claim_assignment(txn: Txn, stream_id: StreamId, node_id: NodeId, now_ms: int) -> None:
    """For an open by ``node_id`` that makes a CLOSED stream OPENED: NotOwnerError when the stream's
    assignment row targets another node with a valid session; otherwise the row (targeting the
    caller, or a node without a valid session) is removed."""
    row = txn.view.assignment(stream_id)
    if row is None:
        return
    if row.to_node_id != node_id and node_alive(txn.view, row.to_node_id, now_ms):
        raise NotOwnerError(
            f"stream {stream_id} is being moved to node {row.to_node_id}", owner_node_id=row.to_node_id
        )
    txn.write(RemoveAssignment(stream_id))


# -- reassignment ------------------------------------------------------------------------------------


def request_reassign(
    txn: Txn, *, stream_ids: Sequence[StreamId], to_node_id: NodeId, now_ms: int
) -> list[Assignment]:
    check_int("to_node_id", to_node_id, low=0)
    try:
        ids = list(stream_ids)
    except TypeError as exc:
        raise InvalidArgumentError(f"stream_ids must be a sequence of ids, got {stream_ids!r:.80}") from exc
    if len(ids) > REASSIGN_STREAMS_MAX:
        raise InvalidArgumentError(f"at most {REASSIGN_STREAMS_MAX} streams per request, got {len(ids)}")
    for stream_id in ids:
        check_int("stream_id", stream_id, low=0)
    view = txn.view
    if not node_alive(view, to_node_id, now_ms):
        raise NotFoundError(f"node {to_node_id} has no valid session", code=ErrorCode.NODE_NOT_ALIVE)
    written: list[Assignment] = []
    for stream_id in sorted(set(ids)):
        stream = view.stream(stream_id)
        if stream is None:
            raise NotFoundError(f"stream {stream_id} does not exist", code=ErrorCode.STREAM_NOT_EXIST)
        owner = owner_of(stream)
        if owner == to_node_id:
            if view.assignment(stream_id) is not None:
                # The later request wins: back to the owner. The row stays, rewritten to target the
                # owner: a move the owner already started ends with the stream CLOSED, and the owner
                # then opens it again (its gain removes the row); an owner that had not started the
                # move settles the row (settle_assignment) while it holds the stream open.
                row = Assignment(stream_id, to_node_id, owner, now_ms)
                txn.write(PutAssignment(row))
                written.append(row)
            continue
        row = Assignment(stream_id, to_node_id, owner, now_ms)
        txn.write(PutAssignment(row))
        written.append(row)
    return written


def settle_assignment(
    txn: Txn, *, stream_id: StreamId, node_id: NodeId, node_epoch: int, now_ms: int
) -> bool:
    """Remove the stream's row if it targets ``node_id``, which holds the stream OPENED (a request
    sent it back to its owner before the owner started moving it). Returns whether a row went."""
    check_int("stream_id", stream_id, low=0)
    check_node(node_id, node_epoch)
    view = txn.view
    session_check(view, node_id, node_epoch, now_ms)
    row = view.assignment(stream_id)
    stream = view.stream(stream_id)
    if row is None or row.to_node_id != node_id or stream is None or owner_of(stream) != node_id:
        return False
    txn.write(RemoveAssignment(stream_id))
    return True


def redirect_assignments(
    txn: Txn, *, stream_ids: Sequence[StreamId], to_node_id: NodeId, now_ms: int
) -> list[Assignment]:
    """Send each named row whose target has no valid session (now, in this transaction) to
    ``to_node_id``, which must have one: the stream goes there instead of waiting for a node that is
    gone. A row that is gone or whose target is alive again is left as it is."""
    check_int("to_node_id", to_node_id, low=0)
    view = txn.view
    if not node_alive(view, to_node_id, now_ms):
        raise NotFoundError(f"node {to_node_id} has no valid session", code=ErrorCode.NODE_NOT_ALIVE)
    written: list[Assignment] = []
    for stream_id in sorted(set(stream_ids)):
        check_int("stream_id", stream_id, low=0)
        row = view.assignment(stream_id)
        if row is None or node_alive(view, row.to_node_id, now_ms) or row.to_node_id == to_node_id:
            continue
        redirected = dataclasses.replace(row, to_node_id=to_node_id, requested_at_ms=now_ms)
        txn.write(PutAssignment(redirected))
        written.append(redirected)
    return written


# -- takeovers ---------------------------------------------------------------------------------------


def _check_taker(
    view: StateView, node_id: NodeId, taker_node_id: int, taker_node_epoch: int, now_ms: int
) -> None:
    if taker_node_id == node_id:
        raise InvalidArgumentError(f"node {node_id} cannot take itself over")
    if not session_valid(view.node(NodeId(taker_node_id)), taker_node_epoch, now_ms):
        raise NotFoundError(
            f"taker node {taker_node_id} epoch {taker_node_epoch} has no valid session",
            code=ErrorCode.NODE_NOT_ALIVE,
        )


def start_takeover(
    txn: Txn, *, node_id: NodeId, node_epoch: int, taker_node_id: int, taker_node_epoch: int, now_ms: int
) -> TakeoverInfo:
    check_node(node_id, node_epoch)
    check_int("taker_node_id", taker_node_id, low=-1)
    check_int("taker_node_epoch", taker_node_epoch, low=-1)
    view = txn.view
    for other in view.takeovers():
        if other.state in IN_FLIGHT:
            raise ConflictError(
                f"the takeover of node {other.node_id} is still {other.state.name}: one at a time",
                code=ErrorCode.NODE_TAKEOVER_IN_PROGRESS,
            )
    info = view.node(node_id)
    if info is None or info.node_epoch != node_epoch:
        current = None if info is None else info.node_epoch
        raise ConflictError(
            f"node {node_id} epoch {node_epoch} is not its current session (current: {current})",
            code=ErrorCode.NODE_FENCED,
        )
    if session_valid(info, node_epoch, now_ms):
        raise ConflictError(
            f"node {node_id} epoch {node_epoch} still holds its lease (until {info.lease_expires_at_ms} ms)",
            code=ErrorCode.NODE_LOCKED,
        )
    if taker_node_id == -1:
        if taker_node_epoch != -1:
            raise InvalidArgumentError("taker_node_epoch must be -1 without a taker")
    else:
        _check_taker(view, node_id, taker_node_id, taker_node_epoch, now_ms)
    if info.node_epoch >= OFFSET_MAX:
        raise ConflictError(f"node {node_id} has no node epoch left", code=ErrorCode.STREAM_INNER_ERROR)
    fence_epoch = node_epoch + 1
    txn.write(PutNode(node_id, fence_epoch, now_ms, info.heartbeat_at_ms, info.registered_at_ms))
    streams = tuple((s.stream_id, s.epoch) for s in view.opened_streams() if owner_of(s) == node_id)
    for row in view.assignments():
        if row.to_node_id == node_id:
            txn.write(RemoveAssignment(row.stream_id))
    runtime = view.node_runtime(node_id)
    if not streams:
        state, taker_node_id, taker_node_epoch, attempt = TakeoverState.DONE, -1, -1, 0
    elif taker_node_id == -1:
        state, attempt = TakeoverState.PENDING, 0
    else:
        state, attempt = TakeoverState.RUNNING, 1
    takeover = TakeoverInfo(
        node_id=node_id,
        node_epoch=node_epoch,
        fence_epoch=fence_epoch,
        wal_path="" if runtime is None else runtime.wal_path,
        streams=streams,
        state=state,
        taker_node_id=taker_node_id,
        taker_node_epoch=taker_node_epoch,
        attempt=attempt,
        created_at_ms=now_ms,
        updated_at_ms=now_ms,
    )
    txn.write(PutTakeover(takeover))
    return takeover


def reassign_takeover(
    txn: Txn, *, node_id: NodeId, taker_node_id: NodeId, taker_node_epoch: int, now_ms: int
) -> TakeoverInfo:
    check_int("node_id", node_id, low=0)
    check_node(taker_node_id, taker_node_epoch)
    view = txn.view
    takeover = in_flight_takeover(view, node_id)
    if takeover is None:
        raise ConflictError(f"no takeover of node {node_id} is in flight", code=ErrorCode.STREAM_INNER_ERROR)
    _check_taker(view, node_id, taker_node_id, taker_node_epoch, now_ms)
    updated = dataclasses.replace(
        takeover,
        state=TakeoverState.RUNNING,
        taker_node_id=taker_node_id,
        taker_node_epoch=taker_node_epoch,
        attempt=takeover.attempt + 1,
        updated_at_ms=now_ms,
    )
    txn.write(PutTakeover(updated))
    return updated


def _running_for(
    view: StateView, node_id: NodeId, taker_node_id: NodeId, taker_node_epoch: int, now_ms: int
) -> TakeoverInfo:
    """The takeover of ``node_id`` if it is RUNNING with this taker, whose session is valid."""
    check_int("node_id", node_id, low=0)
    check_node(taker_node_id, taker_node_epoch)
    session_check(view, taker_node_id, taker_node_epoch, now_ms)
    takeover = view.takeover(node_id)
    if (
        takeover is None
        or takeover.state != TakeoverState.RUNNING
        or (takeover.taker_node_id, takeover.taker_node_epoch) != (taker_node_id, taker_node_epoch)
    ):
        found = (
            "none"
            if takeover is None
            else (
                f"{takeover.state.name} with taker {takeover.taker_node_id} epoch {takeover.taker_node_epoch}"
            )
        )
        raise ConflictError(
            f"the takeover of node {node_id} is not running with taker {taker_node_id} epoch "
            f"{taker_node_epoch} (found: {found})",
            code=ErrorCode.NODE_FENCED,
        )
    return takeover


def takeover_streams(
    txn: Txn, *, node_id: NodeId, taker_node_id: NodeId, taker_node_epoch: int, now_ms: int
) -> list[tuple[StreamMetadata, int]]:
    view = txn.view
    takeover = _running_for(view, node_id, taker_node_id, taker_node_epoch, now_ms)
    taken: list[tuple[StreamMetadata, int]] = []
    for stream_id, dead_epoch in sorted(takeover.streams):
        stream = view.stream(stream_id)
        if stream is None or stream.state != StreamState.OPENED:
            continue
        if owner_of(stream) == taker_node_id and stream.epoch > dead_epoch:
            taken.append((stream, dead_epoch))  # taken by this taker already (a retried call)
            continue
        if stream.epoch >= OFFSET_MAX:
            raise ConflictError(f"stream {stream_id} has no epoch left", code=ErrorCode.STREAM_INNER_ERROR)
        taken.append((new_range(txn, stream, node_id=taker_node_id, epoch=stream.epoch + 1), dead_epoch))
    if taken:
        txn.write(PutTakeover(dataclasses.replace(takeover, updated_at_ms=now_ms)))
    return taken


def new_range(txn: Txn, stream: StreamMetadata, *, node_id: NodeId, epoch: int) -> StreamMetadata:
    """Open ``stream`` as ``node_id`` at ``epoch``: the last range sealed at the end offset, a new
    range ``[end, end)`` owned by ``node_id``; returns the stream after (OPENED). The caller has
    checked that the open is allowed."""
    ranges = list(stream.ranges)
    if ranges and ranges[-1].end_offset != stream.end_offset:
        ranges[-1] = dataclasses.replace(ranges[-1], end_offset=stream.end_offset)
        txn.write(PutRange(ranges[-1]))
    next_index = ranges[-1].range_index + 1 if ranges else 0
    added = RangeMetadata(stream.stream_id, epoch, next_index, stream.end_offset, stream.end_offset, node_id)
    txn.write(PutRange(added))
    ranges.append(added)
    opened = dataclasses.replace(stream, epoch=epoch, state=StreamState.OPENED, ranges=tuple(ranges))
    put_stream(txn, opened)
    return opened


def finish_takeover(
    txn: Txn,
    *,
    node_id: NodeId,
    taker_node_id: NodeId,
    taker_node_epoch: int,
    wal_end_offset: int,
    now_ms: int,
) -> TakeoverInfo:
    check_int("wal_end_offset", wal_end_offset, low=-1)
    view = txn.view
    takeover = _running_for(view, node_id, taker_node_id, taker_node_epoch, now_ms)
    for stream_id, _ in takeover.streams:
        stream = view.stream(stream_id)
        if stream is not None and owner_of(stream) == taker_node_id:
            put_stream(txn, dataclasses.replace(stream, state=StreamState.CLOSED))
    if wal_end_offset > 0 and stream_ops.kv_applied_offset(view, node_id=node_id) < wal_end_offset - 1:
        # What the taker read is applied (or had no KV changes); a record above it was written after
        # the fence and never acknowledged: the dead node's next session must not apply it.
        stream_ops.kv_apply(txn, writes=[], node_id=node_id, wal_offset=wal_end_offset - 1)
    done = dataclasses.replace(
        takeover, state=TakeoverState.DONE, wal_end_offset=wal_end_offset, updated_at_ms=now_ms
    )
    txn.write(PutTakeover(done))
    return done


# -- takeover attempts that fail (decision 0045) -------------------------------------------------------


def report_takeover_progress(
    txn: Txn, *, node_id: NodeId, taker_node_id: NodeId, taker_node_epoch: int, now_ms: int
) -> TakeoverInfo:
    takeover = _running_for(txn.view, node_id, taker_node_id, taker_node_epoch, now_ms)
    updated = dataclasses.replace(takeover, updated_at_ms=now_ms)
    txn.write(PutTakeover(updated))
    return updated


def give_back_takeover(
    txn: Txn, *, node_id: NodeId, taker_node_id: NodeId, taker_node_epoch: int, now_ms: int
) -> TakeoverInfo:
    takeover = _running_for(txn.view, node_id, taker_node_id, taker_node_epoch, now_ms)
    pending = dataclasses.replace(
        takeover, state=TakeoverState.PENDING, taker_node_id=-1, taker_node_epoch=-1, updated_at_ms=now_ms
    )
    txn.write(PutTakeover(pending))
    return pending


def fail_takeover(txn: Txn, *, node_id: NodeId, now_ms: int) -> TakeoverInfo:
    """FAILED; each snapshot stream a taker holds OPENED goes back to the dead node (new range at
    epoch + 1: a taker still running is fenced off it), so the dead node's next session, which
    ``register_node`` hands its OPENED streams, replays them from its own WAL."""
    check_int("node_id", node_id, low=0)
    view = txn.view
    takeover = in_flight_takeover(view, node_id)
    if takeover is None:
        raise ConflictError(f"no takeover of node {node_id} is in flight", code=ErrorCode.STREAM_INNER_ERROR)
    for stream_id, dead_epoch in sorted(takeover.streams):
        stream = view.stream(stream_id)
        if stream is None or stream.state != StreamState.OPENED or owner_of(stream) == node_id:
            continue  # gone, or never taken: still the dead node's
        if stream.epoch <= dead_epoch or stream.epoch >= OFFSET_MAX:
            continue
        new_range(txn, stream, node_id=node_id, epoch=stream.epoch + 1)
    failed = dataclasses.replace(
        takeover, state=TakeoverState.FAILED, taker_node_id=-1, taker_node_epoch=-1, updated_at_ms=now_ms
    )
    txn.write(PutTakeover(failed))
    return failed
