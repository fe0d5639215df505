"""The metadata controller: each operation's preconditions, in AutoMQ's order, and the changes it writes.

Pure decisions: every function reads through a :class:`StateView` and appends
:mod:`~s3stream.metadata.changes` to a :class:`Txn`; it never mutates state. A backend runs one
function per operation and applies ``txn.changes`` atomically only when it returns, so an operation
that raises writes nothing. Both backends (SQLite and the in-memory twin) share this module, so their
semantics cannot drift apart; what differs between them is only how they read and apply.

Reference: ``shared/reference/s3stream-compaction-and-metadata.md`` sections 1.5 and 1.6 (AutoMQ
``main`` behaviour, without failover mode, fast close and historical WAL responsibility).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

from s3stream.errors import (
    ConflictError,
    ErrorCode,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
    OffsetOutOfRangeError,
)
from s3stream.ids import NOOP_OBJECT_ID, NodeId, ObjectId, StreamId
from s3stream.metadata.base import (
    CommitStreamObjectRequest,
    CommitStreamSetObjectRequest,
    ObjectKind,
    ObjectSlice,
    ObjectState,
    RangeMetadata,
    S3ObjectMetadata,
    StreamMetadata,
    StreamObject,
    StreamOffsetRange,
    StreamSetObject,
    StreamState,
)
from s3stream.metadata.changes import (
    Change,
    Counter,
    PutKv,
    PutNode,
    PutObject,
    PutRange,
    PutStream,
    PutStreamObject,
    PutStreamSetObject,
    RemoveKv,
    RemoveObject,
    RemoveRange,
    RemoveStream,
    RemoveStreamObject,
    RemoveStreamSetObject,
    SetCounter,
)

PREPARE_COUNT_MAX = 10_000
"""Object ids one prepare_objects call may allocate."""
TTL_MS_MAX = 7 * 24 * 3600 * 1000
GET_LIMIT_MAX = 100_000
"""Largest ``limit`` of a listing query."""
RANGES_PER_COMMIT_MAX = 100_000
TAG_COUNT_MAX = 64
TAG_CHARS_MAX = 1024
KV_KEY_CHARS_MAX = 1024
KV_VALUE_BYTES_MAX = 1 << 20
OFFSET_MAX = (1 << 63) - 1
"""Offsets, epochs and ids are stored as signed 64-bit integers (SQLite INTEGER)."""


class StreamSetRange(NamedTuple):
    """One StreamSet object's range of one stream, as the read path scans them."""

    object_id: ObjectId
    object_size_bytes: int
    range: StreamOffsetRange


class StateView(Protocol):
    """Read access to the metadata state inside the running transaction."""

    def node_epoch(self, node_id: NodeId) -> int | None: ...

    def stream(self, stream_id: StreamId) -> StreamMetadata | None:
        """With ``ranges`` sorted by range index."""
        ...

    def opened_streams(self) -> list[StreamMetadata]: ...

    def streams(self) -> list[StreamMetadata]:
        """Every stream, by id."""
        ...

    def objects(self, states: frozenset[ObjectState] | None) -> list[S3ObjectMetadata]:
        """Objects in the given states (all when None), by id."""
        ...

    def stream_set_objects(self, node_id: NodeId) -> list[StreamSetObject]:
        """The node's StreamSet objects by order id (then id)."""
        ...

    def destroyable(self, marked_before_ms: int, limit: int) -> list[S3ObjectMetadata]:
        """MARK_DESTROYED objects with ``marked_at_ms < marked_before_ms``, by mark time then id."""
        ...

    def object(self, object_id: ObjectId) -> S3ObjectMetadata | None: ...

    def stream_set_object(self, object_id: ObjectId) -> StreamSetObject | None: ...

    def stream_object(self, object_id: ObjectId) -> StreamObject | None: ...

    def stream_objects_from(self, stream_id: StreamId, offset: int, limit: int) -> list[StreamObject]:
        """The stream's stream objects ending after ``offset``, by start offset (then id)."""
        ...

    def stream_set_ranges_from(
        self, node_id: NodeId, stream_id: StreamId, offset: int
    ) -> list[StreamSetRange]:
        """The node's StreamSet-object ranges of the stream ending after ``offset``, by order id (then id)."""
        ...

    def expired_prepared(self, now_ms: int) -> list[S3ObjectMetadata]:
        """PREPARED objects with ``expires_at_ms < now_ms``, by id."""
        ...

    def next_id(self, counter: Counter) -> int: ...

    def kv(self, key: str) -> bytes | None: ...


class Txn:
    """One operation's view plus the changes it has decided so far."""

    __slots__ = ("changes", "view")

    def __init__(self, view: StateView) -> None:
        self.view = view
        self.changes: list[Change] = []

    def write(self, change: Change) -> None:
        self.changes.append(change)


# -- argument checks -----------------------------------------------------------------------------


def _check_int(name: str, value: object, *, low: int, high: int = OFFSET_MAX) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be an integer in [{low}, {high}], got {value!r}")


def _check_node(node_id: int, node_epoch: int) -> None:
    _check_int("node_id", node_id, low=0)
    _check_int("node_epoch", node_epoch, low=0)


def _check_tags(tags: Mapping[str, str]) -> None:
    if len(tags) > TAG_COUNT_MAX:
        raise InvalidArgumentError(f"at most {TAG_COUNT_MAX} tags, got {len(tags)}")
    for key, value in tags.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidArgumentError(f"tags must map str to str, got {key!r}: {value!r}")
        if not key or len(key) > TAG_CHARS_MAX or len(value) > TAG_CHARS_MAX:
            raise InvalidArgumentError(f"tag key must be 1..{TAG_CHARS_MAX} chars, value at most that")


def _check_span(what: str, start_offset: int, end_offset: int) -> None:
    _check_int(f"{what} start_offset", start_offset, low=0)
    _check_int(f"{what} end_offset", end_offset, low=0)
    if start_offset >= end_offset:
        raise InvalidArgumentError(
            f"{what} must satisfy start_offset < end_offset, got [{start_offset}, {end_offset})"
        )


# -- shared checks (reference 1.5) ---------------------------------------------------------------


def node_epoch_check(view: StateView, node_id: NodeId, node_epoch: int) -> None:
    stored = view.node_epoch(node_id)
    if stored is None:
        raise NotFoundError(f"node {node_id} is not registered", code=ErrorCode.NODE_EPOCH_NOT_EXIST)
    if stored > node_epoch:
        raise FencedError(
            f"node {node_id} epoch {node_epoch} is older than the registered {stored}",
            code=ErrorCode.NODE_EPOCH_EXPIRED,
        )


def ownership_check(view: StateView, stream_id: StreamId, epoch: int, node_id: NodeId) -> StreamMetadata:
    stream = view.stream(stream_id)
    if stream is None:
        raise NotFoundError(f"stream {stream_id} does not exist", code=ErrorCode.STREAM_NOT_EXIST)
    if stream.epoch > epoch:
        raise FencedError(
            f"stream {stream_id} epoch {epoch} is fenced by epoch {stream.epoch}",
            code=ErrorCode.STREAM_FENCED,
        )
    if stream.epoch < epoch:
        raise ConflictError(
            f"stream {stream_id} epoch {epoch} is newer than its epoch {stream.epoch}",
            code=ErrorCode.STREAM_INNER_ERROR,
        )
    if not stream.ranges:
        raise ConflictError(f"stream {stream_id} has no current range", code=ErrorCode.STREAM_INNER_ERROR)
    owner = stream.ranges[-1].node_id
    if owner != node_id:
        raise FencedError(
            f"stream {stream_id} is owned by node {owner}, not node {node_id}", code=ErrorCode.STREAM_FENCED
        )
    return stream


def _put_stream(txn: Txn, stream: StreamMetadata) -> None:
    txn.write(
        PutStream(
            stream_id=stream.stream_id,
            epoch=stream.epoch,
            state=stream.state,
            start_offset=stream.start_offset,
            end_offset=stream.end_offset,
            tags=stream.tags,
        )
    )


# -- nodes and streams ---------------------------------------------------------------------------


def register_node(txn: Txn, *, node_id: NodeId, node_epoch: int) -> list[StreamMetadata]:
    """AutoMQ getOpeningStreams: (re-)register the node, return the OPENED streams it owns."""
    _check_node(node_id, node_epoch)
    stored = txn.view.node_epoch(node_id)
    if stored is not None and node_epoch < stored:
        raise FencedError(
            f"node {node_id} epoch {node_epoch} is older than the registered {stored}",
            code=ErrorCode.NODE_EPOCH_EXPIRED,
        )
    if stored != node_epoch:
        txn.write(PutNode(node_id, node_epoch))
    return [s for s in txn.view.opened_streams() if s.ranges and s.ranges[-1].node_id == node_id]


def create_stream(txn: Txn, *, node_id: NodeId, node_epoch: int, tags: Mapping[str, str] | None) -> StreamId:
    _check_node(node_id, node_epoch)
    tags = dict(tags or {})
    _check_tags(tags)
    node_epoch_check(txn.view, node_id, node_epoch)
    stream_id = StreamId(txn.view.next_id(Counter.STREAM_ID))
    txn.write(SetCounter(Counter.STREAM_ID, stream_id + 1))
    txn.write(PutStream(stream_id, -1, StreamState.CLOSED, 0, 0, tags))
    return stream_id


def _removable_ranges(ranges: Sequence[RangeMetadata], stream_objects: Sequence[StreamObject]) -> list[int]:
    """Indexes of non-last ranges that are empty or inside the first contiguous run of stream objects."""
    run: tuple[int, int] | None = None
    for so in stream_objects:
        if run is None:
            run = (so.start_offset, so.end_offset)
        elif so.start_offset <= run[1]:
            run = (run[0], max(run[1], so.end_offset))
        else:
            break
    removable = []
    for r in ranges[:-1]:
        empty = r.start_offset == r.end_offset
        covered = run is not None and run[0] <= r.start_offset and r.end_offset <= run[1]
        if empty or covered:
            removable.append(r.range_index)
    return removable


def open_stream(
    txn: Txn, *, node_id: NodeId, node_epoch: int, stream_id: StreamId, epoch: int
) -> StreamMetadata:
    _check_node(node_id, node_epoch)
    _check_int("stream_id", stream_id, low=0)
    _check_int("epoch", epoch, low=0)
    view = txn.view
    node_epoch_check(view, node_id, node_epoch)
    stream = view.stream(stream_id)
    if stream is None:
        raise NotFoundError(f"stream {stream_id} does not exist", code=ErrorCode.STREAM_NOT_EXIST)
    if stream.epoch > epoch:
        raise FencedError(
            f"stream {stream_id} epoch {epoch} is fenced by epoch {stream.epoch}",
            code=ErrorCode.STREAM_FENCED,
        )
    if stream.epoch == epoch:  # a retried open, or open -> close -> open with one epoch
        if not stream.ranges:
            raise ConflictError(f"stream {stream_id} has no current range", code=ErrorCode.STREAM_INNER_ERROR)
        owner = stream.ranges[-1].node_id
        if owner != node_id:
            raise FencedError(
                f"stream {stream_id} epoch {epoch} is owned by node {owner}", code=ErrorCode.STREAM_FENCED
            )
        if stream.state == StreamState.CLOSED:
            stream = dataclasses.replace(stream, state=StreamState.OPENED)
            _put_stream(txn, stream)
        return stream
    if stream.state == StreamState.OPENED:
        raise ConflictError(
            f"stream {stream_id} is still opened with epoch {stream.epoch}", code=ErrorCode.STREAM_NOT_CLOSED
        )
    ranges = list(stream.ranges)
    if ranges and ranges[-1].end_offset != stream.end_offset:
        ranges[-1] = dataclasses.replace(ranges[-1], end_offset=stream.end_offset)
        txn.write(PutRange(ranges[-1]))
    next_index = ranges[-1].range_index + 1 if ranges else 0
    new_range = RangeMetadata(stream_id, epoch, next_index, stream.end_offset, stream.end_offset, node_id)
    txn.write(PutRange(new_range))
    ranges.append(new_range)
    removable = _removable_ranges(ranges, view.stream_objects_from(stream_id, -1, GET_LIMIT_MAX))
    for index in removable:
        txn.write(RemoveRange(stream_id, index))
    kept = tuple(r for r in ranges if r.range_index not in removable)
    stream = dataclasses.replace(stream, epoch=epoch, state=StreamState.OPENED, ranges=kept)
    _put_stream(txn, stream)
    return stream


def close_stream(txn: Txn, *, node_id: NodeId, node_epoch: int, stream_id: StreamId, epoch: int) -> None:
    _check_node(node_id, node_epoch)
    _check_int("stream_id", stream_id, low=0)
    _check_int("epoch", epoch, low=0)
    node_epoch_check(txn.view, node_id, node_epoch)
    stream = ownership_check(txn.view, stream_id, epoch, node_id)
    if stream.state == StreamState.CLOSED:
        return
    _put_stream(txn, dataclasses.replace(stream, state=StreamState.CLOSED))


def trim_stream(
    txn: Txn, *, node_id: NodeId, node_epoch: int, stream_id: StreamId, epoch: int, new_start_offset: int
) -> None:
    _check_node(node_id, node_epoch)
    _check_int("stream_id", stream_id, low=0)
    _check_int("epoch", epoch, low=0)
    _check_int("new_start_offset", new_start_offset, low=0)
    node_epoch_check(txn.view, node_id, node_epoch)
    stream = ownership_check(txn.view, stream_id, epoch, node_id)
    if stream.state != StreamState.OPENED:
        raise ConflictError(f"stream {stream_id} is not opened", code=ErrorCode.STREAM_NOT_OPENED)
    if new_start_offset < stream.start_offset:
        raise ConflictError(
            f"stream {stream_id} cannot trim back from {stream.start_offset} to {new_start_offset}",
            code=ErrorCode.OFFSET_NOT_MATCHED,
        )
    if new_start_offset == stream.start_offset:
        return
    end_offset = max(stream.end_offset, new_start_offset)
    _put_stream(txn, dataclasses.replace(stream, start_offset=new_start_offset, end_offset=end_offset))
    last = stream.ranges[-1]
    for r in stream.ranges:
        if r.start_offset >= new_start_offset:
            break
        if r is last:
            end = max(new_start_offset, r.end_offset)
            txn.write(PutRange(dataclasses.replace(r, start_offset=new_start_offset, end_offset=end)))
        elif r.end_offset <= new_start_offset:
            txn.write(RemoveRange(stream_id, r.range_index))
        else:
            txn.write(PutRange(dataclasses.replace(r, start_offset=new_start_offset)))


def delete_stream(txn: Txn, *, stream_id: StreamId, epoch: int, now_ms: int) -> None:
    """No node or epoch check (AutoMQ's topic cleanup passes Long.MAX); a missing stream is a no-op."""
    _check_int("stream_id", stream_id, low=0)
    _check_int("epoch", epoch, low=-1)
    stream = txn.view.stream(stream_id)
    if stream is None:
        return
    if stream.state != StreamState.CLOSED:
        raise ConflictError(f"stream {stream_id} is not closed", code=ErrorCode.STREAM_NOT_CLOSED)
    for so in txn.view.stream_objects_from(stream_id, -1, GET_LIMIT_MAX):
        obj = txn.view.object(so.object_id)
        if obj is None or obj.state == ObjectState.MARK_DESTROYED:
            raise ConflictError(
                f"stream object {so.object_id} of stream {stream_id} is not live",
                code=ErrorCode.STREAM_INNER_ERROR,
            )
        txn.write(PutObject(_marked(obj, now_ms)))
    txn.write(RemoveStream(stream_id))


# -- objects -------------------------------------------------------------------------------------


def _marked(obj: S3ObjectMetadata, now_ms: int) -> S3ObjectMetadata:
    return dataclasses.replace(obj, state=ObjectState.MARK_DESTROYED, marked_at_ms=now_ms)


def _destroy(txn: Txn, obj: S3ObjectMetadata, now_ms: int) -> None:
    """Mark a live object destroyed and drop it from the StreamSet / stream object indexes."""
    txn.write(PutObject(_marked(obj, now_ms)))
    if obj.kind == ObjectKind.STREAM_SET:
        txn.write(RemoveStreamSetObject(obj.object_id))
    elif obj.kind == ObjectKind.STREAM:
        txn.write(RemoveStreamObject(obj.object_id))


def prepare_objects(txn: Txn, *, count: int, ttl_ms: int, now_ms: int) -> ObjectId:
    _check_int("count", count, low=1, high=PREPARE_COUNT_MAX)
    _check_int("ttl_ms", ttl_ms, low=1, high=TTL_MS_MAX)
    first = txn.view.next_id(Counter.OBJECT_ID)
    txn.write(SetCounter(Counter.OBJECT_ID, first + count))
    for object_id in range(first, first + count):
        txn.write(
            PutObject(S3ObjectMetadata(ObjectId(object_id), ObjectState.PREPARED, 0, now_ms, now_ms + ttl_ms))
        )
    return ObjectId(first)


def _committable(view: StateView, object_id: ObjectId) -> S3ObjectMetadata | None:
    """The PREPARED object to commit, or None if it is already COMMITTED (a redundant retry)."""
    obj = view.object(object_id)
    if obj is None or obj.state == ObjectState.MARK_DESTROYED:
        raise NotFoundError(f"object {object_id} is not prepared", code=ErrorCode.OBJECT_NOT_EXIST)
    if obj.state == ObjectState.COMMITTED:
        return None
    return obj


def _committed(obj: S3ObjectMetadata, *, size_bytes: int, kind: ObjectKind, now_ms: int) -> S3ObjectMetadata:
    return dataclasses.replace(
        obj, state=ObjectState.COMMITTED, size_bytes=size_bytes, committed_at_ms=now_ms, kind=kind
    )


def _check_replaced(view: StateView, object_id: ObjectId) -> None:
    """AutoMQ's attribute-only "replace" commit: we keep no attributes, so it only checks the object."""
    obj = view.object(object_id)
    if obj is None:
        raise NotFoundError(f"object {object_id} does not exist", code=ErrorCode.OBJECT_NOT_EXIST)
    if obj.state != ObjectState.COMMITTED:
        raise ConflictError(f"object {object_id} is not committed", code=ErrorCode.OBJECT_NOT_COMMITTED)


def _check_ids(name: str, ids: Sequence[ObjectId]) -> None:
    if len(ids) > RANGES_PER_COMMIT_MAX:
        raise InvalidArgumentError(f"at most {RANGES_PER_COMMIT_MAX} {name}, got {len(ids)}")
    for object_id in ids:
        _check_int(name, object_id, low=0)
    if len(set(ids)) != len(ids):
        raise InvalidArgumentError(f"{name} repeat an id: {list(ids)}")


def _check_stream_set_request(req: CommitStreamSetObjectRequest) -> None:
    _check_node(req.node_id, req.node_epoch)
    _check_int("object_id", req.object_id, low=-1)
    _check_int("order_id", req.order_id, low=-1)
    _check_int("object_size_bytes", req.object_size_bytes, low=0)
    if len(req.stream_ranges) + len(req.stream_objects) > RANGES_PER_COMMIT_MAX:
        raise InvalidArgumentError(f"at most {RANGES_PER_COMMIT_MAX} ranges and stream objects per commit")
    if req.object_id == NOOP_OBJECT_ID and req.stream_ranges:
        raise InvalidArgumentError("stream_ranges need a StreamSet object (object_id is -1)")
    previous = -1
    for r in req.stream_ranges:
        _check_int("stream_id", r.stream_id, low=0)
        if r.stream_id <= previous:
            raise InvalidArgumentError("stream_ranges must be sorted by stream id, one range per stream")
        previous = r.stream_id
        _check_span(f"range of stream {r.stream_id}", r.start_offset, r.end_offset)
        _check_int("range size_bytes", r.size_bytes, low=0)
    so_ids = [so.object_id for so in req.stream_objects]
    _check_ids("stream object ids", so_ids)
    for so in req.stream_objects:
        _check_int("stream object stream_id", so.stream_id, low=0)
        _check_span(f"stream object {so.object_id}", so.start_offset, so.end_offset)
        _check_int("stream object size_bytes", so.size_bytes, low=0)
    _check_ids("compacted_object_ids", req.compacted_object_ids)
    replace = req.compacted_object_ids == (req.object_id,)
    named = set(so_ids) | ({req.object_id} if req.object_id != NOOP_OBJECT_ID else set())
    if len(named) != len(so_ids) + (req.object_id != NOOP_OBJECT_ID) or (
        not replace and named & set(req.compacted_object_ids)
    ):
        raise InvalidArgumentError("a commit names one object twice (new, stream and compacted objects)")


def commit_stream_set_object(txn: Txn, req: CommitStreamSetObjectRequest, *, now_ms: int) -> None:
    _check_stream_set_request(req)
    view = txn.view
    node_epoch_check(view, req.node_id, req.node_epoch)
    if req.object_id != NOOP_OBJECT_ID and req.compacted_object_ids == (req.object_id,):
        _check_replaced(view, req.object_id)
        return
    new_object: S3ObjectMetadata | None = None
    if req.object_id != NOOP_OBJECT_ID:
        new_object = _committable(view, req.object_id)
        if new_object is None:
            return  # REDUNDANT_OPERATION: an idempotent retry
    compaction = bool(req.compacted_object_ids)
    data_times, order_ids = [], []
    for object_id in req.compacted_object_ids:
        obj = view.object(object_id)
        if obj is None or obj.state == ObjectState.MARK_DESTROYED:
            raise ConflictError(
                f"compacted object {object_id} is not live", code=ErrorCode.COMPACTED_OBJECTS_NOT_FOUND
            )
        sso = view.stream_set_object(object_id)
        if sso is not None:
            data_times.append(sso.data_time_ms)
            order_ids.append(sso.order_id)
        _destroy(txn, obj, now_ms)
    if new_object is not None:
        order_id = req.order_id
        if order_id == -1:
            order_id = min(order_ids) if order_ids else req.object_id
        txn.write(
            PutObject(
                _committed(
                    new_object, size_bytes=req.object_size_bytes, kind=ObjectKind.STREAM_SET, now_ms=now_ms
                )
            )
        )
        sso = StreamSetObject(
            object_id=req.object_id,
            node_id=req.node_id,
            order_id=order_id,
            data_time_ms=min(data_times) if data_times else now_ms,
            size_bytes=req.object_size_bytes,
            ranges=tuple(req.stream_ranges),
        )
        txn.write(PutStreamSetObject(sso))
    for nso in req.stream_objects:
        obj = _committable(view, nso.object_id)
        if obj is None:
            txn.changes.clear()  # REDUNDANT_OPERATION on a stream object: the whole request is a no-op
            return
        committed = _committed(obj, size_bytes=nso.size_bytes, kind=ObjectKind.STREAM, now_ms=now_ms)
        if view.stream(nso.stream_id) is None:
            txn.write(PutObject(_marked(committed, now_ms)))  # its stream is gone already
            continue
        txn.write(PutObject(committed))
        so = StreamObject(
            nso.object_id, nso.stream_id, nso.start_offset, nso.end_offset, nso.size_bytes, now_ms
        )
        txn.write(PutStreamObject(so))
    if not compaction:
        _advance_end_offsets(txn, req)


def _advance_end_offsets(txn: Txn, req: CommitStreamSetObjectRequest) -> None:
    """The continuity check of a WAL upload, then the end-offset advance of every stream it extends."""
    spans = [(r.stream_id, r.start_offset, r.end_offset) for r in req.stream_ranges]
    spans += [(so.stream_id, so.start_offset, so.end_offset) for so in req.stream_objects]
    spans.sort()
    ends: dict[StreamId, int] = {}
    streams: dict[StreamId, StreamMetadata] = {}
    for stream_id, start, end in spans:
        stream = streams.get(stream_id) or txn.view.stream(stream_id)
        if stream is None:
            continue  # deleted meanwhile: its data is dropped by compaction
        streams[stream_id] = stream
        if end <= stream.start_offset:
            continue  # a fully trimmed upload: accepted, advances nothing
        if stream.state != StreamState.OPENED:
            raise ConflictError(f"stream {stream_id} is not opened", code=ErrorCode.STREAM_NOT_OPENED)
        if not stream.ranges:
            raise ConflictError(f"stream {stream_id} has no current range", code=ErrorCode.STREAM_INNER_ERROR)
        owner = stream.ranges[-1].node_id
        if owner != req.node_id:
            raise FencedError(
                f"stream {stream_id} is owned by node {owner}, not node {req.node_id}",
                code=ErrorCode.STREAM_FENCED,
            )
        expected = ends.get(stream_id, stream.end_offset)
        # once the trim reached the logical end, an upload may start at or below the trim point
        matched = start == expected if expected > stream.start_offset else start <= stream.start_offset
        if not matched:
            raise ConflictError(
                f"stream {stream_id} range [{start}, {end}) does not continue at end offset {expected}",
                code=ErrorCode.OFFSET_NOT_MATCHED,
            )
        ends[stream_id] = end
    for stream_id, end in ends.items():
        stream = streams[stream_id]
        _put_stream(txn, dataclasses.replace(stream, end_offset=end))
        txn.write(PutRange(dataclasses.replace(stream.ranges[-1], end_offset=end)))


def commit_stream_object(txn: Txn, req: CommitStreamObjectRequest, *, now_ms: int) -> None:
    _check_int("object_id", req.object_id, low=-1)
    _check_int("object_size_bytes", req.object_size_bytes, low=0)
    _check_int("stream_id", req.stream_id, low=0)
    _check_int("stream_epoch", req.stream_epoch, low=-1)
    if req.object_id != NOOP_OBJECT_ID:
        _check_span(f"stream object {req.object_id}", req.start_offset, req.end_offset)
    _check_ids("source_object_ids", req.source_object_ids)
    replace = req.object_id != NOOP_OBJECT_ID and req.source_object_ids == (req.object_id,)
    if req.object_id in req.source_object_ids and not replace:
        raise InvalidArgumentError(f"object {req.object_id} is both the new object and a source")
    view = txn.view
    if replace:
        _check_replaced(view, req.object_id)
        return
    _check_node(req.node_id, req.node_epoch)
    node_epoch_check(view, req.node_id, req.node_epoch)
    if req.stream_epoch != -1:
        ownership_check(view, req.stream_id, req.stream_epoch, req.node_id)
    new_object: S3ObjectMetadata | None = None
    if req.object_id != NOOP_OBJECT_ID:
        new_object = _committable(view, req.object_id)
        if new_object is None:
            return  # REDUNDANT_OPERATION
    data_times = []
    for object_id in req.source_object_ids:
        obj = view.object(object_id)
        if obj is None or obj.state == ObjectState.MARK_DESTROYED:
            raise ConflictError(
                f"source object {object_id} is not live", code=ErrorCode.COMPACTED_OBJECTS_NOT_FOUND
            )
        source = view.stream_object(object_id)
        if source is not None and source.data_time_ms >= 0:
            data_times.append(source.data_time_ms)
        _destroy(txn, obj, now_ms)
    if new_object is None:
        return
    committed = _committed(
        new_object, size_bytes=req.object_size_bytes, kind=ObjectKind.STREAM, now_ms=now_ms
    )
    stream = view.stream(req.stream_id)
    if stream is None:
        txn.write(PutObject(_marked(committed, now_ms)))
        return
    txn.write(PutObject(committed))
    data_time_ms = min(data_times) if data_times else now_ms
    so = StreamObject(
        req.object_id, req.stream_id, req.start_offset, req.end_offset, req.object_size_bytes, data_time_ms
    )
    txn.write(PutStreamObject(so))
    if req.end_offset > stream.end_offset:
        _put_stream(txn, dataclasses.replace(stream, end_offset=req.end_offset))


def expire_prepared(txn: Txn, *, now_ms: int) -> list[ObjectId]:
    _check_int("now_ms", now_ms, low=0)
    expired = txn.view.expired_prepared(now_ms)
    for obj in expired:
        txn.write(PutObject(_marked(obj, now_ms)))
    return [obj.object_id for obj in expired]


def mark_destroyed(txn: Txn, object_ids: Sequence[ObjectId], *, now_ms: int) -> None:
    """Every id must exist; already marked objects stay as they are (idempotent)."""
    _check_ids("object_ids", object_ids)
    _check_int("now_ms", now_ms, low=0)
    for object_id in object_ids:
        obj = txn.view.object(object_id)
        if obj is None:
            raise NotFoundError(f"object {object_id} does not exist", code=ErrorCode.OBJECT_NOT_EXIST)
        if obj.state != ObjectState.MARK_DESTROYED:
            _destroy(txn, obj, now_ms)


def remove_objects(txn: Txn, object_ids: Sequence[ObjectId]) -> None:
    """Forget MARK_DESTROYED objects; ids already gone are skipped, live ones are refused."""
    _check_ids("object_ids", object_ids)
    for object_id in object_ids:
        obj = txn.view.object(object_id)
        if obj is None:
            continue
        if obj.state != ObjectState.MARK_DESTROYED:
            raise ConflictError(f"object {object_id} is {obj.state.name}, not MARK_DESTROYED")
        txn.write(RemoveObject(object_id))


# -- read-side queries ---------------------------------------------------------------------------


def _check_query(start_offset: int, end_offset: int, limit: int) -> None:
    _check_int("start_offset", start_offset, low=0)
    _check_int("end_offset", end_offset, low=-1)
    if end_offset != -1 and end_offset <= start_offset:
        raise InvalidArgumentError(f"end_offset {end_offset} must be -1 or above start_offset {start_offset}")
    _check_int("limit", limit, low=1, high=GET_LIMIT_MAX)


def get_objects(
    view: StateView, *, stream_id: StreamId, start_offset: int, end_offset: int, limit: int
) -> list[ObjectSlice]:
    """AutoMQ's getObjects: stream objects first, then the StreamSet objects of the node owning the range
    that holds the next offset, in order-id order; slices are contiguous from the one holding ``start_offset``."""
    _check_int("stream_id", stream_id, low=0)
    _check_query(start_offset, end_offset, limit)
    stream = view.stream(stream_id)
    if stream is None:
        raise NotFoundError(f"stream {stream_id} does not exist", code=ErrorCode.STREAM_NOT_EXIST)
    if start_offset < stream.start_offset:
        raise OffsetOutOfRangeError(
            f"offset {start_offset} of stream {stream_id} is below {stream.start_offset}"
        )
    out: list[ObjectSlice] = []
    next_offset = start_offset

    def take(object_id: ObjectId, kind: ObjectKind, size_bytes: int, start: int, end: int) -> bool:
        """Append a slice if it continues at ``next_offset``; True when the query is then complete."""
        nonlocal next_offset
        out.append(ObjectSlice(object_id, kind, size_bytes, stream_id, start, end))
        next_offset = end
        return len(out) >= limit or (end_offset != -1 and next_offset >= end_offset)

    def fits(start: int) -> bool:
        return start == next_offset or (not out and start <= next_offset)

    while True:
        round_start = next_offset
        for so in view.stream_objects_from(stream_id, next_offset, limit - len(out)):
            if not fits(so.start_offset):
                break
            if take(so.object_id, ObjectKind.STREAM, so.size_bytes, so.start_offset, so.end_offset):
                return out
        owner = _range_holding(stream.ranges, next_offset)
        if owner is not None:
            for item in view.stream_set_ranges_from(owner.node_id, stream_id, next_offset):
                r = item.range
                if r.end_offset <= next_offset:
                    continue
                if fits(r.start_offset):
                    if take(
                        item.object_id,
                        ObjectKind.STREAM_SET,
                        item.object_size_bytes,
                        r.start_offset,
                        r.end_offset,
                    ):
                        return out
                elif r.start_offset > next_offset:
                    break
        if next_offset == round_start:
            return out


def _range_holding(ranges: Sequence[RangeMetadata], offset: int) -> RangeMetadata | None:
    for i, r in enumerate(ranges):
        last = i == len(ranges) - 1
        if r.start_offset <= offset and (offset < r.end_offset or last):
            return r
    return None


def get_stream_objects(
    view: StateView, *, stream_id: StreamId, start_offset: int, end_offset: int, limit: int
) -> list[StreamObject]:
    """Stream objects overlapping ``[start_offset, end_offset)`` by start offset; gaps possible."""
    _check_int("stream_id", stream_id, low=0)
    _check_query(start_offset, end_offset, limit)
    out = []
    for so in view.stream_objects_from(stream_id, start_offset, limit):
        if end_offset != -1 and so.start_offset >= end_offset:
            break
        out.append(so)
    return out


# -- KV ------------------------------------------------------------------------------------------


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not 1 <= len(key) <= KV_KEY_CHARS_MAX:
        raise InvalidArgumentError(f"a key is a str of 1..{KV_KEY_CHARS_MAX} chars, got {key!r:.80}")


def kv_put(txn: Txn, key: str, value: bytes, *, overwrite: bool) -> bytes:
    """putKV / putKVIfAbsent: without ``overwrite`` an existing value wins and is returned."""
    _check_key(key)
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidArgumentError(f"a value is bytes, got {type(value).__name__}")
    value = bytes(value)
    if len(value) > KV_VALUE_BYTES_MAX:
        raise InvalidArgumentError(f"a value is at most {KV_VALUE_BYTES_MAX} bytes, got {len(value)}")
    if not overwrite:
        existing = txn.view.kv(key)
        if existing is not None:
            return existing
    txn.write(PutKv(key, value))
    return value


def kv_get(view: StateView, key: str) -> bytes | None:
    _check_key(key)
    return view.kv(key)


def kv_delete(txn: Txn, key: str) -> bytes | None:
    """delKV: the old value, or None when the key was absent (KEY_NOT_EXIST counts as success)."""
    _check_key(key)
    existing = txn.view.kv(key)
    if existing is not None:
        txn.write(RemoveKv(key))
    return existing
