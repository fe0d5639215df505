"""The object format over a real S3 server: multipart write, tail read, ranged block reads, damage."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest

from s3stream.errors import CorruptionError
from s3stream.objectformat import ObjectReader, ObjectReaderCache, ObjectWriter, object_key
from s3stream.record import StreamRecordBatch
from s3stream.storage.s3 import S3ObjectStorage
from tests.support.s3 import S3TestServer

pytestmark = pytest.mark.integration
MiB = 1 << 20


@pytest.fixture
async def storage(s3_server: S3TestServer, s3_prefix: str) -> AsyncIterator[S3ObjectStorage]:
    store = s3_server.storage(s3_prefix, multipart_threshold_bytes=5 * MiB, part_size_bytes=5 * MiB)
    yield store
    keys = [info.key async for info in store.list()]
    await store.delete(keys)
    await store.close()


def _batches(rng_seed: int) -> list[StreamRecordBatch]:
    rng = random.Random(rng_seed)
    batches = []
    for stream_id in (3, 8, 21):
        offset = rng.randrange(1000)
        for _ in range(120):
            count = rng.randrange(1, 40)
            batches.append(
                StreamRecordBatch(stream_id, 2, offset, count, rng.randbytes(rng.randrange(1, 64 << 10)))
            )
            offset += count
    return batches


async def test_multipart_object_reads_back_block_by_block(storage: S3ObjectStorage, rng_seed: int) -> None:
    batches = _batches(rng_seed)
    key = object_key(4660, "it")
    writer = ObjectWriter(storage.upload(key), block_size_bytes=256 << 10, part_size_bytes=5 * MiB)
    await writer.write(batches)
    written = await writer.close()
    assert written.size_bytes == (await storage.head(key)).size_bytes
    assert storage.stats.counts["upload_part"] >= 2  # the object went up as a multipart upload
    cache = ObjectReaderCache(storage)
    reader = await cache.get(key, written.size_bytes)
    assert reader.index == written.index
    assert reader.has_checksums
    for stream_id in (3, 8, 21):
        mine = [b for b in batches if b.stream_id == stream_id]
        found = reader.find(stream_id, mine[0].base_offset)
        assert found.next_offset == mine[-1].end_offset
        blocks = await reader.read_blocks(found.entries)
        assert [r for b in blocks for r in b.records] == mine
    middle = batches[200]
    found = reader.find(middle.stream_id, middle.base_offset + middle.count - 1, max_bytes=1)
    [block] = await reader.read_blocks(found.entries[:1])
    assert middle in block.records


async def test_damaged_object_on_s3_is_corruption(storage: S3ObjectStorage, rng_seed: int) -> None:
    key = object_key(7, "it")
    writer = ObjectWriter(storage.upload(key), block_size_bytes=64 << 10)
    await writer.write(_batches(rng_seed)[:50])
    written = await writer.close()
    data = bytearray(await storage.get(key))
    victim = written.index[len(written.index) // 2]
    data[victim.start_position + victim.size_bytes // 2] ^= 0x04
    await storage.put(key, bytes(data))
    reader = await ObjectReader.open(storage, key, written.size_bytes)
    with pytest.raises(CorruptionError) as info:
        await reader.read_blocks(reader.index)
    assert info.value.source == key
    assert info.value.position == victim.start_position
