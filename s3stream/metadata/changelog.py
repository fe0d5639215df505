"""The change-log codec: one group commit's :mod:`~s3stream.metadata.changes`, as bytes and back.

Layout: ``docs/format.md`` section 6.1. A group is a header (version, commit time, change count,
body length, CRC32C of the header's other fields and the body) and a body of changes, each a one-byte tag and its fields. Sans-IO: :func:`encode_group` takes
changes and returns bytes; :func:`decode_group` returns the changes or raises
:class:`~s3stream.errors.CorruptionError` (naming ``source`` and the byte position) for anything
else: a wrong version, a CRC mismatch, a truncated or over-long body, an unknown tag, a value out of
its domain. Applying a decoded group to the state before it gives the state after it (every change
is an upsert or a removal, so applying it twice is harmless too).
"""

from __future__ import annotations

import array
import enum
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from crc32c import crc32c

from s3stream.errors import CorruptionError
from s3stream.ids import NodeId, ObjectId, StreamId
from s3stream.metadata.base import (
    LeaseInfo,
    ObjectKind,
    ObjectState,
    RangeMetadata,
    S3ObjectMetadata,
    StreamObject,
    StreamOffsetRange,
    StreamSetObject,
    StreamState,
)
from s3stream.metadata.changes import (
    AdvanceEndOffsets,
    Change,
    Counter,
    PutAssignment,
    PutKv,
    PutLease,
    PutNode,
    PutNodeRuntime,
    PutObject,
    PutPlacement,
    PutRange,
    PutStream,
    PutStreamObject,
    PutStreamSetObject,
    PutTakeover,
    RemoveAssignment,
    RemoveKv,
    RemoveLease,
    RemoveObject,
    RemovePlacements,
    RemoveRange,
    RemoveStream,
    RemoveStreamObject,
    RemoveStreamSetObject,
    SetCounter,
)

GROUP_VERSION = 1
GROUP_HEADER = struct.Struct(
    ">"
    "B"  # version, 1
    "B"  # reserved, 0
    "H"  # reserved, 0
    "q"  # committed at: wall-clock ms of the group commit
    "I"  # change count
    "I"  # body length: bytes after this header
    "I"  # CRC32C of the header's first 20 bytes, then the body
)
GROUP_HEADER_SIZE = GROUP_HEADER.size
_CRC_COVERED = GROUP_HEADER_SIZE - 4
CHANGES_PER_GROUP_MAX = 1 << 24
"""More changes than one group commit can hold (256 operations of at most 100,000 ranges each)."""

_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
_U8 = struct.Struct(">B")


class Tag(enum.IntEnum):
    """One byte before each change; a retired tag is never reused."""

    SET_COUNTER = 1
    PUT_NODE = 2
    PUT_STREAM = 3
    REMOVE_STREAM = 4
    PUT_RANGE = 5
    ADVANCE_END_OFFSETS = 6
    REMOVE_RANGE = 7
    PUT_OBJECT = 8
    REMOVE_OBJECT = 9
    PUT_STREAM_SET_OBJECT = 10
    REMOVE_STREAM_SET_OBJECT = 11
    PUT_STREAM_OBJECT = 12
    REMOVE_STREAM_OBJECT = 13
    PUT_KV = 14
    REMOVE_KV = 15
    PUT_LEASE = 16
    REMOVE_LEASE = 17
    PUT_PLACEMENT = 18
    REMOVE_PLACEMENTS = 19


UNLOGGED = (PutNodeRuntime, PutTakeover, PutAssignment, RemoveAssignment)
"""The cluster's coordination state (node runtime, takeovers, assignments): never in a change log
(the copy leaves them out, :data:`s3stream.metadata.sqlite_copy.SESSION_CHANGES`), so they have no
tag; encoding one is a programming error."""

_COUNTER_CODES = {Counter.STREAM_ID: 0, Counter.OBJECT_ID: 1}
_COUNTERS = {code: counter for counter, code in _COUNTER_CODES.items()}


class _Writer:
    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def u8(self, value: int) -> None:
        self.parts.append(_U8.pack(value))

    def i64s(self, *values: int) -> None:
        self.parts.append(struct.pack(f">{len(values)}q", *values))

    def count(self, value: int) -> None:
        self.parts.append(_U32.pack(value))

    def blob(self, value: bytes) -> None:
        self.parts.append(_U32.pack(len(value)))
        self.parts.append(value)

    def text(self, value: str) -> None:
        self.blob(value.encode())


def _encode_one(out: _Writer, change: Change) -> None:
    if isinstance(change, SetCounter):
        out.u8(Tag.SET_COUNTER)
        out.u8(_COUNTER_CODES[change.counter])
        out.i64s(change.next_value)
    elif isinstance(change, PutNode):
        out.u8(Tag.PUT_NODE)
        out.i64s(
            change.node_id,
            change.node_epoch,
            change.lease_expires_at_ms,
            change.heartbeat_at_ms,
            change.registered_at_ms,
        )
    elif isinstance(change, PutLease):
        lease = change.lease
        out.u8(Tag.PUT_LEASE)
        out.text(lease.name)
        out.i64s(lease.node_id, lease.node_epoch, lease.expires_at_ms)
    elif isinstance(change, RemoveLease):
        out.u8(Tag.REMOVE_LEASE)
        out.text(change.name)
    elif isinstance(change, PutStream):
        out.u8(Tag.PUT_STREAM)
        out.i64s(change.stream_id, change.epoch, int(change.state), change.start_offset, change.end_offset)
        out.count(len(change.tags))
        for key in sorted(change.tags):
            out.text(key)
            out.text(change.tags[key])
    elif isinstance(change, RemoveStream):
        out.u8(Tag.REMOVE_STREAM)
        out.i64s(change.stream_id)
    elif isinstance(change, PutRange):
        r = change.range
        out.u8(Tag.PUT_RANGE)
        out.i64s(r.stream_id, r.epoch, r.range_index, r.start_offset, r.end_offset, r.node_id)
    elif isinstance(change, AdvanceEndOffsets):
        out.u8(Tag.ADVANCE_END_OFFSETS)
        out.count(len(change.stream_ids))
        ids = array.array("q", change.stream_ids)
        ends = array.array("q", change.end_offsets)
        if sys.byteorder == "little":
            ids.byteswap()
            ends.byteswap()
        out.parts += (ids.tobytes(), ends.tobytes())
    elif isinstance(change, RemoveRange):
        out.u8(Tag.REMOVE_RANGE)
        out.i64s(change.stream_id, change.range_index)
    elif isinstance(change, PutObject):
        o = change.object
        out.u8(Tag.PUT_OBJECT)
        out.i64s(
            o.object_id,
            int(o.state),
            o.size_bytes,
            o.prepared_at_ms,
            o.expires_at_ms,
            o.committed_at_ms,
            o.marked_at_ms,
            -1 if o.kind is None else int(o.kind),
        )
    elif isinstance(change, RemoveObject):
        out.u8(Tag.REMOVE_OBJECT)
        out.i64s(change.object_id)
    elif isinstance(change, PutStreamSetObject):
        s = change.stream_set_object
        out.u8(Tag.PUT_STREAM_SET_OBJECT)
        out.i64s(s.object_id, s.node_id, s.order_id, s.data_time_ms, s.size_bytes)
        out.count(len(s.ranges))
        for rr in s.ranges:
            out.i64s(rr.stream_id, rr.start_offset, rr.end_offset, rr.size_bytes)
    elif isinstance(change, RemoveStreamSetObject):
        out.u8(Tag.REMOVE_STREAM_SET_OBJECT)
        out.i64s(change.object_id)
    elif isinstance(change, PutStreamObject):
        so = change.stream_object
        out.u8(Tag.PUT_STREAM_OBJECT)
        out.i64s(so.object_id, so.stream_id, so.start_offset, so.end_offset, so.size_bytes, so.data_time_ms)
    elif isinstance(change, RemoveStreamObject):
        out.u8(Tag.REMOVE_STREAM_OBJECT)
        out.i64s(change.object_id)
    elif isinstance(change, PutKv):
        out.u8(Tag.PUT_KV)
        out.text(change.key)
        out.blob(bytes(change.value))
    elif isinstance(change, RemoveKv):
        out.u8(Tag.REMOVE_KV)
        out.text(change.key)
    elif isinstance(change, PutPlacement):
        out.u8(Tag.PUT_PLACEMENT)
        out.i64s(change.object_id, change.bucket_id)
    elif isinstance(change, RemovePlacements):
        out.u8(Tag.REMOVE_PLACEMENTS)
        out.i64s(change.object_id)
    else:  # pragma: no cover - every kind is handled above
        raise AssertionError(f"unhandled change {change!r}")


@dataclass(frozen=True, slots=True)
class Group:
    """One decoded group commit."""

    committed_at_ms: int
    changes: list[Change]


def encode_group(changes: Sequence[Change], *, committed_at_ms: int) -> bytes:
    """The bytes of one group of changes (``docs/format.md`` section 6.1)."""
    assert len(changes) <= CHANGES_PER_GROUP_MAX
    out = _Writer()
    for change in changes:
        _encode_one(out, change)
    body = b"".join(out.parts)
    head = GROUP_HEADER.pack(GROUP_VERSION, 0, 0, committed_at_ms, len(changes), len(body), 0)
    crc = crc32c(body, crc32c(head[:_CRC_COVERED]))
    return head[:_CRC_COVERED] + _U32.pack(crc) + body


E = TypeVar("E", bound=enum.Enum)


class _Reader:
    __slots__ = ("data", "pos", "source")

    def __init__(self, data: bytes | memoryview, pos: int, source: str) -> None:
        self.data = memoryview(data)
        self.pos = pos
        self.source = source

    def fail(self, message: str) -> CorruptionError:
        return CorruptionError(f"change log: {message}", source=self.source, position=self.pos)

    def take(self, size: int) -> memoryview:
        if size > len(self.data) - self.pos:
            raise self.fail(f"needs {size} more bytes, {len(self.data) - self.pos} left")
        view = self.data[self.pos : self.pos + size]
        self.pos += size
        return view

    def u8(self) -> int:
        return int(self.take(1)[0])

    def i64s(self, count: int) -> tuple[int, ...]:
        return struct.unpack(f">{count}q", self.take(8 * count))

    def i64(self) -> int:
        return int(_I64.unpack(self.take(8))[0])

    def count(self, low_size: int) -> int:
        """A u32 count of items of at least ``low_size`` bytes each, checked against the bytes left."""
        (value,) = _U32.unpack(self.take(4))
        if value * low_size > len(self.data) - self.pos:
            raise self.fail(f"count {value} does not fit in the {len(self.data) - self.pos} bytes left")
        return int(value)

    def blob(self) -> bytes:
        return bytes(self.take(self.count(1)))

    def text(self) -> str:
        raw = self.blob()
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise self.fail("text is not UTF-8") from None

    def enum(self, kind: type[E], value: int) -> E:
        try:
            return kind(value)
        except ValueError:
            raise self.fail(f"{kind.__name__} has no value {value}") from None


def _put_stream(r: _Reader) -> Change:
    stream_id, epoch, state, start, end = r.i64s(5)
    tags = {}
    for _ in range(r.count(8)):
        key = r.text()
        tags[key] = r.text()
    return PutStream(StreamId(stream_id), epoch, r.enum(StreamState, state), start, end, tags)


def _advance(r: _Reader) -> Change:
    n = r.count(16)
    ids, ends = array.array("q"), array.array("q")
    ids.frombytes(r.take(8 * n))
    ends.frombytes(r.take(8 * n))
    if sys.byteorder == "little":
        ids.byteswap()
        ends.byteswap()
    return AdvanceEndOffsets(tuple(StreamId(i) for i in ids), tuple(ends))


def _put_object(r: _Reader) -> Change:
    object_id, state, size, prepared, expires, committed, marked, kind = r.i64s(8)
    return PutObject(
        S3ObjectMetadata(
            ObjectId(object_id),
            r.enum(ObjectState, state),
            size,
            prepared,
            expires,
            committed,
            marked,
            None if kind == -1 else r.enum(ObjectKind, kind),
        )
    )


def _put_stream_set_object(r: _Reader) -> Change:
    object_id, node_id, order_id, data_time_ms, size = r.i64s(5)
    ranges = tuple(
        StreamOffsetRange(StreamId(v[0]), v[1], v[2], v[3]) for v in (r.i64s(4) for _ in range(r.count(32)))
    )
    return PutStreamSetObject(
        StreamSetObject(ObjectId(object_id), NodeId(node_id), order_id, data_time_ms, size, ranges)
    )


def _set_counter(r: _Reader) -> Change:
    code = r.u8()
    counter = _COUNTERS.get(code)
    if counter is None:
        raise r.fail(f"unknown counter code {code}")
    return SetCounter(counter, r.i64())


def _put_range(r: _Reader) -> Change:
    v = r.i64s(6)
    return PutRange(RangeMetadata(StreamId(v[0]), v[1], v[2], v[3], v[4], NodeId(v[5])))


def _put_stream_object(r: _Reader) -> Change:
    v = r.i64s(6)
    return PutStreamObject(StreamObject(ObjectId(v[0]), StreamId(v[1]), v[2], v[3], v[4], v[5]))


def _put_node(r: _Reader) -> Change:
    v = r.i64s(5)
    return PutNode(NodeId(v[0]), v[1], v[2], v[3], v[4])


def _put_lease(r: _Reader) -> Change:
    name = r.text()
    v = r.i64s(3)
    return PutLease(LeaseInfo(name, NodeId(v[0]), v[1], v[2]))


def _put_kv(r: _Reader) -> Change:
    key = r.text()
    return PutKv(key, r.blob())


_DECODERS: dict[Tag, Callable[[_Reader], Change]] = {
    Tag.SET_COUNTER: _set_counter,
    Tag.PUT_NODE: _put_node,
    Tag.PUT_LEASE: _put_lease,
    Tag.REMOVE_LEASE: lambda r: RemoveLease(r.text()),
    Tag.PUT_STREAM: _put_stream,
    Tag.REMOVE_STREAM: lambda r: RemoveStream(StreamId(r.i64())),
    Tag.PUT_RANGE: _put_range,
    Tag.ADVANCE_END_OFFSETS: _advance,
    Tag.REMOVE_RANGE: lambda r: RemoveRange(StreamId(r.i64()), r.i64()),
    Tag.PUT_OBJECT: _put_object,
    Tag.REMOVE_OBJECT: lambda r: RemoveObject(ObjectId(r.i64())),
    Tag.PUT_STREAM_SET_OBJECT: _put_stream_set_object,
    Tag.REMOVE_STREAM_SET_OBJECT: lambda r: RemoveStreamSetObject(ObjectId(r.i64())),
    Tag.PUT_STREAM_OBJECT: _put_stream_object,
    Tag.REMOVE_STREAM_OBJECT: lambda r: RemoveStreamObject(ObjectId(r.i64())),
    Tag.PUT_KV: _put_kv,
    Tag.REMOVE_KV: lambda r: RemoveKv(r.text()),
    Tag.PUT_PLACEMENT: lambda r: PutPlacement(ObjectId(r.i64()), r.i64()),
    Tag.REMOVE_PLACEMENTS: lambda r: RemovePlacements(ObjectId(r.i64())),
}
assert set(_DECODERS) == set(Tag)
_TAG_VALUES = frozenset(int(t) for t in Tag)


def decode_group(data: bytes | memoryview, *, source: str) -> Group:
    """The changes of one encoded group; CorruptionError for anything :func:`encode_group` did not write."""
    view = memoryview(data)
    if len(view) < GROUP_HEADER_SIZE:
        raise CorruptionError(
            f"change log: a group needs {GROUP_HEADER_SIZE} header bytes, got {len(view)}",
            source=source,
            position=0,
        )
    version, reserved1, reserved2, committed_at_ms, count, body_length, crc = GROUP_HEADER.unpack_from(view)
    if crc32c(view[GROUP_HEADER_SIZE:], crc32c(view[:_CRC_COVERED])) != crc:
        raise CorruptionError("change log: group CRC32C mismatch", source=source, position=0)
    if version != GROUP_VERSION:
        raise CorruptionError(f"change log: unknown group version {version}", source=source, position=0)
    if reserved1 or reserved2:
        raise CorruptionError("change log: reserved header bytes are not zero", source=source, position=1)
    if body_length != len(view) - GROUP_HEADER_SIZE:
        raise CorruptionError(
            f"change log: the header says {body_length} body bytes, {len(view) - GROUP_HEADER_SIZE} follow",
            source=source,
            position=16,
        )
    reader = _Reader(view, GROUP_HEADER_SIZE, source)
    changes: list[Change] = []
    for _ in range(count):
        start, value = reader.pos, reader.u8()
        if value not in _TAG_VALUES:
            raise CorruptionError(f"change log: Tag has no value {value}", source=source, position=start)
        tag = Tag(value)
        changes.append(_DECODERS[tag](reader))
    if reader.pos != len(view):
        raise reader.fail(f"{len(view) - reader.pos} bytes follow the last of {count} changes")
    return Group(committed_at_ms, changes)
