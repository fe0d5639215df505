"""The upload pipeline: LogCache block -> prepare -> upload -> commit -> WAL trim, never dropping data.

Acknowledged batches enter the active LogCache block through :meth:`UploadPipeline.put`; a block is
archived once full (or old, or forced) and runs through prepare -> upload -> commit. Prepares and
commits happen strictly in archive order, uploads may overlap (at most ``s3.wal.upload.inflight.max``
at a time), and every step is retried with backoff. Only after a commit is the block freed and the
WAL trimmed below the oldest record still holding uncommitted batches
(:class:`~s3stream.engine.waltrim.WalTrimTracker`). See ``docs/architecture.md`` "Write path".
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from s3stream.config import Config
from s3stream.engine.logcache import CachedBatch, LogCache, LogCacheBlock
from s3stream.engine.stream import Status, StreamHandle
from s3stream.engine.supervisor import Supervisor
from s3stream.engine.upload import ObjectUploader, StreamGroup, UploadPlan, plan_upload
from s3stream.engine.walport import WriteAheadLog
from s3stream.engine.waltrim import WalTrimTracker
from s3stream.errors import (
    ClosedError,
    ConflictError,
    ErrorCode,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
    S3StreamError,
)
from s3stream.hooks import call_hook
from s3stream.ids import ObjectId
from s3stream.logfmt import log_event
from s3stream.metadata.base import CommitStreamSetObjectRequest, MetadataStore, StreamState
from s3stream.record import RECORD_HEADER_SIZE

log = logging.getLogger(__name__)
T = TypeVar("T")
StepMeter = Callable[[str, bool, object, float], None]
"""``(step, ok, result, seconds)`` for each attempt of an upload step (``prepare``, ``upload``,
``commit``): ``result`` is the step's result (None when the attempt failed)."""

COMMITTED_SEQS_PER_TURN = 2048
"""WAL records marked committed per event-loop turn after an upload's commit (~0.5 ms)."""
RELEASED_STREAMS_PER_TURN = 128
"""Stream caches of blocks the LogCache released that are freed per event-loop turn (~0.15 ms: a
1,000-stream block of 1 KiB records freed at once held the loop 1.3 ms, up to 5 ms)."""
FROZEN_STREAMS_PER_TURN = 256
"""Stream caches of a committed block turned into rows per event-loop turn (~0.2 ms: a 1,000-stream
block of 8 records each takes ~0.75 ms; see ``LogCache.freeze_steps``)."""
PLAN_STREAMS_PER_TURN = 256
"""Streams of an archived block read into the upload plan per event-loop turn (~0.1-0.3 ms)."""
COMMIT_REVALIDATE_MAX = 8
"""Commit rejections in a row without a stream to drop before the engine gives up (data stays in the WAL)."""
_NODE_LEVEL_CODES = (ErrorCode.NODE_EPOCH_EXPIRED, ErrorCode.NODE_FENCED, ErrorCode.NODE_EPOCH_NOT_EXIST)


class UploadObserver:
    """Called at the points of the upload protocol, in order, for every archived block; a no-op here.

    Each call is awaited, so an observer may also hold the pipeline at that point.
    """

    async def before_upload(self) -> None:
        """After prepare, before the objects are written."""

    async def before_commit(self) -> None:
        """After the objects are written, before the commit."""

    async def after_commit(self) -> None:
        """After the commit, before the WAL trim."""


@dataclass
class EngineStats:
    appended_records: int = 0
    appended_bytes: int = 0
    uploads: int = 0
    uploaded_stream_count: int = 0
    """Sum over uploads of the streams each held (what a writer with one object per stream would PUT)."""
    uploaded_bytes: int = 0
    upload_busy_s: float = 0.0
    """Wall time during which at least one upload was in flight (archived, not yet committed); up to
    date whenever :meth:`UploadPipeline.force_upload` returns."""
    objects_committed: int = 0
    upload_retries: int = 0
    object_reads: int = 0
    recovered_records: int = 0
    backpressure_rejections: int = 0
    append_errors: int = 0
    """Record batches of append calls that raised (an atomic group counts each of its batches)."""
    backpressure_waits: int = 0
    """Appends that found no room and waited for uploads (each once, whatever its outcome)."""
    backpressure_wait_s: float = 0.0


@dataclass(eq=False)
class UploadTask:
    """One archived block on its way through the pipeline."""

    block: LogCacheBlock
    prev: UploadTask | None
    """The task archived just before, until this one is done (its prepare and commit come first)."""
    prepared: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    stream_ids: frozenset[int] = frozenset()


class UploadPipeline:
    """Archives LogCache blocks and carries each through prepare -> upload -> commit -> WAL trim."""

    def __init__(
        self,
        config: Config,
        *,
        cache: LogCache,
        uploader: ObjectUploader,
        metadata: MetadataStore,
        wal: WriteAheadLog,
        trim_tracker: WalTrimTracker,
        supervisor: Supervisor,
        streams: Mapping[int, StreamHandle],
        stats: EngineStats,
        upload_observer: UploadObserver,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.cache = cache
        self.uploader = uploader
        self.metadata = metadata
        self.wal = wal
        self.trim_tracker = trim_tracker
        self.supervisor = supervisor
        self.streams = streams
        self.stats = stats
        self.upload_observer = upload_observer
        self.clock = clock
        self.room = asyncio.Event()
        """Set whenever a commit frees LogCache and WAL room (or the engine fails): appenders waiting
        for room look again."""
        self.last_failure: str | None = None
        """The last failed upload step (``"upload: UnavailableError(...)"``) while retries go on; None once
        a step succeeds. Errors that tell a caller storage is the reason (back-pressure, close timeouts)
        quote it."""
        self.inflight: list[UploadTask] = []
        self.meter: StepMeter | None = None
        """Told of every attempt of an upload step (metrics, :mod:`s3stream.metrics`); None: nothing."""
        self._last_task: UploadTask | None = None
        self._slots = asyncio.Semaphore(config.upload_inflight_max)
        self._busy_since_s = 0.0  # when ``inflight`` last became non-empty

    def put(self, item: CachedBatch, seq: int) -> None:
        """An acknowledged batch of WAL record ``seq`` enters the active block (archived once full)."""
        if self.cache.put_item(item, seq):
            self.archive_and_upload()

    def archive_and_upload(self) -> UploadTask | None:
        """Archive the active block (if not empty) and start its upload."""
        if self.supervisor.failed is not None:
            return None
        block = self.cache.archive(self.clock())
        if block is None:
            return None
        task = UploadTask(block=block, prev=self._last_task, stream_ids=frozenset(block.streams))
        self._last_task = task
        if not self.inflight:
            self._busy_since_s = self.clock()
        self.inflight.append(task)
        self.supervisor.spawn(self._upload(task), name=f"s3stream-upload-{block.block_id}")
        return task

    def upload_for_room(self) -> None:
        """An append waits for room (LogCache or WAL full): upload the active block, unless uploads are
        already in flight. Their commits free the room; archiving again on every wake-up would only cut
        the active block into many small objects (AutoMQ keeps one forced upload in flight)."""
        if not self.inflight:
            self.archive_and_upload()

    async def force_upload(self, stream_id: int | None) -> None:
        """Upload the active block if it holds ``stream_id`` (any stream if None) and wait for every
        in-flight upload holding it."""
        self.supervisor.check_alive()
        if stream_id is None or stream_id in self.cache.active.streams:
            self.archive_and_upload()
        waits = [t.done.wait() for t in self.inflight if stream_id is None or stream_id in t.stream_ids]
        if waits:
            await asyncio.gather(*waits)
        self.supervisor.check_alive()

    def wake_all(self) -> None:
        """The engine failed: wake every waiter (they find the failure)."""
        self.room.set()
        for task in self.inflight:
            task.done.set()

    async def _upload(self, task: UploadTask) -> None:
        try:
            plan = plan_upload(
                await _streams_of(task.block), split_size_bytes=self.config.stream_object_split_size_bytes
            )
            if task.prev is not None:
                await task.prev.prepared.wait()
            await self._slots.acquire()
            try:
                first_id = await self._retry("prepare", lambda: self.uploader.prepare(plan))
                order_id = first_id
                task.prepared.set()
                while True:
                    await self.upload_observer.before_upload()
                    ids = first_id
                    request = await self._retry("upload", functools.partial(self.uploader.write, plan, ids))
                    request = dataclasses.replace(request, order_id=order_id)
                    log_event(log, logging.DEBUG, "object.uploaded", node=request.node_id, object=request.object_id, bytes=request.object_size_bytes, stream_objects=len(request.stream_objects))  # fmt: skip
                    await self.upload_observer.before_commit()
                    if task.prev is not None:
                        await task.prev.done.wait()
                    self.supervisor.check_alive()
                    try:
                        await self._commit(request, plan)
                        break
                    except NotFoundError as exc:
                        if exc.code != ErrorCode.OBJECT_NOT_EXIST:
                            raise
                    # The upload outlived the prepared TTL (storage was down that long): new ids, same
                    # order id (the data's place in the node's StreamSet object order does not change).
                    log_event(log, logging.WARNING, "object.prepare_expired", object=ids, action="upload again")  # fmt: skip
                    first_id = await self._retry("prepare", lambda: self.uploader.prepare(plan))
                await self.upload_observer.after_commit()
            finally:
                self._slots.release()
            await self._after_commit(task, request)
        finally:
            task.prepared.set()
            # Done: no later task waits for it any more, and it must not keep the earlier ones (with
            # their blocks, released by the LogCache meanwhile) alive in a chain.
            task.prev = None
            if self._last_task is task:
                self._last_task = None

    async def _after_commit(self, task: UploadTask, request: CommitStreamSetObjectRequest) -> None:
        self.stats.uploads += 1
        self.stats.uploaded_stream_count += len(task.stream_ids)
        self.stats.uploaded_bytes += task.block.size_bytes
        self.stats.objects_committed += (1 if request.object_id >= 0 else 0) + len(request.stream_objects)
        log_event(log, logging.INFO, "object.committed", node=request.node_id, epoch=request.node_epoch, object=request.object_id, order=request.order_id, streams=len(task.stream_ids), stream_objects=[so.object_id for so in request.stream_objects], bytes=task.block.size_bytes)  # fmt: skip
        # One entry per batch of the block (8,000 for 8 MiB of 1 KiB records): in turns, so appends run
        # between them. A WAL trim computed meanwhile sees these records still live (trims less).
        seqs = task.block.take_seqs()
        for start in range(0, len(seqs), COMMITTED_SEQS_PER_TURN):
            if start:
                await asyncio.sleep(0)
            self.trim_tracker.committed(seqs[start : start + COMMITTED_SEQS_PER_TURN])
        self.trim_tracker.released(task.block.wal_bytes)
        blocks = list(self.cache.blocks)
        self.cache.mark_free(task.block)  # may release free blocks, from the head only
        holders = [
            holder
            for block in blocks[: len(blocks) - len(self.cache.blocks)]
            for holder in block.take_holders()
        ]
        del blocks  # released blocks go now, their stream caches or rows (and records) in turns below
        self.inflight.remove(task)
        if not self.inflight:
            self.stats.upload_busy_s += self.clock() - self._busy_since_s
        task.done.set()
        self.room.set()
        self.trim_wal()
        await _free_in_turns(holders)
        # Kept for reads until released: frozen (no tracked object per stream) in turns.
        for _ in self.cache.freeze_steps(task.block, FROZEN_STREAMS_PER_TURN):
            await asyncio.sleep(0)

    def trim_wal(self) -> None:
        """Trim the WAL below its oldest live record (after a commit, and when the WAL is full)."""
        trim_to = self.trim_tracker.trim_point(self.cache.uncommitted_wal_offset_min())
        if trim_to is not None:
            self.supervisor.spawn(self._trim_wal(trim_to), name="s3stream-wal-trim")

    async def _trim_wal(self, offset: int) -> None:
        try:
            await self.wal.trim(offset)
        except (S3StreamError, OSError) as exc:
            log_event(log, logging.WARNING, "wal.trim_failed", offset=offset, error=exc, action="retry after the next commit")  # fmt: skip

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
        epochs = {s.stream_id: s.epoch for s in (*plan.stream_set, *plan.stream_objects)}
        lost: set[int] = set()
        starts = [(r.stream_id, r.start_offset) for r in request.stream_ranges] + [
            (s.stream_id, s.start_offset) for s in request.stream_objects
        ]
        for stream_id, start in starts:
            held = self.streams.get(stream_id)
            if held is not None and held.status is Status.RESERVED:
                # Held for an external commit, which uploads the stream's data before it commits: a
                # refusal here is never "taken over", and dropping the data would lose acknowledged
                # records. The commit is retried (and fails the engine if it keeps being refused).
                log_event(
                    log,
                    logging.ERROR,
                    "commit.stream_reserved",
                    stream=stream_id,
                    action="data kept in the commit",
                )
                continue
            try:
                meta = await self.metadata.describe_stream(stream_id)
            except NotFoundError:
                lost.add(stream_id)
                continue
            if meta.epoch != epochs[stream_id] or meta.state != StreamState.OPENED or meta.end_offset > start:
                lost.add(stream_id)
        if not lost:
            log_event(log, logging.WARNING, "commit.rejected", error=exc, action="retry")
            await asyncio.sleep(self.config.upload_retry_backoff_ms / 1000)
            return request
        for lost_id in lost:
            log_event(log, logging.WARNING, "stream.ownership_lost", stream=lost_id, action="data dropped from the commit")  # fmt: skip
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
        meter = self.meter
        while True:
            self.supervisor.check_alive()
            started_s = time.perf_counter() if meter is not None else 0.0
            try:
                result = await op()
            except (FencedError, ConflictError, NotFoundError, InvalidArgumentError, ClosedError):
                if meter is not None:
                    call_hook("upload.step_meter", meter, what, False, None, time.perf_counter() - started_s)
                raise
            except (S3StreamError, OSError, TimeoutError) as exc:
                if meter is not None:
                    call_hook("upload.step_meter", meter, what, False, None, time.perf_counter() - started_s)
                self.last_failure = f"{what}: {exc!r}"
                self.stats.upload_retries += 1
                log_event(log, logging.WARNING, "upload.step_failed", step=what, retry_in_s=delay_s, error=repr(exc))  # fmt: skip
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, delay_max_s)
            else:
                if meter is not None:
                    call_hook("upload.step_meter", meter, what, True, result, time.perf_counter() - started_s)
                self.last_failure = None
                return result

    def failure_hint(self) -> str:
        """Why uploads may not be getting through, for an error message."""
        if self.last_failure is None:
            return "no upload step has failed: object storage is slow"
        return f"uploads are failing, retried: {self.last_failure}"


async def _free_in_turns(holders: list[object]) -> None:
    """Drop the last references to released stream caches (or frozen rows) a few at a time (their
    records go with them), so freeing a released block is spread over event-loop turns."""
    while holders:
        await asyncio.sleep(0)
        del holders[-RELEASED_STREAMS_PER_TURN:]


async def _streams_of(block: LogCacheBlock) -> StreamGroup:
    """The archived block's records by stream (ascending id): its own stream caches, which no longer
    change, as the writer's columns, with payload sizes from the cache's tallies (no per-record work,
    no object per stream), ``PLAN_STREAMS_PER_TURN`` streams per event-loop turn."""
    stream_ids = list(block.streams.keys())
    caches = list(block.streams.values())
    payload_bytes: list[int] = []
    for start in range(0, len(caches), PLAN_STREAMS_PER_TURN):
        if start:
            await asyncio.sleep(0)
        payload_bytes.extend(
            cache.size_bytes - RECORD_HEADER_SIZE * len(cache.payloads)
            for cache in caches[start : start + PLAN_STREAMS_PER_TURN]
        )
    return StreamGroup.of_record_columns(stream_ids, caches, payload_bytes)
