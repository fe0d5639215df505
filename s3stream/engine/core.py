"""The node-local stream engine: stream lifecycle, fetch, restart recovery, and the wiring of its parts.

:class:`Engine` is the storage of every open stream on one node (AutoMQ's ``S3Storage``). It owns the streams'
state (:mod:`s3stream.engine.stream`) and delegates the write path: appends and their ordered acknowledgement
to :class:`~s3stream.engine.append.AppendPath`, LogCache blocks through prepare -> upload -> commit -> WAL
trim to :class:`~s3stream.engine.pipeline.UploadPipeline`, and its background tasks to a
:class:`~s3stream.engine.supervisor.Supervisor`. Fetches read the LogCache, then objects. ``start()`` first
replays the WAL's untrimmed records (``docs/automq-model.md`` section 13; the plan is
:func:`~s3stream.engine.recovery.plan_replay`). See ``docs/architecture.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, cast

from s3stream.config import Config
from s3stream.engine import external
from s3stream.engine.append import AppendPath
from s3stream.engine.fetchmerge import merge_fetch
from s3stream.engine.kvlog import KvApplier, apply_record
from s3stream.engine.logcache import CachedBatch, LogCache
from s3stream.engine.pipeline import EngineStats, StepMeter, UploadObserver, UploadPipeline
from s3stream.engine.recovery import after_takeover, plan_replay
from s3stream.engine.sequencer import fail_stream, wait_drained
from s3stream.engine.stream import Status, StreamHandle
from s3stream.engine.supervisor import Supervisor
from s3stream.engine.upload import ObjectUploader
from s3stream.engine.walbody import KvMutation, KvOp
from s3stream.engine.walport import WriteAheadLog
from s3stream.engine.waltrim import WalTrimTracker
from s3stream.errors import (
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
from s3stream.ids import NodeId, StreamId
from s3stream.logfmt import log_event
from s3stream.metadata.base import CommitObjectsRequest, MetadataStore, StreamMetadata
from s3stream.model import FetchedBatch
from s3stream.record import StreamRecordBatch
from s3stream.storage.base import ObjectStorage

__all__ = ["Engine", "EngineStats", "ObjectStreamReaderLike", "Status", "StreamHandle", "UploadObserver"]

log = logging.getLogger(__name__)

NODE_FENCE_CODES = frozenset(
    {ErrorCode.NODE_EPOCH_EXPIRED, ErrorCode.NODE_FENCED, ErrorCode.NODE_EPOCH_NOT_EXIST}
)
"""Codes of a FencedError that fences the whole node (its session), not one stream."""

TICK_S = 0.05
"""Period of the background ticker (time-triggered uploads, the WAL append watchdog)."""


class ObjectStreamReaderLike(Protocol):
    """What the engine needs from the object read path (``s3stream.engine.reader``)."""

    async def read(
        self, stream_id: StreamId, start_offset: int, end_offset: int, max_bytes: int
    ) -> list[StreamRecordBatch]:
        """A new list of the batches from the one holding ``start_offset``, contiguous, stopping
        before ``end_offset`` and once ``max_bytes`` payload bytes are reached (at least one batch),
        or where the stream's objects end; a gap or overlap raises CorruptionError. A fetch that the
        LogCache has no part of returns it as it is (it is what ``merge_fetch`` would make of it)."""
        ...

    async def close(self) -> None: ...


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
        upload_observer: UploadObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
        lease_check: Callable[[], bool] | None = None,
    ) -> None:
        """``lease_check``: the node lease (``Heartbeat.holds_lease``); appends are acknowledged only
        while it holds (:mod:`s3stream.engine.append`). None: an embedded engine with no lease."""
        self.config = config
        self.wal = wal
        self.metadata = metadata
        self.storage = storage
        self.node_id = node_id
        self.node_epoch = node_epoch
        self.reader = reader
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
        self.stats = EngineStats()
        self._trim_tracker = WalTrimTracker()
        self._supervisor = Supervisor(self._on_failure)
        self._pipeline = UploadPipeline(
            config,
            cache=self.cache,
            uploader=self.uploader,
            metadata=metadata,
            wal=wal,
            trim_tracker=self._trim_tracker,
            supervisor=self._supervisor,
            streams=self.streams,
            stats=self.stats,
            upload_observer=upload_observer or UploadObserver(),
            clock=clock,
        )
        self._kv = KvApplier(metadata, self._trim_tracker, self._supervisor, node_id=node_id)
        self._appends = AppendPath(
            config,
            cache=self.cache,
            wal=wal,
            kv=self._kv,
            trim_tracker=self._trim_tracker,
            pipeline=self._pipeline,
            supervisor=self._supervisor,
            stats=self.stats,
            clock=clock,
        )
        self._appends.lease_check = lease_check
        self.append = self._appends.append
        self.append_one = self._appends.append_one
        self.force_upload = self._pipeline.force_upload
        self._ticker: asyncio.Task[None] | None = None
        self._external_lock = asyncio.Lock()

    def set_meters(
        self, *, append_latency: Callable[[float], None] | None, upload_step: StepMeter | None
    ) -> None:
        """The metrics hooks (:mod:`s3stream.metrics`): the sampled append latency
        (:data:`~s3stream.engine.append.LATENCY_SAMPLE_MASK`) and each upload step's attempts."""
        self._appends.latency = append_latency
        self._pipeline.meter = upload_step

    @property
    def upload_observer(self) -> UploadObserver:
        return self._pipeline.upload_observer

    @upload_observer.setter
    def upload_observer(self, upload_observer: UploadObserver) -> None:
        self._pipeline.upload_observer = upload_observer

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Register the node, replay the WAL, upload what it held, start the ticker."""
        opening = await self.metadata.register_node(node_id=self.node_id, node_epoch=self.node_epoch)
        await self._recover(opening)
        self._ticker = asyncio.create_task(self._tick_loop(), name="s3stream-engine-ticker")

    async def close(self) -> None:
        """Close every open stream (forcing its data up), stop background work."""
        supervisor = self._supervisor
        if supervisor.closed:
            return
        try:
            async with asyncio.timeout(self.config.close_timeout_ms / 1000):
                if supervisor.failed is None:
                    with contextlib.suppress(S3StreamError):
                        await self.force_upload(None)  # one upload for every stream, then the closes
                for handle in list(self.streams.values()):
                    with contextlib.suppress(S3StreamError):
                        await self.close_stream(handle)
                if supervisor.failed is None:
                    await self.force_upload(None)
        except TimeoutError:
            log_event(log, logging.WARNING, "engine.close_upload_timeout", node=self.node_id, close_timeout_ms=self.config.close_timeout_ms, action="data stays in the WAL, uploaded at the next open")  # fmt: skip
        finally:
            supervisor.closed = True
            if self._ticker is not None:
                self._ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._ticker
            await supervisor.cancel_and_wait()
            supervisor.fail(ClosedError("engine closed"))
            if self.reader is not None:
                await self.reader.close()

    def abandon(self) -> None:
        """Stop every background task and refuse work, uploading nothing and closing nothing: what a
        crash leaves behind (tests restart a new engine on the same WAL, metadata and storage)."""
        if self._ticker is not None:
            self._ticker.cancel()
        self._supervisor.cancel()

    def fence(self, error: FencedError) -> None:
        """The node's session is lost (epoch bumped, lease expired): refuse every later append, open,
        commit and KV change with ``error``, and stop the uploads in flight (they would only be refused).

        The engine writes no object and no metadata afterwards; what the WAL holds stays there for the
        node's next session to replay."""
        self._supervisor.fail(error)
        self._supervisor.cancel_tasks()

    @property
    def fenced(self) -> bool:
        """True once the node's session is lost (:meth:`fence`, or a commit refused for the node)."""
        failed = self._supervisor.failed
        return isinstance(failed, FencedError) and failed.code in NODE_FENCE_CODES

    @property
    def wal_pending_bytes(self) -> int:
        """WAL bytes of records not uploaded yet (what a takeover of this node would replay)."""
        return self._trim_tracker.live_bytes

    def _check_alive(self) -> None:
        self._supervisor.check_alive()

    @contextlib.contextmanager
    def _fence_on_node_error(self) -> Iterator[None]:
        """A metadata write refused for the node's session (not for one stream) fences the engine."""
        try:
            yield
        except FencedError as exc:
            if exc.code in NODE_FENCE_CODES:
                self.fence(exc)
            raise

    def _on_failure(self, error: S3StreamError) -> None:
        """A background task died (or the engine closed): fence every stream, fail every pending append.
        A node-level fence also stops the uploads in flight."""
        fence = error if isinstance(error, FencedError | ClosedError) else ClosedError(str(error))
        for handle in self.streams.values():
            handle.fence(fence)
            fail_stream(handle, error, self._trim_tracker)
        self._kv.fail_all(error)
        self._pipeline.wake_all()
        if isinstance(error, FencedError) and error.code in NODE_FENCE_CODES:
            self._supervisor.cancel_tasks()

    # -- KV ----------------------------------------------------------------------------------------
    async def kv_put(self, key: str, value: bytes, *, overwrite: bool) -> bytes:
        """Put through the WAL (see :mod:`s3stream.engine.kvlog`); returns the value now stored."""
        op = KvOp.PUT if overwrite else KvOp.PUT_IF_ABSENT
        stored = await self._appends.append_kv(KvMutation(op, key, value))
        assert stored is not None
        return stored

    async def kv_delete(self, key: str) -> bytes | None:
        """Delete through the WAL; returns the value the key had (None if absent)."""
        return await self._appends.append_kv(KvMutation(KvOp.DELETE, key))

    async def kv_get(self, key: str) -> bytes | None:
        self._check_alive()
        return await self.metadata.kv_get(key)

    # -- streams ---------------------------------------------------------------------------------
    async def create_stream(self, tags: Mapping[str, str] | None) -> StreamId:
        self._check_alive()
        with self._fence_on_node_error():
            return await self.metadata.create_stream(
                node_id=self.node_id, node_epoch=self.node_epoch, tags=tags
            )

    async def open_stream(self, stream_id: StreamId, epoch: int) -> StreamHandle:
        self._check_alive()
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidArgumentError(f"epoch must be a non-negative int, got {epoch!r}")
        existing = self.streams.get(stream_id)
        if existing is not None and existing.status in (Status.OPEN, Status.CLOSING, Status.RESERVED):
            if epoch < existing.epoch:
                raise FencedError(f"stream {stream_id} is open here with epoch {existing.epoch} > {epoch}")
            if existing.close_timed_out:
                raise ConflictError(
                    f"stream {stream_id} is still closing here: its close timed out waiting for its upload; "
                    "close it again (Stream.close) before reopening"
                )
            raise ConflictError(f"stream {stream_id} is already open in this client")
        with self._fence_on_node_error():
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
        log_event(log, logging.DEBUG, "stream.opened", node=self.node_id, stream=stream_id, epoch=epoch, start=meta.start_offset, end=meta.end_offset)  # fmt: skip
        return handle

    async def close_stream(self, handle: StreamHandle) -> None:
        """Stop appends, wait for pending ones, force the stream's data up, close it at metadata.

        The upload is awaited at most ``s3.close.timeout.ms``; past it UnavailableError, and the
        stream stays *closing* (readable, no appends, not reopenable here, its data durable in the WAL
        and still being uploaded) until a later close gets through."""
        if handle.status is Status.CLOSED or (handle.status is Status.CLOSING and not handle.close_timed_out):
            return
        if handle.status is Status.RESERVED:
            handle.check_writable()  # ConflictError naming the reservation: release it first
        was_fenced = handle.status is Status.FENCED
        handle.status = Status.CLOSING
        handle.close_timed_out = False
        await self._finish_close(handle, was_fenced=was_fenced)

    async def _finish_close(self, handle: StreamHandle, *, was_fenced: bool) -> None:
        """:meth:`close_stream` of a handle already marked CLOSING (no appends admitted)."""
        drained = wait_drained(handle)
        if drained is not None:
            await asyncio.gather(drained, return_exceptions=True)
        try:
            if not was_fenced and self._supervisor.failed is None:
                try:
                    async with asyncio.timeout(self.config.close_timeout_ms / 1000):
                        await self.force_upload(handle.stream_id)
                except TimeoutError:
                    handle.close_timed_out = True
                    raise UnavailableError(
                        f"stream {handle.stream_id}: close gave up after s3.close.timeout.ms "
                        f"({self.config.close_timeout_ms} ms) waiting for its upload ({self._pipeline.failure_hint()}); "
                        "its data is durable in the WAL and still being uploaded; close again to wait more"
                    ) from None
                with self._fence_on_node_error():
                    await self.metadata.close_stream(
                        node_id=self.node_id,
                        node_epoch=self.node_epoch,
                        stream_id=handle.stream_id,
                        epoch=handle.epoch,
                    )
                log_event(log, logging.DEBUG, "stream.closed", node=self.node_id, stream=handle.stream_id, epoch=handle.epoch)  # fmt: skip
        finally:
            if handle.status is Status.CLOSING and not handle.close_timed_out:
                handle.status = Status.CLOSED
            if handle.status is not Status.CLOSING and self.streams.get(handle.stream_id) is handle:
                del self.streams[handle.stream_id]

    async def open_streams(
        self, requests: Sequence[tuple[StreamId, int]]
    ) -> list[tuple[StreamId, StreamHandle | S3StreamError]]:
        """:meth:`open_stream` of many ``(stream_id, epoch)`` pairs with one metadata transaction
        (``MetadataStore.open_streams``): per request, in order, the open handle or the error the
        single open would have raised. A node-level fence is raised (and fences the engine)."""
        self._check_alive()
        refused: dict[StreamId, S3StreamError] = {}
        asked: list[tuple[StreamId, int]] = []
        for stream_id, epoch in requests:
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
                raise InvalidArgumentError(f"epoch must be a non-negative int, got {epoch!r}")
            existing = self.streams.get(stream_id)
            if existing is not None and existing.status in (Status.OPEN, Status.CLOSING, Status.RESERVED):
                refused[stream_id] = ConflictError(f"stream {stream_id} is already open in this client")
            else:
                asked.append((stream_id, epoch))
        opened: dict[StreamId, StreamHandle | S3StreamError] = dict(refused)
        if asked:
            with self._fence_on_node_error():
                outcomes = await self.metadata.open_streams(
                    node_id=self.node_id, node_epoch=self.node_epoch, requests=asked
                )
            for (stream_id, epoch), outcome in zip(asked, outcomes, strict=True):
                if outcome.error is not None or outcome.stream is None:
                    opened[stream_id] = outcome.error or ConflictError(f"stream {stream_id}: no metadata")
                    continue
                meta = outcome.stream
                handle = StreamHandle(
                    stream_id=stream_id,
                    epoch=epoch,
                    start_offset=meta.start_offset,
                    next_offset=meta.end_offset,
                    confirm_offset=meta.end_offset,
                )
                self.streams[stream_id] = handle
                opened[stream_id] = handle
        return [(stream_id, opened[stream_id]) for stream_id, _ in requests]

    async def move_streams(self, handles: Sequence[StreamHandle], to_node_id: int) -> list[StreamHandle]:
        """Give up streams reassigned to ``to_node_id``: at once every later append of them raises
        MovedError naming that node; the appends in flight finish (acknowledged or failed as usual);
        then their data is forced up (one upload carries all of them: they all stop taking appends
        before it) and those uploaded are closed in one metadata transaction
        (``MetadataStore.close_streams``).

        Returns the handles no longer open here (CLOSED, or FENCED: a stream-level refusal). A stream
        whose upload timed out (``s3.close.timeout.ms``) stays *closing* with ``moved_to`` set; a
        later call retries it. A stream whose upload or metadata close failed otherwise is dropped
        here as by :meth:`close_stream` (the watcher closes such strays). A node-level fence is raised."""
        self._check_alive()
        moving = []
        for handle in handles:
            timed_out = handle.status is Status.CLOSING and handle.close_timed_out
            if handle.status is Status.OPEN or timed_out:
                handle.moved_to = to_node_id
                handle.status = Status.CLOSING  # appends refused from here on, with MovedError
                handle.close_timed_out = False
                moving.append(handle)
        try:
            drains = [d for d in (wait_drained(h) for h in moving) if d is not None]
            if drains:
                await asyncio.gather(*drains, return_exceptions=True)
            ready = []
            if self._supervisor.failed is None:
                uploaded = await asyncio.gather(*(self._move_upload(h, to_node_id) for h in moving))
                ready = [
                    h for h, ok in zip(moving, uploaded, strict=True) if ok and h.status is Status.CLOSING
                ]
            if ready:
                with self._fence_on_node_error():
                    outcomes = await self.metadata.close_streams(
                        node_id=self.node_id,
                        node_epoch=self.node_epoch,
                        requests=[(h.stream_id, h.epoch) for h in ready],
                    )
                for handle, outcome in zip(ready, outcomes, strict=True):
                    if outcome.error is not None:
                        log_event(log, logging.WARNING, "stream.move_refused", stream=handle.stream_id, to_node=to_node_id, error=outcome.error)  # fmt: skip
        except S3StreamError as exc:
            if isinstance(exc, FencedError) and exc.code in NODE_FENCE_CODES:
                raise
            log_event(log, logging.WARNING, "stream.move_close_failed", streams=len(moving), to_node=to_node_id, error=exc, action="retry")  # fmt: skip
        finally:
            for handle in moving:
                if handle.status is Status.CLOSING and not handle.close_timed_out:
                    handle.status = Status.CLOSED
                if handle.status is not Status.CLOSING and self.streams.get(handle.stream_id) is handle:
                    del self.streams[handle.stream_id]
        return [h for h in moving if h.status is not Status.CLOSING]

    async def _move_upload(self, handle: StreamHandle, to_node_id: int) -> bool:
        """Force one moving stream's data up within ``s3.close.timeout.ms``; whether it went up."""
        try:
            async with asyncio.timeout(self.config.close_timeout_ms / 1000):
                await self.force_upload(handle.stream_id)
        except TimeoutError:
            handle.close_timed_out = True
            log_event(log, logging.WARNING, "stream.move_upload_timeout", stream=handle.stream_id, to_node=to_node_id, close_timeout_ms=self.config.close_timeout_ms, action="retry")  # fmt: skip
            return False
        except S3StreamError as exc:
            log_event(log, logging.WARNING, "stream.move_upload_failed", stream=handle.stream_id, to_node=to_node_id, error=exc)  # fmt: skip
            return False
        return True

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
        with self._fence_on_node_error():
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
        with self._fence_on_node_error():
            await self.metadata.delete_stream(stream_id=handle.stream_id, epoch=handle.epoch)

    # -- external commits (s3stream.engine.external) --------------------------------------------
    def reserve_streams(self, handles: Sequence[StreamHandle], reason: str = "a reservation") -> None:
        """Refuse new appends to these streams (ConflictError naming ``reason``) until released;
        appends in flight finish. All or none; a stream reserved for the same reason stays so."""
        self._check_alive()
        external.reserve(handles, reason)

    def release_streams(self, handles: Sequence[StreamHandle]) -> None:
        """Accept appends again (a handle that is not reserved is left as it is)."""
        external.release(handles)

    async def commit_external(self, handles: Sequence[StreamHandle], request: CommitObjectsRequest) -> None:
        """Commit objects written outside the WAL (:func:`s3stream.engine.external.commit_external`):
        the handles' streams are reserved, drained and uploaded first, and their next and confirm
        offsets move to the new end offsets after the commit."""
        self._check_alive()
        async with self._external_lock:
            await external.commit_external(self, handles, request)

    async def settle_external(self, handles: Sequence[StreamHandle]) -> int:
        """Settle handles an external commit with an unknown outcome left reserved
        (:func:`s3stream.engine.external.settle_external`): they take the metadata's end offsets and
        are released. Returns how many were settled."""
        self._check_alive()
        async with self._external_lock:
            return await external.settle_external(self, handles)

    async def commit_objects_now(self, request: CommitObjectsRequest) -> None:
        """``commit_objects`` under this engine's node session (a node-level refusal fences the
        engine); callers go through :meth:`commit_external`."""
        self._check_alive()
        with self._fence_on_node_error():
            await self.metadata.commit_objects(request)

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
            if cached:
                records = merge_fetch(
                    cached,
                    head,
                    start_offset=start_offset,
                    end_offset=end_offset,
                    max_bytes=max_bytes,
                    source=f"stream {handle.stream_id}",
                )
            else:
                # Objects only: the reader's result already is the fetch (it starts with the batch
                # holding start_offset, is contiguous, stops before end_offset and after max_bytes
                # by the same rule), which merge_fetch would return unchanged.
                records = head
        handle.check_readable()
        # A StreamRecordBatch is a FetchedBatch: the records go out as they are (the list is this
        # call's own, so the caller may change it).
        return cast(list[FetchedBatch], records)

    async def _read_objects(
        self, stream_id: StreamId, start_offset: int, end_offset: int, max_bytes: int
    ) -> list[StreamRecordBatch]:
        if self.reader is None:
            raise UnavailableError("no object reader configured: data is no longer cached")
        records = await self.reader.read(stream_id, start_offset, end_offset, max_bytes)
        self.stats.object_reads += 1
        return records

    async def _tick_loop(self) -> None:
        interval_s = self.config.wal_upload_interval_ms / 1000
        while True:
            await asyncio.sleep(min(TICK_S, interval_s))
            self._appends.watchdog()
            active = self.cache.active
            if not active.is_empty() and self.clock() - active.created_at_s >= interval_s:
                self._pipeline.archive_and_upload()

    # -- recovery --------------------------------------------------------------------------------
    async def _await_replay_uploads(self, uploads: asyncio.Future[Any], replayed: int) -> None:
        """Wait for the replayed records' uploads while they make progress; UnavailableError once a
        wait of ``s3.close.timeout.ms`` ends with the last upload step failed (storage unreachable or
        refusing: the open would otherwise wait forever). Slow storage whose steps succeed is waited for."""
        wait_s = self.config.close_timeout_ms / 1000
        while True:
            try:
                await asyncio.wait_for(asyncio.shield(uploads), wait_s)
                return
            except TimeoutError:
                if self._pipeline.last_failure is None:
                    continue
            uploads.cancel()
            await self._supervisor.cancel_and_wait()
            raise UnavailableError(
                f"open gave up uploading the {replayed} record batches the WAL held: after a wait of "
                f"s3.close.timeout.ms ({self.config.close_timeout_ms} ms) {self._pipeline.failure_hint()}; "
                "nothing is lost: they stay in the WAL, open again once object storage answers"
            )

    async def _recover(self, opening: list[StreamMetadata]) -> None:
        """Replay untrimmed WAL records of this node's open streams, upload them, close the streams."""
        records = await self.wal.recover()
        stored_applied = applied_offset = await self.metadata.kv_applied_offset(self.node_id)
        own = [t for t in await self.metadata.list_takeovers() if t.node_id == self.node_id]
        adjust = after_takeover(
            own[0] if own else None,
            opening,
            kv_applied_offset=applied_offset,
            wal_end_offset=max((offset + 1 for offset, _ in records), default=0),
        )
        if adjust.kv_applied_offset != applied_offset:
            log_event(log, logging.WARNING, "wal.kv_after_takeover_skipped", node=self.node_id, after_wal_offset=applied_offset, reason="written after this node was fenced and taken over")  # fmt: skip
            applied_offset = adjust.kv_applied_offset
        plan = plan_replay(records, opening, kv_applied_offset=applied_offset, handed_back=adjust.handed_back)
        for wal_offset, mutations in plan.kv_records:
            await apply_record(self.metadata, mutations, node_id=self.node_id, wal_offset=wal_offset)
        if stored_applied != plan.wal_end_offset - 1 and not plan.kv_records:
            # Everything this WAL holds is applied (or it is a new WAL: offsets start again at 0, so
            # a mark left by a lost WAL would hide its records).
            await self.metadata.kv_apply([], node_id=self.node_id, wal_offset=plan.wal_end_offset - 1)
        for gap in plan.gaps:
            log_event(log, logging.ERROR, "wal.gap", node=self.node_id, stream=gap.stream_id, expected=gap.expected_offset, found=gap.found_offset, action="later batches dropped")  # fmt: skip
        self._trim_tracker.written(plan.wal_end_offset - 1)
        seqs = []
        for record in plan.records:  # WAL order: the trim tracker follows WAL offsets
            seq = self._appends.next_seq()
            seqs.append(seq)
            self._trim_tracker.submitted(
                seq,
                batch_count=len(record.batches),
                size_bytes=record.body_size_bytes,
                offset=record.wal_offset,
            )
        replayed = 0
        for (
            index,
            batch,
        ) in plan.release:  # each stream in offset order (held batches after their predecessor)
            self._pipeline.put(
                CachedBatch(batch.stream_id, batch.epoch, batch.base_offset, batch.count, batch.payload),
                seqs[index],
            )
            replayed += 1
        self.stats.recovered_records = replayed
        if replayed:
            log_event(log, logging.INFO, "wal.recovered", node=self.node_id, batches=replayed, wal_records=len(records))  # fmt: skip
        self._pipeline.archive_and_upload()
        waits = [t.done.wait() for t in self._pipeline.inflight]
        if waits:
            await self._await_replay_uploads(asyncio.gather(*waits), replayed)
        self._check_alive()
        if records:
            await self.wal.trim(max(self._trim_tracker.trim_point() or 0, self._trim_tracker.end_offset))
        for meta in opening:
            with contextlib.suppress(FencedError, ConflictError, NotFoundError):
                await self.metadata.close_stream(
                    node_id=self.node_id,
                    node_epoch=self.node_epoch,
                    stream_id=meta.stream_id,
                    epoch=meta.epoch,
                )
