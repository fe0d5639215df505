"""Executor-side upload of one AutoMQ-format object: record batches in (stream id, offset) order in.

One event loop and one storage client per executor Python worker (Spark reuses workers across
tasks), so a task pays no client start-up. The object is streamed: parts leave as they fill.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

from s3stream.objectformat import object_key
from s3stream.objectformat.writer import ObjectWriter, RecordFields
from s3stream.storage.base import ObjectStorage
from s3stream.storage.uri import open_storage

__all__ = ["RecordFields", "upload_object"]

_WRITE_BATCH_RECORDS = 256
"""Records handed to the writer per call."""

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_storages: dict[str, ObjectStorage] = {}


def _runtime(bucket_uri: str) -> tuple[asyncio.AbstractEventLoop, ObjectStorage]:
    global _loop
    with _lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
        storage = _storages.get(bucket_uri)
        if storage is None:
            storage = _storages[bucket_uri] = open_storage(bucket_uri)
        return _loop, storage


def upload_object(
    bucket_uri: str,
    namespace: str,
    object_id: int,
    records: Iterator[RecordFields],
    *,
    part_size_bytes: int,
) -> int:
    """Write ``records`` as object ``object_id`` and return its size in bytes; nothing is visible on failure."""
    loop, storage = _runtime(bucket_uri)
    return loop.run_until_complete(
        _upload(storage, object_key(object_id, namespace), records, part_size_bytes)
    )


async def _upload(
    storage: ObjectStorage, key: str, records: Iterator[RecordFields], part_size_bytes: int
) -> int:
    writer = ObjectWriter(storage.upload(key), part_size_bytes=part_size_bytes)
    try:
        batch: list[RecordFields] = []
        for r in records:
            batch.append(r)
            if len(batch) >= _WRITE_BATCH_RECORDS:
                await writer.write_fields(batch)
                batch = []
        if batch:
            await writer.write_fields(batch)
        return await writer.finish()
    except BaseException:
        await writer.abort()
        raise
