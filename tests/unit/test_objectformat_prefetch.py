"""ObjectReaderCache.prefetch / peek, and the read path waiting for the first object of a window only."""

from __future__ import annotations

import asyncio

from s3stream.engine.readstate import ReadaheadSettings
from s3stream.objectformat import ObjectReaderCache, object_key
from s3stream.storage.memory import MemoryObjectStorage
from tests.unit.test_objectformat import OBJECT, OBJECT_SIZE
from tests.unit.test_reader import NS, Env, make_batches


class _Gated:
    def __init__(self, storage: MemoryObjectStorage) -> None:
        self.storage = storage
        self.gets: list[str] = []
        self.gate = asyncio.Event()

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self.gets.append(key)
        await self.gate.wait()
        return await self.storage.get(key, start, end)


async def test_prefetch_opens_in_the_background_and_a_get_shares_it() -> None:
    storage = MemoryObjectStorage()
    await storage.put("a", OBJECT)
    gated = _Gated(storage)
    cache = ObjectReaderCache(gated)
    cache.prefetch("a", OBJECT_SIZE)
    cache.prefetch("a", OBJECT_SIZE)  # already opening: nothing new
    await asyncio.sleep(0)
    assert cache.peek("a", OBJECT_SIZE) is None  # still opening
    waiter = asyncio.create_task(cache.get("a", OBJECT_SIZE))
    gated.gate.set()
    reader = await waiter
    assert gated.gets == ["a"]  # one tail GET for the prefetch and the get
    assert cache.peek("a", OBJECT_SIZE) is reader
    assert cache.peek("a", OBJECT_SIZE + 1) is None  # another size is another object
    cache.prefetch("a", OBJECT_SIZE)  # cached: nothing new
    await asyncio.sleep(0)
    assert gated.gets == ["a"]


async def test_a_failed_prefetch_is_not_kept_and_the_next_get_meets_the_error() -> None:
    cache = ObjectReaderCache(MemoryObjectStorage())
    cache.prefetch("missing", OBJECT_SIZE)
    await asyncio.sleep(0.01)  # fails in the background without an unretrieved-exception warning
    assert cache.peek("missing", OBJECT_SIZE) is None
    assert len(cache) == 0


async def test_a_read_waits_for_the_first_object_of_its_window_only() -> None:
    env = await Env().setup()
    s = await env.stream()
    data = make_batches(s, 0, 40, size=50)
    for i in range(4):  # four objects: one metadata lookup returns them all
        await env.write_object(data[i * 10 : (i + 1) * 10])
    reader = env.reader()
    slow = asyncio.Event()
    slices = await env.metadata.get_objects(stream_id=s, start_offset=0, end_offset=-1, limit=10)
    keys = [object_key(sl.object_id, NS) for sl in slices]
    inner = reader._readers._storage

    class SlowTails:
        async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
            if key != keys[0]:
                await slow.wait()  # every other object's tail hangs
            return await inner.get(key, start, end)

    reader._readers._storage = SlowTails()  # the tails of objects 2-4 hang
    got = await asyncio.wait_for(reader.read(s, 0, 80, 100), timeout=5)
    assert got == data[: len(got)]
    slow.set()
    rest = await asyncio.wait_for(reader.read(s, got[-1].end_offset, 80, 1 << 20), timeout=5)
    assert got + rest == data
    await reader.close()


async def test_readahead_near_the_window_end_opens_the_next_objects_early() -> None:
    env = await Env().setup()
    s = await env.stream()
    data = make_batches(s, 0, 80, size=400)  # one batch per block: a block is ~all payload
    for i in range(8):  # eight objects: two metadata lookups of four
        await env.write_object(data[i * 10 : (i + 1) * 10])
    ahead = ReadaheadSettings(initial_bytes=12_000, max_bytes=12_000, free_guard_bytes=0)  # ~3 objects
    reader = env.reader(readahead=ahead)
    got = await reader.read(s, 0, 160, 100)
    await asyncio.sleep(0.05)  # readahead plans near the window's end, then asks for what follows
    slices = await env.metadata.get_objects(stream_id=s, start_offset=0, end_offset=-1, limit=10)
    keys = [object_key(sl.object_id, NS) for sl in slices]
    assert len(keys) == 8
    [state] = reader._states.values()
    assert state.window_end <= slices[3].end_offset  # the window has not reached object 5 ...
    assert all(key in reader._readers for key in keys[4:])  # ... but its index is open already
    rest = await reader.read(s, got[-1].end_offset, 160, 1 << 20)
    assert got + rest == data
    await reader.close()
