"""Executor-side direct writes: one AutoMQ-format object from record batches with absolute offsets, synchronously.

:func:`write_object` is what a Spark executor task (any process without an engine) calls to write the
object of one prepared id: the batches (Kafka RecordBatch v2 payloads whose base offsets are already the
absolute stream offsets planned by the driver) are encoded by
:class:`~s3stream.objectformat.writer.ObjectWriter` (``docs/format.md`` section 2) and streamed to the
object's key (:func:`~s3stream.objectformat.keys.object_key`) with a create-only upload: a second
attempt writing the same id meets ConflictError instead of replacing an object that may be committed.
The object becomes part of a stream only when the driver commits it
(:meth:`s3stream.engine.client.Client.commit_objects`); one never committed is garbage-collected.

Memory is bounded whatever the object's size: batches are taken from the iterable a chunk at a time
(:data:`CHUNK_MAX_BYTES`), and the upload holds at most ``buffer_max_bytes`` (parts leave as they fill).

One process-wide worker per Python process (a Spark Python worker runs many tasks one after the other):
a daemon thread running an event loop and a cache of open object stores by bucket URI, so a task reuses
the connections of the tasks before it. A forked child (Spark's worker daemon forks) starts its own.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import threading
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from s3stream._loop import new_event_loop
from s3stream.errors import InvalidArgumentError
from s3stream.ids import ObjectId
from s3stream.metadata.base import CommittedObject, StreamOffsetRange
from s3stream.objectformat.keys import object_key
from s3stream.objectformat.writer import DEFAULT_BLOCK_SIZE_BYTES, ObjectWriter, RecordFields
from s3stream.storage.base import MIN_PART_SIZE_BYTES, ObjectStorage, Upload
from s3stream.storage.local import LocalObjectStorage
from s3stream.storage.memory import MemoryObjectStorage
from s3stream.storage.uri import open_storage

T = TypeVar("T")

CHUNK_MAX_BYTES = 4 << 20
"""Payload bytes taken from the caller's iterable before they are handed to the writer."""
PART_SIZE_BYTES = 8 << 20
"""The multipart part size of a direct write (an object smaller than one part is one PUT)."""
BUFFER_MAX_BYTES = 32 << 20
"""What one upload may hold buffered (parts in flight included)."""
assert MIN_PART_SIZE_BYTES <= PART_SIZE_BYTES <= BUFFER_MAX_BYTES
CLOSE_TIMEOUT_S = 10.0
"""How long closing the worker's stores may take at the end of the process."""


@dataclass(frozen=True, slots=True)
class WrittenObjectInfo:
    """What :func:`write_object` wrote: the small description a task sends to the driver."""

    object_id: ObjectId
    key: str
    size_bytes: int
    ranges: tuple[StreamOffsetRange, ...]
    """Per stream ``[start, end)`` and payload bytes, by stream id."""

    def committed(self, *, stream_object: bool = False) -> CommittedObject:
        """The object as a :class:`CommittedObject` of a commit request (a stream object holds one
        stream: ``stream_object`` with several ranges raises InvalidArgumentError)."""
        if stream_object and len(self.ranges) != 1:
            raise InvalidArgumentError(f"object {self.object_id} holds {len(self.ranges)} streams, not one")
        return CommittedObject(self.object_id, self.size_bytes, self.ranges, stream_object)


class _Worker:
    """The process's event loop thread and its object stores, by bucket URI."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = new_event_loop()
        self.stores: dict[str, ObjectStorage] = {}
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="s3stream-direct-writer", daemon=True
        )
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def storage(self, bucket_uri: str) -> ObjectStorage:
        """Runs on the loop thread only (an S3 client belongs to its loop)."""
        store = self.stores.get(bucket_uri)
        if store is None:
            store = self.stores[bucket_uri] = open_storage(bucket_uri)
        return store

    def close(self) -> None:
        """Close every store (their connections), then stop the loop; for the end of the process."""

        async def close_all() -> None:
            stores, self.stores = list(self.stores.values()), {}
            for store in stores:
                await store.close()

        if self.pid == os.getpid() and self.thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(close_all(), self.loop).result(timeout=CLOSE_TIMEOUT_S)
            self.loop.call_soon_threadsafe(self.loop.stop)


_lock = threading.Lock()
_worker: _Worker | None = None


@atexit.register
def close_worker() -> None:
    """Close the process's worker (its stores and loop), if it has one; the next write starts a new one."""
    global _worker
    with _lock:
        worker, _worker = _worker, None
    if worker is not None:
        worker.close()


def _the_worker() -> _Worker:
    global _worker
    with _lock:
        if _worker is None or _worker.pid != os.getpid():
            _worker = _Worker()  # a forked child does not inherit the parent's loop thread
        return _worker


def create_only_upload(storage: ObjectStorage, key: str) -> Upload:
    """An upload of ``key`` that publishes only if the key does not exist (else ConflictError)."""
    from s3stream.storage.s3 import S3ObjectStorage  # botocore is imported only where S3 is used

    if isinstance(storage, S3ObjectStorage | LocalObjectStorage | MemoryObjectStorage):
        return storage.upload(key, buffer_max_bytes=BUFFER_MAX_BYTES, if_absent=True)
    raise InvalidArgumentError(f"{type(storage).__name__} has no create-only upload")


def _chunks(batches: Iterable[RecordFields]) -> Iterable[list[RecordFields]]:
    """The batches in chunks of about :data:`CHUNK_MAX_BYTES`; InvalidArgumentError at a batch that
    does not continue its stream exactly (a gap: the object's range would claim missing offsets)."""
    chunk: list[RecordFields] = []
    size = 0
    last_stream, last_end = -1, -1
    for fields in batches:
        stream_id, _, base_offset, count, _ = fields
        if stream_id == last_stream and base_offset != last_end:
            raise InvalidArgumentError(
                f"stream {stream_id}: batch at offset {base_offset} does not continue at {last_end}"
            )
        last_stream, last_end = stream_id, base_offset + count
        chunk.append(fields)
        size += len(fields[4])
        if size >= CHUNK_MAX_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def write_object(
    bucket_uri: str,
    namespace: str,
    object_id: int,
    batches: Iterable[RecordFields],
    *,
    block_size_bytes: int = DEFAULT_BLOCK_SIZE_BYTES,
) -> WrittenObjectInfo:
    """Write object ``object_id`` of ``namespace`` in ``bucket_uri`` from ``batches``, each
    ``(stream_id, epoch, base_offset, count, payload)`` in (stream id, offset) order, contiguous per
    stream; blocks until the object is published. Returns its description.

    Errors: InvalidArgumentError for batches out of order (nothing is published), ConflictError if
    the key exists already (another attempt of the same id), UnavailableError if storage is
    unreachable past its retry deadline. Nothing is published unless the whole object is."""
    key = object_key(object_id, namespace)
    chunks = iter(_chunks(batches))
    first = next(chunks, None)
    if first is None:
        raise InvalidArgumentError(f"object {object_id}: no batches to write")
    worker = _the_worker()

    async def start() -> ObjectWriter:
        upload = create_only_upload(worker.storage(bucket_uri), key)
        return ObjectWriter(upload, block_size_bytes=block_size_bytes, part_size_bytes=PART_SIZE_BYTES)

    writer = worker.run(start())
    try:
        worker.run(writer.write_fields(first))
        del first
        for chunk in chunks:
            worker.run(writer.write_fields(chunk))
        written = worker.run(writer.close())
    except BaseException:
        worker.run(writer.abort())
        raise
    return WrittenObjectInfo(ObjectId(object_id), key, written.size_bytes, written.stream_ranges)
