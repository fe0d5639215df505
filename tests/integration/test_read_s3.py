"""The read path against a real S3 server (Ceph RGW) and real SQLite metadata.

Objects are written with ObjectWriter through S3ObjectStorage (single PUT and multipart), committed
to a SQLite metadata store, and read back through ObjectStreamReader: whole ranges with readahead,
a compaction that deletes the objects under a reader (real 404s), and a corrupted object.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from s3stream.engine.blockcache import BlockCache
from s3stream.engine.reader import ObjectStreamReader
from s3stream.engine.readstate import ReadaheadSettings
from s3stream.errors import CorruptionError
from s3stream.ids import NodeId, ObjectId, StreamId
from s3stream.metadata.base import CommitStreamObjectRequest
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.objectformat import DataBlock, ObjectReaderCache, ObjectWriter, object_key
from s3stream.record import StreamRecordBatch
from s3stream.storage.s3 import S3ObjectStorage
from tests.support.objects import commit_stream_set_object
from tests.support.s3 import S3TestServer

pytestmark = pytest.mark.integration

NS = "itest"
NODE = NodeId(0)
KiB = 1024
MiB = 1024 * KiB


class World:
    def __init__(self, storage: S3ObjectStorage, metadata: SqliteMetadataStore) -> None:
        self.storage = storage
        self.metadata = metadata

    async def stream(self) -> StreamId:
        stream_id = await self.metadata.create_stream(node_id=NODE, node_epoch=1)
        await self.metadata.open_stream(node_id=NODE, node_epoch=1, stream_id=stream_id, epoch=0)
        return stream_id

    async def write(self, batches: list[StreamRecordBatch], *, block_size: int = 64 * KiB) -> ObjectId:
        return await commit_stream_set_object(
            self.metadata,
            self.storage,
            sorted(batches, key=lambda b: (b.stream_id, b.base_offset)),
            namespace=NS,
            node_id=NODE,
            block_size_bytes=block_size,
            part_size_bytes=5 * MiB,
            ttl_ms=600_000,
        )

    def reader(self, *, readahead: bool = True) -> ObjectStreamReader:
        return ObjectStreamReader(
            self.metadata,
            self.storage,
            namespace=NS,
            block_cache=BlockCache[DataBlock](64 * MiB),
            reader_cache=ObjectReaderCache(self.storage),
            readahead=ReadaheadSettings(enabled=readahead, free_guard_bytes=0),
        )


@pytest.fixture
async def world(s3_server: S3TestServer, s3_prefix: str, tmp_path: Path) -> AsyncIterator[World]:
    storage = s3_server.storage(s3_prefix)
    metadata = await SqliteMetadataStore.open(tmp_path / "metadata.db")
    await metadata.register_node(node_id=NODE, node_epoch=1)
    try:
        yield World(storage, metadata)
    finally:
        keys = [info.key async for info in storage.list("")]
        await storage.delete(keys)
        await storage.close()
        await metadata.close()


def records(stream_id: int, start: int, n: int, rng: random.Random, size_max: int) -> list[StreamRecordBatch]:
    out, offset = [], start
    for _ in range(n):
        count = rng.randint(1, 5)
        out.append(StreamRecordBatch(stream_id, 0, offset, count, rng.randbytes(rng.randint(1, size_max))))
        offset += count
    return out


async def read_all(
    reader: ObjectStreamReader, stream_id: StreamId, end: int, max_bytes: int
) -> list[StreamRecordBatch]:
    out: list[StreamRecordBatch] = []
    offset = 0
    while offset < end:
        got = await reader.read(stream_id, offset, end, max_bytes)
        assert got, f"no progress at offset {offset}"
        out.extend(got)
        offset = got[-1].end_offset
    return out


async def test_sequential_catch_up_read_returns_every_batch(world: World, rng_seed: int) -> None:
    rng = random.Random(rng_seed)
    s, other = await world.stream(), await world.stream()
    data = records(s, 0, 900, rng, 16 * KiB)  # ~7 MiB: the second object goes multipart
    await world.write(data[:300] + records(other, 0, 50, rng, 1 * KiB))
    await world.write(data[300:], block_size=256 * KiB)
    reader = world.reader()
    try:
        got = await read_all(reader, s, data[-1].end_offset, 256 * KiB)
        assert got == data
        assert reader.stats().readahead_count > 0
    finally:
        await reader.close()


async def test_objects_deleted_by_compaction_under_a_reader_are_retried(world: World, rng_seed: int) -> None:
    rng = random.Random(rng_seed)
    s = await world.stream()
    data = records(s, 0, 200, rng, 4 * KiB)
    old = [
        await world.write(data[:100], block_size=8 * KiB),
        await world.write(data[100:], block_size=8 * KiB),
    ]
    reader = world.reader(readahead=False)
    try:
        first = await reader.read(s, 0, data[-1].end_offset, 16 * KiB)
        new_id = await world.metadata.prepare_objects(count=1, ttl_ms=600_000)
        writer = ObjectWriter(world.storage.upload(object_key(new_id, NS)), block_size_bytes=8 * KiB)
        await writer.write(data)
        written = await writer.close()
        await world.metadata.commit_stream_object(
            CommitStreamObjectRequest(
                object_id=new_id,
                object_size_bytes=written.size_bytes,
                stream_id=s,
                stream_epoch=-1,
                start_offset=0,
                end_offset=data[-1].end_offset,
                source_object_ids=tuple(old),
                node_id=NODE,
                node_epoch=1,
            )
        )
        await world.storage.delete([object_key(o, NS) for o in old])
        rest = await read_all_from(reader, s, first[-1].end_offset, data[-1].end_offset)
        assert first + rest == data
        assert reader.stats().retry_count >= 1
    finally:
        await reader.close()


async def read_all_from(
    reader: ObjectStreamReader, s: StreamId, start: int, end: int
) -> list[StreamRecordBatch]:
    out: list[StreamRecordBatch] = []
    while start < end:
        got = await reader.read(s, start, end, 1 * MiB)
        assert got
        out.extend(got)
        start = got[-1].end_offset
    return out


async def test_corrupted_object_is_reported_never_returned(world: World, rng_seed: int) -> None:
    rng = random.Random(rng_seed)
    s = await world.stream()
    data = records(s, 0, 50, rng, 2 * KiB)
    object_id = await world.write(data, block_size=4 * KiB)
    key = object_key(object_id, NS)
    raw = bytearray(await world.storage.get(key))
    raw[rng.randrange(0, 4 * KiB)] ^= 0x01  # one bit inside the first data block
    await world.storage.put(key, bytes(raw))
    reader = world.reader(readahead=False)
    try:
        with pytest.raises(CorruptionError) as info:
            await reader.read(s, 0, data[-1].end_offset, 1 * MiB)
        assert info.value.source == key
    finally:
        await reader.close()
