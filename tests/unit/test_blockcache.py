"""Block cache: byte limit, LRU eviction, single-flight loads, early free once read, TTL."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s3stream._loop import run
from s3stream.engine.blockcache import BlockCache, BlockKey, BlockRequest
from s3stream.errors import InvalidArgumentError, UnavailableError
from s3stream.ids import ObjectId


def key(obj: int, pos: int = 0) -> BlockKey:
    return BlockKey(ObjectId(obj), pos)


class Loader:
    """Counts calls and the blocks each one fetched; values are 'obj:pos'."""

    def __init__(self, *, gate: asyncio.Event | None = None, fail: Exception | None = None) -> None:
        self.calls: list[list[BlockKey]] = []
        self.gate = gate
        self.fail = fail

    async def __call__(self, requests: Sequence[BlockRequest]) -> list[str]:
        self.calls.append([r.key for r in requests])
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return [f"{r.key.object_id}:{r.key.position}" for r in requests]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rejects_bad_limits() -> None:
    with pytest.raises(InvalidArgumentError):
        BlockCache[str](0)
    with pytest.raises(InvalidArgumentError):
        BlockCache[str](10, ttl_s=0)


async def test_miss_loads_once_then_hits() -> None:
    cache = BlockCache[str](1000)
    load = Loader()
    first = await cache.get_many([BlockRequest(key(1), 100, hold=False)], load)
    second = await cache.get_many([BlockRequest(key(1), 100, hold=False)], load)
    assert first.values == second.values == ["1:0"]
    assert (first.hit_count, first.miss_count) == (0, 1)
    assert (second.hit_count, second.miss_count) == (1, 0)
    assert load.calls == [[key(1)]]
    assert cache.used_bytes == 100


async def test_missing_blocks_of_one_call_are_loaded_together_in_order() -> None:
    cache = BlockCache[str](1000)
    load = Loader()
    await cache.get_many([BlockRequest(key(1, 100), 10, hold=False)], load)
    got = await cache.get_many(
        [BlockRequest(key(1, 0), 10), BlockRequest(key(1, 100), 10), BlockRequest(key(1, 200), 10)], load
    )
    assert got.values == ["1:0", "1:100", "1:200"]
    assert load.calls[1] == [key(1, 0), key(1, 200)]


async def test_concurrent_misses_for_one_block_do_one_load() -> None:
    cache = BlockCache[str](1000)
    gate = asyncio.Event()
    load = Loader(gate=gate)
    tasks = [
        asyncio.create_task(cache.get_many([BlockRequest(key(7), 50, hold=False)], load)) for _ in range(5)
    ]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*tasks)
    assert [r.values for r in results] == [["7:0"]] * 5
    assert load.calls == [[key(7)]]


async def test_failed_load_fails_every_waiter_and_is_not_cached() -> None:
    cache = BlockCache[str](1000)
    gate = asyncio.Event()
    load = Loader(gate=gate, fail=UnavailableError("s3 down"))
    tasks = [asyncio.create_task(cache.get_many([BlockRequest(key(7), 50)], load)) for _ in range(3)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, UnavailableError) for r in results)
    assert len(load.calls) == 1
    assert cache.used_bytes == 0
    ok = await cache.get_many([BlockRequest(key(7), 50)], Loader())
    assert ok.values == ["7:0"]


async def test_cancelled_loader_lets_a_waiter_load_it_itself() -> None:
    cache = BlockCache[str](1000)
    gate = asyncio.Event()
    slow = Loader(gate=gate)
    loader_task = asyncio.create_task(cache.get_many([BlockRequest(key(3), 10)], slow))
    await asyncio.sleep(0)
    fast = Loader()
    waiter = asyncio.create_task(cache.get_many([BlockRequest(key(3), 10)], fast))
    await asyncio.sleep(0)
    loader_task.cancel()
    got = await waiter
    assert got.values == ["3:0"]
    assert fast.calls == [[key(3)]]
    with pytest.raises(asyncio.CancelledError):
        await loader_task
    assert cache.used_bytes == 10


async def test_byte_limit_evicts_least_recently_used() -> None:
    cache = BlockCache[str](300)
    load = Loader()
    for obj in (1, 2, 3):
        await cache.get_many([BlockRequest(key(obj), 100, hold=False)], load)
    await cache.get_many([BlockRequest(key(1), 100, hold=False)], load)  # 1 is now most recent
    await cache.get_many([BlockRequest(key(4), 100, hold=False)], load)
    assert key(2) not in cache
    assert all(key(o) in cache for o in (1, 3, 4))
    assert cache.used_bytes == 300 <= cache.capacity_bytes
    assert cache.evicted_unread_count == 0


async def test_block_larger_than_the_cache_is_returned_but_not_kept() -> None:
    cache = BlockCache[str](100)
    load = Loader()
    await cache.get_many([BlockRequest(key(1), 60, hold=False)], load)
    got = await cache.get_many([BlockRequest(key(2), 500)], load)
    assert got.values == ["2:0"]
    assert key(2) not in cache
    assert cache.used_bytes <= cache.capacity_bytes


async def test_loads_in_flight_count_against_the_limit() -> None:
    cache = BlockCache[str](200)
    await cache.get_many([BlockRequest(key(1), 100, hold=False)], Loader())
    gate = asyncio.Event()
    task = asyncio.create_task(cache.get_many([BlockRequest(key(2), 150)], Loader(gate=gate)))
    await asyncio.sleep(0)
    assert key(1) not in cache  # evicted to make room for the reservation
    assert cache.used_bytes == 150
    gate.set()
    await task
    assert cache.used_bytes == 150


async def test_block_read_by_its_last_holder_is_freed_at_once() -> None:
    cache = BlockCache[str](1000)
    load = Loader()
    await cache.get_many([BlockRequest(key(1), 100)], load)  # holder A
    await cache.get_many([BlockRequest(key(1), 100)], load)  # holder B
    cache.release([key(1)], read=True)
    assert key(1) in cache
    cache.release([key(1)], read=True)
    assert key(1) not in cache
    assert cache.used_bytes == 0


async def test_released_unread_block_stays_for_the_lru() -> None:
    cache = BlockCache[str](1000)
    await cache.get_many([BlockRequest(key(1), 100)], Loader())
    cache.release([key(1)], read=False)
    assert key(1) in cache
    cache.release([key(1)], read=True)  # no holder left: nothing to free early
    assert key(1) in cache


async def test_evicting_a_held_block_is_counted_as_unread() -> None:
    cache = BlockCache[str](200)
    load = Loader()
    await cache.get_many([BlockRequest(key(1), 100)], load)
    await cache.get_many([BlockRequest(key(2), 100, hold=False)], load)
    await cache.get_many([BlockRequest(key(3), 100, hold=False)], load)
    assert key(1) not in cache
    assert cache.evicted_unread_count == 1


async def test_idle_blocks_expire_after_the_ttl() -> None:
    clock = Clock()
    cache = BlockCache[str](1000, ttl_s=60, clock=clock)
    load = Loader()
    await cache.get_many([BlockRequest(key(1), 100)], load)
    await cache.get_many([BlockRequest(key(2), 100, hold=False)], load)
    clock.now += 30
    await cache.get_many([BlockRequest(key(2), 100, hold=False)], load)  # touched: stays
    clock.now += 31
    await cache.get_many([BlockRequest(key(9), 1, hold=False)], load)
    assert key(1) not in cache
    assert key(2) in cache
    assert cache.evicted_unread_count == 1
    assert cache.stats().block_count == 2


@settings(max_examples=150, deadline=None)
@given(
    capacity=st.integers(50, 600),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["get", "get", "release_read", "release_unread", "tick"]),
            st.lists(st.integers(0, 12), min_size=1, max_size=4, unique=True),
            st.booleans(),
        ),
        max_size=40,
    ),
)
def test_random_operations_keep_the_invariants(capacity: int, ops: list[tuple[str, list[int], bool]]) -> None:
    """Values are always right, the byte limit holds, and a stored block is never loaded again."""
    sizes = {i: 10 + 7 * i for i in range(13)}  # every block fits in the smallest cache

    async def scenario() -> None:
        clock = Clock()
        cache = BlockCache[str](capacity, ttl_s=5, clock=clock)
        load = Loader()
        for op, objs, flag in ops:
            keys = [key(o) for o in objs]
            if op == "get":
                live = {k for k, e in cache._entries.items() if e.last_access_s > clock.now - 5}
                stored = {k for k in keys if k in live}
                got = await cache.get_many(
                    [BlockRequest(k, sizes[k.object_id], hold=flag) for k in keys], load
                )
                assert got.values == [f"{k.object_id}:0" for k in keys]
                assert got.hit_count == len(stored)
                assert not stored & set(load.calls[-1] if got.miss_count else [])
            elif op == "tick":
                clock.now += 3 if flag else 1
            else:
                cache.release(keys, read=op == "release_read")
            assert cache.used_bytes <= capacity
            assert cache.used_bytes == sum(sizes[k.object_id] for k in cache._entries)

    run(scenario())


async def test_a_failed_call_gives_back_the_holds_it_took() -> None:
    cache = BlockCache[str](1000)
    await cache.get_many([BlockRequest(key(1), 10, hold=False)], Loader())
    with pytest.raises(UnavailableError):
        await cache.get_many(
            [BlockRequest(key(1), 10), BlockRequest(key(2), 10)], Loader(fail=UnavailableError("down"))
        )
    cache.release([key(1)], read=True)  # no holder: a read does not free it early
    assert key(1) in cache
