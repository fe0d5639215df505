"""The write path and its recovery: WAL -> sequencer -> LogCache -> uploads -> commit -> WAL trim.

:class:`Engine` is the node-local storage of every open stream (AutoMQ's ``S3Storage``): it assigns
nothing itself (streams assign offsets), writes one WAL record per append or atomic group, restores
per-stream order of acknowledgements with a callback sequencer (reference 3.8), inserts acknowledged
records into the :class:`~s3stream.engine.logcache.LogCache`, archives a block once it is full or old,
and runs each archived block through prepare -> upload -> commit (prepares and commits strictly in
archive order; uploads may overlap; every step retried with backoff, never dropping data). Only after
a commit is the WAL trimmed and the block marked free. ``start()`` first replays the WAL's untrimmed
records (reference 3.11 step 5). See ``docs/architecture.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from s3stream.config import Config
from s3stream.engine.logcache import LogCache, LogCacheBlock
from s3stream.engine.reader import merge_fetch
from s3stream.engine.recovery import plan_replay
from s3stream.engine.upload import ObjectUploader, UploadPlan, plan_upload
from s3stream.engine.walbody import encode_group
from s3stream.engine.walport import WriteAheadLog
from s3stream.engine.waltrim import WalTrimTracker
from s3stream.errors import (
    CapacityError,
    ClosedError,
    ConflictError,
    ErrorCode,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
    OffsetOutOfRangeError,
    S3StreamError,
    UnavailableError,
)
from s3stream.ids import NodeId, ObjectId, StreamId
from s3stream.metadata.base import (
    CommitStreamSetObjectRequest,
    MetadataStore,
    StreamMetadata,
    StreamState,
)
from s3stream.model import FetchedBatch
from s3stream.record import StreamRecordBatch
from s3stream.storage.base import ObjectStorage

log = logging.getLogger(__name__)
T = TypeVar("T")

TICK_S = 0.05
"""Period of the background ticker (time-triggered uploads, forced-upload batching)."""
COMMIT_REVALIDATE_MAX = 8
"""Commit rejections in a row without a stream to drop before the engine gives up (data stays in the WAL)."""
_NODE_LEVEL_CODES = (ErrorCode.NODE_EPOCH_EXPIRED, ErrorCode.NODE_FENCED, ErrorCode.NODE_EPOCH_NOT_EXIST)


class ObjectStreamReaderLike(Protocol):
    """What the engine needs from the object read path (``s3stream.engine.reader``)."""

    async def read(
        self, stream_id: StreamId, start_offset: int, end_offset: int, max_bytes: int
    ) -> list[StreamRecordBatch]: ...

    async def close(self) -> None: ...


class TestHooks:
    """Points where crash tests pause or kill the process (set from the environment by the caller)."""

    __test__ = False

    async def before_upload(self) -> None:
        """After prepare, before the objects are written."""

    async def before_commit(self) -> None:
        """After the objects are written, before the commit."""

    async def after_commit(self) -> None:
        """After the commit, before the WAL trim."""


class Status(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"
    FENCED = "fenced"


class _Pending:
    """One WAL record (plain append or atomic group) waiting for durability and its turn."""

    __slots__ = ("by_stream", "future", "persisted", "remaining", "seq")

    def __init__(
        self,
        seq: int,
        by_stream: dict[int, list[StreamRecordBatch]],
        future: asyncio.Future[None],
        remaining: int,
    ) -> None:
        self.seq = seq
        self.by_stream = by_stream
        self.future = future
        self.remaining = remaining
        self.persisted = False


@dataclass(eq=False)
class StreamHandle:
    """Engine-side state of one open stream."""

    stream_id: StreamId
    epoch: int
    start_offset: int
    next_offset: int
    confirm_offset: int
    status: Status = Status.OPEN
    error: S3StreamError | None = None
    queue: deque[_Pending] = field(default_factory=deque)

    def check_writable(self) -> None:
        if self.status is Status.FENCED:
            raise self.error or FencedError(f"stream {self.stream_id} is fenced")
        if self.status is not Status.OPEN:
            raise ClosedError(f"stream {self.stream_id} is {self.status.value}")

    def check_readable(self) -> None:
        if self.status is Status.FENCED:
            raise self.error or FencedError(f"stream {self.stream_id} is fenced")
        if self.status is Status.CLOSED:
            raise ClosedError(f"stream {self.stream_id} is closed")


@dataclass(eq=False)
class _UploadTask:
    block: LogCacheBlock
    prev: _UploadTask | None
    prepared: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    stream_ids: frozenset[int] = frozenset()


class Engine:
    """Node-local stream storage: append, fetch, uploads, recovery. One per data dir."""

    def __init__(
        self,
        config: Config,
        *,
        wal: WriteAheadLog,
        metadata: MetadataStore,
        storage: ObjectStorage,
        node_id: NodeId,
        node_epoch: int,
        reader: ObjectStreamReaderLike | None = None,
        hooks: TestHooks | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.wal = wal
        self.metadata = metadata
        self.storage = storage
        self.node_id = node_id
        self.node_epoch = node_epoch
        self.reader = reader
        self.hooks = hooks or TestHooks()
        self.clock = clock
        self.cache = LogCache(
            capacity_bytes=config.wal_cache_size_bytes,
            upload_threshold_bytes=config.wal_upload_threshold_bytes,
            max_stream_count=config.max_stream_num_per_stream_set_object,
            now_s=clock(),
        )
        self.uploader = ObjectUploader(
            storage=storage,
            metadata=metadata,
            namespace=config.namespace,
            node_id=node_id,
            node_epoch=node_epoch,
            block_size_bytes=config.object_block_size_bytes,
            part_size_bytes=config.object_part_size_bytes,
            prepared_ttl_ms=config.object_prepared_ttl_ms,
        )
        self.streams: dict[int, StreamHandle] = {}
        self._seq = 0
        # seq -> [wal offset or None while in flight, records not yet committed, body bytes]
        self._live = WalTrimTracker()
        self._wal_room_bytes = int(config.wal_capacity_bytes * 0.9)
        self._uploads_active = 0
        self._upload_busy_since = 0.0
        self._in_wal: dict[int, float] = {}
        """seq -> submit time of WAL appends in flight, oldest first (the watchdog's view)."""

        self._block_seqs: dict[int, list[int]] = {}
        self._last_task: _UploadTask | None = None
        self._inflight: list[_UploadTask] = []
        self._upload_slots = asyncio.Semaphore(config.upload_inflight_max)
        self._room = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None
        self._failed: S3StreamError | None = None
        self._closed = False
        self.stats = EngineStats()

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Register the node, replay the WAL, upload what it held, start the ticker."""
        opening = await self.metadata.register_node(node_id=self.node_id, node_epoch=self.node_epoch)
        await self._recover(opening)
        self._ticker = asyncio.create_task(self._tick_loop(), name="s3stream-engine-ticker")

    async def close(self) -> None:
        """Close every open stream (forcing its data up), stop background work."""
        if self._closed:
            return
        try:
            async with asyncio.timeout(self.config.close_timeout_ms / 1000):
                if self._failed is None:
                    with contextlib.suppress(S3StreamError):
                        await self.force_upload(None)  # one upload for every stream, then the closes
                for handle in list(self.streams.values()):
                    with contextlib.suppress(S3StreamError):
                        await self.close_stream(handle)
                if self._failed is None:
                    await self.force_upload(None)
        except TimeoutError:
            log.warning(
                "close gave up waiting for uploads after %d ms: the data stays in the WAL and is uploaded "
                "on the next open",
                self.config.close_timeout_ms,
            )
        finally:
            self._closed = True
            if self._ticker is not None:
                self._ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._ticker
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._fail_all(ClosedError("engine closed"))
            if self.reader is not None:
                await self.reader.close()

    def abandon(self) -> None:
        """Stop every background task and refuse work, uploading nothing and closing nothing: what a
        crash leaves behind (tests restart a new engine on the same WAL, metadata and storage)."""
        self._closed = True
        if self._ticker is not None:
            self._ticker.cancel()
        for task in list(self._tasks):
            task.cancel()

    def _check_alive(self) -> None:
        if self._failed is not None:
            raise self._failed
        if self._closed:
            raise ClosedError("engine closed")

    def _fail_all(self, error: S3StreamError) -> None:
        """A background task died (or the engine closed): fail every pending append."""
        if self._failed is None and not isinstance(error, ClosedError):
            self._failed = error
            log.error("engine failed: %s", error)
        for handle in self.streams.values():
            if handle.status is Status.OPEN or handle.status is Status.CLOSING:
                handle.status = Status.FENCED
                handle.error = (
                    error if isinstance(error, FencedError | ClosedError) else ClosedError(str(error))
                )
            for pending in handle.queue:
                if not pending.future.done():
                    pending.future.set_exception(error)
                    pending.future.exception()  # retrieved: its appender may have failed on its own
            handle.queue.clear()
        self._room.set()
        for task in self._inflight:
            task.done.set()

    # -- streams ---------------------------------------------------------------------------------
    async def create_stream(self, tags: Mapping[str, str] | None) -> StreamId:
        self._check_alive()
        return await self.metadata.create_stream(node_id=self.node_id, node_epoch=self.node_epoch, tags=tags)

    async def open_stream(self, stream_id: StreamId, epoch: int) -> StreamHandle:
        self._check_alive()
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidArgumentError(f"epoch must be a non-negative int, got {epoch!r}")
        existing = self.streams.get(stream_id)
        if existing is not None and existing.status in (Status.OPEN, Status.CLOSING):
            if epoch < existing.epoch:
                raise FencedError(f"stream {stream_id} is open here with epoch {existing.epoch} > {epoch}")
            raise ConflictError(f"stream {stream_id} is already open in this client")
        meta = await self.metadata.open_stream(
            node_id=self.node_id, node_epoch=self.node_epoch, stream_id=stream_id, epoch=epoch
        )
        handle = StreamHandle(
            stream_id=stream_id,
            epoch=epoch,
            start_offset=meta.start_offset,
            next_offset=meta.end_offset,
            confirm_offset=meta.end_offset,
        )
        self.streams[stream_id] = handle
        return handle

    async def close_stream(self, handle: StreamHandle) -> None:
        """Stop appends, wait for pending ones, force the stream's data up, close it at metadata."""
        if handle.status in (Status.CLOSED, Status.CLOSING):
            return
        was_fenced = handle.status is Status.FENCED
        handle.status = Status.CLOSING
        if handle.queue:
            await asyncio.gather(*(p.future for p in handle.queue), return_exceptions=True)
        try:
            if not was_fenced and self._failed is None:
                await self.force_upload(handle.stream_id)
                await self.metadata.close_stream(
                    node_id=self.node_id,
                    node_epoch=self.node_epoch,
                    stream_id=handle.stream_id,
                    epoch=handle.epoch,
                )
        finally:
            if handle.status is Status.CLOSING:
                handle.status = Status.CLOSED
            if self.streams.get(handle.stream_id) is handle:
                del self.streams[handle.stream_id]

    async def trim_stream(self, handle: StreamHandle, new_start_offset: int) -> None:
        handle.check_writable()
        if isinstance(new_start_offset, bool) or not isinstance(new_start_offset, int):
            raise InvalidArgumentError(f"trim offset must be an int, got {new_start_offset!r}")
        if new_start_offset > handle.confirm_offset:
            raise OffsetOutOfRangeError(
                f"trim offset {new_start_offset} is above stream {handle.stream_id}'s confirm offset "
                f"{handle.confirm_offset}"
            )
        if new_start_offset <= handle.start_offset:
            return
        if self.cache.blocks_with_stream(handle.stream_id):
            # Metadata accepts a trim only up to the committed end: commit first.
            await self.force_upload(handle.stream_id)
        await self.metadata.trim_stream(
            node_id=self.node_id,
            node_epoch=self.node_epoch,
            stream_id=handle.stream_id,
            epoch=handle.epoch,
            new_start_offset=new_start_offset,
        )
        handle.start_offset = max(handle.start_offset, new_start_offset)

    async def destroy_stream(self, handle: StreamHandle) -> None:
        handle.check_writable()
        await self.close_stream(handle)
        await self.metadata.delete_stream(stream_id=handle.stream_id, epoch=handle.epoch)

    # -- append ----------------------------------------------------------------------------------
    async def append(
        self,
        appends: Sequence[tuple[StreamHandle, bytes, int]],
        kv_puts: Sequence[tuple[str, bytes]] = (),
    ) -> list[int]:
        """Append ``(stream, payload, count)`` entries (and KV puts) as ONE WAL record.

        Returns the base offsets; returns once the record is durable, the KV puts are in metadata and
        every earlier append of the same streams is acknowledged.
        """
        if self._failed is not None or self._closed:
            self._check_alive()
        size = 0
        record_max = self.config.record_size_max_bytes
        for handle, payload, _ in appends:
            if handle.status is not Status.OPEN:
                handle.check_writable()
            if len(payload) > record_max:
                raise InvalidArgumentError(
                    f"record batch of {len(payload)} bytes is above s3.record.size.max ({record_max})"
                )
            size += len(payload)
        for key, value in kv_puts:
            size += len(key) + len(value)
        if not self._has_room(size):
            await self._admit(size)
            for handle, _, _ in appends:
                handle.check_writable()
        # No await from here until the WAL write: offsets are assigned in submission order.
        by_stream: dict[int, list[StreamRecordBatch]] = {}
        handles: dict[int, StreamHandle] = {}
        if len(appends) == 1 and not kv_puts:
            handle, payload, count = appends[0]
            base = handle.next_offset
            handle.next_offset = base + count
            record = StreamRecordBatch(handle.stream_id, handle.epoch, base, count, payload)
            by_stream[handle.stream_id] = [record]
            handles[handle.stream_id] = handle
            bases = [base]
            body = record.encode()
            record_count = 1
        else:
            bases = []
            for handle, payload, count in appends:
                base = handle.next_offset
                handle.next_offset += count
                record = StreamRecordBatch(handle.stream_id, handle.epoch, base, count, bytes(payload))
                by_stream.setdefault(handle.stream_id, []).append(record)
                handles[handle.stream_id] = handle
                bases.append(base)
            body = encode_group([r for rs in by_stream.values() for r in rs], kv_puts)
            record_count = len(appends)
        if len(body) > self.config.wal_record_size_max_bytes:
            for handle, _, count in reversed(appends):
                handle.next_offset -= count
            raise InvalidArgumentError(
                f"WAL record of {len(body)} bytes is above s3.wal.record.size.max "
                f"({self.config.wal_record_size_max_bytes})"
            )
        seq = self._seq
        self._seq = seq + 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        pending = _Pending(seq, by_stream, future, remaining=len(by_stream))
        entry: list[int] | None = None
        if record_count:
            entry = self._live.submitted(seq, batch_count=record_count, size_bytes=len(body))
        for handle in handles.values():
            handle.queue.append(pending)
        try:
            offset = await self._wal_append(body, seq)
            for key, value in kv_puts:
                await self.metadata.kv_put(key, value, overwrite=True)
        except S3StreamError as exc:
            self._append_failed(pending, handles.values(), exc)
            raise
        except BaseException as exc:
            self._append_failed(pending, handles.values(), UnavailableError(f"append interrupted: {exc!r}"))
            raise
        if entry is not None:
            entry[0] = offset
        self._live.written(offset)
        pending.persisted = True
        if not by_stream:
            future.set_result(None)
        for handle in handles.values():
            self._sequence(handle)
        if not future.done():
            await future
        elif future.exception() is not None:
            raise future.exception()  # type: ignore[misc]
        stats = self.stats
        stats.appended_records += record_count
        stats.appended_bytes += size
        return bases

    async def append_one(self, handle: StreamHandle, payload: bytes, count: int) -> int:
        """One batch to one stream (the common case of :meth:`append`, without its generality)."""
        if handle.status is not Status.OPEN or self._failed is not None or self._closed:
            self._check_alive()
            handle.check_writable()
        size = len(payload)
        if size > self.config.record_size_max_bytes:
            raise InvalidArgumentError(
                f"record batch of {size} bytes is above s3.record.size.max ({self.config.record_size_max_bytes})"
            )
        if not self._has_room(size):
            await self._admit(size)
            handle.check_writable()
        base = handle.next_offset
        handle.next_offset = base + count
        record = StreamRecordBatch(handle.stream_id, handle.epoch, base, count, payload)
        body = record.encode()
        seq = self._seq
        self._seq = seq + 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        pending = _Pending(seq, {handle.stream_id: [record]}, future, 1)
        entry = self._live.submitted(seq, batch_count=1, size_bytes=len(body))
        handle.queue.append(pending)
        try:
            offset = await self._wal_append(body, seq)
        except S3StreamError as exc:
            self._append_failed(pending, (handle,), exc)
            raise
        except BaseException as exc:
            self._append_failed(pending, (handle,), UnavailableError(f"append interrupted: {exc!r}"))
            raise
        entry[0] = offset
        self._live.written(offset)
        pending.persisted = True
        self._sequence(handle)
        if not future.done():
            await future
        elif future.exception() is not None:
            raise future.exception()  # type: ignore[misc]
        stats = self.stats
        stats.appended_records += 1
        stats.appended_bytes += size
        return base

    def _has_room(self, size_bytes: int) -> bool:
        return (
            self.cache.size_bytes + size_bytes <= self.cache.capacity_bytes
            and self._live.live_bytes + size_bytes <= self._wal_room_bytes
        )

    async def _admit(self, size_bytes: int) -> None:
        """Wait for room in the LogCache and the WAL; CapacityError after the configured wait."""
        deadline = self.clock() + self.config.append_backpressure_wait_ms / 1000
        while True:
            self._check_alive()
            if self.cache.has_room(size_bytes) and (
                self._live.live_bytes + size_bytes <= self._wal_room_bytes or self._live.live_bytes == 0
            ):
                return
            self._archive_and_upload()
            remaining = deadline - self.clock()
            if remaining <= 0:
                self.stats.backpressure_rejections += 1
                raise CapacityError(
                    f"no room: LogCache {self.cache.size_bytes}/{self.cache.capacity_bytes} bytes, WAL "
                    f"{self._live.live_bytes}/{self.config.wal_capacity_bytes} bytes awaiting upload"
                )
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), timeout=min(remaining, 0.1))

    async def _wal_append(self, body: bytes, seq: int) -> int:
        """The WAL write. No per-append timer (it would cost more than the append): the ticker's
        watchdog fails the engine and closes the WAL when one stays in flight too long."""
        in_wal = self._in_wal
        in_wal[seq] = self.clock()
        try:
            try:
                return await self.wal.append(body)
            except CapacityError:
                pass
            deadline = self.clock() + self.config.append_backpressure_wait_ms / 1000
            while True:
                self._archive_and_upload()
                self._room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), timeout=0.1)
                self._check_alive()
                try:
                    return await self.wal.append(body)
                except CapacityError:
                    if self.clock() >= deadline:
                        raise
        finally:
            del in_wal[seq]

    def _watchdog(self) -> None:
        """AutoMQ's WAL append timeout: an append in flight for longer fails the engine."""
        if not self._in_wal:
            return
        started = self._in_wal[next(iter(self._in_wal))]
        timeout_s = self.config.wal_append_timeout_ms / 1000
        if self.clock() - started > timeout_s:
            self._fail_all(UnavailableError(f"a WAL append did not complete within {timeout_s} s"))
            self._spawn(self.wal.close(), name="s3stream-wal-close-after-timeout")

    def _append_failed(
        self, pending: _Pending, handles: Iterable[StreamHandle], error: S3StreamError
    ) -> None:
        """Any append failure fences its streams (AutoMQ): later appends of them fail too."""
        self._live.failed(pending.seq)
        fence = (
            error
            if isinstance(error, FencedError)
            else FencedError(f"stream fenced after a failed append: {error}")
        )
        for handle in handles:
            if handle.status in (Status.OPEN, Status.CLOSING):
                handle.status = Status.FENCED
                handle.error = fence
            for other in list(handle.queue):
                if not other.future.done():
                    other.future.set_exception(error if other is pending else fence)
                    other.future.exception()  # retrieved: the failing appender raises its own error
            handle.queue.clear()
        self._room.set()

    def _sequence(self, handle: StreamHandle) -> None:
        """Pop the stream's persisted head requests in order into the LogCache; acknowledge them."""
        while handle.queue and handle.queue[0].persisted:
            pending = handle.queue.popleft()
            if pending.future.done():
                continue
            for record in pending.by_stream[handle.stream_id]:
                self._cache_put(record, pending.seq)
                handle.confirm_offset = record.end_offset
            pending.remaining -= 1
            if pending.remaining == 0:
                pending.future.set_result(None)

    def _cache_put(self, record: StreamRecordBatch, seq: int) -> None:
        block = self.cache.active
        full = self.cache.put(record)
        self._block_seqs.setdefault(block.block_id, []).append(seq)
        if full:
            self._archive_and_upload()

    # -- fetch -----------------------------------------------------------------------------------
    async def fetch(
        self, handle: StreamHandle, start_offset: int, end_offset: int, max_bytes: int
    ) -> list[FetchedBatch]:
        handle.check_readable()
        for name, value in (
            ("start_offset", start_offset),
            ("end_offset", end_offset),
            ("max_bytes", max_bytes),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgumentError(f"{name} must be an int, got {value!r}")
        if end_offset < start_offset:
            raise InvalidArgumentError(f"end_offset {end_offset} is below start_offset {start_offset}")
        if max_bytes <= 0:
            raise InvalidArgumentError(f"max_bytes must be positive, got {max_bytes}")
        if start_offset < handle.start_offset or end_offset > handle.confirm_offset:
            raise OffsetOutOfRangeError(
                f"[{start_offset}, {end_offset}) is outside stream {handle.stream_id}'s "
                f"[{handle.start_offset}, {handle.confirm_offset}]"
            )
        if start_offset == end_offset:
            return []
        cached = self.cache.get(handle.stream_id, start_offset, end_offset, max_bytes)
        if cached and cached[0].base_offset <= start_offset:
            records = cached
        else:
            head_end = cached[0].base_offset if cached else end_offset
            head = await self._read_objects(handle.stream_id, start_offset, head_end, max_bytes)
            records = merge_fetch(
                cached,
                head,
                start_offset=start_offset,
                end_offset=end_offset,
                max_bytes=max_bytes,
                source=f"stream {handle.stream_id}",
            )
        handle.check_readable()
        return [FetchedBatch(r.base_offset, r.count, r.payload) for r in records]

    async def _read_objects(
        self, stream_id: StreamId, start_offset: int, end_offset: int, max_bytes: int
    ) -> list[StreamRecordBatch]:
        if self.reader is None:
            raise UnavailableError("no object reader configured: data is no longer cached")
        records = await self.reader.read(stream_id, start_offset, end_offset, max_bytes)
        self.stats.object_reads += 1
        return records

    # -- uploads ---------------------------------------------------------------------------------
    def _archive_and_upload(self) -> _UploadTask | None:
        """Archive the active block (if not empty) and start its upload pipeline."""
        if self._failed is not None:
            return None
        block = self.cache.archive(self.clock())
        if block is None:
            return None
        task = _UploadTask(block=block, prev=self._last_task, stream_ids=frozenset(block.streams))
        self._last_task = task
        self._inflight.append(task)
        self._spawn(self._upload(task), name=f"s3stream-upload-{block.block_id}")
        return task

    def _spawn(self, coro: Awaitable[None], *, name: str) -> None:
        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except S3StreamError as exc:
                self._fail_all(exc)
            except Exception as exc:
                self._fail_all(UnavailableError(f"background task {name} died: {exc!r}"))
                raise

        task = asyncio.create_task(guarded(), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def force_upload(self, stream_id: int | None) -> None:
        """Upload the active block if it holds ``stream_id`` (any stream if None) and wait for every
        in-flight upload holding it."""
        self._check_alive()
        if stream_id is None or stream_id in self.cache.active.streams:
            self._archive_and_upload()
        waits = [t.done.wait() for t in self._inflight if stream_id is None or stream_id in t.stream_ids]
        if waits:
            await asyncio.gather(*waits)
        self._check_alive()

    async def _upload(self, task: _UploadTask) -> None:
        plan = plan_upload(
            task.block.records_by_stream(), split_size_bytes=self.config.stream_object_split_size_bytes
        )
        if self._uploads_active == 0:
            self._upload_busy_since = self.clock()
        self._uploads_active += 1
        try:
            if task.prev is not None:
                await task.prev.prepared.wait()
            await self._upload_slots.acquire()
            try:
                first_id = await self._retry("prepare", lambda: self.uploader.prepare(plan))
                order_id = first_id
                task.prepared.set()
                while True:
                    await self.hooks.before_upload()
                    ids = first_id
                    request = await self._retry("upload", functools.partial(self.uploader.write, plan, ids))
                    request = dataclasses.replace(request, order_id=order_id)
                    await self.hooks.before_commit()
                    if task.prev is not None:
                        await task.prev.done.wait()
                    self._check_alive()
                    try:
                        await self._commit(request, plan)
                        break
                    except NotFoundError as exc:
                        if exc.code != ErrorCode.OBJECT_NOT_EXIST:
                            raise
                    # The upload outlived the prepared TTL (storage was down that long): new ids, same
                    # order id (the data's place in the node's StreamSet object order does not change).
                    log.warning("prepared objects from %d expired before their commit: uploading again", ids)
                    first_id = await self._retry("prepare", lambda: self.uploader.prepare(plan))
                await self.hooks.after_commit()
            finally:
                self._upload_slots.release()
            self._after_commit(task, request)
        finally:
            task.prepared.set()
            self._uploads_active -= 1
            if self._uploads_active == 0:
                self.stats.upload_busy_s += self.clock() - self._upload_busy_since

    def _after_commit(self, task: _UploadTask, request: CommitStreamSetObjectRequest) -> None:
        self.stats.uploads += 1
        self.stats.uploaded_stream_count += len(task.stream_ids)
        self.stats.uploaded_bytes += task.block.size_bytes
        self.stats.objects_committed += (1 if request.object_id >= 0 else 0) + len(request.stream_objects)
        self._live.committed(self._block_seqs.pop(task.block.block_id, []))
        self.cache.mark_free(task.block)
        self._inflight.remove(task)
        task.done.set()
        self._room.set()
        trim_to = self._live.trim_point()
        if trim_to is not None:
            self._spawn(self._trim_wal(trim_to), name="s3stream-wal-trim")

    async def _trim_wal(self, offset: int) -> None:
        try:
            await self.wal.trim(offset)
        except (S3StreamError, OSError) as exc:
            log.warning("WAL trim to %d failed (retried after the next commit): %s", offset, exc)

    async def _commit(self, request: CommitStreamSetObjectRequest, plan: UploadPlan) -> None:
        """Commit, dropping the ranges of streams that are no longer ours (fenced, deleted)."""
        rejections = 0
        while True:
            if not request.stream_ranges and not request.stream_objects:
                return  # every stream went away: the prepared objects expire and are deleted
            try:
                await self._retry(
                    "commit", functools.partial(self.metadata.commit_stream_set_object, request)
                )
                return
            except (FencedError, ConflictError, NotFoundError) as exc:
                if exc.code in _NODE_LEVEL_CODES or exc.code == ErrorCode.OBJECT_NOT_EXIST:
                    raise
                rejections += 1
                request = await self._drop_lost_streams(request, plan, exc)
                if rejections > COMMIT_REVALIDATE_MAX:
                    raise

    async def _drop_lost_streams(
        self, request: CommitStreamSetObjectRequest, plan: UploadPlan, exc: S3StreamError
    ) -> CommitStreamSetObjectRequest:
        epochs = {sid: recs[0].epoch for sid, recs in (*plan.stream_set, *plan.stream_objects)}
        lost: set[int] = set()
        starts = [(r.stream_id, r.start_offset) for r in request.stream_ranges] + [
            (s.stream_id, s.start_offset) for s in request.stream_objects
        ]
        for stream_id, start in starts:
            try:
                meta = await self.metadata.describe_stream(stream_id)
            except NotFoundError:
                lost.add(stream_id)
                continue
            if meta.epoch != epochs[stream_id] or meta.state != StreamState.OPENED or meta.end_offset > start:
                lost.add(stream_id)
        if not lost:
            log.warning("commit rejected with no stream to drop, retrying: %s", exc)
            await asyncio.sleep(self.config.upload_retry_backoff_ms / 1000)
            return request
        for lost_id in lost:
            log.warning("stream %d lost ownership: its uploaded data is dropped from the commit", lost_id)
            handle = self.streams.get(lost_id)
            if handle is not None and handle.epoch == epochs[lost_id]:
                handle.status = Status.FENCED
                handle.error = FencedError(f"stream {lost_id} was taken over by another owner")
        ranges = tuple(r for r in request.stream_ranges if r.stream_id not in lost)
        objects = tuple(s for s in request.stream_objects if s.stream_id not in lost)
        return CommitStreamSetObjectRequest(
            node_id=request.node_id,
            node_epoch=request.node_epoch,
            object_id=request.object_id if ranges else ObjectId(-1),
            order_id=request.order_id,
            object_size_bytes=request.object_size_bytes if ranges else 0,
            stream_ranges=ranges,
            stream_objects=objects,
        )

    async def _retry(self, what: str, op: Callable[[], Awaitable[T]]) -> T:
        """Run ``op`` until it succeeds; transient failures back off exponentially (never give up)."""
        delay_s = self.config.upload_retry_backoff_ms / 1000
        delay_max_s = self.config.upload_retry_backoff_max_ms / 1000
        while True:
            self._check_alive()
            try:
                return await op()
            except (FencedError, ConflictError, NotFoundError, InvalidArgumentError, ClosedError):
                raise
            except (S3StreamError, OSError, TimeoutError) as exc:
                self.stats.upload_retries += 1
                log.warning("%s failed, retrying in %.2f s: %r", what, delay_s, exc)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, delay_max_s)

    async def _tick_loop(self) -> None:
        interval_s = self.config.wal_upload_interval_ms / 1000
        while True:
            await asyncio.sleep(min(TICK_S, interval_s))
            self._watchdog()
            active = self.cache.active
            if not active.is_empty() and self.clock() - active.created_at_s >= interval_s:
                self._archive_and_upload()

    # -- recovery --------------------------------------------------------------------------------
    async def _recover(self, opening: list[StreamMetadata]) -> None:
        """Replay untrimmed WAL records of this node's open streams, upload them, close the streams."""
        records = await self.wal.recover()
        plan = plan_replay(records, opening)
        for key, value in plan.kv_puts:
            await self.metadata.kv_put(key, value, overwrite=True)
        for gap in plan.gaps:
            log.error("WAL gap in stream %d: expected offset %d, found %d; later batches dropped",
                      gap.stream_id, gap.expected_offset, gap.found_offset)  # fmt: skip
        self._live.written(plan.wal_end_offset - 1)
        replayed = 0
        for record in plan.records:
            seq = self._seq
            self._seq += 1
            self._live.submitted(
                seq,
                batch_count=len(record.batches),
                size_bytes=record.body_size_bytes,
                offset=record.wal_offset,
            )
            for batch in record.batches:
                self._cache_put(batch, seq)
                replayed += 1
        self.stats.recovered_records = replayed
        if replayed:
            log.info("recovered %d record batches from the WAL", replayed)
        self._archive_and_upload()
        waits = [t.done.wait() for t in self._inflight]
        if waits:
            await asyncio.gather(*waits)
        self._check_alive()
        if records:
            await self.wal.trim(max(self._live.trim_point() or 0, self._live.end_offset))
        for meta in opening:
            with contextlib.suppress(FencedError, ConflictError, NotFoundError):
                await self.metadata.close_stream(
                    node_id=self.node_id,
                    node_epoch=self.node_epoch,
                    stream_id=meta.stream_id,
                    epoch=meta.epoch,
                )


@dataclass
class EngineStats:
    appended_records: int = 0
    appended_bytes: int = 0
    uploads: int = 0
    uploaded_stream_count: int = 0
    """Sum over uploads of the streams each held (what a writer with one object per stream would PUT)."""
    uploaded_bytes: int = 0
    upload_busy_s: float = 0.0
    """Wall time during which at least one upload was in flight (prepare to commit)."""
    objects_committed: int = 0
    upload_retries: int = 0
    object_reads: int = 0
    recovered_records: int = 0
    backpressure_rejections: int = 0
