"""Stream object compaction: drop wholly trimmed stream objects, merge small adjacent ones.

``docs/automq-model.md`` section 10. :func:`plan_stream_object_compaction` is pure: a stream's objects
and start offset in, a plan out (expired objects; groups of at least two contiguous objects up to
the size limit). :class:`StreamObjectCompactor` carries a plan out: expired objects are committed
away (``object_id -1``, at most 1000 sources per request); each group becomes one new object whose
data region is the sources' surviving blocks (leading blocks wholly below the start offset are
dropped) copied in order, server-side (``Upload.copy``, UploadPartCopy) for regions of at least
5 MiB and read, verified and rewritten below that; then the rebuilt index (positions re-based),
checksum section (the sources' block CRCs) and footer. Bytes are never decoded on the copy path.

Memory, with budget ``B`` (``memory_budget_bytes``): a rewritten region is below
``copy_size_min_bytes`` and is held twice (the GET buffer and the joined region) until the upload has
copied it; the new object's upload is given ``buffer_max_bytes = B - 2 * copy_size_min_bytes`` (its
staged copies are read only at ``complete``, within that bound). Objects without a checksum section
are read region by region whatever the region's size (they are never copied server-side).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from crc32c import crc32c

from compaction.blockio import crcs_by_position, read_verified_blocks
from compaction.target import TargetedExecutor, WriteTarget
from s3stream.errors import CorruptionError, InvalidArgumentError
from s3stream.ids import NOOP_OBJECT_ID, ObjectId, StreamId
from s3stream.metadata.base import CommitStreamObjectRequest, StreamObject
from s3stream.objectformat import IndexEntry, ObjectReader, encode_tail, object_key
from s3stream.storage.base import MAX_DELETE_BATCH, MIN_PART_SIZE_BYTES

log = logging.getLogger(__name__)

GROUP_OBJECTS_MAX = 5000
"""Objects merged into one (AutoMQ's limit per group)."""
COPY_SIZE_MIN_BYTES = MIN_PART_SIZE_BYTES
"""Regions at least this large are copied server-side; smaller ones are read and rewritten."""


@dataclass(frozen=True, slots=True)
class StreamObjectCompactionPlan:
    stream_id: StreamId
    expired_object_ids: tuple[ObjectId, ...]
    """Objects wholly below the start offset: destroyed without a replacement."""
    groups: tuple[tuple[StreamObject, ...], ...]
    """Each group: two or more contiguous objects in offset order, merged into one."""


def plan_stream_object_compaction(
    objects: Sequence[StreamObject],
    *,
    stream_id: StreamId,
    start_offset: int,
    max_size_bytes: int,
    group_objects_max: int = GROUP_OBJECTS_MAX,
) -> StreamObjectCompactionPlan:
    """Group a stream's living objects: a new group starts at an offset gap, when the next object
    would take the group past ``max_size_bytes``, or at ``group_objects_max`` objects."""
    if max_size_bytes < 1 or group_objects_max < 2:
        raise InvalidArgumentError("max_size_bytes must be positive and group_objects_max at least 2")
    ordered = sorted({o.object_id: o for o in objects}.values(), key=lambda o: (o.start_offset, o.end_offset))
    if any(o.stream_id != stream_id for o in ordered):
        raise InvalidArgumentError(f"stream objects of another stream than {stream_id}")
    expired = tuple(o.object_id for o in ordered if o.end_offset <= start_offset)
    groups: list[list[StreamObject]] = []
    size = 0
    for o in ordered:
        if o.end_offset <= start_offset:
            continue
        g = groups[-1] if groups else None
        if (
            g is not None
            and g[-1].end_offset == o.start_offset
            and size + o.size_bytes <= max_size_bytes
            and len(g) < group_objects_max
        ):
            g.append(o)
            size += o.size_bytes
        else:
            groups.append([o])
            size = o.size_bytes
    return StreamObjectCompactionPlan(stream_id, expired, tuple(tuple(g) for g in groups if len(g) > 1))


@dataclass(frozen=True, slots=True)
class StreamObjectOutcome:
    expired_count: int = 0
    merged_source_count: int = 0
    written_count: int = 0
    bytes_copied: int = 0
    """Server-side copied bytes (UploadPartCopy)."""
    bytes_rewritten: int = 0
    """Bytes read and written again (regions below the copy threshold)."""
    bytes_written: int = 0

    def __add__(self, other: StreamObjectOutcome) -> StreamObjectOutcome:
        return StreamObjectOutcome(
            *(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self))
        )


class StreamObjectCompactor(TargetedExecutor):
    """Executes :class:`StreamObjectCompactionPlan` s."""

    def __init__(
        self,
        target: WriteTarget,
        *,
        copy_size_min_bytes: int = COPY_SIZE_MIN_BYTES,
        memory_budget_bytes: int | None = None,
    ) -> None:
        """``memory_budget_bytes``: bounds the new object's upload (module docstring); None: unbounded."""
        super().__init__(target)
        self.copy_size_min_bytes = copy_size_min_bytes
        self.memory_budget_bytes = memory_budget_bytes

    @property
    def upload_buffer_max_bytes(self) -> int | None:
        """The new object's ``buffer_max_bytes``: the budget less two rewritten regions (module docstring)."""
        if self.memory_budget_bytes is None:
            return None
        return max(1, self.memory_budget_bytes - 2 * self.copy_size_min_bytes)

    async def execute(self, plan: StreamObjectCompactionPlan) -> StreamObjectOutcome:
        outcome = StreamObjectOutcome()
        expired = plan.expired_object_ids
        for i in range(0, len(expired), MAX_DELETE_BATCH):
            await self.metadata.commit_stream_object(
                self._request(plan.stream_id, NOOP_OBJECT_ID, 0, 0, 0, expired[i : i + MAX_DELETE_BATCH])
            )
        outcome += StreamObjectOutcome(expired_count=len(expired))
        for group in plan.groups:
            outcome += await self._merge(plan.stream_id, group)
        return outcome

    def _request(
        self,
        stream_id: StreamId,
        object_id: ObjectId,
        size: int,
        start: int,
        end: int,
        sources: Sequence[ObjectId],
    ) -> CommitStreamObjectRequest:
        return CommitStreamObjectRequest(
            object_id=object_id,
            object_size_bytes=size,
            stream_id=stream_id,
            stream_epoch=-1,
            start_offset=start,
            end_offset=end,
            source_object_ids=tuple(sources),
            node_id=self.node_id,
            node_epoch=self.node_epoch,
        )

    async def _merge(self, stream_id: StreamId, group: tuple[StreamObject, ...]) -> StreamObjectOutcome:
        # the start offset may have moved since planning: read it again, drop blocks below it
        start_offset = (await self.metadata.describe_stream(stream_id)).start_offset
        readers = [
            await ObjectReader.open(self.storage, object_key(o.object_id, self.namespace), o.size_bytes)
            for o in group
        ]
        object_id = await self.metadata.prepare_objects(count=1, ttl_ms=self.prepared_ttl_ms)
        upload = self.storage.upload(
            object_key(object_id, self.namespace), buffer_max_bytes=self.upload_buffer_max_bytes
        )
        entries: list[IndexEntry] = []
        crcs: list[int] = []
        copied = rewritten = 0
        position = 0
        try:
            for reader in readers:
                index = reader.index
                if any(e.stream_id != stream_id for e in index):
                    raise CorruptionError(
                        f"stream object holds blocks of another stream than {stream_id}", source=reader.key
                    )
                first = next((i for i, e in enumerate(index) if e.end_offset > start_offset), len(index))
                live = index[first:]  # only leading blocks lie wholly below the start offset
                if not live:
                    continue
                region_start, region_end = live[0].start_position, live[-1].end_position
                source_crcs = crcs_by_position(reader.index, reader.block_crcs)
                if source_crcs is not None and region_end - region_start >= self.copy_size_min_bytes:
                    await upload.copy(reader.key, region_start, region_end)
                    copied += region_end - region_start
                    crcs.extend(source_crcs[e.start_position] for e in live)
                else:
                    blocks = await read_verified_blocks(self.storage, {reader.key: (live, source_crcs)})
                    region = bytearray()
                    for e in live:
                        block = blocks[(reader.key, e.start_position)]
                        if e.start_position - region_start != len(region):
                            region += bytes(e.start_position - region_start - len(region))
                        region += block
                        crcs.append(source_crcs[e.start_position] if source_crcs else crc32c(block))
                    await upload.write(region)
                    rewritten += len(region)
                for e in live:
                    entries.append(
                        dataclasses.replace(e, start_position=position + e.start_position - region_start)
                    )
                position += region_end - region_start
            if not entries:  # everything was trimmed meanwhile: destroy the sources, write nothing
                await upload.abort()
                await self.metadata.commit_stream_object(
                    self._request(stream_id, NOOP_OBJECT_ID, 0, 0, 0, [o.object_id for o in group])
                )
                return StreamObjectOutcome(expired_count=len(group))
            tail = encode_tail(entries, crcs, index_position=position)
            await upload.write(tail)
            size = await upload.complete()
            if size != position + len(tail):
                raise CorruptionError(
                    f"storage reports {size} bytes for an object of {position + len(tail)} bytes",
                    source=upload.key,
                )
        except BaseException:
            await upload.abort()
            raise
        await self.observer.before_commit()
        await self.metadata.commit_stream_object(
            self._request(
                stream_id,
                object_id,
                size,
                entries[0].start_offset,
                entries[-1].end_offset,
                [o.object_id for o in group],
            )
        )
        await self.observer.after_commit()
        log.debug(
            "stream %s: merged %d stream objects into %d (%d bytes)", stream_id, len(group), object_id, size
        )
        return StreamObjectOutcome(
            merged_source_count=len(group),
            written_count=1,
            bytes_copied=copied,
            bytes_rewritten=rewritten,
            bytes_written=size,
        )
