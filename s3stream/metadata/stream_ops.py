"""Stream and node operations and KV pairs: preconditions in AutoMQ's order, changes written.

``docs/automq-model.md`` sections 1, 2 and 7 (registration, create, open, close, trim, delete; KV).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from s3stream.errors import (
    ConflictError,
    CorruptionError,
    ErrorCode,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
)
from s3stream.ids import NodeId, StreamId
from s3stream.metadata import cluster_ops
from s3stream.metadata.base import (
    KvWrite,
    ObjectState,
    RangeMetadata,
    StreamMetadata,
    StreamObject,
    StreamState,
)
from s3stream.metadata.changes import (
    Counter,
    PutKv,
    PutNode,
    PutObject,
    PutRange,
    PutStream,
    RemoveAssignment,
    RemoveKv,
    RemoveRange,
    RemoveStream,
    SetCounter,
)
from s3stream.metadata.controller import (
    KV_KEY_CHARS_MAX,
    KV_VALUE_MAX_BYTES,
    OFFSET_MAX,
    StateView,
    Txn,
    check_int,
    check_node,
    check_tags,
    marked,
    node_epoch_check,
    ownership_check,
    put_stream,
)


def register_node(txn: Txn, *, node_id: NodeId, node_epoch: int, now_ms: int) -> list[StreamMetadata]:
    """AutoMQ getOpeningStreams: (re-)register the node, return the OPENED streams it owns.

    A new epoch starts an unleased session (valid while its epoch is current); the same epoch
    writes nothing, so a session opened by ``open_node`` keeps its lease."""
    check_node(node_id, node_epoch)
    stored = txn.view.node_epoch(node_id)
    if stored is not None and node_epoch < stored:
        raise FencedError(
            f"node {node_id} epoch {node_epoch} is older than the registered {stored}",
            code=ErrorCode.NODE_EPOCH_EXPIRED,
        )
    if stored != node_epoch:
        txn.write(PutNode(node_id, node_epoch, registered_at_ms=now_ms))
    return [s for s in txn.view.opened_streams() if s.ranges and s.ranges[-1].node_id == node_id]


def create_stream(txn: Txn, *, node_id: NodeId, node_epoch: int, tags: Mapping[str, str] | None) -> StreamId:
    check_node(node_id, node_epoch)
    try:
        tags = dict(tags or {})
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"tags must be a mapping of str to str, got {type(tags).__name__}"
        ) from exc
    check_tags(tags)
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
    txn: Txn, *, node_id: NodeId, node_epoch: int, stream_id: StreamId, epoch: int, now_ms: int
) -> StreamMetadata:
    """AutoMQ's openStream plus the cluster's ownership rules (:mod:`~s3stream.metadata.cluster_ops`):
    a stream OPENED by another node -> NotOwnerError (its session is valid) or
    UnavailableError(NODE_TAKEOVER_IN_PROGRESS) (it lapsed); an open that makes a CLOSED stream
    OPENED honours and removes its assignment row."""
    check_node(node_id, node_epoch)
    check_int("stream_id", stream_id, low=0)
    check_int("epoch", epoch, low=0)
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
            cluster_ops.claim_assignment(txn, stream_id, node_id, now_ms)
            stream = dataclasses.replace(stream, state=StreamState.OPENED)
            put_stream(txn, stream)
        return stream
    if stream.state == StreamState.OPENED:
        if cluster_ops.owner_of(stream) not in (-1, node_id):
            cluster_ops.refuse_opened_elsewhere(view, stream, node_id, now_ms)
        raise ConflictError(
            f"stream {stream_id} is still opened with epoch {stream.epoch}", code=ErrorCode.STREAM_NOT_CLOSED
        )
    cluster_ops.claim_assignment(txn, stream_id, node_id, now_ms)
    ranges = list(stream.ranges)
    if ranges and ranges[-1].end_offset != stream.end_offset:
        ranges[-1] = dataclasses.replace(ranges[-1], end_offset=stream.end_offset)
        txn.write(PutRange(ranges[-1]))
    next_index = ranges[-1].range_index + 1 if ranges else 0
    new_range = RangeMetadata(stream_id, epoch, next_index, stream.end_offset, stream.end_offset, node_id)
    txn.write(PutRange(new_range))
    ranges.append(new_range)
    removable = _removable_ranges(ranges, view.stream_objects_from(stream_id, -1, OFFSET_MAX))
    for index in removable:
        txn.write(RemoveRange(stream_id, index))
    kept = tuple(r for r in ranges if r.range_index not in removable)
    stream = dataclasses.replace(stream, epoch=epoch, state=StreamState.OPENED, ranges=kept)
    put_stream(txn, stream)
    return stream


def close_stream(txn: Txn, *, node_id: NodeId, node_epoch: int, stream_id: StreamId, epoch: int) -> None:
    check_node(node_id, node_epoch)
    check_int("stream_id", stream_id, low=0)
    check_int("epoch", epoch, low=0)
    node_epoch_check(txn.view, node_id, node_epoch)
    stream = ownership_check(txn.view, stream_id, epoch, node_id)
    if stream.state == StreamState.CLOSED:
        return
    put_stream(txn, dataclasses.replace(stream, state=StreamState.CLOSED))


def trim_stream(
    txn: Txn, *, node_id: NodeId, node_epoch: int, stream_id: StreamId, epoch: int, new_start_offset: int
) -> None:
    check_node(node_id, node_epoch)
    check_int("stream_id", stream_id, low=0)
    check_int("epoch", epoch, low=0)
    check_int("new_start_offset", new_start_offset, low=0)
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
    put_stream(txn, dataclasses.replace(stream, start_offset=new_start_offset, end_offset=end_offset))
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
    check_int("stream_id", stream_id, low=0)
    check_int("epoch", epoch, low=-1)
    stream = txn.view.stream(stream_id)
    if stream is None:
        return
    if stream.state != StreamState.CLOSED:
        raise ConflictError(f"stream {stream_id} is not closed", code=ErrorCode.STREAM_NOT_CLOSED)
    for so in txn.view.stream_objects_from(stream_id, -1, OFFSET_MAX):
        obj = txn.view.object(so.object_id)
        if obj is None or obj.state == ObjectState.MARK_DESTROYED:
            raise ConflictError(
                f"stream object {so.object_id} of stream {stream_id} is not live",
                code=ErrorCode.STREAM_INNER_ERROR,
            )
        txn.write(PutObject(marked(obj, now_ms)))
    if txn.view.assignment(stream_id) is not None:
        txn.write(RemoveAssignment(stream_id))
    txn.write(RemoveStream(stream_id))


# -- KV ------------------------------------------------------------------------------------------


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not 1 <= len(key) <= KV_KEY_CHARS_MAX:
        raise InvalidArgumentError(f"a key is a str of 1..{KV_KEY_CHARS_MAX} chars, got {key!r:.80}")
    try:
        key.encode("utf-8")  # what SQLite stores; a lone surrogate cannot be
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(f"a key must be encodable as UTF-8, got {key!r:.80}") from exc


def kv_put(txn: Txn, key: str, value: bytes, *, overwrite: bool) -> bytes:
    """putKV / putKVIfAbsent: without ``overwrite`` an existing value wins and is returned."""
    _check_key(key)
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidArgumentError(f"a value is bytes, got {type(value).__name__}")
    value = bytes(value)
    if len(value) > KV_VALUE_MAX_BYTES:
        raise InvalidArgumentError(f"a value is at most {KV_VALUE_MAX_BYTES} bytes, got {len(value)}")
    if not overwrite:
        existing = txn.view.kv(key)
        if existing is not None:
            return existing
    txn.write(PutKv(key, value))
    return value


def kv_get(view: StateView, key: str) -> bytes | None:
    _check_key(key)
    return view.kv(key)


KV_APPLIED_KEY_PREFIX = "\x00s3stream.kv.applied."
"""KV key of a node's applied KV WAL offset (``<prefix><node id>``, ASCII decimal value): under the
reserved prefix that the KV client refuses, so only :func:`kv_apply` writes it."""


def kv_applied_key(node_id: NodeId) -> str:
    return f"{KV_APPLIED_KEY_PREFIX}{int(node_id)}"


def kv_apply(txn: Txn, *, writes: Sequence[KvWrite], node_id: NodeId, wal_offset: int) -> list[bytes | None]:
    """Several KV changes and the node's applied WAL offset, in one transaction (see
    :meth:`~s3stream.metadata.base.MetadataStore.kv_apply`). One change per key is written: the
    final state after ``writes`` in order (a later write of the batch sees the earlier ones)."""
    check_int("node_id", node_id, low=0)
    check_int("wal_offset", wal_offset, low=-1)
    state: dict[str, bytes | None] = {}
    results: list[bytes | None] = []
    for write in writes:
        if not isinstance(write, KvWrite):
            raise InvalidArgumentError(f"a KV write is a KvWrite, got {type(write).__name__}")
        _check_key(write.key)
        current = state[write.key] if write.key in state else txn.view.kv(write.key)
        if write.value is None:
            results.append(current)
            state[write.key] = None
            continue
        if not isinstance(write.value, bytes | bytearray | memoryview):
            raise InvalidArgumentError(f"a value is bytes, got {type(write.value).__name__}")
        value = bytes(write.value)
        if len(value) > KV_VALUE_MAX_BYTES:
            raise InvalidArgumentError(f"a value is at most {KV_VALUE_MAX_BYTES} bytes, got {len(value)}")
        if not write.overwrite and current is not None:
            results.append(current)
            continue
        state[write.key] = value
        results.append(value)
    for key, final in state.items():
        txn.write(RemoveKv(key) if final is None else PutKv(key, final))
    txn.write(PutKv(kv_applied_key(node_id), str(wal_offset).encode()))
    return results


def kv_applied_offset(view: StateView, *, node_id: NodeId) -> int:
    check_int("node_id", node_id, low=0)
    raw = view.kv(kv_applied_key(node_id))
    if raw is None:
        return -1
    try:
        return int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptionError(
            f"the applied KV WAL offset of node {node_id} is not a number: {raw[:40]!r}",
            source=kv_applied_key(node_id),
        ) from exc


def kv_delete(txn: Txn, key: str) -> bytes | None:
    """delKV: the old value, or None when the key was absent (KEY_NOT_EXIST counts as success)."""
    _check_key(key)
    existing = txn.view.kv(key)
    if existing is not None:
        txn.write(RemoveKv(key))
    return existing
