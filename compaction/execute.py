"""The StreamSet compaction executor: carries out a :class:`~compaction.plan.CommitPlan`.

Per plan: one output StreamSet object (prepared once, when the plan has StreamSet blocks), written
across all steps; per step: read and verify the step's blocks (position-contiguous blocks of a
source share one GET of at most 16 MiB), write its stream objects (ids prepared per step, written
concurrently), append its StreamSet blocks, then drop the step's buffers. Then the sanity check
(every live block of a compacted object is covered by a new range) and one atomic
``commit_stream_set_object`` naming the compacted objects (order id -1: the metadata store keeps the
smallest order id of the compacted objects). Blocks are copied verbatim (``BlockCopyWriter``: each
verified block goes straight to the upload, no second buffer); each new object gets a rebuilt index
and checksum section. A failure aborts the uploads in progress; objects
already written stay PREPARED until their TTL and are then deleted by the garbage collector.

Memory, with budget ``B``, reserve ``R`` (:class:`~compaction.plan.CompactionLimits`) and step
``S = (B - R) / 2``: a step's GET buffers hold at most ``S``; its stream-object uploads hold copies
of at most ``S`` (an upload holds only what was written to it and they complete within the step, so
they get no ``buffer_max_bytes``: a limit would only turn their single PUTs into multipart uploads);
the StreamSet object's upload, carried across steps, is given ``buffer_max_bytes=R``, so its staged
body, parts in flight and part being filled stay under ``R``. Total ``2 S + R <= B``, plus the
storage client's transient request buffers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from compaction.blockio import crcs_by_position, read_verified_blocks
from compaction.blockwriter import BlockCopyWriter
from compaction.plan import BlockRef, CommitPlan, SourceObject, StreamObjectPlan, uncovered_blocks
from compaction.target import TargetedExecutor, WriteTarget
from s3stream.errors import CorruptionError
from s3stream.ids import NOOP_OBJECT_ID, ObjectId, StreamId
from s3stream.logfmt import log_event
from s3stream.metadata.base import CommitStreamSetObjectRequest, NewStreamObject
from s3stream.objectformat import IndexEntry, WrittenObject, object_key

log = logging.getLogger(__name__)

WRITE_CONCURRENCY_MAX = 8
"""Stream objects of one step written at once (AutoMQ's upload pool of 8)."""


@dataclass(frozen=True, slots=True)
class CommitOutcome:
    """What one executed plan did."""

    committed: bool
    compacted_object_ids: tuple[ObjectId, ...]
    stream_set_object_id: ObjectId
    stream_object_ids: tuple[ObjectId, ...]
    bytes_read: int
    bytes_written: int
    problem: str = ""


class StreamSetCompactionExecutor(TargetedExecutor):
    """Writes and commits planned StreamSet compactions and force splits."""

    def __init__(self, target: WriteTarget, *, writer_buffer_max_bytes: int | None = None) -> None:
        """``writer_buffer_max_bytes``: the ``buffer_max_bytes`` of the StreamSet object's upload (see
        the module docstring)."""
        super().__init__(target)
        self.writer_buffer_max_bytes = writer_buffer_max_bytes

    def _writer(self, object_id: ObjectId, buffer_max_bytes: int | None) -> BlockCopyWriter:
        key = object_key(object_id, self.namespace)
        return BlockCopyWriter(self.storage.upload(key, buffer_max_bytes=buffer_max_bytes))

    async def execute(
        self, plan: CommitPlan, sources: Mapping[ObjectId, SourceObject], start_offsets: Mapping[int, int]
    ) -> CommitOutcome:
        keys = {oid: object_key(oid, self.namespace) for oid in plan.compacted_object_ids}
        crcs = {oid: crcs_by_position(sources[oid].index, sources[oid].block_crcs) for oid in keys}
        sso_id = NOOP_OBJECT_ID
        sso_writer: BlockCopyWriter | None = None
        if plan.has_stream_set_object:
            sso_id = await self.metadata.prepare_objects(count=1, ttl_ms=self.prepared_ttl_ms)
            sso_writer = self._writer(sso_id, self.writer_buffer_max_bytes)  # written across steps
        new_objects: list[NewStreamObject] = []
        bytes_read = bytes_written = 0
        try:
            for step in plan.steps:
                wanted: dict[ObjectId, list[IndexEntry]] = {}
                for b in step.blocks():
                    wanted.setdefault(b.object_id, []).append(b.entry)
                data = await read_verified_blocks(
                    self.storage, {keys[oid]: (entries, crcs[oid]) for oid, entries in wanted.items()}
                )

                def take(
                    b: BlockRef, data: dict[tuple[str, int], memoryview] = data
                ) -> tuple[memoryview, int | None]:
                    """The block's bytes (dropped from the step's map: written once) and its CRC if known."""
                    by_position = crcs[b.object_id]
                    view = data.pop((keys[b.object_id], b.entry.start_position))
                    return view, by_position[b.entry.start_position] if by_position is not None else None

                bytes_read += step.read_bytes
                new_objects += await self._write_stream_objects(step.stream_objects, take)
                if sso_writer is not None:
                    for b in step.stream_set_blocks:
                        await sso_writer.write_block(b.entry, *take(b))
                del data, take
            sso: WrittenObject | None = await sso_writer.close() if sso_writer is not None else None
        except BaseException:
            if sso_writer is not None:
                await sso_writer.abort()
            raise
        bytes_written = sum(so.size_bytes for so in new_objects) + (sso.size_bytes if sso else 0)
        request = CommitStreamSetObjectRequest(
            node_id=self.node_id,
            node_epoch=self.node_epoch,
            object_id=sso_id,
            order_id=-1,
            object_size_bytes=sso.size_bytes if sso else 0,
            stream_ranges=sso.stream_ranges if sso else (),
            stream_objects=tuple(sorted(new_objects, key=lambda so: (so.stream_id, so.start_offset))),
            compacted_object_ids=plan.compacted_object_ids,
        )
        outcome = CommitOutcome(
            False,
            plan.compacted_object_ids,
            sso_id,
            tuple(so.object_id for so in request.stream_objects),
            bytes_read,
            bytes_written,
        )
        new_ranges = [(r.stream_id, r.start_offset, r.end_offset) for r in request.stream_ranges]
        new_ranges += [(so.stream_id, so.start_offset, so.end_offset) for so in request.stream_objects]
        missing = uncovered_blocks((sources[oid] for oid in keys), start_offsets, new_ranges)
        if missing:
            problem = f"sanity check failed: {len(missing)} live blocks not covered, first {missing[0]}"
            log_event(log, logging.ERROR, "compaction.not_committed", objects=plan.compacted_object_ids, problem=problem)  # fmt: skip
            return dataclasses.replace(outcome, problem=problem)
        await self.observer.before_commit()
        await self.metadata.commit_stream_set_object(request)
        log_event(log, logging.DEBUG, "compaction.committed", object=sso_id, compacted=plan.compacted_object_ids, stream_objects=len(request.stream_objects), bytes_in=bytes_read, bytes_out=bytes_written)  # fmt: skip
        await self.observer.after_commit()
        return dataclasses.replace(outcome, committed=True)

    async def _write_stream_objects(
        self,
        plans: tuple[StreamObjectPlan, ...],
        take: Callable[[BlockRef], tuple[memoryview, int | None]],
    ) -> list[NewStreamObject]:
        if not plans:
            return []
        first = await self.metadata.prepare_objects(count=len(plans), ttl_ms=self.prepared_ttl_ms)
        slots = asyncio.Semaphore(WRITE_CONCURRENCY_MAX)

        async def one(i: int, so: StreamObjectPlan) -> NewStreamObject:
            object_id = ObjectId(first + i)
            async with slots:
                writer = self._writer(object_id, None)  # holds only step bytes: no limit needed
                try:
                    for b in so.blocks:
                        await writer.write_block(b.entry, *take(b))
                    written = await writer.close()
                except BaseException:
                    await writer.abort()
                    raise
            if (written.stream_ranges[0].start_offset, written.stream_ranges[-1].end_offset) != (
                so.start_offset,
                so.end_offset,
            ):
                raise CorruptionError(
                    f"stream object {object_id} does not hold its planned range", source=writer.key
                )
            return NewStreamObject(
                object_id, StreamId(so.stream_id), so.start_offset, so.end_offset, written.size_bytes
            )

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(i, so)) for i, so in enumerate(plans)]
        return [t.result() for t in tasks]
