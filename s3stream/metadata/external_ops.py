"""External commits: many objects written outside the WAL, their stream ends and KV, in one transaction.

The controller side of :meth:`~s3stream.metadata.base.MetadataStore.commit_objects` (design:
``docs/architecture.md``, "External commits (direct writes)"; decision 0039). Invariants it keeps:

* continuity: each stream's ranges, taken in request order, tile ``[end offset, new end offset)``;
  the stream is OPENED at the request's epoch and its last range is the node's;
* read order: StreamSet objects get their order ids here, drawn from the object id counter (which
  the commit advances past them), so an object committed later orders after every StreamSet object
  committed or prepared earlier, whatever its own id: the getObjects scan, which walks a node's
  StreamSet objects by order id, finds its ranges right after the ones before them;
* all or nothing: one controller call, so a failed check writes nothing.
"""

from __future__ import annotations

import dataclasses

from s3stream.errors import (
    ConflictError,
    ErrorCode,
    InvalidArgumentError,
    NotFoundError,
)
from s3stream.ids import ObjectId, StreamId
from s3stream.metadata.base import (
    CommitObjectsRequest,
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
    SetCounter,
)
from s3stream.metadata.controller import (
    RANGES_PER_COMMIT_MAX,
    StateView,
    Txn,
    check_int,
    check_node,
    check_span,
    node_epoch_check,
    ownership_check,
)
from s3stream.metadata.object_ops import _destroy
from s3stream.metadata.stream_ops import kv_put


def _check_request(req: CommitObjectsRequest) -> None:
    """Argument checks only (no state read): shapes, ranges, ids named once."""
    check_node(req.node_id, req.node_epoch)
    range_count = 0
    named: set[int] = set()
    for obj in req.objects:
        check_int("object_id", obj.object_id, low=0)
        check_int("object_size", obj.object_size, low=0)
        if obj.object_id in named:
            raise InvalidArgumentError(f"object {obj.object_id} is named twice")
        named.add(obj.object_id)
        if not obj.ranges:
            raise InvalidArgumentError(f"object {obj.object_id} has no range")
        if obj.stream_object and len(obj.ranges) != 1:
            raise InvalidArgumentError(f"stream object {obj.object_id} must have exactly one range")
        range_count += len(obj.ranges)
        previous = -1
        for r in obj.ranges:
            check_int("stream_id", r.stream_id, low=0)
            if r.stream_id <= previous:
                raise InvalidArgumentError(
                    f"the ranges of object {obj.object_id} must be sorted by stream id, one per stream"
                )
            previous = r.stream_id
            check_span(
                f"range of stream {r.stream_id} in object {obj.object_id}", r.start_offset, r.end_offset
            )
            check_int("range size_bytes", r.size_bytes, low=0)
    if range_count + len(req.release_ids) > RANGES_PER_COMMIT_MAX:
        raise InvalidArgumentError(f"at most {RANGES_PER_COMMIT_MAX} ranges and released ids per commit")
    for stream_id, epoch in req.stream_epochs.items():
        check_int("stream_epochs key", stream_id, low=0)
        check_int(f"epoch of stream {stream_id}", epoch, low=0)
    for object_id in req.release_ids:
        check_int("release id", object_id, low=0)
    if len(set(req.release_ids)) != len(req.release_ids) or named & set(req.release_ids):
        raise InvalidArgumentError("release_ids repeat an id or name an object the request commits")
    for key in req.kv_expect:
        if not isinstance(key, str):
            raise InvalidArgumentError(f"a kv_expect key is a str, got {key!r:.80}")


def _is_redundant(view: StateView, req: CommitObjectsRequest) -> bool:
    """A retry of a commit that already happened: every object COMMITTED, every put key holding its
    value (and something to compare: an empty request is never a retry)."""
    if not req.objects and not req.kv_puts:
        return False
    for obj in req.objects:
        stored = view.object(obj.object_id)
        if stored is None or stored.state != ObjectState.COMMITTED:
            return False
    return all(view.kv(key) == bytes(value) for key, value in req.kv_puts.items())


def _prepared(view: StateView, object_id: ObjectId) -> S3ObjectMetadata:
    obj = view.object(object_id)
    if obj is None or obj.state == ObjectState.MARK_DESTROYED:
        raise NotFoundError(f"object {object_id} is not prepared", code=ErrorCode.OBJECT_NOT_EXIST)
    if obj.state == ObjectState.COMMITTED:
        raise ConflictError(
            f"object {object_id} is committed already, by another request", code=ErrorCode.REDUNDANT_OPERATION
        )
    return obj


def _advance(txn: Txn, req: CommitObjectsRequest) -> None:
    """Check every stream named (epoch, state, owner) and its continuity; write the new ends."""
    view = txn.view
    spans: dict[StreamId, list[tuple[int, int]]] = {}
    for obj in req.objects:
        for r in obj.ranges:
            spans.setdefault(r.stream_id, []).append((r.start_offset, r.end_offset))
    missing = sorted(set(spans) - set(req.stream_epochs))
    if missing:
        raise InvalidArgumentError(f"stream_epochs has no epoch for streams {missing}")
    ends: dict[StreamId, int] = {}
    for stream_id in sorted(req.stream_epochs):
        stream = ownership_check(view, stream_id, req.stream_epochs[stream_id], req.node_id)
        if stream.state != StreamState.OPENED:
            raise ConflictError(f"stream {stream_id} is not opened", code=ErrorCode.STREAM_NOT_OPENED)
        end = stream.end_offset
        for start, new_end in spans.get(stream_id, ()):
            if start != end:
                raise ConflictError(
                    f"stream {stream_id} range [{start}, {new_end}) does not continue at offset {end}",
                    code=ErrorCode.OFFSET_NOT_MATCHED,
                )
            end = new_end
        if end != stream.end_offset:
            ends[stream_id] = end
    if ends:
        txn.write(AdvanceEndOffsets(tuple(ends), tuple(ends.values())))


def commit_objects(txn: Txn, req: CommitObjectsRequest, *, now_ms: int) -> None:
    _check_request(req)
    view = txn.view
    node_epoch_check(view, req.node_id, req.node_epoch)
    if _is_redundant(view, req):
        return  # REDUNDANT_OPERATION: the same commit, retried after an unknown outcome
    for key, expected in req.kv_expect.items():
        value = view.kv(key)
        if value != (None if expected is None else bytes(expected)):
            raise ConflictError(
                f"KV key {key!r:.80} holds {value!r:.40}, not the expected {expected!r:.40}",
                code=ErrorCode.KV_CONDITION_FAILED,
            )
    prepared = [_prepared(view, obj.object_id) for obj in req.objects]
    _advance(txn, req)
    stream_set_count = sum(not obj.stream_object for obj in req.objects)
    order_id = view.next_id(Counter.OBJECT_ID)
    if stream_set_count:
        txn.write(SetCounter(Counter.OBJECT_ID, order_id + stream_set_count))
    for obj, stored in zip(req.objects, prepared, strict=True):
        kind = ObjectKind.STREAM if obj.stream_object else ObjectKind.STREAM_SET
        committed = dataclasses.replace(
            stored, state=ObjectState.COMMITTED, size_bytes=obj.object_size, committed_at_ms=now_ms, kind=kind
        )
        txn.write(PutObject(committed))
        if obj.stream_object:
            r = obj.ranges[0]
            so = StreamObject(
                obj.object_id, r.stream_id, r.start_offset, r.end_offset, obj.object_size, now_ms
            )
            txn.write(PutStreamObject(so))
        else:
            sso = StreamSetObject(
                object_id=obj.object_id,
                node_id=req.node_id,
                order_id=order_id,
                data_time_ms=now_ms,
                size_bytes=obj.object_size,
                ranges=obj.ranges,
            )
            txn.write(PutStreamSetObject(sso))
            order_id += 1
    for key, value in req.kv_puts.items():
        kv_put(txn, key, value, overwrite=True)
    for object_id in req.release_ids:
        released = view.object(object_id)
        if released is None or released.state == ObjectState.MARK_DESTROYED:
            continue  # expired and collected, or released already
        if released.state == ObjectState.COMMITTED:
            raise ConflictError(f"released object {object_id} is committed")
        _destroy(txn, released, now_ms)
