"""Object operations: prepare, commit StreamSet and stream objects, the lifecycle to removal.

``docs/automq-model.md`` sections 6-8 (prepareObject, commitStreamSetObject with its continuity check,
commitStreamObject; prepared-object expiry; mark-destroy and removal).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from s3stream.errors import (
    ConflictError,
    ErrorCode,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
)
from s3stream.ids import NOOP_OBJECT_ID, ObjectId, StreamId
from s3stream.metadata.base import (
    CommitStreamObjectRequest,
    CommitStreamSetObjectRequest,
    ObjectKind,
    ObjectState,
    S3ObjectMetadata,
    StreamObject,
    StreamSetObject,
    StreamState,
)
from s3stream.metadata.changes import (
    AdvanceEndOffsets,
    Counter,
    PutObject,
    PutStreamObject,
    PutStreamSetObject,
    RemoveObject,
    RemovePlacements,
    RemoveStreamObject,
    RemoveStreamSetObject,
    SetCounter,
)
from s3stream.metadata.controller import (
    OFFSET_MAX,
    PREPARE_MAX_COUNT,
    RANGES_PER_COMMIT_MAX,
    TTL_MAX_MS,
    StateView,
    Txn,
    check_int,
    check_node,
    check_span,
    marked,
    node_epoch_check,
    ownership_check,
    put_stream,
)


def _destroy(txn: Txn, obj: S3ObjectMetadata, now_ms: int) -> None:
    """Mark a live object destroyed and drop it from the StreamSet / stream object indexes."""
    txn.write(PutObject(marked(obj, now_ms)))
    if obj.kind == ObjectKind.STREAM_SET:
        txn.write(RemoveStreamSetObject(obj.object_id))
    elif obj.kind == ObjectKind.STREAM:
        txn.write(RemoveStreamObject(obj.object_id))


def prepare_objects(txn: Txn, *, count: int, ttl_ms: int, now_ms: int) -> ObjectId:
    check_int("count", count, low=1, high=PREPARE_MAX_COUNT)
    check_int("ttl_ms", ttl_ms, low=1, high=TTL_MAX_MS)
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
        check_int(name, object_id, low=0)
    if len(set(ids)) != len(ids):
        raise InvalidArgumentError(f"{name} repeat an id: {list(ids)}")


def _check_stream_set_request(req: CommitStreamSetObjectRequest) -> None:
    check_node(req.node_id, req.node_epoch)
    check_int("object_id", req.object_id, low=-1)
    check_int("order_id", req.order_id, low=-1)
    check_int("object_size_bytes", req.object_size_bytes, low=0)
    if len(req.stream_ranges) + len(req.stream_objects) > RANGES_PER_COMMIT_MAX:
        raise InvalidArgumentError(f"at most {RANGES_PER_COMMIT_MAX} ranges and stream objects per commit")
    if req.object_id == NOOP_OBJECT_ID and req.stream_ranges:
        raise InvalidArgumentError("stream_ranges need a StreamSet object (object_id is -1)")
    previous = -1
    for r in req.stream_ranges:
        sid, start, end, size = r.stream_id, r.start_offset, r.end_offset, r.size_bytes
        if (  # the common case in one expression; anything else takes the checks below for its error
            type(sid) is int and type(start) is int and type(end) is int and type(size) is int
            and previous < sid <= OFFSET_MAX and 0 <= start < end <= OFFSET_MAX and 0 <= size <= OFFSET_MAX
        ):  # fmt: skip
            previous = sid
            continue
        check_int("stream_id", r.stream_id, low=0)
        if r.stream_id <= previous:
            raise InvalidArgumentError("stream_ranges must be sorted by stream id, one range per stream")
        previous = r.stream_id
        check_span(f"range of stream {r.stream_id}", r.start_offset, r.end_offset)
        check_int("range size_bytes", r.size_bytes, low=0)
    so_ids = [so.object_id for so in req.stream_objects]
    _check_ids("stream object ids", so_ids)
    for so in req.stream_objects:
        check_int("stream object stream_id", so.stream_id, low=0)
        check_span(f"stream object {so.object_id}", so.start_offset, so.end_offset)
        check_int("stream object size_bytes", so.size_bytes, low=0)
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
    data_time_ms = min(data_times) if data_times else now_ms  # a compaction keeps its data's age
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
            data_time_ms=data_time_ms,
            size_bytes=req.object_size_bytes,
            ranges=tuple(req.stream_ranges),
        )
        txn.write(PutStreamSetObject(sso))
    if not _commit_stream_objects(txn, req, data_time_ms=data_time_ms, now_ms=now_ms):
        txn.changes.clear()  # REDUNDANT_OPERATION on a stream object: the whole request is a no-op
        return
    if not compaction:
        _advance_end_offsets(txn, req)


def _commit_stream_objects(
    txn: Txn, req: CommitStreamSetObjectRequest, *, data_time_ms: int, now_ms: int
) -> bool:
    """Commit the request's new stream objects; False if one is committed already (a retry)."""
    view = txn.view
    for nso in req.stream_objects:
        obj = _committable(view, nso.object_id)
        if obj is None:
            return False
        committed = _committed(obj, size_bytes=nso.size_bytes, kind=ObjectKind.STREAM, now_ms=now_ms)
        if view.stream(nso.stream_id) is None:
            txn.write(PutObject(marked(committed, now_ms)))  # its stream is gone already
            continue
        txn.write(PutObject(committed))
        so = StreamObject(
            nso.object_id, nso.stream_id, nso.start_offset, nso.end_offset, nso.size_bytes, data_time_ms
        )
        txn.write(PutStreamObject(so))
    return True


def _advance_end_offsets(txn: Txn, req: CommitStreamSetObjectRequest) -> None:
    """The continuity check of a WAL upload, then the end-offset advance of every stream it extends."""
    spans = [(r.stream_id, r.start_offset, r.end_offset) for r in req.stream_ranges]
    spans += [(so.stream_id, so.start_offset, so.end_offset) for so in req.stream_objects]
    spans.sort()
    stream_ids = tuple(span[0] for span in spans)
    if len(set(stream_ids)) == len(spans) and txn.view.all_continue_at_end(req.node_id, spans):
        # hot path of every upload: every check below would pass, and a span's end is its stream's
        txn.write(AdvanceEndOffsets(stream_ids, tuple(span[2] for span in spans)))
        return
    ends: dict[StreamId, int] = {}
    heads = txn.view.stream_heads([span[0] for span in spans])
    opened = StreamState.OPENED
    for stream_id, start, end in spans:
        head = heads.get(stream_id)
        if head is None:
            continue  # deleted meanwhile: its data is dropped by compaction
        if end <= head.start_offset:
            continue  # a fully trimmed upload: accepted, advances nothing
        if head.state != opened:
            raise ConflictError(f"stream {stream_id} is not opened", code=ErrorCode.STREAM_NOT_OPENED)
        if head.range_index < 0:
            raise ConflictError(f"stream {stream_id} has no current range", code=ErrorCode.STREAM_INNER_ERROR)
        if head.range_node_id != req.node_id:
            raise FencedError(
                f"stream {stream_id} is owned by node {head.range_node_id}, not node {req.node_id}",
                code=ErrorCode.STREAM_FENCED,
            )
        expected = ends.get(stream_id, head.end_offset)
        # once the trim reached the logical end, an upload may start at or below the trim point
        matched = start == expected if expected > head.start_offset else start <= head.start_offset
        if not matched:
            raise ConflictError(
                f"stream {stream_id} range [{start}, {end}) does not continue at end offset {expected}",
                code=ErrorCode.OFFSET_NOT_MATCHED,
            )
        ends[stream_id] = end
    # only the two end offsets are written (the SQLite store runs them as one executemany per
    # table, not one upsert of the whole row each); the range advanced is the head's, the last one
    if ends:
        txn.write(AdvanceEndOffsets(tuple(ends), tuple(ends.values())))


def commit_stream_object(txn: Txn, req: CommitStreamObjectRequest, *, now_ms: int) -> None:
    check_int("object_id", req.object_id, low=-1)
    check_int("object_size_bytes", req.object_size_bytes, low=0)
    check_int("stream_id", req.stream_id, low=0)
    check_int("stream_epoch", req.stream_epoch, low=-1)
    if req.object_id != NOOP_OBJECT_ID:
        check_span(f"stream object {req.object_id}", req.start_offset, req.end_offset)
    _check_ids("source_object_ids", req.source_object_ids)
    replace = req.object_id != NOOP_OBJECT_ID and req.source_object_ids == (req.object_id,)
    if req.object_id in req.source_object_ids and not replace:
        raise InvalidArgumentError(f"object {req.object_id} is both the new object and a source")
    view = txn.view
    if replace:
        _check_replaced(view, req.object_id)
        return
    check_node(req.node_id, req.node_epoch)
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
        txn.write(PutObject(marked(committed, now_ms)))
        return
    txn.write(PutObject(committed))
    data_time_ms = min(data_times) if data_times else now_ms
    so = StreamObject(
        req.object_id, req.stream_id, req.start_offset, req.end_offset, req.object_size_bytes, data_time_ms
    )
    txn.write(PutStreamObject(so))
    if req.end_offset > stream.end_offset:
        put_stream(txn, dataclasses.replace(stream, end_offset=req.end_offset))


def expire_prepared(txn: Txn, *, now_ms: int) -> list[ObjectId]:
    check_int("now_ms", now_ms, low=0)
    expired = txn.view.expired_prepared(now_ms)
    for obj in expired:
        txn.write(PutObject(marked(obj, now_ms)))
    return [obj.object_id for obj in expired]


def mark_destroyed(txn: Txn, object_ids: Sequence[ObjectId], *, now_ms: int) -> None:
    """Every id must exist; already marked objects stay as they are (idempotent)."""
    _check_ids("object_ids", object_ids)
    check_int("now_ms", now_ms, low=0)
    for object_id in object_ids:
        obj = txn.view.object(object_id)
        if obj is None:
            raise NotFoundError(f"object {object_id} does not exist", code=ErrorCode.OBJECT_NOT_EXIST)
        if obj.state != ObjectState.MARK_DESTROYED:
            _destroy(txn, obj, now_ms)


def remove_objects(txn: Txn, object_ids: Sequence[ObjectId]) -> None:
    """Forget MARK_DESTROYED objects; ids already gone are skipped, live ones are refused."""
    _check_ids("object_ids", object_ids)
    removed: list[ObjectId] = []
    for object_id in object_ids:
        obj = txn.view.object(object_id)
        if obj is None:
            continue
        if obj.state != ObjectState.MARK_DESTROYED:
            raise ConflictError(f"object {object_id} is {obj.state.name}, not MARK_DESTROYED")
        removed.append(object_id)
    for object_id in txn.view.placements(removed) if removed else ():  # rows leave with the object
        txn.write(RemovePlacements(object_id))
    for object_id in removed:
        txn.write(RemoveObject(object_id))
