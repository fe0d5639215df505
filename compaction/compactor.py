"""The Compactor: the background component that runs compaction and garbage collection periodically.

One run (:meth:`Compactor.run_once`): StreamSet object compaction of this node's objects, or with
``cluster_wide`` (the maintenance node's compactor) of every registered node's objects, each node's
separately (force splits first, one commit each, then one merge commit), then stream object
compaction of the streams this node owns, or of every stream with ``cluster_wide`` (when its
interval has passed, or when asked), then a garbage collection pass (with
an orphan scan when asked or when the StreamSet interval has passed). It returns a
:class:`CompactionReport` and logs it. The loop runs the first time one interval after ``start``
(AutoMQ), then every interval, or after ``RETRY_SOON_S`` if candidates were left over. A failed run
is logged and retried at the next tick; ``close`` cancels the loop and waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from compaction.blockio import open_reader
from compaction.execute import StreamSetCompactionExecutor
from compaction.gc import GarbageCollector, GcReport
from compaction.observer import CompactionObserver
from compaction.plan import (
    CompactionLimits,
    SourceObject,
    plan_stream_set_compaction,
)
from compaction.stream_objects import (
    StreamObjectCompactor,
    StreamObjectOutcome,
    plan_stream_object_compaction,
)
from compaction.target import WriteTarget
from s3stream.clock import wall_clock_ms
from s3stream.config import Config
from s3stream.errors import S3StreamError
from s3stream.ids import NodeId, ObjectId, StreamId
from s3stream.logfmt import log_event
from s3stream.metadata.base import MetadataStore
from s3stream.objectformat import object_key
from s3stream.storage.base import ObjectStorage

log = logging.getLogger(__name__)

RETRY_SOON_S = 10.0
"""Delay of the next run when candidates were left over (AutoMQ: 10 s)."""
STREAM_OBJECTS_PER_QUERY_MAX = 100_000


CompactionMeter = Callable[[str, "tuple[int, int, int, int] | None"], None]
"""``(kind, moved)`` after each pass of a run: ``kind`` ``stream_set`` or ``stream_object``; ``moved``
(bytes in, bytes out, objects in, objects out), or None when the pass failed."""


@dataclass(frozen=True, slots=True)
class CompactionReport:
    """What one run did. Counts are objects; bytes are object bytes; durations in milliseconds."""

    stream_set_objects_compacted: int = 0
    """StreamSet objects replaced by merges and force splits (marked destroyed)."""
    stream_set_objects_written: int = 0
    stream_objects_written: int = 0
    """By StreamSet compaction (splits) and stream object compaction (merges)."""
    stream_objects_merged: int = 0
    """Stream objects replaced by merges."""
    stream_objects_expired: int = 0
    """Stream objects wholly below their stream's start offset, destroyed."""
    force_split_count: int = 0
    commit_count: int = 0
    skipped_object_count: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    bytes_copied: int = 0
    """Copied server-side (UploadPartCopy) by stream object merges."""
    gc: GcReport = dataclasses.field(default_factory=GcReport)
    stream_set_duration_ms: float = 0.0
    stream_object_duration_ms: float = 0.0
    gc_duration_ms: float = 0.0
    problems: tuple[str, ...] = ()
    more_pending: bool = False

    def log_fields(self) -> dict[str, object]:
        """The run as the fields of its ``compaction.run`` log line."""
        return {
            "stream_set_in": self.stream_set_objects_compacted, "stream_set_out": self.stream_set_objects_written,
            "stream_objects_out": self.stream_objects_written, "stream_objects_merged": self.stream_objects_merged,
            "stream_objects_expired": self.stream_objects_expired, "force_split": self.force_split_count,
            "bytes_read": self.bytes_read, "bytes_written": self.bytes_written, "bytes_copied": self.bytes_copied,
            "commits": self.commit_count, "skipped": self.skipped_object_count,
            "gc_deleted": self.gc.deleted_count, "gc_deleted_bytes": self.gc.deleted_bytes,
            "gc_prepared_expired": self.gc.prepared_expired_count, "gc_orphans": self.gc.orphan_deleted_count,
            "duration_ms": round(self.stream_set_duration_ms + self.stream_object_duration_ms + self.gc_duration_ms),
            "problems": "; ".join(self.problems) or None,
        }  # fmt: skip

    def summary(self) -> str:
        return (
            f"compaction: {self.stream_set_objects_compacted} StreamSet objects compacted "
            f"({self.force_split_count} force split) into {self.stream_set_objects_written} StreamSet + "
            f"{self.stream_objects_written} stream objects; {self.stream_objects_merged} stream objects merged, "
            f"{self.stream_objects_expired} expired; read {self.bytes_read} B, wrote {self.bytes_written} B, "
            f"copied {self.bytes_copied} B; {self.commit_count} commits, {self.skipped_object_count} skipped; "
            f"gc: {self.gc.prepared_expired_count} prepared expired, {self.gc.deleted_count} deleted "
            f"({self.gc.deleted_bytes} B), {self.gc.orphan_deleted_count} orphans, "
            f"{self.gc.incomplete_uploads_reclaimed} incomplete uploads; "
            f"{self.stream_set_duration_ms:.0f} + {self.stream_object_duration_ms:.0f} + "
            f"{self.gc_duration_ms:.0f} ms"
            + (f"; problems: {'; '.join(self.problems)}" if self.problems else "")
        )


class Compactor:
    """Background compaction of one node's objects (every node's with ``cluster_wide``). ``start()`` / ``close()``; ``run_once()`` any time
    (runs never overlap)."""

    def __init__(
        self,
        config: Config,
        metadata: MetadataStore,
        storage: ObjectStorage,
        *,
        node_id: NodeId,
        node_epoch: int,
        clock_ms: Callable[[], int] = wall_clock_ms,
        observer: CompactionObserver | None = None,
        prepared_ttl_ms: int | None = None,
        orphan_ttl_ms: int | None = None,
        cluster_wide: bool = False,
    ) -> None:
        """``cluster_wide``: compact every registered node's StreamSet objects (each node's separately,
        committed for that node at its current epoch, so the new objects stay that node's) and every
        stream's stream objects, as the one elected maintenance node does; otherwise only this node's
        StreamSet objects and the stream objects of the streams it owns."""
        self.config = config
        self.cluster_wide = cluster_wide
        self.metadata = metadata
        self.storage = storage
        self.node_id = node_id
        self.node_epoch = node_epoch
        self.clock_ms = clock_ms
        self.limits = CompactionLimits.from_config(config)
        ttl_ms = prepared_ttl_ms if prepared_ttl_ms is not None else config.object_prepared_ttl_ms
        observer = observer or CompactionObserver()
        target = WriteTarget(metadata, storage, config.namespace, node_id, node_epoch, ttl_ms, observer)
        self.target = target
        self.stream_set = StreamSetCompactionExecutor(
            target, writer_buffer_max_bytes=self.limits.writer_buffer_max_bytes
        )
        self.stream_objects = StreamObjectCompactor(
            target, memory_budget_bytes=self.limits.memory_budget_bytes
        )
        self.gc = GarbageCollector(
            metadata,
            storage,
            namespace=config.namespace,
            retention_ms=config.object_delete_retention_minutes * 60_000,
            orphan_ttl_ms=orphan_ttl_ms if orphan_ttl_ms is not None else 2 * ttl_ms,
            clock_ms=clock_ms,
            observer=observer,
        )
        self.interval_s = config.stream_set_object_compaction_interval_minutes * 60.0
        self.stream_object_interval_ms = config.stream_object_compaction_interval_minutes * 60_000
        self.last_report: CompactionReport | None = None
        self.meter: CompactionMeter | None = None
        """Told of each pass of a run (metrics); None: nothing."""
        self.error: BaseException | None = None
        """Set if the background loop died of an unexpected error (it then stops)."""
        self._last_stream_object_run_ms = clock_ms()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="s3stream-compactor")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        delay = self.interval_s
        while True:
            await asyncio.sleep(delay)
            delay = self.interval_s
            try:
                report = await self.run_once(scan_orphans=True)
            except (S3StreamError, OSError) as exc:
                log_event(log, logging.WARNING, "compaction.run_failed", node=self.node_id, error=exc, action="retry next interval")  # fmt: skip
                continue
            except Exception as exc:  # the task boundary: a bug stops compaction, loudly
                self.error = exc
                log.exception("compactor stopped")
                raise
            if report.more_pending:
                delay = RETRY_SOON_S

    async def run_once(
        self, *, stream_objects: bool | None = None, scan_orphans: bool = False
    ) -> CompactionReport:
        """One run now. ``stream_objects``: None = when its interval has passed."""
        async with self._lock:
            try:
                report = await self._stream_set_pass()
            except BaseException:
                self._meter_run("stream_set", None)
                raise
            self._meter_run(
                "stream_set",
                (
                    report.bytes_read,
                    report.bytes_written,
                    report.stream_set_objects_compacted,
                    report.stream_set_objects_written + report.stream_objects_written,
                ),
            )
            now_ms = self.clock_ms()
            if stream_objects or (
                stream_objects is None
                and now_ms - self._last_stream_object_run_ms >= self.stream_object_interval_ms
            ):
                self._last_stream_object_run_ms = now_ms
                t0 = time.perf_counter()
                try:
                    outcome = await self._stream_object_pass()
                except BaseException:
                    self._meter_run("stream_object", None)
                    raise
                self._meter_run(
                    "stream_object",
                    (
                        outcome.bytes_rewritten + outcome.bytes_copied,
                        outcome.bytes_written + outcome.bytes_copied,
                        outcome.merged_source_count + outcome.expired_count,
                        outcome.written_count,
                    ),
                )
                report = dataclasses.replace(
                    report,
                    stream_objects_written=report.stream_objects_written + outcome.written_count,
                    stream_objects_merged=outcome.merged_source_count,
                    stream_objects_expired=outcome.expired_count,
                    bytes_read=report.bytes_read + outcome.bytes_rewritten,
                    bytes_written=report.bytes_written + outcome.bytes_written,
                    bytes_copied=outcome.bytes_copied,
                    stream_object_duration_ms=(time.perf_counter() - t0) * 1000,
                )
            t0 = time.perf_counter()
            gc = await self.gc.collect(scan_orphans=scan_orphans)
            report = dataclasses.replace(report, gc=gc, gc_duration_ms=(time.perf_counter() - t0) * 1000)
        self.last_report = report
        log_event(log, logging.INFO, "compaction.run", node=self.node_id, **report.log_fields())
        return report

    def _meter_run(self, kind: str, moved: tuple[int, int, int, int] | None) -> None:
        meter = self.meter
        if meter is not None:
            meter(kind, moved)

    async def _stream_set_pass(self) -> CompactionReport:
        if not self.cluster_wide:
            return await self._node_stream_set_pass(self.node_id, self.stream_set)
        report = CompactionReport()
        for node in await self.metadata.list_nodes():
            if node.node_id == self.node_id:
                executor = self.stream_set
            else:
                target = dataclasses.replace(self.target, node_id=node.node_id, node_epoch=node.node_epoch)
                executor = StreamSetCompactionExecutor(
                    target, writer_buffer_max_bytes=self.limits.writer_buffer_max_bytes
                )
            one = await self._node_stream_set_pass(node.node_id, executor)
            report = _add_stream_set_reports(report, one)
        return report

    async def _node_stream_set_pass(
        self, node_id: NodeId, executor: StreamSetCompactionExecutor
    ) -> CompactionReport:
        """StreamSet compaction of one node's objects (their order ids are that node's upload order)."""
        t0 = time.perf_counter()
        ssos = await self.metadata.get_stream_set_objects(node_id)
        sources: dict[ObjectId, SourceObject] = {}
        problems: list[str] = []
        for sso in ssos:
            key = object_key(sso.object_id, self.config.namespace)
            try:
                reader = await open_reader(self.storage, key, sso.size_bytes)
            except S3StreamError as exc:  # AutoMQ: an unreadable object is skipped
                problems.append(f"object {sso.object_id} skipped: {exc}")
                continue
            sources[sso.object_id] = SourceObject(
                sso.object_id, sso.order_id, sso.data_time_ms, sso.size_bytes, reader.index, reader.block_crcs
            )
        start_offsets: dict[int, int] = {
            s.stream_id: s.start_offset for s in await self.metadata.list_streams()
        }
        plan = plan_stream_set_compaction(
            list(sources.values()), start_offsets, self.limits, now_ms=self.clock_ms()
        )
        if plan.problem:
            problems.append(plan.problem)
        counts = dict(compacted=0, sso=0, so=0, commits=0, read=0, written=0)
        commit_plans = [*plan.force_splits, *([plan.compaction] if plan.compaction else [])]
        for commit_plan in commit_plans:
            try:
                outcome = await executor.execute(commit_plan, sources, start_offsets)
            except S3StreamError as exc:  # AutoMQ: logged; the next run plans again from scratch
                problems.append(
                    f"{commit_plan.kind.value} of {list(commit_plan.compacted_object_ids)} failed: {exc}"
                )
                continue
            counts["read"] += outcome.bytes_read
            if not outcome.committed:
                problems.append(outcome.problem)
                continue
            counts["compacted"] += len(outcome.compacted_object_ids)
            counts["sso"] += outcome.stream_set_object_id >= 0
            counts["so"] += len(outcome.stream_object_ids)
            counts["commits"] += 1
            counts["written"] += outcome.bytes_written
        return CompactionReport(
            stream_set_objects_compacted=counts["compacted"],
            stream_set_objects_written=counts["sso"],
            stream_objects_written=counts["so"],
            force_split_count=len(plan.force_splits),
            commit_count=counts["commits"],
            skipped_object_count=len(plan.skipped_object_ids),
            bytes_read=counts["read"],
            bytes_written=counts["written"],
            stream_set_duration_ms=(time.perf_counter() - t0) * 1000,
            problems=tuple(problems),
            more_pending=plan.more_pending,
        )

    async def _stream_object_pass(self) -> StreamObjectOutcome:
        total = StreamObjectOutcome()
        for stream in await self.metadata.list_streams():
            if not self.cluster_wide and stream.ranges and stream.ranges[-1].node_id != self.node_id:
                continue  # another node owns it: its compactor does this
            objects = await self.metadata.get_stream_objects(
                stream_id=StreamId(stream.stream_id),
                start_offset=0,
                end_offset=-1,
                limit=STREAM_OBJECTS_PER_QUERY_MAX,
            )
            if not objects:
                continue
            plan = plan_stream_object_compaction(
                objects,
                stream_id=stream.stream_id,
                start_offset=stream.start_offset,
                max_size_bytes=self.config.stream_object_compaction_max_size_bytes,
            )
            if plan.expired_object_ids or plan.groups:
                try:
                    total += await self.stream_objects.execute(plan)
                except S3StreamError as exc:  # AutoMQ: logged, the stream is skipped this run
                    log_event(log, logging.WARNING, "compaction.stream_objects_failed", stream=stream.stream_id, error=exc)  # fmt: skip
        return total


def _add_stream_set_reports(a: CompactionReport, b: CompactionReport) -> CompactionReport:
    """The StreamSet pass reports of two nodes as one."""
    return dataclasses.replace(
        a,
        stream_set_objects_compacted=a.stream_set_objects_compacted + b.stream_set_objects_compacted,
        stream_set_objects_written=a.stream_set_objects_written + b.stream_set_objects_written,
        stream_objects_written=a.stream_objects_written + b.stream_objects_written,
        force_split_count=a.force_split_count + b.force_split_count,
        commit_count=a.commit_count + b.commit_count,
        skipped_object_count=a.skipped_object_count + b.skipped_object_count,
        bytes_read=a.bytes_read + b.bytes_read,
        bytes_written=a.bytes_written + b.bytes_written,
        stream_set_duration_ms=a.stream_set_duration_ms + b.stream_set_duration_ms,
        problems=a.problems + b.problems,
        more_pending=a.more_pending or b.more_pending,
    )
