"""ObjectWriter: encodes record batches into data blocks and streams the object out through an Upload.

Layout: ``docs/format.md`` section 2. Blocks hold one stream each and are cut when their payload
bytes reach ``block_size_bytes`` (the counter restarts for every stream and every block). Completed
blocks wait in a buffer until they reach ``part_size_bytes`` (or ``handover_bytes``) and are then
handed to ``Upload.write`` as one ``bytes`` (the buffer itself, not a copy); ``close`` writes the rest, the index block, the checksum section and
the footer. The whole object is never held in memory.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

from crc32c import crc32c

from s3stream.errors import ClosedError, CorruptionError, InvalidArgumentError
from s3stream.ids import StreamId
from s3stream.metadata.base import StreamOffsetRange
from s3stream.native import NATIVE
from s3stream.objectformat.block import check_block_header
from s3stream.objectformat.codec import (
    DATA_BLOCK_FLAG,
    DATA_BLOCK_HEADER,
    DATA_BLOCK_HEADER_SIZE,
    DATA_BLOCK_MAGIC,
    I32_MAX,
    I64_MAX,
    INDEX_ENTRY,
    IndexEntry,
)
from s3stream.objectformat.tail import encode_tail_index
from s3stream.record import RECORD_HEADER, RECORD_HEADER_SIZE, RECORD_MAGIC, StreamRecordBatch
from s3stream.storage.base import MIN_PART_SIZE_BYTES, Upload

DEFAULT_BLOCK_SIZE_BYTES = 1 << 20
DEFAULT_PART_SIZE_BYTES = 16 << 20
BLOCK_SIZE_MAX_BYTES = 1 << 30
BLOCK_DATA_MAX_BYTES = I32_MAX - DATA_BLOCK_HEADER_SIZE
_BLANK_BLOCK_HEADER = bytes(DATA_BLOCK_HEADER_SIZE)
"""A block's data length is an i32; a block is cut early rather than overflow it."""
RecordFields = tuple[int, int, int, int, bytes]
"""(stream id, epoch, base offset, count, payload): a record batch as :meth:`ObjectWriter.write_fields`
takes it (the LogCache's form; ``StreamRecordBatch(*fields)`` is the same batch)."""
_RECORD_PREFIX = struct.Struct(RECORD_HEADER.format[:4])
"""The record header's first fields (magic, stream id, epoch): one stream's records share them."""
_RECORD_TAIL = struct.Struct(">" + RECORD_HEADER.format[4:])
"""The rest (base offset, count, payload length): ``prefix + tail`` is :data:`RECORD_HEADER`."""
assert _RECORD_PREFIX.size + _RECORD_TAIL.size == RECORD_HEADER_SIZE


class RecordColumns(Protocol):
    """One stream's contiguous records as columns (the LogCache's ``StreamCache`` is one): record
    ``i`` is ``(stream_id, epoch if epochs is None else epochs[i], bases[i], count, payloads[i])``
    with ``count = bases[i + 1] - bases[i]`` (``end - bases[i]`` for the last one)."""

    @property
    def stream_id(self) -> int: ...
    @property
    def epoch(self) -> int | None: ...
    @property
    def epochs(self) -> Sequence[int] | None: ...
    @property
    def bases(self) -> Sequence[int]: ...
    @property
    def end(self) -> int: ...
    @property
    def payloads(self) -> Sequence[bytes]: ...


@dataclass(frozen=True)
class WrittenObject:
    """What ``ObjectWriter.close`` produced: the object's key, size, index and per-stream ranges."""

    key: str
    size_bytes: int
    index: tuple[IndexEntry, ...]
    known_stream_ranges: tuple[StreamOffsetRange, ...] | None = field(default=None, repr=False, compare=False)
    """The ranges if the producer had them at hand; else :attr:`stream_ranges` derives them."""

    @cached_property
    def stream_ranges(self) -> tuple[StreamOffsetRange, ...]:
        """Per stream ``[start, end)`` and payload bytes (built on first use: an object of 1,000
        streams takes ~5 ms, which the engine's uploads, knowing their ranges, never spend)."""
        if self.known_stream_ranges is not None:
            return self.known_stream_ranges
        return stream_ranges_of(self.index)


def stream_ranges_of(index: Iterable[IndexEntry]) -> tuple[StreamOffsetRange, ...]:
    """Per stream: ``[first block start, last block end)`` and its payload bytes, by stream id."""
    ranges: list[StreamOffsetRange] = []
    for e in index:
        if ranges and ranges[-1].stream_id == e.stream_id:
            last = ranges[-1]
            ranges[-1] = StreamOffsetRange(
                last.stream_id, last.start_offset, e.end_offset, last.size_bytes + e.payload_bytes
            )
        else:
            ranges.append(
                StreamOffsetRange(StreamId(e.stream_id), e.start_offset, e.end_offset, e.payload_bytes)
            )
    return tuple(ranges)


class ObjectWriter:
    """Writes one object. Calls must not overlap; batches arrive in (stream id, offset) order.

    A failed upload write or ``close`` leaves the writer closed (``ClosedError`` afterwards); the
    caller then calls ``abort``.
    """

    def __init__(
        self,
        upload: Upload,
        *,
        block_size_bytes: int = DEFAULT_BLOCK_SIZE_BYTES,
        part_size_bytes: int = DEFAULT_PART_SIZE_BYTES,
        handover_bytes: int | None = None,
    ) -> None:
        """``handover_bytes`` (at most the part size; default: the part size) lets completed blocks go
        to the upload in smaller pieces, for an upload that assembles its parts itself (the S3 and
        local stores do). Then the buffer never grows much past it: growing a buffer past the
        allocator's mmap threshold (glibc raises it to the size of the last large buffer freed, e.g.
        the previous object's) moves it with a copy into fresh pages, ~3.9 ms of loop CPU (2,000
        page faults) in one step once per 8 MiB object handed over whole."""
        if not 1 <= block_size_bytes <= BLOCK_SIZE_MAX_BYTES:
            raise InvalidArgumentError(f"block_size_bytes must be in [1, {BLOCK_SIZE_MAX_BYTES}]")
        if part_size_bytes <= 0:
            raise InvalidArgumentError("part_size_bytes must be positive")
        self._upload = upload
        self._block_size_bytes = block_size_bytes
        self._part_size_bytes = max(MIN_PART_SIZE_BYTES, part_size_bytes)
        self._handover_bytes = self._part_size_bytes
        if handover_bytes is not None:
            if handover_bytes <= 0:
                raise InvalidArgumentError("handover_bytes must be positive")
            self._handover_bytes = min(handover_bytes, self._part_size_bytes)
        self._bio = io.BytesIO()
        """Bytes not yet handed to the upload (always written at its end); its first byte is object
        position ``_flushed_bytes``. A part leaves as ``bytes`` (``getvalue`` hands over the buffer
        itself, no copy), which the S3 upload keeps by reference: a bytearray part was copied into
        the upload's pages (~1.3 ms of loop CPU per 8 MiB object, ~18 ms per 32 MiB one, mostly
        page faults on the fresh pages).
        It grows by appending (realloc, no zero-filling)."""
        self._flushed_bytes = 0
        self._index = bytearray()
        """The index block so far, each entry encoded as its data block is cut: no object per entry
        while the object is written (a tuple per entry was one more object per stream for the
        garbage collector to count and scan, 1,000 per upload of 1,000 streams; the IndexEntry
        objects are built once, at close)."""
        self._crcs: list[int] = []
        self._scratch = bytearray()
        """Where the compiled encoder puts a run of records before they join the buffer (reused: its
        pages are touched once per writer, and the run is still in the cache when copied)."""
        self._last_stream = -1
        self._last_end = 0
        # the open block (None: no open block)
        self._open_stream: int | None = None
        self._open_at = 0
        self._open_start_offset = 0
        self._open_count = 0
        self._open_payload_bytes = 0
        self._closed = False
        self._busy = False

    @property
    def key(self) -> str:
        return self._upload.key

    async def write(self, batches: Iterable[StreamRecordBatch]) -> None:
        """Append batches; they continue the (stream id, offset) order of every earlier call."""
        batches = list(batches)
        self._enter()
        try:
            if NATIVE is not None and NATIVE.check_batches(
                batches, self._last_stream, self._last_end, BLOCK_DATA_MAX_BYTES - RECORD_HEADER_SIZE
            ):
                i = 0
                while i < len(batches):
                    i = self._encode_batches(batches, i, len(batches))
                    await self._maybe_flush_part()
                return
            self._validate(batches)
            records = [(b.stream_id, b.epoch, b.base_offset, b.count, b.payload) for b in batches]
            i = 0
            while i < len(records):
                i = self._encode_from(records, i, len(records), check=False)
                await self._maybe_flush_part()
        finally:
            self._busy = False

    async def write_fields(
        self, records: Sequence[RecordFields], start: int = 0, end: int | None = None
    ) -> None:
        """:meth:`write` of ``records[start:end]`` given as field tuples (``RecordFields``, the
        StreamRecordBatch constructor's order), checked as they are encoded: no batch objects, no
        copy of the sequence. A record out of range or out of order raises ``InvalidArgumentError``
        after the records before it were encoded: the writer is then closed (the caller aborts).
        """
        n = len(records) if end is None else end
        await self._encode_checked(lambda i: self._encode_from(records, i, n, check=True), start, n)

    async def write_columns(self, columns: RecordColumns, start: int = 0, end: int | None = None) -> None:
        """:meth:`write_fields` of records ``[start, end)`` of one stream given as columns (no tuple per
        record: ~0.3 us a 1 KiB record against ~1 us through field tuples), checked as encoded."""
        if columns.epoch is None:  # mixed epochs (the stream was reopened within one block): rare
            epochs = columns.epochs
            assert epochs is not None
            bases, payloads, sid = columns.bases, columns.payloads, columns.stream_id
            n = len(bases) if end is None else end
            nexts = [*bases[start + 1 : n], columns.end] if n == len(bases) else bases[start + 1 : n + 1]
            records = [
                (sid, epochs[i], bases[i], nexts[i - start] - bases[i], payloads[i]) for i in range(start, n)
            ]
            await self.write_fields(records)
            return
        epoch, n = columns.epoch, len(columns.bases) if end is None else end
        await self._encode_checked(lambda i: self._encode_columns(columns, epoch, i, n), start, n)

    async def _encode_checked(self, encode: Callable[[int], int], start: int, end: int) -> None:
        """Encode records ``[start, end)`` a slice at a time (``encode(i)`` encodes from record ``i``
        and returns where it stopped), handing completed parts over between slices. A record that
        fails its check (``InvalidArgumentError``) closes the writer: the caller aborts."""
        self._enter()
        try:
            i = start
            while i < end:
                i = encode(i)
                await self._maybe_flush_part()
        except InvalidArgumentError:
            self._closed = True
            raise
        finally:
            self._busy = False

    async def write_streams(self, streams: Sequence[RecordColumns]) -> None:
        """:meth:`write_columns` of every record of each stream in turn, in one call (an upload of
        1,000 streams of a few records each spent more on a call per stream than on its records)."""
        for columns in streams:
            if columns.epoch is None:
                await self.write_columns(columns)
                continue
            # _encode_checked inlined: a coroutine call per stream cost more than a small stream's records
            self._enter()
            try:
                i, n = 0, len(columns.bases)
                while i < n:
                    i = self._encode_columns(columns, columns.epoch, i, n)
                    if self._open_stream is None and self._bio.tell() >= self._handover_bytes:
                        await self._flush_part()
            except InvalidArgumentError:
                self._closed = True
                raise
            finally:
                self._busy = False

    async def write_block(self, entry: IndexEntry, block: bytes | bytearray | memoryview) -> None:
        """Append one whole encoded data block verbatim (compaction copies); its position is re-based."""
        self._enter()
        try:
            self._validate_block(entry, block)
            self._cut_block()
            position = self._flushed_bytes + self._bio.tell()
            self._bio.write(block)
            self._index += INDEX_ENTRY.pack(
                entry.stream_id,
                entry.start_offset,
                entry.end_offset - entry.start_offset,
                entry.record_count,
                position,
                entry.size_bytes,
            )
            self._crcs.append(crc32c(block))
            self._last_stream, self._last_end = entry.stream_id, entry.end_offset
            await self._maybe_flush_part()
        finally:
            self._busy = False

    async def close(self) -> WrittenObject:
        """Write the remaining blocks, the index block, the checksum section and the footer; publish."""
        size_bytes = await self.finish()
        entries = tuple(
            IndexEntry(stream_id, start, start + delta, count, position, size)
            for stream_id, start, delta, count, position, size in INDEX_ENTRY.iter_unpack(self._index)
        )
        return WrittenObject(self._upload.key, size_bytes, entries)

    async def finish(self) -> int:
        """:meth:`close`, returning only the object's size: no :class:`IndexEntry` object is built
        (~0.5 us each; an upload of 1,000 streams needs none of them)."""
        self._enter()
        try:
            self._cut_block()
            index_position = self._flushed_bytes + self._bio.tell()
            self._bio.write(encode_tail_index(bytes(self._index), self._crcs, index_position=index_position))
            expected_size = self._flushed_bytes + self._bio.tell()
            self._closed = True  # one attempt: after a failure here the caller aborts
            await self._flush_part()
            size_bytes = await self._upload.complete()
        finally:
            self._busy = False
        if size_bytes != expected_size:
            raise CorruptionError(
                f"storage reports {size_bytes} bytes for an object of {expected_size} bytes",
                source=self._upload.key,
            )
        return size_bytes

    async def abort(self) -> None:
        """Give up: nothing of the object becomes visible. Allowed at any time, also after a failure."""
        self._closed = True
        self._bio = io.BytesIO()
        await self._upload.abort()

    # -- internals ------------------------------------------------------------------------------

    def _enter(self) -> None:
        if self._closed:
            raise ClosedError(f"object writer for {self._upload.key} is closed")
        if self._busy:
            raise InvalidArgumentError("ObjectWriter calls must not overlap")
        self._busy = True

    def _validate(self, batches: list[StreamRecordBatch]) -> None:
        last_stream, last_end = self._last_stream, self._last_end
        payload_max = BLOCK_DATA_MAX_BYTES - RECORD_HEADER_SIZE
        for b in batches:
            if type(b) is not StreamRecordBatch and not isinstance(b, StreamRecordBatch):
                raise InvalidArgumentError(f"expected StreamRecordBatch, got {type(b).__name__}")
            stream_id, base_offset, count = b.stream_id, b.base_offset, b.count
            end_offset = base_offset + count
            if not (0 <= stream_id <= I64_MAX and -(1 << 63) <= b.epoch <= I64_MAX and base_offset >= 0):
                raise InvalidArgumentError(f"record batch field out of range: {_describe(b)}")
            if not 1 <= count <= I32_MAX or end_offset > I64_MAX:
                raise InvalidArgumentError(f"record batch count out of range: {_describe(b)}")
            if len(b.payload) > payload_max:
                raise InvalidArgumentError(f"record batch payload too large: {_describe(b)}")
            if stream_id < last_stream or (stream_id == last_stream and base_offset < last_end):
                raise InvalidArgumentError(
                    f"record batches must come in (stream id, offset) order: {_describe(b)} after "
                    f"stream {last_stream} end offset {last_end}"
                )
            last_stream, last_end = stream_id, end_offset

    def _validate_block(self, entry: IndexEntry, block: bytes | bytearray | memoryview) -> None:
        if not isinstance(entry, IndexEntry):
            raise InvalidArgumentError(f"expected IndexEntry, got {type(entry).__name__}")
        if len(block) != entry.size_bytes or entry.size_bytes > BLOCK_DATA_MAX_BYTES + DATA_BLOCK_HEADER_SIZE:
            raise InvalidArgumentError(
                f"block of {len(block)} bytes for an entry of {entry.size_bytes} bytes"
            )
        if not (
            0 <= entry.stream_id <= I64_MAX
            and 0 <= entry.start_offset <= entry.end_offset <= I64_MAX
            and entry.end_offset - entry.start_offset <= I32_MAX
            and 1 <= entry.record_count <= I32_MAX
        ):
            raise InvalidArgumentError(f"index entry out of range: {entry}")
        if entry.stream_id < self._last_stream or (
            entry.stream_id == self._last_stream and entry.start_offset < self._last_end
        ):
            raise InvalidArgumentError(
                f"block of stream {entry.stream_id} at offset {entry.start_offset} is out of order after "
                f"stream {self._last_stream} end offset {self._last_end}"
            )
        try:
            check_block_header(block, 0, entry, source="<block>")
            if len(block) < DATA_BLOCK_HEADER_SIZE + RECORD_HEADER_SIZE:
                raise InvalidArgumentError("block too short for its records")
            magic, stream_id, _epoch, base_offset, _count, _length = RECORD_HEADER.unpack_from(
                block, DATA_BLOCK_HEADER_SIZE
            )
        except CorruptionError as exc:
            raise InvalidArgumentError(f"block does not match its index entry: {exc}") from exc
        if magic != RECORD_MAGIC or stream_id != entry.stream_id or base_offset != entry.start_offset:
            raise InvalidArgumentError("block's first record does not match its index entry")

    def _encode_from(self, records: Sequence[RecordFields], i: int, n: int, *, check: bool) -> int:
        """Encode ``records[i:n]`` until one closes a block; returns the index after the last encoded.

        The hot path: the open block's state lives in locals and is written back on the way out.
        With ``check`` each record is validated as it is encoded (:meth:`write_fields`); a bad one
        raises ``InvalidArgumentError`` with the records before it encoded.
        """
        write = self._bio.write
        size = self._bio.tell()
        pack = RECORD_HEADER.pack
        threshold = self._block_size_bytes
        part_size = self._handover_bytes
        stream = self._open_stream
        open_at = self._open_at
        start_offset = self._open_start_offset
        record_count = self._open_count
        payload_bytes = self._open_payload_bytes
        last_end = self._last_end
        last_stream = self._last_stream
        payload_max = BLOCK_DATA_MAX_BYTES - RECORD_HEADER_SIZE
        full = False
        while i < n:
            stream_id, epoch, base_offset, count, payload = records[i]
            i += 1
            length = len(payload)
            end_offset = base_offset + count
            if check and not (
                (stream_id > last_stream or (stream_id == last_stream and base_offset >= last_end))
                and 0 <= stream_id <= I64_MAX
                and 1 <= count <= I32_MAX
                and end_offset <= I64_MAX
                and -(1 << 63) <= epoch <= I64_MAX
                and base_offset >= 0
                and length <= payload_max
            ):
                self._open_count, self._open_payload_bytes = record_count, payload_bytes
                self._last_stream, self._last_end = last_stream, last_end
                raise InvalidArgumentError(
                    f"record out of range or out of (stream id, offset) order: stream {stream_id} "
                    f"offset {base_offset} count {count} payload {length} bytes after stream "
                    f"{last_stream} end offset {last_end}"
                )
            if (
                stream != stream_id
                or size - open_at + length + (RECORD_HEADER_SIZE - DATA_BLOCK_HEADER_SIZE)
                > BLOCK_DATA_MAX_BYTES
                or end_offset - start_offset > I32_MAX
            ):
                if stream is not None:
                    self._open_count, self._last_end = record_count, last_end
                    self._cut_block()
                    if size >= part_size:  # let the caller hand out a part first
                        self._last_stream = stream
                        return i - 1
                stream = stream_id
                open_at = size
                start_offset = base_offset
                record_count = payload_bytes = 0
                self._open_stream, self._open_at, self._open_start_offset = stream, open_at, start_offset
                write(_BLANK_BLOCK_HEADER)  # filled in when the block is cut
                size += DATA_BLOCK_HEADER_SIZE
            write(pack(RECORD_MAGIC, stream_id, epoch, base_offset, count, length))
            write(payload)
            size += RECORD_HEADER_SIZE + length
            record_count += 1
            payload_bytes += length
            last_end = end_offset
            last_stream = stream_id
            if payload_bytes >= threshold:
                full = True
                break
        self._open_count, self._open_payload_bytes = record_count, payload_bytes
        if stream is not None:
            self._last_stream, self._last_end = stream, last_end
        if full:
            self._cut_block()
        return i

    def _encode_batches(self, batches: list[StreamRecordBatch], i: int, n: int) -> int:
        """:meth:`_encode_from` of ``batches[i:n]`` (accepted by the compiled ``check_batches``), the
        records of each block encoded by the compiled ``encode_run`` in one call: the same bytes, the
        same blocks and the same stops for a part handover."""
        assert NATIVE is not None
        encode_run = NATIVE.encode_run
        threshold = self._block_size_bytes
        while i < n:
            batch = batches[i]
            size = self._bio.tell()
            stream = self._open_stream
            if (
                stream != batch.stream_id
                or size - self._open_at + len(batch.payload) + (RECORD_HEADER_SIZE - DATA_BLOCK_HEADER_SIZE)
                > BLOCK_DATA_MAX_BYTES
                or batch.base_offset + batch.count - self._open_start_offset > I32_MAX
            ):
                if stream is not None:
                    self._cut_block()
                    if size >= self._handover_bytes:  # let the caller hand out a part first
                        return i
                self._open_stream, self._open_at, self._open_start_offset = (
                    batch.stream_id,
                    size,
                    batch.base_offset,
                )
                self._open_count = self._open_payload_bytes = 0
                self._bio.write(_BLANK_BLOCK_HEADER)  # filled in when the block is cut
                size += DATA_BLOCK_HEADER_SIZE
            encoded_bytes, j, payload_bytes, last_end = encode_run(
                self._scratch,
                batches,
                i,
                n,
                batch.stream_id,
                size - self._open_at,
                self._open_start_offset,
                self._open_payload_bytes,
                threshold,
            )
            assert j > i, "a record that fits a block was not encoded"
            self._bio.write(memoryview(self._scratch)[:encoded_bytes])
            self._open_count += j - i
            self._open_payload_bytes = payload_bytes
            self._last_stream, self._last_end = batch.stream_id, last_end
            i = j
            if payload_bytes >= threshold:
                self._cut_block()
                return i
        return i

    def _encode_columns(self, columns: RecordColumns, epoch: int, i: int, n: int) -> int:
        """:meth:`_encode_from` of records ``[i, n)`` of one stream's columns with one epoch."""
        payloads = columns.payloads
        if NATIVE is not None and type(payloads) is list:
            return self._encode_columns_compiled(columns, payloads, epoch, i, n)
        return self._encode_columns_py(columns, epoch, i, n)

    def _encode_columns_compiled(
        self, columns: RecordColumns, payloads: list[bytes], epoch: int, i: int, n: int
    ) -> int:
        """:meth:`_encode_columns_py` with each block's run of records encoded by the compiled
        ``encode_columns_run``: the same bytes, blocks and stops. A record it does not take (one that
        fails the checks, or a payload that is not bytes) is left to :meth:`_encode_columns_py`, which
        raises or encodes it with the same state."""
        assert NATIVE is not None
        stream_id = columns.stream_id
        bases = columns.bases
        self._check_columns_from(columns, epoch, i)
        if self._open_stream is not None and self._open_stream != stream_id:
            self._cut_block()
            if self._bio.tell() >= self._handover_bytes:  # let the caller hand out a part first
                return i
        run = NATIVE.encode_columns_run
        threshold = self._block_size_bytes
        payload_max = BLOCK_DATA_MAX_BYTES - RECORD_HEADER_SIZE
        while i < n:
            opening = self._open_stream is None
            encoded_bytes, j, payload_bytes, last_end, deferred = run(
                self._scratch,
                bases,
                payloads,
                columns.end,
                i,
                n,
                stream_id,
                epoch,
                DATA_BLOCK_HEADER_SIZE if opening else self._bio.tell() - self._open_at,
                bases[i] if opening else self._open_start_offset,
                0 if opening else self._open_payload_bytes,
                threshold,
                payload_max,
            )
            if j > i:
                if opening:
                    size = self._bio.tell()
                    self._open_stream, self._open_at, self._open_start_offset = stream_id, size, bases[i]
                    self._open_count = 0
                    self._bio.write(_BLANK_BLOCK_HEADER)  # filled in when the block is cut
                self._bio.write(memoryview(self._scratch)[:encoded_bytes])
                self._open_count += j - i
                self._open_payload_bytes = payload_bytes
                self._last_stream, self._last_end = stream_id, last_end
                i = j
                if payload_bytes >= threshold:
                    self._cut_block()
                    return i
            if deferred:
                return self._encode_columns_py(columns, epoch, i, n)
            if i < n:  # record i does not fit the open block
                assert not opening, "a record that fits an empty block was not encoded"
                size = self._bio.tell()
                self._cut_block()
                if size >= self._handover_bytes:  # let the caller hand out a part first
                    return i
        return i

    def _check_columns_from(self, columns: RecordColumns, epoch: int, i: int) -> None:
        """The stream's order and ranges, checked before its records ``[i, ...)`` are encoded."""
        stream_id = columns.stream_id
        bases = columns.bases
        last_stream, last_end = self._last_stream, self._last_end
        if not (
            (stream_id > last_stream or (stream_id == last_stream and bases[i] >= last_end))
            and 0 <= stream_id <= I64_MAX
            and -(1 << 63) <= epoch <= I64_MAX
            and bases[i] >= 0
            and columns.end <= I64_MAX
        ):
            raise InvalidArgumentError(
                f"records of stream {stream_id} (epoch {epoch}) from offset {bases[i]} out of range or "
                f"out of (stream id, offset) order after stream {last_stream} end offset {last_end}"
            )

    def _encode_columns_py(self, columns: RecordColumns, epoch: int, i: int, n: int) -> int:
        """:meth:`_encode_columns` in pure Python."""
        stream_id = columns.stream_id
        bases = columns.bases
        self._check_columns_from(columns, epoch, i)
        last_end = self._last_end
        count = len(bases)
        if i == 0 and n == count:  # the whole stream (the common case): no slice of the payloads
            payloads = columns.payloads
            records = zip(bases, [*bases[1:], columns.end], payloads, strict=True)
        else:
            nexts = bases[i + 1 : n + 1]
            records = zip(
                bases[i:n], [*nexts, columns.end] if n == count else nexts, columns.payloads[i:n], strict=True
            )
        write = self._bio.write
        size = self._bio.tell()
        pack = _RECORD_TAIL.pack
        prefix = _RECORD_PREFIX.pack(RECORD_MAGIC, stream_id, epoch)
        threshold = self._block_size_bytes
        # the open block's data (after its header) must stay <= BLOCK_DATA_MAX_BYTES
        room_max = BLOCK_DATA_MAX_BYTES + DATA_BLOCK_HEADER_SIZE - RECORD_HEADER_SIZE
        payload_max = BLOCK_DATA_MAX_BYTES - RECORD_HEADER_SIZE
        open_at = self._open_at
        start_offset = self._open_start_offset
        record_count = self._open_count
        payload_bytes = self._open_payload_bytes
        if self._open_stream is not None and self._open_stream != stream_id:
            self._cut_block()
            if size >= self._handover_bytes:  # let the caller hand out a part first
                return i
        full = False
        for base, end_offset, payload in records:
            length = len(payload)
            if not (1 <= end_offset - base <= I32_MAX and end_offset <= I64_MAX and length <= payload_max):
                self._open_count, self._open_payload_bytes, self._last_end = (
                    record_count,
                    payload_bytes,
                    last_end,
                )
                raise InvalidArgumentError(
                    f"record of stream {stream_id} at offset {base}: count {end_offset - base} or payload "
                    f"{length} bytes out of range"
                )
            if (
                self._open_stream is None
                or size - open_at + length > room_max
                or (end_offset - start_offset > I32_MAX)
            ):
                if self._open_stream is not None:
                    self._open_count, self._last_end = record_count, last_end
                    self._cut_block()
                    if size >= self._handover_bytes:  # let the caller hand out a part first
                        self._last_stream = stream_id
                        return i
                open_at = size
                start_offset = base
                record_count = payload_bytes = 0
                self._open_stream, self._open_at, self._open_start_offset = stream_id, open_at, base
                write(_BLANK_BLOCK_HEADER)  # filled in when the block is cut
                size += DATA_BLOCK_HEADER_SIZE
            write(prefix)
            write(pack(base, end_offset - base, length))
            write(payload)
            size += RECORD_HEADER_SIZE + length
            i += 1
            record_count += 1
            payload_bytes += length
            last_end = end_offset
            if payload_bytes >= threshold:
                full = True
                break
        self._open_count, self._open_payload_bytes = record_count, payload_bytes
        self._last_stream, self._last_end = stream_id, last_end
        if full:
            self._cut_block()
        return i

    def _cut_block(self) -> None:
        if self._open_stream is None:
            return
        at = self._open_at
        size = self._bio.tell() - at
        self._index += INDEX_ENTRY.pack(
            self._open_stream,
            self._open_start_offset,
            self._last_end - self._open_start_offset,
            self._open_count,
            self._flushed_bytes + at,
            size,
        )
        with self._bio.getbuffer() as view:  # released at once: the buffer cannot grow meanwhile
            DATA_BLOCK_HEADER.pack_into(
                view, at, DATA_BLOCK_MAGIC, DATA_BLOCK_FLAG, self._open_count, size - DATA_BLOCK_HEADER_SIZE
            )
            self._crcs.append(crc32c(view[at:]))
        self._open_stream = None

    async def _maybe_flush_part(self) -> None:
        if self._open_stream is None and self._bio.tell() >= self._handover_bytes:
            await self._flush_part()

    async def _flush_part(self) -> None:
        """Hand every completed byte in the buffer to the upload, as one ``bytes`` (no copy)."""
        assert self._open_stream is None
        part = self._bio.getvalue()
        if not part:
            return
        self._flushed_bytes += len(part)
        self._bio = io.BytesIO()
        try:
            await self._upload.write(part)
        except BaseException:
            self._closed = True  # the object is incomplete: only abort() is left
            raise


def _describe(b: StreamRecordBatch) -> str:
    return f"stream {b.stream_id} offset {b.base_offset} count {b.count} payload {len(b.payload)} bytes"
