"""The LogCache: acknowledged record batches held in memory until (and after) they are uploaded.

AutoMQ's delta-WAL cache (reference section 4): an ordered list of blocks, oldest first; the last one
is the *active* block that receives records, older ones are *archived* (being uploaded, or uploaded
and kept for reads). Each block keeps one :class:`StreamCache` per stream (records in offset order).
A block is full at ``upload_threshold_bytes`` or at ``max_stream_count`` streams. After an upload's
commit the block is marked *free*; free blocks stay readable and are dropped (oldest first) only when
the cache holds more than 90 % of its capacity. No I/O, no clock: the caller passes times.

Records are kept as plain tuples (:data:`CachedBatch`, the fields of a StreamRecordBatch in
constructor order), not as StreamRecordBatch objects: the garbage collector stops tracking a tuple
of ints and bytes, so a full cache (100,000+ small records) does not lengthen every full
collection, which would otherwise stall the event loop for tens of ms (the append latency tail).
Readers get StreamRecordBatch objects built on the way out.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from array import array
from dataclasses import dataclass, field

from sortedcontainers import SortedDict

from s3stream.record import RECORD_HEADER_SIZE, StreamRecordBatch

CachedBatch = tuple[int, int, int, int, bytes]
"""(stream id, epoch, base offset, count, payload): ``StreamRecordBatch(*item)`` rebuilds the batch."""

_base_offset = operator.itemgetter(2)
"""A cached record's base offset (the key its stream's list is sorted by)."""

NO_WAL_OFFSET = 1 << 62
"""``LogCacheBlock.wal_offset_min`` of a block holding no per-block record (above any WAL offset)."""

FREE_THRESHOLD_RATIO = 0.9
"""Free blocks are released once the cache holds more than this share of its capacity (AutoMQ 4.4)."""


class StreamCache:
    """One stream's records within one block: ``[start_offset, end_offset)`` in offset order.

    Records arrive in offset order (the sequencer guarantees it), so the plain list stays sorted
    by base offset and serves binary search as it is.
    """

    __slots__ = ("items", "size_bytes")

    def __init__(self) -> None:
        self.items: list[CachedBatch] = []
        self.size_bytes = 0

    @property
    def start_offset(self) -> int:
        return self.items[0][2]

    @property
    def end_offset(self) -> int:
        last = self.items[-1]
        return last[2] + last[3]

    def __len__(self) -> int:
        return len(self.items)

    def add(self, item: CachedBatch) -> int:
        """Append the next record of the stream; returns its encoded size."""
        items = self.items
        assert not items or item[2] == items[-1][2] + items[-1][3], (
            f"stream {item[0]}: record at {item[2]} after end {self.end_offset}"
        )
        items.append(item)
        size = RECORD_HEADER_SIZE + len(item[4])
        self.size_bytes += size
        return size

    def batches(self, start: int = 0, end: int | None = None) -> list[StreamRecordBatch]:
        """The records ``[start, end)`` (positions in this cache) as StreamRecordBatch objects."""
        return [StreamRecordBatch(*item) for item in self.items[start:end]]

    @property
    def records(self) -> list[StreamRecordBatch]:
        return self.batches()

    def overlapping(self, start_offset: int, end_offset: int) -> list[StreamRecordBatch]:
        """Records overlapping ``[start_offset, end_offset)`` in order."""
        if not self.items or start_offset >= self.end_offset or end_offset <= self.start_offset:
            return []
        # The record containing start_offset is the last one whose base offset is <= start_offset.
        index = max(bisect.bisect_right(self.items, start_offset, key=_base_offset) - 1, 0)
        out: list[StreamRecordBatch] = []
        for item in itertools.islice(self.items, index, None):
            if item[2] >= end_offset:
                break
            if item[2] + item[3] > start_offset:
                out.append(StreamRecordBatch(*item))
        return out


@dataclass(eq=False)
class LogCacheBlock:
    """A group of records uploaded together as one StreamSet object (plus stream objects)."""

    block_id: int
    created_at_s: float
    streams: SortedDict = field(default_factory=SortedDict)
    """stream id -> StreamCache, in ascending stream id (the StreamSet object's order)."""
    size_bytes: int = 0
    free: bool = False
    archived: bool = False
    seqs: array[int] = field(default_factory=lambda: array("q"))
    """The WAL record seq of each record put with one (a seq once per batch): the per-record entries
    of the WAL trim tracker (atomic groups, replayed records) that learn they are committed once
    the block is (:meth:`take_seqs`). An int array: no int object kept alive per record."""
    wal_offset_min: int = NO_WAL_OFFSET
    """The lowest WAL offset of the records put with their offset (plain appends: the WAL trim
    tracker's per-block records, live until the block is committed)."""
    wal_bytes: int = 0
    """The WAL body bytes of those records (``live_bytes`` of the trim tracker until committed)."""

    def put(self, item: CachedBatch) -> None:
        cache = self.streams.get(item[0])
        if cache is None:
            cache = self.streams[item[0]] = StreamCache()
        self.size_bytes += cache.add(item)

    def take_seqs(self) -> array[int]:
        """The block's ``seqs``, handed over once (the block keeps none afterwards)."""
        seqs, self.seqs = self.seqs, array("q")
        return seqs

    def records_by_stream(self) -> list[tuple[int, list[StreamRecordBatch]]]:
        """Every stream's records, streams in ascending id order (the StreamSet object order)."""
        return [(stream_id, cache.batches()) for stream_id, cache in self.streams.items()]

    def is_empty(self) -> bool:
        return not self.streams


class LogCache:
    """The blocks of acknowledged records, with a byte limit (``capacity_bytes``)."""

    def __init__(
        self, *, capacity_bytes: int, upload_threshold_bytes: int, max_stream_count: int, now_s: float = 0.0
    ) -> None:
        assert 0 < upload_threshold_bytes <= capacity_bytes
        self.capacity_bytes = capacity_bytes
        self.upload_threshold_bytes = upload_threshold_bytes
        self.max_stream_count = max_stream_count
        self._ids = itertools.count()
        self.blocks: list[LogCacheBlock] = [LogCacheBlock(next(self._ids), now_s)]
        self.size_bytes = 0

    @property
    def active(self) -> LogCacheBlock:
        return self.blocks[-1]

    def put(self, record: StreamRecordBatch) -> bool:
        """Add an acknowledged record to the active block; True when the block is now full."""
        return self.put_item(
            (record.stream_id, record.epoch, record.base_offset, record.count, record.payload)
        )

    def put_item(self, item: CachedBatch, seq: int = -1, wal_offset: int = -1) -> bool:
        """:meth:`put` of a record in its cached form (the append path builds no StreamRecordBatch);
        ``seq`` (if not negative) is its WAL record's, kept in the block's ``seqs``; otherwise
        ``wal_offset`` (if not negative) is the WAL offset of the plain record it is, kept as the
        block's ``wal_offset_min`` and ``wal_bytes``."""
        block = self.blocks[-1]
        streams = block.streams
        cache = streams.get(item[0])
        if cache is None:
            cache = streams[item[0]] = StreamCache()
        # StreamCache.add, inlined: this runs once per append.
        items = cache.items
        assert not items or item[2] == items[-1][2] + items[-1][3], (
            f"stream {item[0]}: record at {item[2]} after end {cache.end_offset}"
        )
        items.append(item)
        size = RECORD_HEADER_SIZE + len(item[4])
        cache.size_bytes += size
        if seq >= 0:
            block.seqs.append(seq)
        elif wal_offset >= 0:
            if wal_offset < block.wal_offset_min:
                block.wal_offset_min = wal_offset
            block.wal_bytes += size
        block.size_bytes += size
        self.size_bytes += size
        return block.size_bytes >= self.upload_threshold_bytes or len(streams) >= self.max_stream_count

    def is_full(self, block: LogCacheBlock) -> bool:
        return block.size_bytes >= self.upload_threshold_bytes or len(block.streams) >= self.max_stream_count

    def archive(self, now_s: float) -> LogCacheBlock | None:
        """Seal the active block (None if it is empty) and open a new one."""
        block = self.active
        if block.is_empty():
            block.created_at_s = now_s
            return None
        block.archived = True
        self.blocks.append(LogCacheBlock(next(self._ids), now_s))
        return block

    def mark_free(self, block: LogCacheBlock) -> None:
        """The block's records are committed to object storage: it may be released under pressure."""
        assert block.archived
        assert not block.free
        block.free = True
        self.try_real_free()

    def try_real_free(self, *, target_bytes: int | None = None) -> int:
        """Release free blocks from the head while above 90 % (or ``target_bytes``); returns bytes freed."""
        target = int(self.capacity_bytes * FREE_THRESHOLD_RATIO) if target_bytes is None else target_bytes
        freed = 0
        while self.size_bytes > target and len(self.blocks) > 1 and self.blocks[0].free:
            block = self.blocks.pop(0)
            self.size_bytes -= block.size_bytes
            freed += block.size_bytes
        return freed

    def uncommitted_wal_offset_min(self) -> int:
        """The lowest WAL offset of a per-block record in a block not yet committed (-1: none)."""
        lowest = min((b.wal_offset_min for b in self.blocks if not b.free), default=NO_WAL_OFFSET)
        return -1 if lowest == NO_WAL_OFFSET else lowest

    def unfree_bytes(self) -> int:
        """Bytes not yet committed to object storage (what back-pressure counts)."""
        return sum(block.size_bytes for block in self.blocks if not block.free)

    def has_room(self, size_bytes: int) -> bool:
        """Whether ``size_bytes`` more fit, after releasing free blocks if needed."""
        if self.size_bytes + size_bytes <= self.capacity_bytes:
            return True
        self.try_real_free(target_bytes=max(self.capacity_bytes - size_bytes, 0))
        return self.size_bytes + size_bytes <= self.capacity_bytes or self.size_bytes == 0

    def get(
        self, stream_id: int, start_offset: int, end_offset: int, max_bytes: int
    ) -> list[StreamRecordBatch]:
        """Cached records of ``[start_offset, end_offset)``, contiguous and in order.

        Full or partial hit from ``start_offset``: records from the one containing ``start_offset``
        onwards, stopping at ``end_offset``, at a gap, or once ``max_bytes`` of payload are returned
        (at least one record). Otherwise, when the cache holds the *tail* of the range (a contiguous
        run starting strictly inside it), that run; the caller reads the head from object storage.
        Otherwise empty.
        """
        found: list[StreamRecordBatch] = []
        for block in self.blocks:
            cache = block.streams.get(stream_id)
            if cache is not None:
                found.extend(cache.overlapping(start_offset, end_offset))
        if not found:
            return []
        if found[0].base_offset > start_offset:
            # Keep only the contiguous run that ends with the newest record.
            index = len(found) - 1
            while index > 0 and found[index - 1].end_offset == found[index].base_offset:
                index -= 1
            found = found[index:]
        out: list[StreamRecordBatch] = []
        budget = max_bytes
        for record in found:
            if out and (record.base_offset != out[-1].end_offset or budget <= 0):
                break
            out.append(record)
            budget -= len(record.payload)
        return out

    def stream_end_offset(self, stream_id: int) -> int | None:
        """End offset of the newest cached record of a stream (None if none is cached)."""
        for block in reversed(self.blocks):
            cache: StreamCache | None = block.streams.get(stream_id)
            if cache is not None:
                return cache.end_offset
        return None

    def blocks_with_stream(self, stream_id: int) -> list[LogCacheBlock]:
        return [block for block in self.blocks if not block.free and stream_id in block.streams]
