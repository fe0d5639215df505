"""Turning one archived LogCache block into objects: plan (pure), write, commit (docs/automq-model.md 5-6).

:func:`plan_upload` decides which streams go into the block's single StreamSet object and which
become separate stream objects (AutoMQ's split rule, ``docs/automq-model.md`` section 5): a stream with at
least ``split_size_bytes`` of payload gets its own stream object; when the block holds exactly one stream, or
every stream is that large, there is no StreamSet object at all. :class:`ObjectUploader` carries a plan out:
one ``prepare_objects`` call for all ids (StreamSet object first, then stream objects in ascending stream id),
the object writes (at most ``OBJECT_WRITES_INFLIGHT_MAX`` at once), and the commit request.

Memory: the block's records stay in the LogCache until the commit; each object writer encodes
(copies) its records into data blocks and holds up to ``WRITER_HANDOVER_BYTES`` plus one data block
before handing them to the upload, which holds up to its part size (plus the parts in flight).
Writing every object of a block at once could therefore hold a second copy of the whole block (peak
~2x the LogCache limit); with the bound, what writers and uploads hold beyond the LogCache is at most
``OBJECT_WRITES_INFLIGHT_MAX`` times that per upload (plus the slice being encoded).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import overload

from s3stream.ids import NOOP_OBJECT_ID, NodeId, ObjectId, StreamId
from s3stream.metadata.base import (
    CommitStreamSetObjectRequest,
    MetadataStore,
    NewStreamObject,
    StreamOffsetRange,
)
from s3stream.objectformat import ObjectWriter, object_key
from s3stream.objectformat.writer import RecordColumns, RecordFields
from s3stream.storage.base import ObjectStorage

OBJECT_WRITES_INFLIGHT_MAX = 4
"""Objects of one upload written at the same time (the rest wait their turn, in plan order)."""
WRITE_SLICE_BYTES = 128 * 1024
"""Payload bytes encoded between two yields to the event loop (~0.3 ms of encoding of 1 KiB
records); appends run between slices."""
WRITER_HANDOVER_BYTES = 1 << 20
"""Completed blocks an object writer hands to the upload at a time (as ``bytes``, kept by reference by
the S3 and local stores, which assemble their parts): the writer's buffer stays small, so it is never
moved with a copy when it grows (see ``ObjectWriter``)."""
RANGES_PER_TURN = 256
"""Commit ranges built per event-loop turn (~0.3 ms)."""


@dataclass(frozen=True, slots=True)
class StreamRecords:
    """One stream's records of a block, in offset order, as field tuples (``RecordFields``: the
    LogCache's own items, neither copied nor turned into StreamRecordBatch objects)."""

    stream_id: int
    records: Sequence[RecordFields]
    payload_bytes: int
    columns: RecordColumns | None = None
    """The same records as columns (the LogCache's stream cache), if the producer has them: the
    object writer encodes from these without a tuple per record."""

    @classmethod
    def of(cls, stream_id: int, records: Sequence[RecordFields]) -> StreamRecords:
        return cls(stream_id, records, sum(len(r[4]) for r in records))

    @property
    def epoch(self) -> int:
        return self.records[0][1]

    @property
    def start_offset(self) -> int:
        return self.records[0][2]

    @property
    def end_offset(self) -> int:
        last = self.records[-1]
        return last[2] + last[3]


class ColumnRecords(Sequence[RecordFields]):
    """One stream's columns read as field tuples (``RecordFields``), each built when read."""

    __slots__ = ("_columns",)

    def __init__(self, columns: RecordColumns) -> None:
        self._columns = columns

    def __len__(self) -> int:
        return len(self._columns.bases)

    @overload
    def __getitem__(self, index: int) -> RecordFields: ...

    @overload
    def __getitem__(self, index: slice) -> list[RecordFields]: ...

    def __getitem__(self, index: int | slice) -> RecordFields | list[RecordFields]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        c = self._columns
        bases = c.bases
        n = len(bases)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(index)
        end = bases[index + 1] if index + 1 < n else c.end
        epoch = c.epoch if c.epochs is None else c.epochs[index]
        assert epoch is not None
        return (c.stream_id, epoch, bases[index], end - bases[index], c.payloads[index])


class _RecordsOfColumns(Sequence[Sequence[RecordFields]]):
    """A group's records column when every stream has columns: a :class:`ColumnRecords` built per
    read, none kept (a plan of 1,000 streams kept 1,000 view objects alive through its upload: each
    a tracked object, ~1.4 more young collections per upload)."""

    __slots__ = ("_columns",)

    def __init__(self, columns: tuple[RecordColumns, ...]) -> None:
        self._columns = columns

    def __len__(self) -> int:
        return len(self._columns)

    @overload
    def __getitem__(self, index: int) -> Sequence[RecordFields]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Sequence[RecordFields]]: ...

    def __getitem__(self, index: int | slice) -> Sequence[RecordFields] | Sequence[Sequence[RecordFields]]:
        if isinstance(index, slice):
            return _RecordsOfColumns(self._columns[index])
        return ColumnRecords(self._columns[index])


class StreamGroup(Sequence[StreamRecords]):
    """Streams of a plan, kept as three columns: a plan lives as long as its upload, and one object
    per stream would reach the collector's oldest generation on every upload (1,000 streams: 1,000
    more objects to scan in each full collection until they die). Items are built when read."""

    __slots__ = ("columns", "payload_bytes", "records", "stream_ids")

    def __init__(self, streams: Iterable[StreamRecords] = ()) -> None:
        listed = list(streams)
        self.stream_ids = tuple(s.stream_id for s in listed)
        self.records: Sequence[Sequence[RecordFields]] = tuple(s.records for s in listed)
        self.payload_bytes = tuple(s.payload_bytes for s in listed)
        self.columns: tuple[RecordColumns | None, ...] = tuple(s.columns for s in listed)

    @classmethod
    def of_columns(
        cls,
        stream_ids: Sequence[int],
        records: Sequence[Sequence[RecordFields]],
        payload_bytes: Sequence[int],
        columns: Sequence[RecordColumns | None] | None = None,
    ) -> StreamGroup:
        assert len(stream_ids) == len(records) == len(payload_bytes)
        assert columns is None or len(columns) == len(stream_ids)
        group = cls()
        group.stream_ids, group.records, group.payload_bytes = (
            tuple(stream_ids),
            tuple(records),
            tuple(payload_bytes),
        )
        group.columns = (None,) * len(stream_ids) if columns is None else tuple(columns)
        return group

    @classmethod
    def of_record_columns(
        cls, stream_ids: Sequence[int], columns: Sequence[RecordColumns], payload_bytes: Sequence[int]
    ) -> StreamGroup:
        """Streams given by their columns alone: no object per stream (records are read through
        :class:`ColumnRecords` views built when asked for)."""
        assert len(stream_ids) == len(columns) == len(payload_bytes)
        group = cls()
        group.stream_ids, group.payload_bytes = tuple(stream_ids), tuple(payload_bytes)
        group.columns = tuple(columns)
        group.records = _RecordsOfColumns(tuple(columns))
        return group

    def take(self, indexes: Sequence[int]) -> StreamGroup:
        """The streams at ``indexes`` (in that order)."""
        columns = [self.columns[i] for i in indexes]
        if isinstance(self.records, _RecordsOfColumns):
            return StreamGroup.of_record_columns(
                [self.stream_ids[i] for i in indexes],
                columns,  # type: ignore[arg-type]  # no None: the group has columns only
                [self.payload_bytes[i] for i in indexes],
            )
        return StreamGroup.of_columns(
            [self.stream_ids[i] for i in indexes],
            [self.records[i] for i in indexes],
            [self.payload_bytes[i] for i in indexes],
            columns,
        )

    def __len__(self) -> int:
        return len(self.stream_ids)

    @overload
    def __getitem__(self, index: int) -> StreamRecords: ...

    @overload
    def __getitem__(self, index: slice) -> StreamGroup: ...

    def __getitem__(self, index: int | slice) -> StreamRecords | StreamGroup:
        if isinstance(index, slice):
            return StreamGroup(self[i] for i in range(*index.indices(len(self))))
        return StreamRecords(
            self.stream_ids[index], self.records[index], self.payload_bytes[index], self.columns[index]
        )

    def __repr__(self) -> str:
        return f"StreamGroup(stream_ids={self.stream_ids!r})"


@dataclass(frozen=True, slots=True)
class UploadPlan:
    """Which streams of a block go where. Both groups are in ascending stream id order."""

    stream_set: StreamGroup
    stream_objects: StreamGroup

    @property
    def object_count(self) -> int:
        return (1 if self.stream_set else 0) + len(self.stream_objects)


def plan_upload(streams: Sequence[StreamRecords], *, split_size_bytes: int) -> UploadPlan:
    """AutoMQ's split rule (docs/automq-model.md section 5) over streams sorted by stream id (a
    :class:`StreamGroup` is taken as it is: no object per stream is made)."""
    group = streams if isinstance(streams, StreamGroup) else StreamGroup(streams)
    keep = [
        i
        for i, (records, columns) in enumerate(zip(group.records, group.columns, strict=True))
        if (len(columns.bases) if columns is not None else records)
    ]
    ids = group.stream_ids
    assert all(ids[a] < ids[b] for a, b in itertools.pairwise(keep)), "streams must be sorted and unique"
    payloads = group.payload_bytes
    big = [i for i in keep if payloads[i] >= split_size_bytes]
    if len(keep) == 1 or len(big) == len(keep):
        return UploadPlan(StreamGroup(), group.take(keep))
    small = [i for i in keep if payloads[i] < split_size_bytes]
    return UploadPlan(group.take(small), group.take(big))


async def _ranges_of(streams: StreamGroup) -> tuple[StreamOffsetRange, ...]:
    """The StreamSet object's ranges for its commit, ``RANGES_PER_TURN`` per event-loop turn (from the
    columns where the streams have them: no StreamRecords, no record tuple built)."""
    ranges: list[StreamOffsetRange] = []
    ids, columns, payload_bytes = streams.stream_ids, streams.columns, streams.payload_bytes
    for start in range(0, len(streams), RANGES_PER_TURN):
        if start:
            await asyncio.sleep(0)
        for i in range(start, min(len(streams), start + RANGES_PER_TURN)):
            c = columns[i]
            if c is None:
                ranges.append(_range_of(streams[i]))
            else:
                ranges.append(StreamOffsetRange(StreamId(ids[i]), c.bases[0], c.end, payload_bytes[i]))
    return tuple(ranges)


def _range_of(stream: StreamRecords) -> StreamOffsetRange:
    return StreamOffsetRange(
        stream_id=StreamId(stream.stream_id),
        start_offset=stream.start_offset,
        end_offset=stream.end_offset,
        size_bytes=stream.payload_bytes,
    )


class ObjectUploader:
    """Writes planned objects and builds their commit request (no retries here: the caller retries)."""

    def __init__(
        self,
        *,
        storage: ObjectStorage,
        metadata: MetadataStore,
        namespace: str,
        node_id: NodeId,
        node_epoch: int,
        block_size_bytes: int,
        part_size_bytes: int,
        prepared_ttl_ms: int,
        object_writes_max: int = OBJECT_WRITES_INFLIGHT_MAX,
    ) -> None:
        assert object_writes_max >= 1, object_writes_max
        self.storage = storage
        self.metadata = metadata
        self.namespace = namespace
        self.node_id = node_id
        self.node_epoch = node_epoch
        self.block_size_bytes = block_size_bytes
        self.part_size_bytes = part_size_bytes
        self.prepared_ttl_ms = prepared_ttl_ms
        self.object_writes_max = object_writes_max

    async def prepare(self, plan: UploadPlan) -> ObjectId:
        """Allocate the plan's object ids; returns the first."""
        assert plan.object_count > 0
        return await self.metadata.prepare_objects(count=plan.object_count, ttl_ms=self.prepared_ttl_ms)

    async def write(self, plan: UploadPlan, first_id: ObjectId) -> CommitStreamSetObjectRequest:
        """Write every object of the plan (``object_writes_max`` at a time); returns the commit request."""
        slots = asyncio.Semaphore(self.object_writes_max)

        async def bounded(object_id: ObjectId, streams: Sequence[StreamRecords]) -> int:
            async with slots:
                return await self._write_object(object_id, streams)

        next_id = first_id
        jobs: list[asyncio.Task[int]] = []
        sso_id = NOOP_OBJECT_ID
        if plan.stream_set:
            sso_id = next_id
            next_id = ObjectId(next_id + 1)
            jobs.append(asyncio.ensure_future(bounded(sso_id, plan.stream_set)))
        so_ids: list[ObjectId] = []
        for stream in plan.stream_objects:
            so_ids.append(next_id)
            jobs.append(asyncio.ensure_future(bounded(next_id, StreamGroup((stream,)))))
            next_id = ObjectId(next_id + 1)
        try:
            sizes = await asyncio.gather(*jobs)
        except BaseException:
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
            raise
        # built last: they live until the commit is done, not through the whole upload
        stream_ranges = await _ranges_of(plan.stream_set)
        sso_size = sizes[0] if plan.stream_set else 0
        so_sizes = sizes[1:] if plan.stream_set else sizes
        return CommitStreamSetObjectRequest(
            node_id=self.node_id,
            node_epoch=self.node_epoch,
            object_id=sso_id,
            order_id=sso_id if sso_id != NOOP_OBJECT_ID else first_id,
            object_size_bytes=sso_size,
            stream_ranges=stream_ranges,
            stream_objects=tuple(
                NewStreamObject(
                    object_id=oid,
                    stream_id=StreamId(stream.stream_id),
                    start_offset=stream.start_offset,
                    end_offset=stream.end_offset,
                    size_bytes=size,
                )
                for oid, size, stream in zip(so_ids, so_sizes, plan.stream_objects, strict=True)
            ),
        )

    async def _write_object(self, object_id: ObjectId, streams: Sequence[StreamRecords]) -> int:
        upload = self.storage.upload(object_key(object_id, self.namespace))
        writer = ObjectWriter(
            upload,
            block_size_bytes=self.block_size_bytes,
            part_size_bytes=self.part_size_bytes,
            handover_bytes=WRITER_HANDOVER_BYTES,
        )
        try:
            # Encoding is CPU work on the event loop: hand it over in slices of about
            # WRITE_SLICE_BYTES (sized from each stream's mean record) so appends keep flowing.
            if isinstance(streams, StreamGroup) and None not in streams.columns:
                await _encode_group(writer, streams)
            else:
                await _encode_records(writer, streams)
            return await writer.finish()
        except BaseException:
            await asyncio.shield(_abort_quietly(upload))
            raise


async def _encode_records(writer: ObjectWriter, streams: Sequence[StreamRecords]) -> None:
    """Encode the streams' records in slices of about ``WRITE_SLICE_BYTES`` (sized from each stream's
    mean record), a loop turn between slices: encoding is CPU work on the event loop."""
    unyielded_bytes = 0
    for stream in streams:
        count = len(stream.records)
        step = max(1, WRITE_SLICE_BYTES * count // max(1, stream.payload_bytes))
        columns = stream.columns
        for start in range(0, count, step):
            end = min(count, start + step)
            if columns is not None:
                await writer.write_columns(columns, start, end)
            else:
                await writer.write_fields(stream.records, start, end)
            unyielded_bytes += stream.payload_bytes * (end - start) // count
            if unyielded_bytes >= WRITE_SLICE_BYTES:
                unyielded_bytes = 0
                await asyncio.sleep(0)


async def _encode_group(writer: ObjectWriter, group: StreamGroup) -> None:
    """:func:`_encode_records` of streams that all have columns: runs of small streams go to the
    writer in one call per slice (a call per stream of a few records cost ~5 us, more than its
    records), a stream of a slice or more is cut into slices of its records."""
    columns = group.columns
    payload_bytes = group.payload_bytes
    n = len(columns)
    i = 0
    while i < n:
        if payload_bytes[i] >= WRITE_SLICE_BYTES:
            await _encode_records(writer, (group[i],))
            i += 1
            continue
        j, slice_bytes = i, 0
        while j < n and slice_bytes < WRITE_SLICE_BYTES and payload_bytes[j] < WRITE_SLICE_BYTES:
            slice_bytes += payload_bytes[j]
            j += 1
        await writer.write_streams(columns[i:j])  # type: ignore[arg-type]  # no None: checked by the caller
        i = j
        await asyncio.sleep(0)


async def _abort_quietly(upload: object) -> None:
    abort = getattr(upload, "abort", None)
    if abort is None:
        return
    try:
        await abort()
    except Exception:  # noqa: BLE001 - best effort: the prepared TTL reclaims what abort could not
        return
