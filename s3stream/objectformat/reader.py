"""ObjectReader: tail read, index search and verified ranged reads of data blocks of one object.

Layout: ``docs/format.md`` section 2. ``open`` reads the object's tail once (AutoMQ's guess of the
index size plus 4 bytes per block for our CRCs), decodes the footer, and re-reads once from the
index block when the guess was short. ``find`` is AutoMQ's search: the block holding the start
offset, then a forward scan while the stream's blocks are contiguous. ``read_blocks`` issues one
ranged GET per run of adjacent blocks and checks every block (CRC32C when the object has a checksum
section, then header and records) before returning anything; with ``decode=False`` the records of
each block are decoded and checked on first use instead (:class:`DataBlock`), so a reader that loads
ahead keeps compact bytes, not one object per record batch.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from s3stream.errors import CorruptionError, InvalidArgumentError
from s3stream.objectformat.block import check_block_header, decode_block
from s3stream.objectformat.codec import (
    BLOCK_CRC_SIZE,
    CHECKSUM_SECTION_HEADER_SIZE,
    FOOTER_SIZE,
    INDEX_ENTRY_SIZE,
    Footer,
    IndexEntry,
    NeedBytes,
    ObjectTail,
    tail_guess_bytes,
    verify_crc,
)
from s3stream.objectformat.decode import decode_data_block
from s3stream.objectformat.tail import decode_tail
from s3stream.record import StreamRecordBatch

NO_END_OFFSET = -1
MAX_BYTES_UNBOUNDED = 2**62


class RangeSource(Protocol):
    """The part of :class:`~s3stream.storage.base.ObjectStorage` a reader needs: ranged GETs."""

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes: ...


_COUNT = operator.attrgetter("count")
_PAYLOAD = operator.attrgetter("payload")


class DataBlock:
    """One verified data block of an object: its index entry and its record batches.

    Either decoded when built (``records`` given) or *lazy*: built from the block's bytes after their
    CRC32C and header passed, its records decoded and checked on the first access of :attr:`records`
    (which raises :class:`~s3stream.errors.CorruptionError`, naming the object and the byte position,
    on every access if they fail), then kept and the bytes dropped. Records never come from bytes
    that failed a check. A lazy block holds its own bytes (never a view pinning a larger GET buffer),
    so its memory is its index entry's size.
    """

    __slots__ = ("_contiguous", "_data", "_payload_prefix", "_records", "_source", "entry")

    entry: IndexEntry
    _data: bytes | None
    _source: str
    _records: tuple[StreamRecordBatch, ...] | None
    _contiguous: bool | None
    _payload_prefix: Sequence[int] | None

    def __init__(
        self,
        entry: IndexEntry,
        records: Sequence[StreamRecordBatch] | None = None,
        *,
        data: bytes | None = None,
        source: str = "<buffer>",
    ) -> None:
        if (records is None) == (data is None):
            raise InvalidArgumentError("a data block takes either its records or its bytes")
        if data is not None and len(data) != entry.size_bytes:
            raise InvalidArgumentError(f"{len(data)} bytes for a block of {entry.size_bytes}")
        self.entry = entry
        self._data = data
        self._source = source
        self._records = None if records is None else tuple(records)
        self._contiguous = None
        self._payload_prefix = None

    @property
    def records(self) -> tuple[StreamRecordBatch, ...]:
        """The block's record batches in offset order (decoded and checked on first access)."""
        records = self._records
        if records is None:
            assert self._data is not None
            records, self._contiguous, payload_bytes = decode_data_block(
                self._data, self.entry, source=self._source
            )
            if payload_bytes:  # all alike: the prefix sums are a range, no pass over the records
                self._payload_prefix = range(0, (len(records) + 1) * payload_bytes, payload_bytes)
            self._records = records
            self._data = None
        return records

    @property
    def decoded(self) -> bool:
        """Whether :attr:`records` has been decoded (a lazy block not yet read holds only bytes)."""
        return self._records is not None

    @property
    def contiguous(self) -> bool:
        """The records continue each other without a gap from the entry's start to its end offset.

        The codec already checked that they ascend without overlap from the start offset and end at
        the end offset, so their counts summing to the span means no gap.
        """
        records = self.records  # decoding a lazy block finds out on the way
        contiguous = self._contiguous
        if contiguous is None:
            entry = self.entry
            contiguous = sum(map(_COUNT, records)) == entry.end_offset - entry.start_offset
            self._contiguous = contiguous
        return contiguous

    @property
    def payload_prefix(self) -> Sequence[int]:
        """``prefix[k]``: payload bytes of the first ``k`` records (``len(records) + 1`` entries)."""
        records = self.records  # decoding a block of like records sets it
        prefix = self._payload_prefix
        if prefix is None:
            prefix = list(itertools.accumulate(map(len, map(_PAYLOAD, records)), initial=0))
            self._payload_prefix = prefix
        return prefix

    def __repr__(self) -> str:
        state = f"{len(self._records)} records" if self._records is not None else "not decoded"
        return f"DataBlock({self.entry!r}, {state})"


@dataclass(frozen=True, slots=True)
class FindResult:
    """Blocks to read for a fetch, the offset after the last of them, and whether the fetch is satisfied."""

    entries: tuple[IndexEntry, ...]
    next_offset: int
    fulfilled: bool


class ObjectReader:
    """An opened object: its verified index, and reads of its blocks."""

    key: str
    size_bytes: int
    index: tuple[IndexEntry, ...]
    has_checksums: bool
    footer: Footer
    block_crcs: tuple[int, ...] | None
    """CRC32C of each block in index order; None for an object without checksum section (AutoMQ's)."""

    def __init__(self, storage: RangeSource, key: str, size_bytes: int, tail: ObjectTail) -> None:
        self._storage = storage
        self.key = key
        self.size_bytes = size_bytes
        self.footer = tail.footer
        self.index = tail.index
        self.has_checksums = tail.block_crcs is not None
        self.block_crcs = tail.block_crcs
        self._slot_by_position = {e.start_position: i for i, e in enumerate(self.index)}
        self._search_keys = [(e.stream_id, e.end_offset) for e in self.index]

    @classmethod
    async def open(cls, storage: RangeSource, key: str, size_bytes: int) -> ObjectReader:
        """Read and verify the tail of ``key`` (``size_bytes`` long, as committed to metadata)."""
        if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 0:
            raise InvalidArgumentError(f"object size must be a non-negative int, got {size_bytes!r}")
        if size_bytes < FOOTER_SIZE:
            raise CorruptionError(
                f"object of {size_bytes} bytes is too small for a footer", source=key, position=0
            )
        guess = tail_guess_bytes(size_bytes)
        tail = await _get_exact(storage, key, size_bytes - guess, size_bytes, size_bytes)
        parsed = decode_tail(tail, object_size=size_bytes, source=key)
        if isinstance(parsed, NeedBytes):
            head = await _get_exact(storage, key, parsed.start, size_bytes - guess, size_bytes)
            parsed = decode_tail(head + tail, object_size=size_bytes, source=key)
            if isinstance(parsed, NeedBytes):  # pragma: no cover - decode_tail is deterministic
                raise CorruptionError("index block moved between reads", source=key, position=parsed.start)
        return cls(storage, key, size_bytes, parsed)

    @property
    def index_bytes(self) -> int:
        """Bytes of index block and checksum section this reader holds (what the reader cache counts)."""
        n = len(self.index)
        return n * INDEX_ENTRY_SIZE + (
            CHECKSUM_SECTION_HEADER_SIZE + n * BLOCK_CRC_SIZE if self.has_checksums else 0
        )

    def find(
        self,
        stream_id: int,
        start_offset: int,
        end_offset: int = NO_END_OFFSET,
        max_bytes: int = MAX_BYTES_UNBOUNDED,
    ) -> FindResult:
        """Blocks of ``stream_id`` covering ``[start_offset, end_offset)`` (-1: open end), AutoMQ's way.

        Starts at the block holding ``start_offset`` (none: empty result) and takes following blocks
        of the stream while they continue without a gap. ``max_bytes`` counts payload bytes of every
        block but the first partially needed one; the result is ``fulfilled`` once ``end_offset`` is
        reached or ``max_bytes`` is used up.
        """
        if start_offset < 0 or (end_offset != NO_END_OFFSET and end_offset < start_offset) or max_bytes < 0:
            raise InvalidArgumentError(
                f"bad find range: start {start_offset} end {end_offset} max_bytes {max_bytes}"
            )
        entries: list[IndexEntry] = []
        next_offset = start_offset
        remaining = max_bytes
        fulfilled = False
        i = bisect.bisect_right(self._search_keys, (stream_id, start_offset))
        index = self.index
        if i < len(index) and index[i].stream_id == stream_id and index[i].start_offset <= start_offset:
            for e in index[i:]:
                if e.stream_id != stream_id or e.start_offset > next_offset:
                    break
                if e.end_offset <= next_offset:
                    continue
                if e.start_offset == next_offset:
                    remaining -= min(remaining, e.payload_bytes)
                entries.append(e)
                next_offset = e.end_offset
                if (end_offset != NO_END_OFFSET and next_offset >= end_offset) or remaining == 0:
                    fulfilled = True
                    break
        return FindResult(tuple(entries), next_offset, fulfilled)

    async def read_blocks(self, entries: Sequence[IndexEntry], *, decode: bool = True) -> list[DataBlock]:
        """Read, verify and decode the given blocks (entries of this object's index), in order.

        ``decode=False`` checks each block's CRC32C and header now and leaves its records to be
        decoded and checked on first use (lazy :class:`DataBlock`: one bytes object per block).
        """
        out: list[DataBlock] = []
        for entry, buf, at in await self._read(entries):
            self._verify_crc(entry, buf, at)
            if decode:
                out.append(DataBlock(entry, decode_block(buf, at, entry, source=self.key)))
                continue
            check_block_header(buf, at, entry, source=self.key)
            size = entry.size_bytes
            data = buf if at == 0 and len(buf) == size else bytes(memoryview(buf)[at : at + size])
            out.append(DataBlock(entry, data=data, source=self.key))
        return out

    async def read_block_bytes(self, entries: Sequence[IndexEntry]) -> list[bytes]:
        """The verified raw bytes of the given blocks, in order (for copying blocks into new objects)."""
        out: list[bytes] = []
        for entry, buf, at in await self._read(entries):
            if self.has_checksums:
                self._verify_crc(entry, buf, at)
                check_block_header(buf, at, entry, source=self.key)
            else:
                decode_block(buf, at, entry, source=self.key)
            out.append(bytes(memoryview(buf)[at : at + entry.size_bytes]))
        return out

    # -- internals ------------------------------------------------------------------------------

    def _slot(self, entry: IndexEntry) -> int:
        slot = self._slot_by_position.get(getattr(entry, "start_position", -1))
        if slot is None or self.index[slot] != entry:
            raise InvalidArgumentError(f"{entry!r} is not an index entry of {self.key}")
        return slot

    def _verify_crc(self, entry: IndexEntry, buf: bytes, at: int) -> None:
        if self.block_crcs is not None:
            verify_crc(
                memoryview(buf)[at : at + entry.size_bytes],
                self.block_crcs[self._slot(entry)],
                what="data block",
                source=self.key,
                position=entry.start_position,
            )

    async def _read(self, entries: Sequence[IndexEntry]) -> list[tuple[IndexEntry, bytes, int]]:
        """Fetch the blocks; adjacent ones share one GET. Returns (entry, buffer, offset in buffer)."""
        runs: list[list[IndexEntry]] = []
        for entry in entries:
            self._slot(entry)
            if runs and runs[-1][-1].end_position == entry.start_position:
                runs[-1].append(entry)
            else:
                runs.append([entry])
        bufs = await asyncio.gather(
            *(
                _get_exact(
                    self._storage, self.key, run[0].start_position, run[-1].end_position, self.size_bytes
                )
                for run in runs
            )
        )
        out: list[tuple[IndexEntry, bytes, int]] = []
        for run, buf in zip(runs, bufs, strict=True):
            base = run[0].start_position
            out.extend((e, buf, e.start_position - base) for e in run)
        return out


async def _get_exact(storage: RangeSource, key: str, start: int, end: int, object_size: int) -> bytes:
    """``[start, end)`` of the object; a short read means the object is shorter than recorded."""
    try:
        data = await storage.get(key, start, end)
    except InvalidArgumentError as exc:  # the storage refuses a range past the object's real end
        raise CorruptionError(
            f"cannot read [{start}, {end}) of an object recorded as {object_size} bytes: {exc}",
            source=key,
            position=start,
        ) from exc
    if len(data) != end - start:
        raise CorruptionError(
            f"object is shorter than its recorded size {object_size}: read {len(data)} of {end - start} "
            f"bytes at [{start}, {end})",
            source=key,
            position=start + len(data),
        )
    return data
