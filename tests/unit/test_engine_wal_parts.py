"""Plain WAL bodies: large ones handed over as (header, payload) parts (no copy), small ones joined;
the same bytes as the record encoding either way."""

from __future__ import annotations

from pathlib import Path

import pytest

from s3stream.assembly import build_reader, open_block_wal
from s3stream.engine.append import PARTS_MIN_BYTES
from s3stream.engine.client import Client
from s3stream.engine.core import Engine
from s3stream.engine.walbody import decode_body, encode_plain, plain_parts
from s3stream.engine.walport import BodyParts, MemoryWal, WriteAheadLog, body_size
from s3stream.errors import CapacityError, InvalidArgumentError
from s3stream.ids import NodeId
from s3stream.metadata.base import MetadataStore
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.model import RecordBatch
from s3stream.record import RECORD_MAGIC, StreamRecordBatch
from s3stream.storage.base import ObjectStorage
from s3stream.storage.local import LocalObjectStorage
from s3stream.storage.memory import MemoryObjectStorage
from tests.support.configs import small_config

KiB = 1024
MiB = 1024 * KiB

CONFIG = small_config(wal_upload_threshold_bytes=4 * MiB, wal_upload_interval_ms=600_000)

PAYLOADS = [b"a", bytes(range(256)) * 4, bytes(range(251)) * 261, b"\x00" * (64 * KiB)]
"""1 B, 1 KiB, an odd ~64 KiB and exactly 64 KiB."""


class RecordingWal:
    """Wraps a WAL and keeps what the engine hands to ``append`` and what ``recover`` returned."""

    def __init__(self, inner: WriteAheadLog) -> None:
        self.inner = inner
        self.appended: list[BodyParts] = []
        self.recovered: list[tuple[int, bytes]] = []

    async def append(self, body: BodyParts) -> int:
        self.appended.append(body)
        return await self.inner.append(body)

    async def trim(self, offset: int) -> None:
        await self.inner.trim(offset)

    async def recover(self) -> list[tuple[int, bytes]]:
        self.recovered = await self.inner.recover()
        return self.recovered

    async def close(self) -> None:
        await self.inner.close()


async def start_engine(
    wal: WriteAheadLog, metadata: MetadataStore, storage: ObjectStorage, epoch: int
) -> Client:
    engine = Engine(
        CONFIG,
        wal=wal,
        metadata=metadata,
        storage=storage,
        node_id=NodeId(0),
        node_epoch=epoch,
        reader=build_reader(CONFIG, metadata, storage),
    )
    await engine.start()
    return Client(engine, metadata, closers=[wal.close])


@pytest.mark.parametrize("payload", PAYLOADS, ids=len)
@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_plain_parts_join_to_the_record_encoding_without_copying_the_payload(
    payload: bytes, kind: type
) -> None:
    given = kind(payload)
    header, tail = plain_parts(7, 1 << 40, (1 << 62) + 3, 1 << 30, given)
    assert tail is given
    expected = StreamRecordBatch(7, 1 << 40, (1 << 62) + 3, 1 << 30, payload).encode()
    assert (
        header + bytes(tail)
        == expected
        == encode_plain(StreamRecordBatch(7, 1 << 40, (1 << 62) + 3, 1 << 30, payload))
    )
    assert decode_body(expected).batches == (StreamRecordBatch(7, 1 << 40, (1 << 62) + 3, 1 << 30, payload),)


async def test_memory_wal_stores_parts_as_the_joined_body_with_the_same_offsets() -> None:
    whole = MemoryWal(capacity_bytes=1 * MiB)
    parted = MemoryWal(capacity_bytes=1 * MiB)
    bodies: list[tuple[bytes | bytearray | memoryview, ...]] = [
        (b"head", b"payload"),
        (b"", bytearray(b"xyz"), memoryview(b"0123456789")[2:6]),
        (b"only",),
    ]
    for parts in bodies:
        joined = b"".join(parts)
        assert await whole.append(joined) == await parted.append(parts)
        assert await parted.append(list(parts)) == await whole.append(joined)
    assert parted.records == whole.records
    assert all(type(body) is bytes for body in parted.records.values())
    assert list(parted.records.values())[:2] == [b"headpayload", b"headpayload"]
    assert (parted.used_bytes, parted.next_offset) == (whole.used_bytes, whole.next_offset)
    await parted.trim(parted.next_offset)
    assert parted.used_bytes == 0
    assert parted.records == {}


async def test_memory_wal_limits_count_the_joined_size_of_the_parts() -> None:
    wal = MemoryWal(capacity_bytes=1 * KiB, record_max_bytes=100)
    with pytest.raises(InvalidArgumentError, match="101 bytes"):
        await wal.append((b"x" * 50, b"y" * 51))
    assert body_size([b"x" * 50, bytearray(50)]) == 100
    await wal.append([b"x" * 50, bytearray(50)])
    for _ in range(7):
        await wal.append((b"z" * 60, b"w" * 40))
    with pytest.raises(CapacityError):
        await wal.append((b"z" * 60, b"w" * 40))
    assert wal.append_count == 8


async def test_the_engine_hands_a_large_plain_append_over_as_header_and_the_callers_payload() -> None:
    wal = RecordingWal(MemoryWal(capacity_bytes=CONFIG.wal_capacity_bytes))
    client = await start_engine(wal, MemoryMetadataStore(), MemoryObjectStorage(), 1)
    stream = await client.streams.create_and_open_stream(epoch=3)
    for payload in PAYLOADS:
        await stream.append(RecordBatch(payload, count=2))
    plain = wal.appended[-len(PAYLOADS) :]
    for index, (body, payload) in enumerate(zip(plain, PAYLOADS, strict=True)):
        expected = StreamRecordBatch(stream.stream_id, 3, 2 * index, 2, payload).encode()
        if len(payload) < PARTS_MIN_BYTES:  # small: one joined body (cheaper for the WAL than parts)
            assert type(body) is bytes
            assert body == expected
        else:
            assert isinstance(body, tuple)
            assert len(body) == 2
            assert body[1] is payload, "the payload goes to the WAL uncopied"
            assert b"".join(body) == expected
    assert sum(isinstance(body, tuple) for body in plain) == 2
    inner = wal.inner
    assert isinstance(inner, MemoryWal)
    assert [b for b in inner.records.values() if b[0] == RECORD_MAGIC] == [
        b"".join(b) if isinstance(b, tuple) else b for b in plain
    ]
    await client.close()


async def test_block_wal_records_written_as_parts_are_the_joined_encoding_and_replay(tmp_path: Path) -> None:
    """Real WAL file, SQLite and local objects: the bytes recovered after a crash are the previous
    joined encoding of each plain batch, and the restarted engine serves them."""
    metadata = await SqliteMetadataStore.open(str(tmp_path / "metadata.db"))
    storage = LocalObjectStorage(str(tmp_path / "objects"))
    wal = RecordingWal(await open_block_wal(tmp_path / "wal", CONFIG, node_epoch=1))
    client = await start_engine(wal, metadata, storage, 1)
    stream = await client.streams.create_and_open_stream(epoch=5)
    for payload in PAYLOADS:
        await stream.append(RecordBatch(payload))
    await client.append_atomic([(stream, RecordBatch(b"grouped"))], kv={"k": b"v"})
    assert sum(isinstance(body, tuple) for body in wal.appended) == sum(
        len(p) >= PARTS_MIN_BYTES for p in PAYLOADS
    )
    assert client.engine.stats.uploads == 0
    client.engine.abandon()  # crash: nothing uploaded, nothing trimmed
    await wal.close()

    again_wal = RecordingWal(await open_block_wal(tmp_path / "wal", CONFIG, node_epoch=2))
    again = await start_engine(again_wal, metadata, storage, 2)
    plain = [body for _, body in again_wal.recovered if body[0] == RECORD_MAGIC]
    assert plain == [StreamRecordBatch(stream.stream_id, 5, i, 1, p).encode() for i, p in enumerate(PAYLOADS)]
    assert again.engine.stats.recovered_records == len(PAYLOADS) + 1
    reopened = await again.streams.open_stream(stream.stream_id, epoch=5)
    again.engine.cache.try_real_free(target_bytes=0)
    got = await reopened.fetch(0, len(PAYLOADS) + 1, max_bytes=1 << 30)
    assert [b.payload for b in got] == [*PAYLOADS, b"grouped"]
    await again.close()
    await storage.close()
    await metadata.close()
