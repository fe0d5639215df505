"""ObjectUploader writes at most ``object_writes_max`` objects of one upload at a time."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from s3stream.engine.upload import OBJECT_WRITES_INFLIGHT_MAX, ObjectUploader, StreamRecords, plan_upload
from s3stream.ids import ObjectId
from s3stream.objectformat import object_key
from s3stream.storage.base import Upload
from s3stream.storage.memory import MemoryObjectStorage
from tests.support.objects import make_uploader

KiB = 1024
STREAM_BYTES = 256 * KiB
STREAM_COUNT = 10


class TrackedUpload:
    """An upload of the memory twin that counts itself open from creation to complete/abort."""

    def __init__(self, inner: Upload, owner: TrackingStorage) -> None:
        self.key = inner.key
        self._inner = inner
        self._owner = owner
        self._open = True
        owner.open_count += 1
        owner.open_max_count = max(owner.open_max_count, owner.open_count)

    def _closed(self) -> None:
        if self._open:
            self._open = False
            self._owner.open_count -= 1

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        await asyncio.sleep(0.001)  # a slow network: writers overlap if allowed to
        await self._inner.write(data)

    async def copy(self, source_key: str, start: int, end: int) -> None:
        await self._inner.copy(source_key, start, end)

    async def complete(self) -> int:
        try:
            return await self._inner.complete()
        finally:
            self._closed()

    async def abort(self) -> None:
        try:
            await self._inner.abort()
        finally:
            self._closed()


class TrackingStorage(MemoryObjectStorage):
    def __init__(self) -> None:
        super().__init__()
        self.open_count = 0
        self.open_max_count = 0

    def upload(self, key: str, *, buffer_max_bytes: int | None = None) -> Upload:
        return TrackedUpload(super().upload(key, buffer_max_bytes=buffer_max_bytes), self)


def uploader(storage: MemoryObjectStorage, **kwargs: int) -> ObjectUploader:
    return make_uploader(storage, block_size_bytes=64 * KiB, part_size_bytes=128 * KiB, **kwargs)


def big_streams() -> list[StreamRecords]:
    return [
        StreamRecords.of(
            sid, [(sid, 0, i, 1, bytes([sid]) * (32 * KiB)) for i in range(STREAM_BYTES // (32 * KiB))]
        )
        for sid in range(STREAM_COUNT)
    ]


@pytest.mark.parametrize("limit", [1, 3, OBJECT_WRITES_INFLIGHT_MAX])
async def test_objects_of_one_upload_are_written_at_most_limit_at_a_time(limit: int) -> None:
    storage = TrackingStorage()
    plan = plan_upload(big_streams(), split_size_bytes=STREAM_BYTES)
    assert len(plan.stream_objects) == STREAM_COUNT
    assert not plan.stream_set
    request = await uploader(storage, object_writes_max=limit).write(plan, ObjectId(100))
    assert storage.open_max_count == limit  # the bound holds, and is reached
    assert storage.open_count == 0
    assert [o.object_id for o in request.stream_objects] == list(range(100, 100 + STREAM_COUNT))
    for obj in request.stream_objects:
        assert len(await storage.get(object_key(obj.object_id, "ns"))) == obj.size_bytes


async def test_a_failed_object_write_aborts_the_waiting_and_running_ones() -> None:
    storage = TrackingStorage()
    plan = plan_upload(big_streams(), split_size_bytes=STREAM_BYTES)
    failing = uploader(storage, object_writes_max=2)
    real_write = failing._write_object

    async def write_object(object_id: ObjectId, streams: Sequence[StreamRecords]) -> int:
        if object_id == 103:
            raise ConnectionError("injected")
        return await real_write(object_id, streams)

    failing._write_object = write_object  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        await failing.write(plan, ObjectId(100))
    assert storage.open_count == 0
    assert storage.open_max_count <= 2
