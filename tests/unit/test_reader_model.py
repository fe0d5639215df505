"""ObjectStreamReader against a model: random object layouts, block sizes, cache sizes and reads."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s3stream._loop import run
from s3stream.engine.blockcache import BlockCache
from s3stream.engine.fetchmerge import merge_fetch
from s3stream.engine.reader import ObjectStreamReader
from s3stream.engine.readstate import ReadaheadSettings
from s3stream.ids import NodeId
from s3stream.metadata.base import CommitStreamObjectRequest, CommitStreamSetObjectRequest, StreamOffsetRange
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.objectformat import DataBlock, ObjectReaderCache, ObjectWriter, object_key
from s3stream.record import StreamRecordBatch
from s3stream.storage.memory import MemoryObjectStorage
from tests.support.objects import commit_stream_set_object
from tests.unit.test_reader_merge import reference

NS = "model"
NODE = NodeId(0)


@dataclass(frozen=True)
class Layout:
    counts: list[int]
    sizes: list[int]
    cuts: list[int]
    block_size: int
    cache_bytes: int
    scan_max_bytes: int
    reads: list[tuple[float, float, int]]


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    counts = draw(st.lists(st.integers(1, 3), min_size=1, max_size=60))
    sizes = draw(st.lists(st.integers(0, 200), min_size=len(counts), max_size=len(counts)))
    cuts = sorted(set(draw(st.lists(st.integers(1, len(counts)), max_size=4))) - {len(counts)})
    reads = draw(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1), st.integers(1, 2000)), max_size=6))
    return Layout(
        counts=counts,
        sizes=sizes,
        cuts=cuts,
        block_size=draw(st.integers(1, 600)),
        cache_bytes=draw(st.sampled_from([1500, 4000, 1 << 20])),
        scan_max_bytes=draw(st.integers(1, 1500)),
        reads=reads,
    )


def assert_merge_keeps(got: list[StreamRecordBatch], start: int, end: int, max_bytes: int) -> None:
    """Engine.fetch returns a read without LogCache part as it is: merge_fetch would not change it."""
    assert merge_fetch([], got, start_offset=start, end_offset=end, max_bytes=max_bytes) == got


async def check(layout: Layout) -> None:
    storage, metadata = MemoryObjectStorage(), MemoryMetadataStore()
    await metadata.register_node(node_id=NODE, node_epoch=1)
    s = await metadata.create_stream(node_id=NODE, node_epoch=1)
    other = await metadata.create_stream(node_id=NODE, node_epoch=1)
    for stream_id in (s, other):
        await metadata.open_stream(node_id=NODE, node_epoch=1, stream_id=stream_id, epoch=0)
    batches, base = [], 0
    for count, size in zip(layout.counts, layout.sizes, strict=True):
        batches.append(StreamRecordBatch(s, 0, base, count, bytes([base % 256]) * size))
        base += count
    bounds = [0, *layout.cuts, len(batches)]
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        await commit_stream_set_object(
            metadata,
            storage,  # type: ignore[arg-type]
            [*batches[lo:hi], StreamRecordBatch(other, 0, i, 1, b"o" * 30)],
            namespace=NS,
            node_id=NODE,
            block_size_bytes=layout.block_size,
        )
    reader = ObjectStreamReader(
        metadata,
        storage,
        namespace=NS,
        block_cache=BlockCache[DataBlock](layout.cache_bytes),
        reader_cache=ObjectReaderCache(storage),
        readahead=ReadaheadSettings(initial_bytes=256, step_bytes=256, max_bytes=4096, free_guard_bytes=0),
    )
    try:
        total = base
        # a sequential consumer, letting readahead run between reads
        offset, scanned = 0, []
        while offset < total:
            got = await reader.read(s, offset, total, layout.scan_max_bytes)
            assert got == reference(batches, offset, total, layout.scan_max_bytes)
            assert_merge_keeps(got, offset, total, layout.scan_max_bytes)
            scanned.extend(got)
            offset = got[-1].end_offset
            await asyncio.sleep(0)
        assert scanned == batches
        for start_frac, end_frac, max_bytes in layout.reads:
            start = min(total - 1, int(start_frac * total))
            end = start + 1 + int(end_frac * (total - start - 1))
            got = await reader.read(s, start, end, max_bytes)
            assert got == reference(batches, start, end, max_bytes)
            assert_merge_keeps(got, start, end, max_bytes)
        assert reader._cache.used_bytes <= reader._cache.capacity_bytes
    finally:
        await reader.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=layouts())
def test_reads_equal_the_model(layout: Layout) -> None:
    run(check(layout))


async def test_concurrent_consumers_read_right_while_compaction_replaces_objects(rng_seed: int) -> None:
    """Consumers scan while a compactor merges pairs of objects into stream objects and deletes the
    old ones at once: every read retries onto the new objects and every consumer sees the stream."""
    import random

    rng = random.Random(rng_seed)
    storage, metadata = MemoryObjectStorage(), MemoryMetadataStore()
    await metadata.register_node(node_id=NODE, node_epoch=1)
    s = await metadata.create_stream(node_id=NODE, node_epoch=1)
    await metadata.open_stream(node_id=NODE, node_epoch=1, stream_id=s, epoch=0)
    data, base = [], 0
    for _ in range(240):
        count = rng.randint(1, 3)
        data.append(StreamRecordBatch(s, 0, base, count, rng.randbytes(rng.randint(1, 120))))
        base += count

    async def write(batches: list[StreamRecordBatch]) -> tuple[int, int]:
        object_id = await metadata.prepare_objects(count=1, ttl_ms=60_000)
        writer = ObjectWriter(
            storage.upload(object_key(object_id, NS)), block_size_bytes=rng.randint(100, 800)
        )
        await writer.write(batches)
        written = await writer.close()
        return object_id, written.size_bytes

    for lo in range(0, 240, 30):
        object_id, size = await write(data[lo : lo + 30])
        await metadata.commit_stream_set_object(
            CommitStreamSetObjectRequest(
                node_id=NODE,
                node_epoch=1,
                object_id=object_id,  # type: ignore[arg-type]
                order_id=object_id,
                object_size_bytes=size,
                stream_ranges=(StreamOffsetRange(s, data[lo].base_offset, data[lo + 29].end_offset),),
            )
        )
    reader = ObjectStreamReader(
        metadata,
        storage,
        namespace=NS,
        block_cache=BlockCache[DataBlock](1 << 20),
        reader_cache=ObjectReaderCache(storage),
        readahead=ReadaheadSettings(initial_bytes=512, step_bytes=512, max_bytes=8192, free_guard_bytes=0),
    )

    async def consumer() -> list[StreamRecordBatch]:
        out: list[StreamRecordBatch] = []
        offset = 0
        while offset < base:
            got = await reader.read(s, offset, base, rng.randint(1, 2000))
            out.extend(got)
            offset = got[-1].end_offset
            await asyncio.sleep(rng.random() / 1000)
        return out

    async def compactor() -> int:
        rounds = 0
        while True:
            slices = await metadata.get_objects(stream_id=s, start_offset=0, end_offset=-1, limit=100)
            if len(slices) < 2:
                return rounds
            i = rng.randrange(len(slices) - 1)
            a, b = slices[i], slices[i + 1]
            merged = [d for d in data if a.start_offset <= d.base_offset < b.end_offset]
            object_id, size = await write(merged)
            await metadata.commit_stream_object(
                CommitStreamObjectRequest(
                    object_id=object_id,  # type: ignore[arg-type]
                    object_size_bytes=size,
                    stream_id=s,
                    stream_epoch=-1,
                    start_offset=a.start_offset,
                    end_offset=b.end_offset,
                    source_object_ids=(a.object_id, b.object_id),
                    node_id=NODE,
                    node_epoch=1,
                )
            )
            await storage.delete([object_key(a.object_id, NS), object_key(b.object_id, NS)])
            rounds += 1
            await asyncio.sleep(0.005)  # far more often than real compaction (minutes)

    try:
        *scans, rounds = await asyncio.gather(consumer(), consumer(), consumer(), compactor())
    finally:
        await reader.close()
    assert rounds == 7
    assert all(scan == data for scan in scans)
    assert await reader_after_compaction(metadata, storage, s, base) == data


async def reader_after_compaction(
    metadata: MemoryMetadataStore, storage: MemoryObjectStorage, s: int, end: int
) -> list[StreamRecordBatch]:
    reader = ObjectStreamReader(
        metadata,
        storage,
        namespace=NS,
        block_cache=BlockCache[DataBlock](1 << 20),
        reader_cache=ObjectReaderCache(storage),
    )
    try:
        return await reader.read(s, 0, end, 1 << 30)  # type: ignore[arg-type]
    finally:
        await reader.close()
