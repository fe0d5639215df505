"""Appends waiting for room (WAL or LogCache full) must not cut the active block into many small objects.

Regression: every waiting append used to archive the active block on each wake-up, so under sustained
back-pressure with slow storage the engine uploaded objects of a few records each (3,462 objects per GiB of
64 KiB records in the ingest benchmark, instead of ~32).
"""

from __future__ import annotations

import asyncio
import dataclasses

from s3stream.model import RecordBatch
from s3stream.storage.base import Upload
from s3stream.storage.memory import MemoryObjectStorage
from tests.unit.test_engine import SMALL, Node

KiB = 1024


class SlowStorage(MemoryObjectStorage):
    """Uploads take a while to complete, as on a real object store under load."""

    def upload(self, key: str, *, buffer_max_bytes: int | None = None) -> Upload:
        inner = super().upload(key, buffer_max_bytes=buffer_max_bytes)
        complete = inner.complete

        async def slow_complete() -> int:
            await asyncio.sleep(0.05)
            return await complete()

        inner.complete = slow_complete  # type: ignore[method-assign]
        return inner


async def test_waiting_appends_do_not_cut_the_active_block_into_small_objects() -> None:
    config = dataclasses.replace(SMALL, append_backpressure_wait_ms=30_000)
    storage = SlowStorage()
    node = Node(config, storage=storage)
    client = await node.open()
    streams = [await client.streams.create_and_open_stream() for _ in range(8)]
    payload = bytes(16 * KiB)
    total_bytes = 6 * 1024 * KiB  # 3x the LogCache, so appends keep waiting for room

    async def producer(index: int) -> None:
        for _ in range(total_bytes // len(payload) // 64):
            await streams[index % len(streams)].append(RecordBatch(payload))

    await asyncio.gather(*(producer(i) for i in range(64)))
    await client.close()

    objects = [key async for key in storage.list("")]
    # Every upload is triggered by a full block (256 KiB threshold) or by back-pressure with nothing in
    # flight; a block always holds many records. 6 MiB / 256 KiB = 24 full blocks; allow for partial ones.
    assert len(objects) <= 3 * (total_bytes // config.wal_upload_threshold_bytes), len(objects)
