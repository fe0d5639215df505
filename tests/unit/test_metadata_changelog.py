"""The change-log codec: every change kind round-trips; damage is CorruptionError, never a wrong value."""

from __future__ import annotations

import random

import pytest

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
from s3stream.metadata.changelog import (
    GROUP_HEADER,
    GROUP_HEADER_SIZE,
    UNLOGGED,
    Tag,
    decode_group,
    encode_group,
)
from s3stream.metadata.changes import (
    AdvanceEndOffsets,
    Change,
    Counter,
    PutKv,
    PutLease,
    PutNode,
    PutObject,
    PutPlacement,
    PutRange,
    PutStream,
    PutStreamObject,
    PutStreamSetObject,
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

EVERY_KIND: list[Change] = [
    SetCounter(Counter.STREAM_ID, 7),
    SetCounter(Counter.OBJECT_ID, (1 << 63) - 1),
    PutNode(NodeId(3), 1_700_000_000_000),
    PutNode(NodeId(4), 9, lease_expires_at_ms=1_700_000_010_000, heartbeat_at_ms=5, registered_at_ms=2),
    PutLease(LeaseInfo("maintenance", NodeId(4), 9, 1_700_000_010_000)),
    RemoveLease("maintenance"),
    PutStream(StreamId(5), 2, StreamState.OPENED, 10, 99, {"topic": "t", "ü": "ẞ"}),
    PutStream(StreamId(6), -1, StreamState.CLOSED, 0, 0, {}),
    RemoveStream(StreamId(9)),
    PutRange(RangeMetadata(StreamId(5), 2, 1, 50, 99, NodeId(3))),
    AdvanceEndOffsets((StreamId(1), StreamId(2), StreamId(1 << 40)), (5, 6, (1 << 62) + 3)),
    AdvanceEndOffsets((), ()),
    RemoveRange(StreamId(5), 0),
    PutObject(S3ObjectMetadata(ObjectId(12), ObjectState.PREPARED, 0, 1, 2)),
    PutObject(
        S3ObjectMetadata(ObjectId(13), ObjectState.COMMITTED, 4096, 1, 2, 3, -1, ObjectKind.STREAM_SET)
    ),
    PutObject(S3ObjectMetadata(ObjectId(14), ObjectState.MARK_DESTROYED, 9, 1, 2, 3, 4, ObjectKind.STREAM)),
    RemoveObject(ObjectId(12)),
    PutStreamSetObject(
        StreamSetObject(
            ObjectId(13),
            NodeId(3),
            13,
            1234,
            4096,
            (StreamOffsetRange(StreamId(1), 0, 5, 100), StreamOffsetRange(StreamId(2), 3, 6, 200)),
        )
    ),
    RemoveStreamSetObject(ObjectId(13)),
    PutStreamObject(StreamObject(ObjectId(14), StreamId(5), 10, 20, 9, 777)),
    RemoveStreamObject(ObjectId(14)),
    PutKv("key/ü", b"\x00\xffvalue"),
    PutKv("empty", b""),
    RemoveKv("key/ü"),
    PutPlacement(ObjectId(13), 0),
    PutPlacement(ObjectId(13), (1 << 31) - 1),
    RemovePlacements(ObjectId(13)),
]


def test_every_change_kind_round_trips_in_order() -> None:
    assert {type(c) for c in EVERY_KIND} == set(Change.__args__) - set(UNLOGGED)
    data = encode_group(EVERY_KIND, committed_at_ms=1_700_000_123_456)
    group = decode_group(data, source="test")
    assert group.committed_at_ms == 1_700_000_123_456
    assert group.changes == EVERY_KIND


def test_every_tag_is_written_by_some_change() -> None:
    data = encode_group(EVERY_KIND, committed_at_ms=0)
    tags = set()
    # walk the body with the decoder's own framing: re-encode each change alone and read its tag byte
    for change in EVERY_KIND:
        tags.add(encode_group([change], committed_at_ms=0)[GROUP_HEADER_SIZE])
    assert tags == {int(t) for t in Tag}
    assert len(data) > GROUP_HEADER_SIZE


def test_an_empty_group_round_trips() -> None:
    assert decode_group(encode_group([], committed_at_ms=5), source="t").changes == []


def test_every_flipped_byte_is_detected() -> None:
    data = encode_group(EVERY_KIND, committed_at_ms=42)
    for pos in range(len(data)):
        damaged = bytearray(data)
        damaged[pos] ^= 0x40
        with pytest.raises(CorruptionError):
            decode_group(bytes(damaged), source="flip")


def test_truncated_and_extended_groups_are_detected() -> None:
    data = encode_group(EVERY_KIND, committed_at_ms=42)
    for cut in (0, 1, GROUP_HEADER_SIZE - 1, GROUP_HEADER_SIZE, len(data) - 1):
        with pytest.raises(CorruptionError):
            decode_group(data[:cut], source="cut")
    with pytest.raises(CorruptionError):
        decode_group(data + b"\x00", source="longer")


def test_a_consistent_header_over_a_bad_body_is_reported_with_its_position() -> None:
    # A body that passes the CRC (re-computed) but holds an unknown tag: the decoder names the byte.
    body = bytes([200])
    head = GROUP_HEADER.pack(1, 0, 0, 0, 1, len(body), 0)
    from crc32c import crc32c

    crc = crc32c(body, crc32c(head[:-4]))
    data = head[:-4] + crc.to_bytes(4, "big") + body
    with pytest.raises(CorruptionError, match="Tag has no value 200") as info:
        decode_group(data, source="bad-tag")
    assert info.value.position == GROUP_HEADER_SIZE


def test_random_bytes_give_corruption_error_only() -> None:
    rng = random.Random(1717)
    print("seed 1717")
    for _ in range(2000):
        size = rng.randrange(0, 80)
        data = bytes(rng.randrange(256) for _ in range(size))
        with pytest.raises(CorruptionError):
            decode_group(data, source="random")
