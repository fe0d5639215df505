"""WAL record bodies: plain batches and atomic groups round-trip; damaged bodies are CorruptionError."""

from __future__ import annotations

import pytest

from s3stream.engine.walbody import (
    ATOMIC_GROUP_MAGIC,
    GROUP_HEADER_SIZE,
    KV_BODY_MAGIC,
    KvMutation,
    KvOp,
    decode_body,
    encode_group,
    encode_kv,
    encode_plain,
    group_size,
)
from s3stream.errors import CorruptionError
from s3stream.record import StreamRecordBatch

A = StreamRecordBatch(1, 2, 3, 4, b"payload")
B = StreamRecordBatch(9, 0, 0, 1, b"")


def test_plain_body_is_the_record_encoding() -> None:
    body = encode_plain(A)
    assert body[0] == 0x22
    assert decode_body(body).batches == (A,)


def test_group_round_trip_and_size() -> None:
    puts = [("ckpt/1", b"\x00\x01"), ("é", b"")]
    body = encode_group([A, B], puts)
    assert body[0] == ATOMIC_GROUP_MAGIC
    assert len(body) == group_size([A, B], puts)
    decoded = decode_body(body)
    assert decoded.batches == (A, B)
    assert decoded.kv_puts == tuple(puts)


def test_golden_group_bytes() -> None:
    body = encode_group([], [("k", b"v")])
    assert body.hex() == "5a01000000000000000000010001000000016b76"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b"",
        lambda b: b"\x99" + b[1:],
        lambda b: b[:5],
        lambda b: b[:-1],
        lambda b: b + b"\x00",
        lambda b: b[:1] + b"\x02" + b[2:],  # version
        lambda b: b[:2] + b"\x00\x01" + b[4:],  # reserved
    ],
)
def test_damaged_group_is_corruption(mutate: object) -> None:
    body = encode_group([A], [("k", b"v")])
    assert callable(mutate)
    with pytest.raises(CorruptionError):
        decode_body(mutate(body), source="wal", position=100)


def test_trailing_bytes_after_a_plain_body_are_corruption() -> None:
    with pytest.raises(CorruptionError, match="at byte 100"):
        decode_body(encode_plain(A) + b"x", source="wal", position=100 - len(encode_plain(A)))
    assert GROUP_HEADER_SIZE == 12


MUTATIONS = [
    KvMutation(KvOp.PUT, "a", b"1"),
    KvMutation(KvOp.PUT_IF_ABSENT, "é", b""),
    KvMutation(KvOp.DELETE, "a"),
]


def test_kv_mutations_round_trip() -> None:
    body = encode_kv(MUTATIONS)
    assert body[0] == KV_BODY_MAGIC
    decoded = decode_body(body)
    assert decoded.batches == ()
    assert decoded.kv_ops == tuple(MUTATIONS)


def test_golden_kv_mutations_bytes() -> None:
    body = encode_kv([KvMutation(KvOp.DELETE, "k")])
    assert body.hex() == "4b0100000000000103000001000000006b"


def test_group_puts_are_kv_ops_too() -> None:
    decoded = decode_body(encode_group([A], [("k", b"v")]))
    assert decoded.kv_ops == (KvMutation(KvOp.PUT, "k", b"v"),)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b[:5],
        lambda b: b[:-1],
        lambda b: b + b"\x00",
        lambda b: b[:1] + b"\x02" + b[2:],  # version
        lambda b: b[:2] + b"\x00\x01" + b[4:],  # reserved
        lambda b: b[:8] + b"\x07" + b[9:],  # unknown operation
        lambda b: b[:9] + b"\x01" + b[10:],  # reserved byte of a mutation
        lambda b: b[:8] + b"\x03" + b[9:],  # a delete that carries a value
    ],
)
def test_damaged_kv_mutations_are_corruption(mutate: object) -> None:
    body = encode_kv([KvMutation(KvOp.PUT, "k", b"v")])
    assert callable(mutate)
    with pytest.raises(CorruptionError):
        decode_body(mutate(body), source="wal", position=100)


async def test_the_append_path_writes_the_plain_body_of_its_batch() -> None:
    from s3stream.config import Config
    from s3stream.engine.client import Client
    from s3stream.engine.core import Engine
    from s3stream.engine.walport import MemoryWal
    from s3stream.ids import NodeId
    from s3stream.metadata.memory import MemoryMetadataStore
    from s3stream.model import RecordBatch
    from s3stream.storage.memory import MemoryObjectStorage

    wal = MemoryWal(capacity_bytes=1 << 24)
    metadata = MemoryMetadataStore()
    engine = Engine(
        Config(), wal=wal, metadata=metadata, storage=MemoryObjectStorage(), node_id=NodeId(0), node_epoch=1
    )
    await engine.start()
    client = Client(engine, metadata)
    stream = await client.streams.create_and_open_stream(epoch=4)
    await stream.append(RecordBatch(b"xyz", count=3))
    await stream.append(RecordBatch(b"w"))
    bodies = [body for _, body in sorted(wal.records.items())]
    assert bodies == [
        encode_plain(StreamRecordBatch(stream.stream_id, 4, 0, 3, b"xyz")),
        encode_plain(StreamRecordBatch(stream.stream_id, 4, 3, 1, b"w")),
    ]
    engine.abandon()
