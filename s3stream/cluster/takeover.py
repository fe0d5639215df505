"""The taker's side of a failover: replay a dead node's WAL and commit its records as this node's.

The controller (:mod:`s3stream.cluster.controller`) fenced the dead node and assigned its takeover to
this node (``MetadataStore.start_takeover`` / ``reassign_takeover``); :func:`run_takeover` does the
work, in this order:

1. **Attach** (:func:`~s3stream.cluster.attach.attach_wal`): the operator's command makes the dead
   node's WAL reachable and may name the path to open instead of the recorded one.
2. **Read** the WAL read-only (:func:`~s3stream.cluster.walread.read_dead_wal`): never written, so
   a dead node that comes back finds it intact.
3. **Take the streams over** (``takeover_streams``): each snapshot stream still open is opened by
   this node at its stored epoch + 1 with a new range at its end offset, even though the dead node
   (or an earlier taker of this same takeover) holds it; from now on only this node can commit to it.
4. **Plan** with the engine's restart rule (:func:`~s3stream.engine.recovery.plan_replay`), the
   streams given with the DEAD node's stream epoch (the epoch its batches carry) and their current
   end offset (what is committed is skipped: the records an earlier taker committed, or the dead
   node's last upload).
5. **KV**: each record's KV changes above the dead node's applied offset are applied for the dead
   node (``kv_apply(node_id=<dead>)``), one transaction per record, as its own restart would.
6. **Upload** the kept batches in order as objects of this node (:class:`~s3stream.engine.upload.
   ObjectUploader`: the engine's split rule and object writer), cut into groups of at most
   ``s3.wal.upload.threshold`` bytes (the size of the owner's own uploads), each prepared, written and
   committed before the next: every commit continues each stream's end offset.
7. **Finish** (``finish_takeover``): the takeover is DONE and the taken streams are CLOSED, so any
   node may open them (the caller, the node's cluster watcher, opens them next on its engine); the
   dead node's applied KV offset covers the WAL the taker read.

Steps 3, 5 and 6 report progress (``report_takeover_progress``): an attempt that reports none for
``s3.wal.failover.progress.leases`` leases is given to another node by the controller.

Idempotent: a taker that dies anywhere leaves a state the next taker finishes. Step 3 re-opens the
streams for the new taker (fencing the old one's later commits), step 4 skips what was committed,
step 5 skips what was applied, and nothing is written to the WAL. A taker fenced mid-way (its session
lapsed: the controller re-assigns the takeover) gets FencedError from the store on its next write.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from s3stream.cluster.attach import ATTACH_TIMEOUT_S, attach_wal
from s3stream.cluster.walread import DeadWal, read_dead_wal
from s3stream.config import Config
from s3stream.engine.kvlog import apply_record
from s3stream.engine.recovery import ReplayPlan, plan_replay
from s3stream.engine.upload import ObjectUploader, StreamRecords, plan_upload
from s3stream.errors import ErrorCode, NotFoundError, UnavailableError
from s3stream.ids import NodeId, StreamId
from s3stream.logfmt import log_event
from s3stream.metadata.base import MetadataStore, TakeoverInfo
from s3stream.objectformat.writer import RecordFields
from s3stream.record import RECORD_HEADER_SIZE, StreamRecordBatch
from s3stream.storage.base import ObjectStorage

log = logging.getLogger(__name__)
T = TypeVar("T")

STEP_ATTEMPTS_MAX = 8
"""Attempts of one prepare, object write or commit on transient errors before the takeover attempt
fails (the watcher then runs it again from the start)."""


class TakeoverObserver:
    """Called at the points of a takeover, in order; a no-op here. Each call is awaited, so an
    observer may hold the takeover there (tests kill the taker at a chosen point)."""

    async def after_streams_taken(self, takeover: TakeoverInfo) -> None:
        """After ``takeover_streams``, before the KV changes and the uploads."""

    async def after_commit(self, takeover: TakeoverInfo, commit_count: int) -> None:
        """After each group's commit (``commit_count`` committed so far in this attempt)."""

    async def before_finish(self, takeover: TakeoverInfo) -> None:
        """After every upload, before ``finish_takeover``."""


@dataclass(frozen=True, slots=True)
class TakeoverResult:
    """What one successful takeover attempt did."""

    node_id: NodeId
    """The dead node."""
    stream_ids: tuple[StreamId, ...]
    """The streams this attempt took over (closed by ``finish_takeover``)."""
    wal_path: str
    batch_count: int
    """Record batches replayed and committed by this attempt."""
    kv_record_count: int
    commit_count: int
    uploaded_bytes: int
    wal_end_offset: int
    dropped_batch_count: int
    gap_count: int
    duration_s: float


async def run_takeover(
    takeover: TakeoverInfo,
    *,
    metadata: MetadataStore,
    storage: ObjectStorage,
    config: Config,
    node_id: NodeId,
    node_epoch: int,
    attach_cmd: str = "",
    attach_timeout_s: float = ATTACH_TIMEOUT_S,
    observer: TakeoverObserver | None = None,
) -> TakeoverResult:
    """Take over the dead node of ``takeover`` as the session ``(node_id, node_epoch)`` (which the
    takeover must name as its RUNNING taker; ``metadata`` is this node's bound store). Returns once
    the takeover is DONE; raises what failed (the takeover stays RUNNING for a retry)."""
    observer = observer or TakeoverObserver()
    started_s = time.monotonic()
    dead = takeover.node_id

    async def progress() -> None:
        """Tell the controller this attempt moves (its no-progress deadline starts again)."""
        await metadata.report_takeover_progress(
            node_id=dead, taker_node_id=node_id, taker_node_epoch=node_epoch
        )

    path = await attach_wal(attach_cmd, node_id=dead, wal_path=takeover.wal_path, timeout_s=attach_timeout_s)
    wal: DeadWal = await asyncio.to_thread(read_dead_wal, path, node_id=dead)
    taken = await metadata.takeover_streams(node_id=dead, taker_node_id=node_id, taker_node_epoch=node_epoch)
    log_event(log, logging.INFO, "takeover.started", node=dead, taker=node_id, taker_epoch=node_epoch, attempt=takeover.attempt, wal=path, wal_records=len(wal.records), streams=[meta.stream_id for meta, _ in taken])  # fmt: skip
    await observer.after_streams_taken(takeover)
    opening = [dataclasses.replace(meta, epoch=dead_epoch) for meta, dead_epoch in taken]
    applied_offset = await metadata.kv_applied_offset(dead)
    plan = plan_replay(wal.records, opening, kv_applied_offset=applied_offset)
    for gap in plan.gaps:
        log_event(log, logging.ERROR, "takeover.wal_gap", node=dead, stream=gap.stream_id, expected=gap.expected_offset, found=gap.found_offset, action="later batches dropped")  # fmt: skip
    for wal_offset, mutations in plan.kv_records:
        await apply_record(metadata, mutations, node_id=dead, wal_offset=wal_offset)
    if plan.kv_records:
        await progress()
    uploader = ObjectUploader(
        storage=storage,
        metadata=metadata,
        namespace=config.namespace,
        node_id=node_id,
        node_epoch=node_epoch,
        block_size_bytes=config.object_block_size_bytes,
        part_size_bytes=config.object_part_size_bytes,
        prepared_ttl_ms=config.object_prepared_ttl_ms,
    )
    commit_count, uploaded_bytes = 0, 0
    for group in upload_groups(
        plan,
        group_bytes_max=config.wal_upload_threshold_bytes,
        group_streams_max=config.max_stream_num_per_stream_set_object,
    ):
        await _upload_group(uploader, metadata, group, config)
        commit_count += 1
        uploaded_bytes += sum(s.payload_bytes for s in group)
        await progress()
        await observer.after_commit(takeover, commit_count)
    await observer.before_finish(takeover)
    await metadata.finish_takeover(
        node_id=dead, taker_node_id=node_id, taker_node_epoch=node_epoch, wal_end_offset=plan.wal_end_offset
    )
    result = TakeoverResult(
        node_id=dead,
        stream_ids=tuple(StreamId(meta.stream_id) for meta, _ in taken),
        wal_path=path,
        batch_count=len(plan.release),
        kv_record_count=len(plan.kv_records),
        commit_count=commit_count,
        uploaded_bytes=uploaded_bytes,
        wal_end_offset=plan.wal_end_offset,
        dropped_batch_count=plan.dropped_batch_count,
        gap_count=len(plan.gaps),
        duration_s=time.monotonic() - started_s,
    )
    log_event(log, logging.INFO, "takeover.done", node=dead, taker=node_id, batches=result.batch_count, kv_records=result.kv_record_count, commits=commit_count, bytes=uploaded_bytes, wal_end=plan.wal_end_offset, dropped=plan.dropped_batch_count, gaps=len(plan.gaps), duration_ms=int(result.duration_s * 1000))  # fmt: skip
    return result


class Taker:
    """The cluster watcher's takeover callback: :func:`run_takeover` as this node's session (the watcher
    calls it for a takeover the store assigned to this node, and again after a failed attempt)."""

    def __init__(
        self,
        *,
        metadata: MetadataStore,
        storage: ObjectStorage,
        config: Config,
        node_id: NodeId,
        node_epoch: int,
        attach_cmd: str = "",
        observer: TakeoverObserver | None = None,
    ) -> None:
        self.metadata = metadata
        self.storage = storage
        self.config = config
        self.node_id = node_id
        self.node_epoch = node_epoch
        self.attach_cmd = attach_cmd
        self.observer = observer or TakeoverObserver()
        self.results: list[TakeoverResult] = []
        """Every takeover this node finished, oldest first."""

    async def __call__(self, takeover: TakeoverInfo) -> Sequence[StreamId]:
        """Run the takeover; returns the streams it took over and closed (the watcher opens them)."""
        result = await run_takeover(
            takeover,
            metadata=self.metadata,
            storage=self.storage,
            config=self.config,
            node_id=self.node_id,
            node_epoch=self.node_epoch,
            attach_cmd=self.attach_cmd,
            observer=self.observer,
        )
        self.results.append(result)
        return result.stream_ids


def upload_groups(
    plan: ReplayPlan, *, group_bytes_max: int, group_streams_max: int
) -> list[list[StreamRecords]]:
    """The plan's kept batches cut into upload groups, in release order (each stream's batches in
    offset order): a group ends once it holds ``group_bytes_max`` bytes, or before it would hold more
    than ``group_streams_max`` streams. Each group's streams are in ascending id (what
    :func:`~s3stream.engine.upload.plan_upload` takes); a stream's batches in a later group continue
    where its batches of the earlier one end."""
    assert group_bytes_max > 0, group_bytes_max
    assert group_streams_max > 0, group_streams_max
    groups: list[list[StreamRecords]] = []
    current: dict[int, list[RecordFields]] = {}
    size_bytes = 0

    def close_group() -> None:
        nonlocal current, size_bytes
        if current:
            groups.append([StreamRecords.of(sid, current[sid]) for sid in sorted(current)])
        current, size_bytes = {}, 0

    for _, batch in plan.release:
        if batch.stream_id not in current and len(current) >= group_streams_max:
            close_group()
        current.setdefault(batch.stream_id, []).append(_fields(batch))
        size_bytes += RECORD_HEADER_SIZE + len(batch.payload)
        if size_bytes >= group_bytes_max:
            close_group()
    close_group()
    return groups


def _fields(batch: StreamRecordBatch) -> RecordFields:
    return (batch.stream_id, batch.epoch, batch.base_offset, batch.count, batch.payload)


async def _upload_group(
    uploader: ObjectUploader, metadata: MetadataStore, group: Sequence[StreamRecords], config: Config
) -> None:
    """Prepare, write and commit one group's objects (the engine's split rule)."""
    plan = plan_upload(group, split_size_bytes=config.stream_object_split_size_bytes)
    while True:
        first_id = await _retry("prepare", lambda: uploader.prepare(plan), config)
        request = await _retry("upload", functools.partial(uploader.write, plan, first_id), config)
        try:
            await _retry("commit", functools.partial(metadata.commit_stream_set_object, request), config)
            return
        except NotFoundError as exc:
            if exc.code != ErrorCode.OBJECT_NOT_EXIST:
                raise
            # The prepared ids expired before the commit (storage was down that long): again.
            log_event(
                log, logging.WARNING, "takeover.prepare_expired", object=first_id, action="upload again"
            )


async def _retry(what: str, op: Callable[[], Awaitable[T]], config: Config) -> T:
    """``op`` again after transient failures (UnavailableError, OSError, timeouts), at most
    :data:`STEP_ATTEMPTS_MAX` times with doubling backoff; other errors at once."""
    delay_s = config.upload_retry_backoff_ms / 1000
    for attempt in range(1, STEP_ATTEMPTS_MAX + 1):
        try:
            return await op()
        except (UnavailableError, OSError, TimeoutError) as exc:
            if attempt == STEP_ATTEMPTS_MAX:
                raise
            log_event(log, logging.WARNING, "takeover.step_failed", step=what, attempt=attempt, retry_in_s=delay_s, error=repr(exc))  # fmt: skip
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, config.upload_retry_backoff_max_ms / 1000)
    raise AssertionError("unreachable")
