"""The data block codec: encoding a block of record batches, and decoding one checked against its index entry.

Layout: ``docs/format.md`` section 2 (the data block, its header in :mod:`s3stream.objectformat.codec`).
Sans-IO: bytes in, values out; a decoder returns the records or raises
:class:`~s3stream.errors.CorruptionError` naming the source and the block's position.
"""

from __future__ import annotations

import functools
import operator
import struct
from collections.abc import Sequence
from typing import Any

from s3stream.errors import CorruptionError
from s3stream.native import NATIVE
from s3stream.objectformat.codec import (
    DATA_BLOCK_FLAG,
    DATA_BLOCK_HEADER,
    DATA_BLOCK_HEADER_SIZE,
    DATA_BLOCK_MAGIC,
    IndexEntry,
)
from s3stream.record import (
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    RECORD_MAGIC,
    SLOT_SETTERS,
    StreamRecordBatch,
    build_records,
)

# ---------------------------------------------------------------------------------------------
# Data blocks


def encode_block_header(record_count: int, data_length: int) -> bytes:
    return DATA_BLOCK_HEADER.pack(DATA_BLOCK_MAGIC, DATA_BLOCK_FLAG, record_count, data_length)


def encode_block(records: Sequence[StreamRecordBatch]) -> bytes:
    """One data block holding ``records`` (caller keeps them to one stream, in offset order)."""
    data_length = sum(RECORD_HEADER_SIZE + len(r.payload) for r in records)
    buf = bytearray(DATA_BLOCK_HEADER_SIZE + data_length)
    DATA_BLOCK_HEADER.pack_into(buf, 0, DATA_BLOCK_MAGIC, DATA_BLOCK_FLAG, len(records), data_length)
    pos = DATA_BLOCK_HEADER_SIZE
    for record in records:
        pos = record.encode_into(buf, pos)
    return bytes(buf)


def check_block_header(
    buf: bytes | bytearray | memoryview, pos: int, entry: IndexEntry, *, source: str
) -> None:
    """Check the block header at ``buf[pos:]`` against its index entry."""
    where = entry.start_position
    if len(buf) - pos < DATA_BLOCK_HEADER_SIZE:
        raise CorruptionError("truncated data block header", source=source, position=where)
    magic, _flag, record_count, data_length = DATA_BLOCK_HEADER.unpack_from(buf, pos)
    if magic != DATA_BLOCK_MAGIC:
        raise CorruptionError(f"bad data block magic 0x{magic & 0xFF:02x}", source=source, position=where)
    if record_count != entry.record_count:
        raise CorruptionError(
            f"data block holds {record_count} records, its index entry says {entry.record_count}",
            source=source,
            position=where,
        )
    if data_length != entry.size_bytes - DATA_BLOCK_HEADER_SIZE:
        raise CorruptionError(
            f"data block length {data_length} disagrees with its index entry size {entry.size_bytes}",
            source=source,
            position=where,
        )


def decode_block(
    buf: bytes | bytearray | memoryview, pos: int, entry: IndexEntry, *, source: str
) -> tuple[StreamRecordBatch, ...]:
    """Decode the data block at ``buf[pos : pos + entry.size_bytes]`` and check it against ``entry``.

    Checks: header magic, counts and length; every record's magic, stream id and non-negative
    fields; offsets ascending without overlap, starting at the entry's start offset and ending at
    its end offset; the records filling the block exactly.
    """
    return decode_block_gapless(buf, pos, entry, source=source)[0]


def decode_block_gapless(
    buf: bytes | bytearray | memoryview, pos: int, entry: IndexEntry, *, source: str
) -> tuple[tuple[StreamRecordBatch, ...], bool]:
    """:func:`decode_block`, and whether each record starts where the previous one ended (no gap
    in the block's offsets; the format allows gaps, a reader returning a contiguous range does not).

    Compiled (:mod:`s3stream.native`) when built; a block it does not accept (damage) goes to
    :func:`decode_block_gapless_py`, which raises the error."""
    if NATIVE is not None:
        decoded = NATIVE.decode_block(
            buf,
            pos,
            entry.stream_id,
            entry.start_offset,
            entry.end_offset,
            entry.record_count,
            entry.size_bytes,
            False,
        )
        if decoded is not None:
            return decoded[0], decoded[1]
    return decode_block_gapless_py(buf, pos, entry, source=source)


def decode_block_gapless_py(
    buf: bytes | bytearray | memoryview, pos: int, entry: IndexEntry, *, source: str
) -> tuple[tuple[StreamRecordBatch, ...], bool]:
    """:func:`decode_block_gapless` in pure Python: the reference implementation (the compiled one
    returns exactly its values, and defers to it wherever it raises)."""
    if len(buf) - pos < entry.size_bytes:
        raise CorruptionError("truncated data block", source=source, position=entry.start_position)
    check_block_header(buf, pos, entry, source=source)
    # slice payloads out of an immutable bytes object: one allocation and copy per payload
    data, lo = (
        (buf, pos) if isinstance(buf, bytes) else (bytes(memoryview(buf)[pos : pos + entry.size_bytes]), 0)
    )
    end = lo + entry.size_bytes
    last_header = end - RECORD_HEADER_SIZE
    cursor = lo + DATA_BLOCK_HEADER_SIZE
    shift = entry.start_position - lo
    stream = entry.stream_id
    expected_offset = entry.start_offset
    if entry.record_count and cursor <= last_header:
        magic, stream_id, _, base_offset, _, _ = RECORD_HEADER.unpack_from(data, cursor)
        if magic == RECORD_MAGIC and stream_id == stream and base_offset != expected_offset:
            raise CorruptionError(
                f"block starts at offset {base_offset}, its index entry says {expected_offset}",
                source=source,
                position=cursor + shift,
            )
    if entry.record_count and cursor <= last_header:
        uniform = _decode_uniform(data, cursor, end, entry)
        if uniform is not None:
            return uniform, True
    # The hot loop (one pass per record batch): locals only, the record built through its slots
    # (record.SLOT_SETTERS) inline, one check expression per batch.
    unpack = RECORD_HEADER.unpack_from
    header_size = RECORD_HEADER_SIZE
    good_magic = RECORD_MAGIC
    new = object.__new__
    cls = StreamRecordBatch
    set_stream_id, set_epoch, set_base_offset, set_count, set_payload = SLOT_SETTERS
    records: list[StreamRecordBatch] = []
    append = records.append
    gapless = True
    for _ in range(entry.record_count):
        if cursor > last_header:
            raise CorruptionError("truncated record batch header", source=source, position=cursor + shift)
        magic, stream_id, epoch, base_offset, count, length = unpack(data, cursor)
        start = cursor + header_size
        stop = start + length
        if (
            magic != good_magic
            or stream_id != stream
            or base_offset != expected_offset
            or (count | length) < 0
            or stop > end
        ):
            if (
                magic != good_magic
                or stream_id != stream
                or base_offset < expected_offset
                or (count | length) < 0
                or stop > end
            ):
                raise CorruptionError(
                    _record_problem(magic, stream_id, entry, count, length, base_offset, expected_offset),
                    source=source,
                    position=cursor + shift,
                )
            gapless = False  # a gap: allowed by the format
        record = new(cls)
        set_stream_id(record, stream_id)
        set_epoch(record, epoch)
        set_base_offset(record, base_offset)
        set_count(record, count)
        set_payload(record, data[start:stop])
        append(record)
        cursor = stop
        expected_offset = base_offset + count
    if cursor != end:
        raise CorruptionError(
            f"{end - cursor} unexpected bytes after the last record of the block",
            source=source,
            position=cursor + shift,
        )
    if expected_offset != entry.end_offset:
        raise CorruptionError(
            f"block records end at offset {expected_offset}, its index entry says {entry.end_offset}",
            source=source,
            position=entry.start_position,
        )
    return tuple(records), gapless


UNIFORM_ROWS_MAX = 128
"""Records one unpack of a uniform block reads: its flat tuple and column slices are the only
objects the garbage collector tracks (a tuple per record, all alive at once, drove young
collections)."""


@functools.lru_cache(maxsize=64)
def _uniform_layout(payload_bytes: int, rows: int) -> struct.Struct:
    """``rows`` records of ``payload_bytes`` each, back to back (header fields, then the payload)."""
    return struct.Struct(">" + (RECORD_HEADER.format.lstrip(">") + f"{payload_bytes}s") * rows)


def _decode_uniform(
    data: bytes, cursor: int, end: int, entry: IndexEntry
) -> tuple[StreamRecordBatch, ...] | None:
    """The records of ``data[cursor:end]`` if their payloads all have the first one's length and
    they continue each other without a gap from the entry's start to its end offset: header fields
    and payloads unpacked in runs of up to :data:`UNIFORM_ROWS_MAX` records into columns, the checks
    of the record-by-record loop done on whole columns, the records built by
    :func:`~s3stream.record.build_records`. Otherwise (sizes vary, a gap, or anything the loop
    reports as corruption) None: the loop decodes or reports it."""
    count = entry.record_count
    length = RECORD_HEADER.unpack_from(data, cursor)[5]
    stride = RECORD_HEADER_SIZE + length
    if length < 0 or end - cursor != count * stride:
        return None
    columns: list[list[Any]] = [[] for _ in range(7)]  # the record layout's seven fields
    magics, stream_ids, epochs, base_offsets, counts, lengths, payloads = columns
    left = count
    while left:
        rows = min(left, UNIFORM_ROWS_MAX)
        fields = _uniform_layout(length, rows).unpack_from(data, cursor)
        for k, column in enumerate(columns):
            column += fields[k::7]
        cursor += rows * stride
        left -= rows
    if (
        magics.count(RECORD_MAGIC) != count
        or stream_ids.count(entry.stream_id) != count
        or lengths.count(length) != count
        or min(counts) < 0
        or base_offsets[0] != entry.start_offset
    ):
        return None
    end_offsets = list(map(operator.add, base_offsets, counts))
    if end_offsets[-1] != entry.end_offset or end_offsets[:-1] != base_offsets[1:]:
        return None
    return build_records(stream_ids, epochs, base_offsets, counts, payloads)


def _record_problem(
    magic: int,
    stream_id: int,
    entry: IndexEntry,
    count: int,
    length: int,
    base_offset: int,
    expected_offset: int,
) -> str:
    if magic != RECORD_MAGIC:
        return f"bad record batch magic 0x{magic & 0xFF:02x}"
    if stream_id != entry.stream_id:
        return f"record of stream {stream_id} in a block of stream {entry.stream_id}"
    if count < 0 or length < 0:
        return "negative record batch count or length"
    if base_offset < expected_offset:
        return f"record batch at offset {base_offset} overlaps the previous one ending at {expected_offset}"
    return "record batch runs past the end of its data block"
