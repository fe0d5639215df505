"""A write retried after "WAL full" lands in the WAL after records submitted later; recovery must
still restore exactly what was acknowledged (streams: every batch; KV: the acknowledged order)."""

from __future__ import annotations

import asyncio

from s3stream.assembly import build_reader
from s3stream.engine.client import Client
from s3stream.engine.core import Engine
from s3stream.engine.walport import BodyParts, MemoryWal, body_size
from s3stream.errors import CapacityError
from s3stream.ids import NodeId
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.model import RecordBatch
from s3stream.storage.memory import MemoryObjectStorage
from tests.support.configs import small_config

MiB = 1 << 20
CONFIG = small_config(wal_upload_threshold_bytes=2 * MiB, append_backpressure_wait_ms=5_000)
BIG_BYTES = 64 * 1024


class RoomForSmallRecordsOnly(MemoryWal):
    """A WAL with room left for small records but not for big ones, until ``make_room()``."""

    def __init__(self) -> None:
        super().__init__(capacity_bytes=CONFIG.wal_capacity_bytes)
        self.full_for_big = False
        self.refused_count = 0

    async def append(self, body: BodyParts) -> int:
        if self.full_for_big and body_size(body) >= BIG_BYTES:
            self.refused_count += 1
            raise CapacityError("WAL full (no room for a big record)")
        return await super().append(body)

    def make_room(self) -> None:
        self.full_for_big = False


async def open_engine(
    wal: MemoryWal, metadata: MemoryMetadataStore, storage: MemoryObjectStorage, epoch: int
) -> Client:
    engine = Engine(
        CONFIG,
        wal=wal.reopen(),
        metadata=metadata,
        storage=storage,
        node_id=NodeId(0),
        node_epoch=epoch,
        reader=build_reader(CONFIG, metadata, storage),
    )
    await engine.start()
    return Client(engine, metadata, closers=[wal.close])


async def wait_until(condition: object, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.001)


async def test_writes_retried_after_wal_full_recover_as_acknowledged() -> None:
    wal, metadata, storage = RoomForSmallRecordsOnly(), MemoryMetadataStore(), MemoryObjectStorage()
    client = await open_engine(wal, metadata, storage, epoch=1)
    stream = await client.streams.create_and_open_stream()
    big_payload, big_value = b"A" * BIG_BYTES, b"V" * BIG_BYTES

    wal.full_for_big = True
    first_append = asyncio.create_task(stream.append(RecordBatch(big_payload)))  # offset 0
    first_put = asyncio.create_task(client.kv.put("k", big_value))
    await wait_until(lambda: wal.refused_count == 2)  # both wait in the "WAL full" retry
    second_append = asyncio.create_task(stream.append(RecordBatch(b"b")))  # offset 1
    second_put = asyncio.create_task(client.kv.put("k", b"small"))
    await wait_until(lambda: wal.append_count == 2)  # the later two are durable first
    wal.make_room()
    assert await first_append == 0
    assert await second_append == 1
    acknowledged = [await first_put, await second_put]
    acknowledged_value = await client.kv.get("k")

    # The interleaving under test: WAL order differs from submission order.
    bodies = [body for _, body in sorted(wal.records.items())]
    assert [len(b) >= BIG_BYTES for b in bodies[-4:]] == [False, False, True, True]
    assert set(acknowledged) == {big_value, b"small"}

    client.engine.abandon()  # crash: nothing uploaded, the WAL holds all four records
    again = await open_engine(wal, metadata, storage, epoch=2)
    assert again.engine.stats.recovered_records == 2
    assert await again.kv.get("k") == acknowledged_value
    reopened = await again.streams.open_stream(stream.stream_id, epoch=stream.epoch)
    assert reopened.confirm_offset == 2
    got = await reopened.fetch(0, 2, max_bytes=1 << 30)
    assert [(b.base_offset, b.payload) for b in got] == [(0, big_payload), (1, b"b")]
    await again.close()
