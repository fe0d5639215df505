"""ObjectStreamReader against a model: random object layouts, block sizes, cache sizes and reads."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s3stream._loop import run
from s3stream.engine.blockcache import BlockCache
from s3stream.engine.reader import ObjectStreamReader, ReadaheadSettings
from s3stream.ids import NodeId
from s3stream.metadata.base import CommitStreamSetObjectRequest
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.objectformat import DataBlock, ObjectReaderCache, ObjectWriter, object_key
from s3stream.record import StreamRecordBatch
from s3stream.storage.memory import MemoryObjectStorage
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
        object_id = await metadata.prepare_objects(count=1, ttl_ms=60_000)
        writer = ObjectWriter(storage.upload(object_key(object_id, NS)), block_size_bytes=layout.block_size)  # type: ignore[arg-type]
        await writer.write([*batches[lo:hi], StreamRecordBatch(other, 0, i, 1, b"o" * 30)])
        written = await writer.close()
        await metadata.commit_stream_set_object(
            CommitStreamSetObjectRequest(
                node_id=NODE,
                node_epoch=1,
                object_id=object_id,
                order_id=object_id,
                object_size_bytes=written.size_bytes,
                stream_ranges=written.stream_ranges,
            )
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
            scanned.extend(got)
            offset = got[-1].end_offset
            await asyncio.sleep(0)
        assert scanned == batches
        for start_frac, end_frac, max_bytes in layout.reads:
            start = min(total - 1, int(start_frac * total))
            end = start + 1 + int(end_frac * (total - start - 1))
            assert await reader.read(s, start, end, max_bytes) == reference(batches, start, end, max_bytes)
        assert reader._cache.used_bytes <= reader._cache.capacity_bytes
    finally:
        await reader.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=layouts())
def test_reads_equal_the_model(layout: Layout) -> None:
    run(check(layout))
