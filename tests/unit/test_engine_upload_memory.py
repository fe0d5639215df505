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
from typing import cast

import pytest

from s3stream.engine import pipeline
from s3stream.engine.logcache import StreamCache
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
    gc.collect()
    alive = [i for i, ref in enumerate(uploaded) if ref() is not None]
    held = {id(block) for block in cache.blocks}
    assert all(id(uploaded[i]()) in held for i in alive), f"blocks {alive} outlive the LogCache"
    await client.close()


async def test_blocks_the_cache_releases_are_freed_in_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit that makes the LogCache release blocks hands their stream caches to
    ``_free_in_turns``, which drops ``RELEASED_STREAMS_PER_TURN`` of them per event-loop turn
    (freeing a 1,000-stream block at once held the loop 1.3-5 ms)."""
    handed: list[list[int]] = []
    original = pipeline._free_in_turns

    async def recording(caches: list[StreamCache]) -> None:
        handed.append([id(cache) for cache in caches])
        await original(caches)

    monkeypatch.setattr(pipeline, "_free_in_turns", recording)
    # blocks below 10 % of the cache: a commit's mark_free (not an append's room check) releases
    client = await Node(dataclasses.replace(SMALL, wal_cache_size_bytes=4 * 1024 * KiB)).open()
    streams = [await client.streams.create_and_open_stream() for _ in range(4)]
    cache = client.engine.cache
    first = cache.active
    first_caches = [id(c) for c in first.streams.values()]
    while first in cache.blocks or not first_caches:
        for i in range(16):
            await streams[i % len(streams)].append(RecordBatch(bytes(16 * KiB)))
        first_caches = first_caches or [id(c) for c in first.streams.values()]
        await client.engine.force_upload(None)
    assert first_caches in handed
    await client.close()


async def test_free_in_turns_drops_a_few_caches_per_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline, "RELEASED_STREAMS_PER_TURN", 2)

    class Tracked:  # a stand-in: StreamCache has slots and no weak references
        pass

    caches = [Tracked() for _ in range(5)]
    refs = [weakref.ref(c) for c in caches]
    task = asyncio.ensure_future(pipeline._free_in_turns(cast("list[StreamCache]", caches)))
    del caches
    alive = []
    for _ in range(4):
        await asyncio.sleep(0)
        alive.append(sum(ref() is not None for ref in refs))
    await task
    assert alive == [5, 3, 1, 0]
