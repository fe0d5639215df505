"""Readers in any process: the uploaded data of every stream, read from objects and shared metadata.

A :class:`Reader` needs no data dir and no WAL; ``s3stream.open_reader(bucket_uri=..., metadata_url=...,
config=...)`` builds one (and ``s3stream.open_reader_sync`` its blocking twin, :class:`SyncReader`).
It reads what writers have *uploaded*: a stream's committed range ``[start_offset, end_offset)`` as
metadata holds it at each call. Records acknowledged by a writer but still in its WAL and LogCache
are not visible until their block is uploaded, which happens at the latest
``s3.wal.upload.interval.ms`` after the block's first record, or earlier once the block holds
``s3.wal.upload.threshold`` bytes (plus the upload's own time); ``Stream.close`` uploads at once.

Invariants:

* Nothing is written: the metadata is opened read-only (SQLite: :mod:`s3stream.metadata.sqlite_readonly`,
  which creates no file; a write operation raises), and objects are only read (ranged GETs).
* ``fetch`` gives the results ``Stream.fetch`` gives for the same uploaded range: the same
  :class:`~s3stream.model.FetchedBatch` list (from the batch holding ``start_offset``, contiguous,
  whole batches, at least one, stopping before ``end_offset`` or after ``max_bytes``), through the
  engine's object read path (:class:`~s3stream.engine.reader.ObjectStreamReader`, its block cache,
  index cache and readahead). A range outside the stream's ``[start_offset, end_offset]`` in
  metadata raises :class:`~s3stream.errors.OffsetOutOfRangeError`, as ``Stream.fetch`` does past its
  confirm offset; an unknown (or deleted) stream raises :class:`~s3stream.errors.NotFoundError`.
* Compaction replacing the objects a read planned on (an object gone from the bucket, or a window
  that no longer continues) makes the read re-plan from fresh metadata
  (:data:`~s3stream.engine.reader.READ_RETRY_MAX` times per read); the replaced objects' bytes stay
  in the bucket for ``s3.object.delete.retention.minutes`` after compaction, so a read planned
  before a compaction usually finishes on them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar, cast

from s3stream.engine.reader import ObjectStreamReader, ReaderStats
from s3stream.errors import ClosedError, InvalidArgumentError, OffsetOutOfRangeError
from s3stream.facade import _LoopThread
from s3stream.ids import StreamId
from s3stream.metadata.base import MetadataStore, StreamMetadata
from s3stream.model import FetchedBatch

T = TypeVar("T")

FETCH_MAX_BYTES_DEFAULT = 1 << 20
"""``max_bytes`` of a fetch that gives none (``Stream.fetch``'s default)."""


def _check_int(name: str, value: object, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an int, got {value!r}")
    if value < low:
        raise InvalidArgumentError(f"{name} must be at least {low}, got {value}")
    return value


class Reader:
    """Reads the uploaded data of any stream (see the module docstring). Build it with
    ``s3stream.open_reader``; ``close()`` (or ``async with``) when done."""

    def __init__(
        self,
        metadata: MetadataStore,
        reader: ObjectStreamReader,
        *,
        closers: list[Callable[[], Awaitable[None]]],
    ) -> None:
        self.metadata = metadata
        """The metadata store, open read-only (SQLite) or shared (PostgreSQL)."""
        self._reader = reader
        self._closers = closers
        """Closed in this order after the object reader."""
        self._closed = False

    async def list_streams(self) -> list[StreamMetadata]:
        """Every stream's metadata (id, epoch, state, ``[start_offset, end_offset)`` uploaded, ranges, tags)."""
        self._check_open()
        return await self.metadata.list_streams()

    async def describe_stream(self, stream_id: StreamId) -> StreamMetadata:
        """One stream's metadata; NotFoundError for an unknown stream."""
        self._check_open()
        return await self.metadata.describe_stream(StreamId(_check_int("stream_id", stream_id, low=0)))

    async def fetch(
        self,
        stream_id: StreamId,
        start_offset: int,
        end_offset: int,
        max_bytes: int = FETCH_MAX_BYTES_DEFAULT,
    ) -> list[FetchedBatch]:
        """Batches covering ``[start_offset, end_offset)`` of the stream's uploaded data, as
        ``Stream.fetch`` returns them; OffsetOutOfRangeError outside ``[start_offset, end_offset]``
        of the stream's metadata now."""
        self._check_open()
        sid = StreamId(_check_int("stream_id", stream_id, low=0))
        _check_int("start_offset", start_offset, low=0)
        _check_int("end_offset", end_offset, low=0)
        _check_int("max_bytes", max_bytes, low=1)
        if end_offset < start_offset:
            raise InvalidArgumentError(f"end_offset {end_offset} is below start_offset {start_offset}")
        stream = await self.metadata.describe_stream(sid)
        if start_offset < stream.start_offset or end_offset > stream.end_offset:
            raise OffsetOutOfRangeError(
                f"[{start_offset}, {end_offset}) is outside stream {sid}'s uploaded "
                f"[{stream.start_offset}, {stream.end_offset}]"
            )
        if start_offset == end_offset:
            return []
        records = await self._reader.read(sid, start_offset, end_offset, max_bytes)
        # A StreamRecordBatch is a FetchedBatch (as Stream.fetch returns them); the list is this call's.
        return cast(list[FetchedBatch], records)

    async def kv_get(self, key: str) -> bytes | None:
        """The KV value of ``key`` in the metadata now (what ``KVClient.get`` returns on a writer that
        shares it), or None."""
        self._check_open()
        if not isinstance(key, str):
            raise InvalidArgumentError(f"key must be a str, got {type(key).__name__}")
        return await self.metadata.kv_get(key)

    def stats(self) -> ReaderStats:
        """The object read path's counters (reads, re-plans after replaced objects, block hits and misses)."""
        return self._reader.stats()

    async def close(self) -> None:
        """Stop readahead, close the object storage and the metadata. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            await self._reader.close()
        for closer in self._closers:
            with contextlib.suppress(Exception):
                await closer()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the reader is closed")

    async def __aenter__(self) -> Reader:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class SyncReader:
    """Blocking :class:`Reader` on its own loop thread; ``with`` closes it. Build it with
    ``s3stream.open_reader_sync``."""

    def __init__(self, reader: Reader, runner: _LoopThread) -> None:
        self.reader = reader
        """The async reader behind this one (use it only from its loop)."""
        self._run = runner

    def list_streams(self) -> list[StreamMetadata]:
        return self._run.run(self.reader.list_streams())

    def describe_stream(self, stream_id: StreamId) -> StreamMetadata:
        return self._run.run(self.reader.describe_stream(stream_id))

    def fetch(
        self,
        stream_id: StreamId,
        start_offset: int,
        end_offset: int,
        max_bytes: int = FETCH_MAX_BYTES_DEFAULT,
    ) -> list[FetchedBatch]:
        return self._run.run(self.reader.fetch(stream_id, start_offset, end_offset, max_bytes))

    def kv_get(self, key: str) -> bytes | None:
        return self._run.run(self.reader.kv_get(key))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` (a call on :attr:`reader` or its metadata) on the reader's loop; its result."""
        return self._run.run(coro)

    def close(self) -> None:
        """Close the reader, then stop the loop thread."""
        try:
            self._run.run(self.reader.close())
        except ClosedError:
            pass
        finally:
            self._run.stop()

    @classmethod
    def start(cls, opener: Callable[[], Coroutine[Any, Any, Reader]]) -> SyncReader:
        """Start a loop thread, run ``opener()`` on it and wrap the reader it returns."""
        runner = _LoopThread()
        try:
            reader = runner.run(opener())
        except BaseException:
            runner.stop()
            raise
        return cls(reader, runner)

    def __enter__(self) -> SyncReader:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
