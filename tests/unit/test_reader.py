"""ObjectStreamReader on the memory twins: objects built with ObjectWriter and committed to metadata."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from s3stream.engine.blockcache import BlockCache
from s3stream.engine.reader import ObjectStreamReader
from s3stream.engine.readplan import MERGED_GET_MAX_BYTES, first_within, merged_runs
from s3stream.engine.readstate import BlockRef, ReadaheadSettings
from s3stream.errors import ClosedError, CorruptionError, InvalidArgumentError, OffsetOutOfRangeError
from s3stream.ids import NodeId, ObjectId, StreamId
from s3stream.metadata.base import CommitStreamObjectRequest
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.objectformat import DataBlock, IndexEntry, ObjectReaderCache, ObjectWriter, object_key
from s3stream.record import StreamRecordBatch
from s3stream.storage.memory import MemoryObjectStorage
from tests.support.objects import commit_stream_set_object

NS = "test"
NODE = NodeId(0)
NODE_EPOCH = 1
BLOCK_SIZE = 256
"""Small blocks: a few records each, so objects hold many blocks."""


class Env:
    def __init__(self) -> None:
        self.storage = MemoryObjectStorage("reader-test")
        self.metadata = MemoryMetadataStore()
        self.gets: list[tuple[str, int, int | None]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.readers: list[ObjectStreamReader] = []

    async def setup(self) -> Env:
        await self.metadata.register_node(node_id=NODE, node_epoch=NODE_EPOCH)
        return self

    async def stream(self) -> StreamId:
        stream_id = await self.metadata.create_stream(node_id=NODE, node_epoch=NODE_EPOCH)
        await self.metadata.open_stream(node_id=NODE, node_epoch=NODE_EPOCH, stream_id=stream_id, epoch=0)
        return stream_id

    async def write_object(
        self, batches: Sequence[StreamRecordBatch], *, stream_object: bool = False
    ) -> ObjectId:
        """One object holding ``batches`` (sorted by stream, offset), committed as a StreamSet object."""
        object_id = await commit_stream_set_object(
            self.metadata,
            self.storage,
            sorted(batches, key=lambda b: (b.stream_id, b.base_offset)),
            namespace=NS,
            node_id=NODE,
            node_epoch=NODE_EPOCH,
            block_size_bytes=BLOCK_SIZE,
        )
        return object_id

    def reader(
        self, *, cache_bytes: int = 64 << 20, readahead: ReadaheadSettings | None = None
    ) -> ObjectStreamReader:
        storage = self.storage
        gets = self.gets
        gate = self.gate

        class CountingStorage:
            async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
                gets.append((key, start, end))
                await gate.wait()
                return await storage.get(key, start, end)

        reader = ObjectStreamReader(
            self.metadata,
            storage,
            namespace=NS,
            block_cache=BlockCache[DataBlock](cache_bytes),
            reader_cache=ObjectReaderCache(CountingStorage()),
            readahead=readahead or ReadaheadSettings(enabled=False),
        )
        self.readers.append(reader)
        return reader


def make_batches(
    stream_id: int, start: int, n: int, *, size: int = 40, count: int = 2
) -> list[StreamRecordBatch]:
    return [
        StreamRecordBatch(stream_id, 0, start + i * count, count, bytes([(start + i) % 251]) * size)
        for i in range(n)
    ]


@pytest.fixture
async def env() -> Env:
    e = await Env().setup()
    yield e  # type: ignore[misc]
    for reader in e.readers:
        await reader.close()


async def three_objects(env: Env) -> tuple[StreamId, list[StreamRecordBatch]]:
    """Stream s with offsets [0, 180) in three objects, interleaved with another stream's data."""
    s = await env.stream()
    other = await env.stream()
    data = make_batches(s, 0, 90)
    for part in range(3):
        chunk = data[part * 30 : (part + 1) * 30]
        await env.write_object(chunk + make_batches(other, part * 10, 5))
    return s, data


async def test_reads_a_range_spanning_several_objects_contiguously(env: Env) -> None:
    s, data = await three_objects(env)
    got = await env.reader().read(s, 0, 180, 1 << 20)
    assert got == data


async def test_read_starts_with_the_batch_containing_the_start_offset(env: Env) -> None:
    s, data = await three_objects(env)
    got = await env.reader().read(s, 61, 71, 1 << 20)
    assert [b.base_offset for b in got] == [60, 62, 64, 66, 68, 70]
    assert got == data[30:36]


async def test_read_stops_at_max_bytes_with_at_least_one_batch(env: Env) -> None:
    s, data = await three_objects(env)
    reader = env.reader()
    assert await reader.read(s, 10, 180, 1) == data[5:6]
    assert await reader.read(s, 10, 180, 100) == data[5:8]  # 40 + 40 < 100, the third crosses it


async def test_read_beyond_the_objects_returns_what_they_hold(env: Env) -> None:
    s, data = await three_objects(env)
    got = await env.reader().read(s, 170, 500, 1 << 20)
    assert got == data[85:]


async def test_read_of_a_stream_without_objects_is_empty(env: Env) -> None:
    s = await env.stream()
    assert await env.reader().read(s, 0, 10, 1 << 20) == []


async def test_sequential_reads_continue_and_free_what_they_read(env: Env) -> None:
    s, data = await three_objects(env)
    reader = env.reader()
    out: list[StreamRecordBatch] = []
    offset = 0
    while offset < 180:
        got = await reader.read(s, offset, 180, 200)
        assert got, f"no progress at {offset}"
        out.extend(got)
        offset = got[-1].end_offset
    assert out == data
    assert reader._cache.used_bytes == 0  # every block was read to its end, so freed at once


async def test_blocks_of_one_read_are_fetched_with_merged_gets(env: Env) -> None:
    s, _ = await three_objects(env)
    reader = env.reader()
    await reader.read(s, 0, 180, 1 << 20)
    # three objects: one tail GET each, plus ONE GET for each object's run of stream-s blocks
    assert len(env.gets) == 6, env.gets
    sizes = [end - start for _, start, end in env.gets if end is not None]
    assert all(size > 3 * BLOCK_SIZE for size in sizes)  # each GET spans several blocks


async def test_concurrent_reads_of_the_same_blocks_issue_one_get_per_block_run(env: Env) -> None:
    s, data = await three_objects(env)
    reader = env.reader()
    results = await asyncio.gather(*(reader.read(s, 0, 60, 1 << 20) for _ in range(5)))
    assert all(r == data[:30] for r in results)
    tail_gets = 1
    assert len(env.gets) == tail_gets + 1, env.gets


async def test_object_replaced_by_compaction_is_read_from_its_replacement(env: Env) -> None:
    s, data = await three_objects(env)
    reader = env.reader()
    first = await reader.read(s, 0, 180, 200)  # the window now holds blocks of the old objects
    assert first == data[:5]
    # compaction: one stream object replaces the three StreamSet objects, which are then deleted
    old = [
        o.object_id
        for o in await env.metadata.get_objects(stream_id=s, start_offset=0, end_offset=-1, limit=10)
    ]
    new_id = await env.metadata.prepare_objects(count=1, ttl_ms=60_000)
    writer = ObjectWriter(env.storage.upload(object_key(new_id, NS)), block_size_bytes=BLOCK_SIZE)
    await writer.write(data)
    written = await writer.close()
    await env.metadata.commit_stream_object(
        CommitStreamObjectRequest(
            object_id=new_id,
            object_size_bytes=written.size_bytes,
            stream_id=s,
            stream_epoch=-1,
            start_offset=0,
            end_offset=180,
            source_object_ids=tuple(old),
            node_id=NODE,
            node_epoch=NODE_EPOCH,
        )
    )
    await env.storage.delete([object_key(o, NS) for o in old])
    rest = await reader.read(s, first[-1].end_offset, 180, 1 << 20)
    assert first + rest == data
    assert reader.stats().retry_count == 1


async def test_object_missing_for_good_is_corruption_after_retries(env: Env) -> None:
    s, _ = await three_objects(env)
    slices = await env.metadata.get_objects(stream_id=s, start_offset=0, end_offset=-1, limit=10)
    await env.storage.delete([object_key(slices[1].object_id, NS)])
    reader = env.reader()
    with pytest.raises(CorruptionError, match="after 2 retries"):
        await reader.read(s, 0, 180, 1 << 20)
    assert reader.stats().retry_count == 2


async def test_corrupt_block_raises_corruption_error_not_data(env: Env) -> None:
    s, _ = await three_objects(env)
    slices = await env.metadata.get_objects(stream_id=s, start_offset=0, end_offset=-1, limit=10)
    key = object_key(slices[0].object_id, NS)
    raw = bytearray(await env.storage.get(key))
    raw[100] ^= 0xFF  # inside the first data block
    await env.storage.put(key, bytes(raw))
    with pytest.raises(CorruptionError) as info:
        await env.reader().read(s, 0, 180, 1 << 20)
    assert info.value.source == key


async def test_trimmed_start_is_out_of_range(env: Env) -> None:
    s, _ = await three_objects(env)
    await env.metadata.trim_stream(
        node_id=NODE, node_epoch=NODE_EPOCH, stream_id=s, epoch=0, new_start_offset=100
    )
    with pytest.raises(OffsetOutOfRangeError):
        await env.reader().read(s, 10, 180, 1 << 20)


async def test_bad_arguments_and_closed_reader(env: Env) -> None:
    s, _ = await three_objects(env)
    reader = env.reader()
    with pytest.raises(InvalidArgumentError):
        await reader.read(s, 10, 5, 100)
    with pytest.raises(InvalidArgumentError):
        await reader.read(s, 0, 5, 0)
    assert await reader.read(s, 5, 5, 100) == []
    await reader.close()
    with pytest.raises(ClosedError):
        await reader.read(s, 0, 5, 100)


async def test_readahead_loads_blocks_ahead_of_a_sequential_reader(env: Env) -> None:
    s, data = await three_objects(env)
    reader = env.reader(readahead=ReadaheadSettings(initial_bytes=1024, step_bytes=1024, free_guard_bytes=0))
    first = await reader.read(s, 0, 180, 100)
    await asyncio.sleep(0.01)  # let the readahead task run
    assert reader.stats().readahead_count >= 1
    gets_after_readahead = len(env.gets)
    second = await reader.read(s, first[-1].end_offset, 180, 100)
    assert first + second == data[: len(first) + len(second)]
    assert len(env.gets) == gets_after_readahead  # served from the readahead
    assert reader.stats().block_hit_count > 0


async def test_readahead_grows_with_misses_and_stops_without_free_space(env: Env) -> None:
    s, _ = await three_objects(env)
    settings = ReadaheadSettings(initial_bytes=512, step_bytes=512, max_bytes=2048, free_guard_bytes=1 << 20)
    reader = env.reader(cache_bytes=1 << 20, readahead=settings)  # the guard alone fills the cache
    await reader.read(s, 0, 180, 100)
    await asyncio.sleep(0.01)
    assert reader.stats().readahead_count == 0
    reader2 = env.reader(
        readahead=ReadaheadSettings(initial_bytes=512, step_bytes=512, max_bytes=2048, free_guard_bytes=0)
    )
    got = await reader2.read(s, 0, 180, 1 << 20)  # several block misses
    state = reader2._states[(s, got[-1].end_offset)]
    assert state.readahead_bytes == 2048  # grown to the cap


async def test_readahead_blocks_are_readable_as_soon_as_their_own_get_completes(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3stream.engine.readplan as readplan_module

    monkeypatch.setattr(readplan_module, "MERGED_GET_MAX_BYTES", 600)  # about two blocks per GET
    s = await env.stream()
    data = make_batches(s, 0, 120, size=100)  # 60 blocks of two batches
    await env.write_object(data)
    one_load = ReadaheadSettings(
        initial_bytes=8192, max_bytes=8192, free_guard_bytes=0, load_max_bytes=1 << 20
    )
    reader = env.reader(readahead=one_load)  # one load of many GETs
    first = await reader.read(s, 0, 240, 100)  # ends inside the first block
    stalled = asyncio.Event()

    async def get(key: str, start: int = 0, end: int | None = None) -> bytes:
        if start > 1500:  # every GET but the first few of the readahead hangs
            await stalled.wait()
        return await env.storage.get(key, start, end)

    for object_reader in list(reader._readers._readers.values()):
        object_reader._storage = type("Stalling", (), {"get": staticmethod(get)})()
    await asyncio.sleep(0.01)  # the readahead issues its GETs
    assert reader.stats().readahead_count == 1
    second = await asyncio.wait_for(reader.read(s, first[-1].end_offset, 240, 300), timeout=5)
    assert first + second == data[: len(first) + len(second)]
    stalled.set()


async def test_returned_payloads_are_bytes_that_pin_no_block(env: Env) -> None:
    s, data = await three_objects(env)
    reader = env.reader()
    got = await reader.read(s, 0, 180, 1 << 20)
    assert got == data
    assert all(type(b.payload) is bytes for b in got)
    assert len(reader._cache) == 0  # every block read to its end was freed; the payloads are copies


async def test_a_cold_read_starts_readahead_while_its_own_get_is_in_flight(env: Env) -> None:
    s, data = await three_objects(env)
    reader = env.reader(readahead=ReadaheadSettings(initial_bytes=1024, free_guard_bytes=0))
    for sl in await env.metadata.get_objects(stream_id=s, start_offset=0, end_offset=-1, limit=10):
        await reader._readers.get(object_key(sl.object_id, NS), sl.size_bytes)  # indexes open
    env.gate.clear()  # every block GET hangs
    task = asyncio.create_task(reader.read(s, 0, 180, 100))
    await asyncio.sleep(0.01)
    assert reader.stats().readahead_count >= 1  # started before the read got its block
    assert len(env.gets) - 3 >= 2  # the read's GET and the readahead's, both in flight
    env.gate.set()
    first = await task
    assert first == data[: len(first)]


async def test_readahead_pauses_after_an_unread_block_is_evicted(env: Env) -> None:
    s, data = await three_objects(env)
    settings = ReadaheadSettings(
        initial_bytes=1024, step_bytes=0, growth_factor=1, free_guard_bytes=0, pause_s=60
    )
    reader = env.reader(cache_bytes=3000, readahead=settings)
    first = await reader.read(s, 0, 180, 60)
    await asyncio.sleep(0.01)  # readahead holds about 1 KiB of blocks ahead of the reader
    loads = reader.stats().readahead_count
    assert loads >= 1
    assert reader._cache.evicted_unread_count == 0
    await reader.read(s, 120, 180, 1 << 20)  # another reader's blocks push them out unread
    assert reader._cache.evicted_unread_count > 0
    loads = reader.stats().readahead_count  # that cold read may have started its own
    got = await reader.read(s, first[-1].end_offset, 180, 60)
    assert first + got == data[: len(first) + len(got)]
    state = reader._states[(s, got[-1].end_offset)]
    assert state.readahead_bytes == settings.initial_bytes
    assert state.paused_until_s > 0
    assert reader.stats().readahead_count == loads  # paused: no new readahead


async def test_gap_inside_a_block_is_corruption(env: Env) -> None:
    s = await env.stream()
    gapped = [StreamRecordBatch(s, 0, 0, 2, b"a" * 10), StreamRecordBatch(s, 0, 3, 2, b"b" * 10)]
    object_id = await env.write_object(gapped)  # one block [0, 5) whose records skip offset 2
    with pytest.raises(CorruptionError, match="where offset 2 was expected") as info:
        await env.reader().read(s, 0, 5, 1 << 20)
    assert info.value.source == object_key(object_id, NS)


async def test_gap_between_blocks_is_corruption(env: Env) -> None:
    s = await env.stream()
    first = make_batches(s, 0, 10, size=100)  # several blocks ending at offset 20
    second = make_batches(s, 25, 10, size=100)  # the next block starts at 25
    await env.write_object(first + second)
    reader = env.reader()
    with pytest.raises(CorruptionError):
        await reader.read(s, 0, 45, 1 << 20)


async def test_close_during_a_read_lets_it_finish_and_keeps_nothing(env: Env) -> None:
    s, data = await three_objects(env)
    reader = env.reader(readahead=ReadaheadSettings(free_guard_bytes=0))
    env.gate.clear()
    task = asyncio.create_task(reader.read(s, 0, 180, 100))
    await asyncio.sleep(0.01)  # blocked in its first GET
    await reader.close()
    env.gate.set()
    assert await task == data[:3]
    assert reader._states == {}
    assert reader.stats().readahead_count == 0
    with pytest.raises(ClosedError):
        await reader.read(s, 0, 180, 100)


async def test_a_full_scan_with_readahead_frees_every_block_it_read(env: Env) -> None:
    s, data = await three_objects(env)
    reader = env.reader(readahead=ReadaheadSettings(initial_bytes=512, step_bytes=512, free_guard_bytes=0))
    out: list[StreamRecordBatch] = []
    offset = 0
    while offset < 180:
        got = await reader.read(s, offset, 180, 150)
        out.extend(got)
        offset = got[-1].end_offset
        await asyncio.sleep(0.001)  # let readahead run ahead of the consumer
    assert out == data
    assert reader.stats().readahead_count > 1
    for state in reader._states.values():
        await asyncio.gather(*state.readahead_tasks)
    assert reader._cache.used_bytes == 0


async def test_blocks_the_consumer_meets_while_readahead_loads_them_are_held_once(env: Env) -> None:
    s, data = await three_objects(env)
    reader = env.reader(readahead=ReadaheadSettings(initial_bytes=4096, step_bytes=4096, free_guard_bytes=0))
    first = await reader.read(s, 0, 180, 100)
    env.gate.clear()  # the readahead's GETs now wait
    await asyncio.sleep(0.01)
    assert reader.stats().readahead_count >= 1
    pending = asyncio.create_task(reader.read(s, first[-1].end_offset, 180, 1 << 20))
    await asyncio.sleep(0.01)  # the consumer waits on blocks the readahead is loading
    env.gate.set()
    rest = await pending
    assert first + rest == data
    for state in reader._states.values():
        await asyncio.gather(*state.readahead_tasks)
    assert reader._cache.used_bytes == 0  # each block was held once, so freed by its one read


def test_a_load_is_cut_to_whole_blocks_within_its_size_and_merged_gets_stay_in_one_object() -> None:
    def ref(object_id: int, i: int, size: int) -> BlockRef:
        return BlockRef(
            ObjectId(object_id), f"k{object_id}", 1 << 30, IndexEntry(1, i, i + 1, 1, i * size, size)
        )

    refs = [ref(1, i, 100) for i in range(5)]
    assert first_within(250, refs) == refs[:2]  # never a third block that would spill over
    assert first_within(50, refs) == refs[:1]  # at least one block
    assert first_within(10_000, refs) == refs
    big = MERGED_GET_MAX_BYTES // 3
    mixed = [ref(1, 0, big), ref(1, 1, big), ref(1, 2, big), ref(1, 3, big), ref(2, 4, 10)]
    assert merged_runs(mixed) == [[0, 1, 2], [3], [4]]  # <= MERGED_GET_MAX_BYTES, one object each


async def test_a_read_that_starts_a_readahead_load_lets_it_plan_before_returning(env: Env) -> None:
    """A consumer reading loaded blocks never suspends on its own: the read gives the new load a
    loop turn, so its blocks are planned (and its GET goes out) while the consumer works."""
    s, _ = await three_objects(env)
    reader = env.reader(readahead=ReadaheadSettings(initial_bytes=1024, step_bytes=1024, free_guard_bytes=0))
    got = await reader.read(s, 0, 180, 100)
    await asyncio.sleep(0.01)  # the first readahead loads are in
    env.gate.clear()  # GETs hang from now on: a load once started stays in flight
    offset = got[-1].end_offset
    for _ in range(20):
        count = reader.stats().readahead_count
        state = reader._states[(s, offset)]
        planned_to = state.readahead_end_offset
        got = await reader.read(s, offset, 180, 100)  # served from loaded blocks
        offset = got[-1].end_offset
        if reader.stats().readahead_count > count:
            assert state.readahead_end_offset > planned_to  # the new load has run and planned
            break
    else:
        raise AssertionError("no read started a readahead load")
    env.gate.set()


async def test_the_default_readahead_guard_is_sized_to_the_block_cache(env: Env) -> None:
    small = env.reader(cache_bytes=64 << 20, readahead=ReadaheadSettings())
    large = env.reader(cache_bytes=1 << 30, readahead=ReadaheadSettings())
    explicit = env.reader(cache_bytes=64 << 20, readahead=ReadaheadSettings(free_guard_bytes=40 << 20))
    assert small._readahead.free_guard_bytes == 16 << 20  # a quarter of the cache
    assert large._readahead.free_guard_bytes == 32 << 20  # AutoMQ's
    assert explicit._readahead.free_guard_bytes == 40 << 20


async def test_a_readahead_extending_the_window_while_the_consumer_drops_read_blocks(env: Env) -> None:
    """The readahead plans under the state lock but awaits the window's extension (metadata, object
    open) while the consumer drops the blocks it read from the window's front without the lock: the
    readahead's place in the window moved under it (it raised IndexError, found on the RGW)."""
    s = await env.stream()
    data = make_batches(s, 0, 64)
    await env.write_object(data[:60])  # many small blocks, most of them read below
    await env.write_object(data[60:62])  # a single block: the extension adds fewer than were dropped
    await env.write_object(data[62:])
    meta_gate = asyncio.Event()
    get_objects = env.metadata.get_objects
    calls = 0

    async def gated_get_objects(**kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls > 1:  # the consumer's first extension passes, the readahead's waits
            await meta_gate.wait()
        return await get_objects(**kwargs)

    env.metadata.get_objects = gated_get_objects  # type: ignore[method-assign]
    reader = env.reader(
        readahead=ReadaheadSettings(initial_bytes=1 << 20, step_bytes=1 << 20, max_bytes=4 << 20)
    )
    failures: list[BaseException] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: failures.append(ctx["exception"]))
    env.gate.clear()  # the consumer's own loads wait ...
    read = asyncio.create_task(reader.read(s, 0, 100, 1 << 20))
    for _ in range(50):
        await asyncio.sleep(0)  # ... while the readahead it started extends the window (and waits)
    env.gate.set()
    first = await read  # the consumer drops what it read from the window
    for _ in range(50):
        await asyncio.sleep(0)
    meta_gate.set()
    for _ in range(50):
        await asyncio.sleep(0)
    tasks = [t for st in reader._state_registry.drop_all() for t in st.readahead_tasks]
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert [e for e in [*failures, *done] if isinstance(e, BaseException)] == []
    assert first == data[:50]
    assert await reader.read(s, 100, 128, 1 << 20) == data[50:]
