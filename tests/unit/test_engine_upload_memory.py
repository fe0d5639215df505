"""What an upload leaves behind once committed: nothing that keeps its LogCache block alive.

Regression: each upload task kept a reference to its predecessor (to wait for its prepare and commit)
and never dropped it, so the newest task held a chain of every task and block the engine had ever
uploaded: the LogCache released free blocks, but their records stayed in memory, and every full
garbage collection scanned ~3,000 more objects per 1,000-stream block (ingest latency run: 45,000
StreamCache objects after 50 uploads in 10 s).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import weakref

import pytest

from s3stream.engine import pipeline
from s3stream.engine.logcache import FrozenStreams
from s3stream.model import RecordBatch
from tests.unit.test_engine import SMALL, Node

KiB = 1024


async def test_released_blocks_are_freed_once_their_upload_is_done() -> None:
    client = await Node(SMALL).open()
    streams = [await client.streams.create_and_open_stream() for _ in range(4)]
    payload = bytes(16 * KiB)
    cache = client.engine.cache
    uploaded: list[weakref.ref[object]] = []
    for _ in range(12):  # 12 blocks of 256 KiB through a 2 MiB LogCache: the first ones are released
        for i in range(16):
            await streams[i % len(streams)].append(RecordBatch(payload))
        block = cache.active
        await client.engine.force_upload(None)
        uploaded.append(weakref.ref(block))
        del block
    cache.try_real_free(target_bytes=0)
    for _ in range(200):  # released blocks' stream caches are dropped a few per loop turn
        gc.collect()
        alive = [i for i, ref in enumerate(uploaded) if ref() is not None]
        held = {id(block) for block in cache.blocks}
        if all(id(uploaded[i]()) in held for i in alive):
            break
        await asyncio.sleep(0.01)
    assert all(id(uploaded[i]()) in held for i in alive), f"blocks {alive} outlive the LogCache"
    await client.close()


async def test_blocks_the_cache_releases_are_freed_in_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit that makes the LogCache release blocks hands their stream caches to
    ``_free_in_turns``, which drops ``RELEASED_STREAMS_PER_TURN`` of them per event-loop turn
    (freeing a 1,000-stream block at once held the loop 1.3-5 ms)."""
    handed: list[list[int]] = []
    original = pipeline._free_in_turns

    async def recording(holders: list[object]) -> None:
        handed.append([id(holder) for holder in holders])
        await original(holders)

    monkeypatch.setattr(pipeline, "_free_in_turns", recording)
    # blocks below 10 % of the cache: a commit's mark_free (not an append's room check) releases
    client = await Node(dataclasses.replace(SMALL, wal_cache_size_bytes=4 * 1024 * KiB)).open()
    streams = [await client.streams.create_and_open_stream() for _ in range(4)]
    cache = client.engine.cache
    first = cache.active
    holders: list[object] = []  # the first block's per-stream record holders (frozen rows by then)
    while first in cache.blocks:
        for i in range(16):
            await streams[i % len(streams)].append(RecordBatch(bytes(16 * KiB)))
        await client.engine.force_upload(None)
        for _ in range(8):
            await asyncio.sleep(0)
        if first in cache.blocks:
            assert isinstance(first.streams, FrozenStreams)
            holders = list(first.streams.rows.values())
    assert [id(h) for h in holders] in handed
    assert first.is_empty()  # the released block keeps none of them
    await client.close()


async def test_a_committed_block_kept_for_reads_is_frozen_in_turns_and_still_serves_fetches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pipeline, "FROZEN_STREAMS_PER_TURN", 1)
    client = await Node(dataclasses.replace(SMALL, wal_cache_size_bytes=4 * 1024 * KiB)).open()
    streams = [await client.streams.create_and_open_stream() for _ in range(16)]
    for n in range(32):
        await streams[n % 16].append(RecordBatch(bytes([n]) * KiB))
    cache = client.engine.cache
    block = cache.active
    await client.engine.force_upload(None)
    assert block.free
    frozen = []
    for _ in range(24):  # one stream per turn: unfrozen until the last one is done, readable throughout
        frozen.append(isinstance(block.streams, FrozenStreams))
        assert [r.payload for r in cache.get(15, 0, 2, max_bytes=1 << 20)] == [
            bytes([15]) * KiB,
            bytes([31]) * KiB,
        ]
        await asyncio.sleep(0)
    assert frozen[0] is False
    assert frozen[-1] is True
    assert block in cache.blocks
    reads = client.engine.stats.object_reads
    for n, stream in enumerate(streams):
        fetched = await stream.fetch(0, 2)
        assert [r.payload for r in fetched] == [bytes([n]) * KiB, bytes([n + 16]) * KiB]
    assert client.engine.stats.object_reads == reads  # served from the frozen block
    await client.close()


async def test_free_in_turns_drops_a_few_caches_per_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline, "RELEASED_STREAMS_PER_TURN", 2)

    class Tracked:  # a stand-in: StreamCache has slots and no weak references
        pass

    holders: list[object] = [Tracked() for _ in range(5)]
    refs = [weakref.ref(c) for c in holders]
    task = asyncio.ensure_future(pipeline._free_in_turns(holders))
    del holders
    alive = []
    for _ in range(4):
        await asyncio.sleep(0)
        alive.append(sum(ref() is not None for ref in refs))
    await task
    assert alive == [5, 3, 1, 0]
