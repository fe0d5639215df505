"""The LogCache: acknowledged record batches held in memory until (and after) they are uploaded.

AutoMQ's delta-WAL cache (``docs/automq-model.md`` section 4): an ordered list of blocks, oldest first; the
last one is the *active* block that receives records, older ones are *archived* (being uploaded, or uploaded
and kept for reads). Each block keeps one :class:`StreamCache` per stream (records in offset order). A block
is full at ``upload_threshold_bytes`` or at ``max_stream_count`` streams. After an upload's commit the block
is marked *free*; free blocks stay readable and are dropped (oldest first) only when the cache holds more than
90 % of its capacity. No I/O, no clock: the caller passes times.

Plain appends (the hot path) are staged in the active block, one flat list of their fields, and
folded into the stream caches up to :data:`STAGED_ROWS_MAX` records at a time, and whenever the
block's streams are read (:class:`LogCacheBlock`): every acknowledged record is readable at once.

Records are kept in columns per stream and block (payloads in a list, epochs, base offsets and
counts in int arrays), not as StreamRecordBatch objects nor as one tuple each: caching a record
creates no object the garbage collector tracks (a tuple per record was one: one young collection
per ~700 appends, and a full one, tens of ms on a big heap, per ~70,000), and the arrays hold no int
objects. Readers get StreamRecordBatch objects built on the way out; the upload encodes straight
from the columns (``ObjectWriter.write_columns``).

A block that takes no more records (committed and marked free: it stays for reads) is *frozen*
(:meth:`LogCache.freeze_steps`, a slice of streams per step): its stream caches become one
:data:`StreamRow` tuple per stream in a plain dict (:class:`FrozenStreams`), holding only ints,
bytes and the payloads, which the collector stops tracking (tuples after the first collection
that sees them, the dict after the first full one). A StreamCache, its payload list and its base
offsets array were three tracked objects per stream and block, all walked by every full collection
(14 uploaded blocks of 1,000 streams: 42,000 objects, ~8 ms a collection); a frozen block keeps
none per stream (the block, its FrozenStreams and its seqs array). Readers get a StreamCache built
from a row when they ask for one (``block.streams.get``); :meth:`LogCache.get` skips rows outside
the range first.
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sortedcontainers import SortedDict

from s3stream.record import RECORD_HEADER_SIZE, StreamRecordBatch


class CachedBatch(NamedTuple):
    """One acknowledged record batch as the append path and the sequencer hand it to the LogCache:
    ``StreamRecordBatch(*item)`` rebuilds the batch. A tuple (nothing more for the collector to track
    than a plain one), read by field name."""

    stream_id: int
    epoch: int
    base_offset: int
    record_count: int
    payload: bytes


NO_WAL_OFFSET = 1 << 62
"""``LogCacheBlock.wal_offset_min`` of a block holding no per-block record (above any WAL offset)."""

FREE_THRESHOLD_RATIO = 0.9
"""Free blocks are released once the cache holds more than this share of its capacity (docs/automq-model.md
section 4)."""

STAGED_ROWS_MAX = 1024
"""Plain records the active block stages (:attr:`LogCacheBlock.staged`) before it folds them into
its stream caches in one loop (:meth:`LogCacheBlock.fold`: ~0.1-0.3 ms at this size)."""

STAGED_FIELDS = 5
"""Entries per staged record in :attr:`LogCacheBlock.staged`: stream id, epoch, base offset, count,
payload."""

StreamRow = tuple[Any, ...]
"""A frozen :class:`StreamCache`: (start offset, end offset, epoch, epochs, base offsets, size in
bytes, then the payloads, one item each: ``ROW_PAYLOADS_AT``), the int arrays as their bytes
(``array.tobytes``): one tuple of nothing the collector tracks (the payloads in a tuple of their own
were a second tracked object per stream, counted toward the young collections when a block freezes)."""

ROW_PAYLOADS_AT = 6
"""Where a :data:`StreamRow`'s payloads start."""


class StreamCache:
    """One stream's records within one block: ``[start_offset, end_offset)`` in offset order.

    Records arrive in offset order and continue each other (the sequencer guarantees it), so the
    columns are: the payloads, the base offsets (sorted: binary search as they are) and the end
    offset (a record's count is the next one's base offset minus its own); the epoch is one for the
    whole stream cache unless the stream was reopened under a new epoch meanwhile (then ``epochs``
    holds one per record). Nothing per record the garbage collector tracks.
    """

    __slots__ = ("bases", "end", "epoch", "epochs", "payloads", "size_bytes", "stream_id")

    def __init__(self, stream_id: int, epoch: int) -> None:
        self.stream_id = stream_id
        self.epoch: int | None = epoch
        """The epoch of every record (None: mixed, see ``epochs``)."""
        self.epochs: array[int] | None = None
        self.payloads: list[bytes] = []
        self.bases = array("q")
        self.end = -1
        """The end offset of the last record (-1: none yet)."""
        self.size_bytes = 0

    @property
    def start_offset(self) -> int:
        return self.bases[0]

    @property
    def end_offset(self) -> int:
        return self.end

    def fields(self) -> list[CachedBatch]:
        """Every record as a :class:`CachedBatch` tuple (built now; the cache keeps none)."""
        return [self.field(i) for i in range(len(self.payloads))]

    def __len__(self) -> int:
        return len(self.payloads)

    def add(self, item: CachedBatch) -> int:
        """Append the next record of the stream; returns its encoded size."""
        stream_id, epoch, base, count, payload = item
        assert stream_id == self.stream_id
        assert self.end < 0 or base == self.end, f"stream {stream_id}: record at {base} after end {self.end}"
        if epoch != self.epoch and self.epochs is None:
            self.epochs = array("q", [self.epoch or 0]) * len(self.payloads)
            self.epoch = None
        if self.epochs is not None:
            self.epochs.append(epoch)
        self.payloads.append(payload)
        self.bases.append(base)
        self.end = base + count
        size = RECORD_HEADER_SIZE + len(payload)
        self.size_bytes += size
        return size

    def row(self) -> StreamRow:
        """The records as a :data:`StreamRow` (what a frozen block keeps of this cache)."""
        epochs = self.epochs
        return (
            self.bases[0],
            self.end,
            self.epoch,
            None if epochs is None else epochs.tobytes(),
            self.bases.tobytes(),
            self.size_bytes,
            *self.payloads,
        )

    @classmethod
    def of_row(cls, stream_id: int, row: StreamRow) -> StreamCache:
        """A stream cache holding a :data:`StreamRow`'s records (its own columns: a copy)."""
        _start, end, epoch, epochs, bases, size_bytes = row[:ROW_PAYLOADS_AT]
        cache = cls(stream_id, 0)
        cache.epoch = epoch
        if epochs is not None:
            cache.epochs = array("q")
            cache.epochs.frombytes(epochs)
        cache.payloads = list(row[ROW_PAYLOADS_AT:])
        cache.bases.frombytes(bases)
        cache.end = end
        cache.size_bytes = size_bytes
        return cache

    def field(self, index: int) -> CachedBatch:
        """Record ``index`` (negative: from the end) as a :class:`CachedBatch`."""
        return CachedBatch(*self._row(index))

    def _row(self, index: int) -> tuple[int, int, int, int, bytes]:
        """:meth:`field` as a plain tuple (the read path builds one per record it returns)."""
        bases = self.bases
        if index < 0:
            index += len(bases)
        base = bases[index]
        count = (bases[index + 1] if index + 1 < len(bases) else self.end) - base
        epoch = self.epoch if self.epochs is None else self.epochs[index]
        assert epoch is not None
        return (self.stream_id, epoch, base, count, self.payloads[index])

    def batches(self, start: int = 0, end: int | None = None) -> list[StreamRecordBatch]:
        """The records ``[start, end)`` (positions in this cache) as StreamRecordBatch objects."""
        return [
            StreamRecordBatch(*self._row(i)) for i in range(*slice(start, end).indices(len(self.payloads)))
        ]

    @property
    def records(self) -> list[StreamRecordBatch]:
        return self.batches()

    def overlapping(self, start_offset: int, end_offset: int) -> list[StreamRecordBatch]:
        """Records overlapping ``[start_offset, end_offset)`` in order."""
        bases = self.bases
        if not bases or start_offset >= self.end or end_offset <= bases[0]:
            return []
        # The record containing start_offset is the last one whose base offset is <= start_offset.
        index = max(bisect.bisect_right(bases, start_offset) - 1, 0)
        out: list[StreamRecordBatch] = []
        for i in range(index, len(bases)):
            if bases[i] >= end_offset:
                break
            out.append(StreamRecordBatch(*self._row(i)))  # records continue each other: all overlap
        return out


class FrozenStreams(Mapping[int, StreamCache]):
    """A frozen block's streams: stream id -> :data:`StreamRow` in ascending stream id, read as
    stream caches (each built when asked for, from its row)."""

    __slots__ = ("rows",)

    def __init__(self, rows: dict[int, StreamRow]) -> None:
        self.rows = rows

    def __getitem__(self, stream_id: int) -> StreamCache:
        return StreamCache.of_row(stream_id, self.rows[stream_id])

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self.rows

    def __iter__(self) -> Iterator[int]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def overlapping(self, stream_id: int, start_offset: int, end_offset: int) -> list[StreamRecordBatch]:
        """:meth:`StreamCache.overlapping` of the stream's cache (none built when the row is outside)."""
        row = self.rows.get(stream_id)
        if row is None or start_offset >= row[1] or end_offset <= row[0]:
            return []
        return StreamCache.of_row(stream_id, row).overlapping(start_offset, end_offset)


@dataclass(eq=False)
class LogCacheBlock:
    """A group of records uploaded together as one StreamSet object (plus stream objects).

    Plain appends are *staged*: :meth:`LogCache.put_plain` adds their fields to one flat list of the
    block (:attr:`staged`), with no per-stream lookup, and the block folds them into its stream
    caches in one loop (:meth:`fold`) every :data:`STAGED_ROWS_MAX` records and whenever its streams
    are asked for (:attr:`streams`: every read, the upload, the archive), so a reader sees every
    record put. Putting each record into its stream cache in line, between the rest of each
    append's work, cost ~0.75 us of event-loop CPU per 1 KiB append into 1,000 streams (held-back
    ingest on the block WAL; ~0.25 us in a hot loop); staging plus the fold's tight loop (~0.2 us a
    record) cost ~0.45 us.
    """

    block_id: int
    created_at_s: float
    stream_max_count: int = 1 << 62
    """The LogCache's ``max_stream_count``: a fold comes before the staged records could exceed it."""
    folded: SortedDict = field(default_factory=SortedDict)
    """stream id -> StreamCache of the folded records (see :attr:`streams`)."""
    staged: list[Any] | None = field(default_factory=list)
    """The plain records put since the last fold, :data:`STAGED_FIELDS` entries each, in put order;
    None once the block is archived (it takes no more: nothing the collector tracks kept for it)."""
    fold_at: int = 0
    """The length of :attr:`staged` that makes :meth:`LogCache.put_plain` fold."""
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

    def __post_init__(self) -> None:
        self._next_fold_at()

    @property
    def streams(self) -> SortedDict:
        """stream id -> StreamCache, in ascending stream id (the StreamSet object's order), with
        every staged record folded in first; a :class:`FrozenStreams` once the block is frozen."""
        if self.staged:
            self.fold()
        return self.folded

    @streams.setter
    def streams(self, streams: SortedDict) -> None:
        assert not self.staged
        self.folded = streams

    def _next_fold_at(self) -> None:
        room = self.stream_max_count - len(self.folded)  # each staged record may add one stream
        self.fold_at = STAGED_FIELDS * min(STAGED_ROWS_MAX, max(room, 1))

    def fold(self) -> None:
        """Move the staged records into their stream caches (in put order: each stream's in offset order).

        Stream caches made by this fold go into the sorted :attr:`folded` at its end, in one update
        (inserted one by one, 1,000 new streams cost ~0.5 ms of bisecting and list inserts: the first
        fold of every block of a 1,000-stream workload; one update of many keys sorts once, ~0.05 ms)."""
        staged = self.staged
        assert staged is not None
        self.staged = []
        streams = self.folded
        get = streams.get
        new: dict[int, StreamCache] = {}
        fields = iter(staged)
        for stream_id, epoch, base, count, payload in zip(
            fields, fields, fields, fields, fields, strict=True
        ):
            cache = get(stream_id)
            if cache is None:
                cache = new.get(stream_id)
                if cache is None:
                    cache = new[stream_id] = StreamCache(stream_id, epoch)
            if epoch == cache.epoch:
                # StreamCache.add, inlined: this runs once per plain record.
                assert cache.end < 0 or base == cache.end, (
                    f"stream {stream_id}: record at {base} after end {cache.end}"
                )
                cache.payloads.append(payload)
                cache.bases.append(base)
                cache.end = base + count
                cache.size_bytes += RECORD_HEADER_SIZE + len(payload)
            else:
                cache.add((stream_id, epoch, base, count, payload))
        if new:
            streams.update(new)
        self._next_fold_at()

    def put(self, item: CachedBatch) -> int:
        """Add a record to its stream's cache (after a fold of the staged ones); returns its size."""
        stream_id, epoch, _, _, _ = item  # unpacked: a plain 5-tuple works too
        streams = self.streams
        cache: StreamCache | None = streams.get(stream_id)
        if cache is None:
            cache = streams[stream_id] = StreamCache(stream_id, epoch)
            self._next_fold_at()
        size = cache.add(item)
        self.size_bytes += size
        return size

    def take_seqs(self) -> array[int]:
        """The block's ``seqs``, handed over once (the block keeps none afterwards)."""
        seqs, self.seqs = self.seqs, array("q")
        return seqs

    def take_holders(self) -> list[object]:
        """What holds each stream's records (its StreamCache, or its :data:`StreamRow` once frozen),
        handed over once by a released block, which keeps none: the caller holds their last
        references and can drop them a few at a time."""
        streams = self.streams
        holders: list[object] = list(
            streams.rows.values() if isinstance(streams, FrozenStreams) else streams.values()
        )
        self.streams = SortedDict()
        return holders

    def records_by_stream(self) -> list[tuple[int, list[StreamRecordBatch]]]:
        """Every stream's records, streams in ascending id order (the StreamSet object order)."""
        return [(stream_id, cache.batches()) for stream_id, cache in self.streams.items()]

    def is_empty(self) -> bool:
        return not self.folded and not self.staged


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
        self.blocks: list[LogCacheBlock] = [LogCacheBlock(next(self._ids), now_s, max_stream_count)]
        self.size_bytes = 0

    @property
    def active(self) -> LogCacheBlock:
        return self.blocks[-1]

    def put(self, record: StreamRecordBatch) -> bool:
        """Add an acknowledged record to the active block; True when the block is now full."""
        return self.put_item(
            CachedBatch(record.stream_id, record.epoch, record.base_offset, record.count, record.payload)
        )

    def put_item(self, item: CachedBatch, seq: int = -1, wal_offset: int = -1) -> bool:
        """:meth:`put` of a record in its cached form (the append path builds no StreamRecordBatch);
        ``seq`` (if not negative) is its WAL record's, kept in the block's ``seqs``; otherwise
        ``wal_offset`` (if not negative) is the WAL offset of the plain record it is, kept as the
        block's ``wal_offset_min`` and ``wal_bytes``."""
        if seq < 0:
            return self.put_plain(*item, wal_offset)
        block = self.blocks[-1]
        size = block.put(item)
        block.seqs.append(seq)
        self.size_bytes += size
        return block.size_bytes >= self.upload_threshold_bytes or len(block.folded) >= self.max_stream_count

    def put_plain(
        self, stream_id: int, epoch: int, base_offset: int, count: int, payload: bytes, wal_offset: int
    ) -> bool:
        """:meth:`put_item` of a plain append's batch given as its fields (the append hot path: no
        tuple built), with its WAL offset (negative: none); True when the block is now full."""
        block = self.blocks[-1]
        staged = block.staged
        assert staged is not None  # the active block's
        staged += (stream_id, epoch, base_offset, count, payload)  # folded later (see LogCacheBlock)
        size = RECORD_HEADER_SIZE + len(payload)
        if wal_offset >= 0:
            if wal_offset < block.wal_offset_min:
                block.wal_offset_min = wal_offset
            block.wal_bytes += size
        block.size_bytes += size
        self.size_bytes += size
        return (
            len(staged) >= block.fold_at or block.size_bytes >= self.upload_threshold_bytes
        ) and self.staged_full(block)

    def staged_full(self, block: LogCacheBlock) -> bool:
        """After a staged put that reached the active ``block``'s fold point or the upload threshold:
        fold if due; True when the block is full.

        The stream count only grows with a fold, and a fold comes before the staged records could take
        it past ``max_stream_count`` (:attr:`LogCacheBlock.fold_at`): checked here, not on every put."""
        staged = block.staged
        if staged is not None and len(staged) >= block.fold_at:
            block.fold()
            if len(block.folded) >= self.max_stream_count:
                return True
        return block.size_bytes >= self.upload_threshold_bytes

    def is_full(self, block: LogCacheBlock) -> bool:
        return block.size_bytes >= self.upload_threshold_bytes or len(block.streams) >= self.max_stream_count

    def archive(self, now_s: float) -> LogCacheBlock | None:
        """Seal the active block (None if it is empty) and open a new one."""
        block = self.active
        if block.is_empty():
            block.created_at_s = now_s
            return None
        block.archived = True
        if block.staged:
            block.fold()
        block.staged = None
        self.blocks.append(LogCacheBlock(next(self._ids), now_s, self.max_stream_count))
        return block

    def mark_free(self, block: LogCacheBlock) -> None:
        """The block's records are committed to object storage: it may be released under pressure."""
        assert block.archived
        assert not block.free
        block.free = True
        self.try_real_free()

    def freeze_steps(self, block: LogCacheBlock, streams_per_step: int) -> Iterator[None]:
        """Freeze a free block: its stream caches become :data:`StreamRow` tuples, built
        ``streams_per_step`` at a time (this yields between steps), then swapped in at once. Stops,
        unfrozen, once the LogCache has released the block. Its records stay readable throughout."""
        assert block.free
        assert streams_per_step > 0
        if isinstance(block.streams, FrozenStreams):
            return
        stream_ids: list[int] = list(block.streams)  # the block takes no more records
        rows: dict[int, StreamRow] = {}
        for start in range(0, len(stream_ids), streams_per_step):
            if start:
                yield
            if not any(b is block for b in self.blocks):
                return  # released: whoever took its holders frees its records (take_holders)
            streams = block.streams  # not kept across a step: a released block's caches go then
            for stream_id in stream_ids[start : start + streams_per_step]:
                rows[stream_id] = streams[stream_id].row()
            del streams
        block.streams = FrozenStreams(rows)

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
            if block.staged:
                block.fold()
            streams = block.folded
            if type(streams) is FrozenStreams:
                found.extend(streams.overlapping(stream_id, start_offset, end_offset))
                continue
            cache = streams.get(stream_id)
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
