"""Fast decode of a data block of records that differ only in their offsets and payloads.

Layout: ``docs/format.md`` section 2 (data block) and "StreamRecordBatch". The usual block of a
producer with fixed-size batches holds records with one magic, stream id, epoch, count and payload
length, at offsets ``start, start + count, ...``: every record header is the first one with only its
base offset changed. Such a block is checked column by column on the bytes themselves: byte ``k`` of
every header is one strided slice (``data[10 + k :: stride]``, one C loop), compared at once with the
first header's byte repeated, and the base offsets are compared with the packed expected ones. The
payloads come from one ``struct`` unpack per run of records (payloads only, no header fields), and
the records are built from constant columns (:func:`~s3stream.record.build_records`).

Anything else (sizes, epochs or counts that vary, a gap, a damaged byte) goes to
:func:`~s3stream.objectformat.codec.decode_block_gapless`, which decodes it or reports the damage: this
module returns exactly what that function returns for every block it accepts, and accepts only
blocks it would decode without a gap.
"""

from __future__ import annotations

import functools
import struct
from typing import NamedTuple

from s3stream.native import NATIVE
from s3stream.objectformat.block import decode_block_gapless_py
from s3stream.objectformat.codec import (
    DATA_BLOCK_HEADER,
    DATA_BLOCK_HEADER_SIZE,
    DATA_BLOCK_MAGIC,
    I64_MAX,
    IndexEntry,
)
from s3stream.record import RECORD_HEADER, RECORD_HEADER_SIZE, RECORD_MAGIC, StreamRecordBatch, build_records

_BASE_OFFSET_AT = struct.calcsize(">bqq")
"""Where a record header's base offset starts (after magic, stream id and epoch)."""
_BASE_OFFSET_SIZE = struct.calcsize(">q")
_CONSTANT_BYTES = tuple(
    k for k in range(RECORD_HEADER_SIZE) if not _BASE_OFFSET_AT <= k < _BASE_OFFSET_AT + _BASE_OFFSET_SIZE
)
"""Header bytes equal in every record of a block this module decodes (all but the base offset)."""
PAYLOAD_ROWS_MAX = 128
"""Payloads one unpack reads (as codec.UNIFORM_ROWS_MAX: a bounded format, a small tuple)."""

assert _BASE_OFFSET_AT == 17
assert _BASE_OFFSET_SIZE == 8
assert RECORD_HEADER.format.lstrip(">")[3] == "q"  # the fourth field, the base offset, is an i64
assert len(_CONSTANT_BYTES) == RECORD_HEADER_SIZE - _BASE_OFFSET_SIZE


@functools.lru_cache(maxsize=64)
def _payloads_layout(payload_bytes: int, rows: int) -> struct.Struct:
    """``rows`` records of ``payload_bytes`` each: skip each header, take each payload."""
    return struct.Struct(">" + f"{RECORD_HEADER_SIZE}x{payload_bytes}s" * rows)


@functools.lru_cache(maxsize=64)
def _offsets_layout(rows: int) -> struct.Struct:
    return struct.Struct(f">{rows}q")


class DecodedBlock(NamedTuple):
    records: tuple[StreamRecordBatch, ...]
    gapless: bool
    """Each record starts where the previous one ended."""
    payload_bytes_each: int | None
    """The payload length of every record, when the fast path found them all alike (else None)."""


def decode_data_block(data: bytes, entry: IndexEntry, *, source: str) -> DecodedBlock:
    """The records of the data block ``data`` (exactly its bytes) and whether they have no gap:
    :func:`~s3stream.objectformat.codec.decode_block_gapless` of ``data`` at 0, faster for blocks of
    records that differ only in offsets and payloads (see the module docstring). Compiled
    (:mod:`s3stream.native`) when built: the same value, and a block it does not accept goes to
    :func:`decode_data_block_py`, which raises the error."""
    if NATIVE is not None:
        decoded = NATIVE.decode_block(
            data,
            0,
            entry.stream_id,
            entry.start_offset,
            entry.end_offset,
            entry.record_count,
            entry.size_bytes,
            True,
        )
        if decoded is not None:
            return DecodedBlock(*decoded)
    return decode_data_block_py(data, entry, source=source)


def decode_data_block_py(data: bytes, entry: IndexEntry, *, source: str) -> DecodedBlock:
    """:func:`decode_data_block` in pure Python: the reference implementation (the compiled one,
    :mod:`s3stream.native`, returns exactly its values and defers to it wherever it raises)."""
    records = _decode_offsets_and_payloads(data, entry)
    if records is not None:
        return DecodedBlock(records, True, len(records[0].payload))
    return DecodedBlock(*decode_block_gapless_py(data, 0, entry, source=source), None)


def _decode_offsets_and_payloads(data: bytes, entry: IndexEntry) -> tuple[StreamRecordBatch, ...] | None:
    """The records if every header is the first one with the base offset advanced by its count
    from the entry's start to its end offset (and the block's header agrees with the entry); else None."""
    count = entry.record_count
    size = entry.size_bytes
    first = DATA_BLOCK_HEADER_SIZE
    if type(data) is not bytes or len(data) != size or count <= 0 or size < first + RECORD_HEADER_SIZE:
        return None
    block_magic, _flag, record_count, data_length = DATA_BLOCK_HEADER.unpack_from(data, 0)
    if block_magic != DATA_BLOCK_MAGIC or record_count != count or data_length != size - first:
        return None
    magic, stream_id, epoch, base_offset, batch_count, length = RECORD_HEADER.unpack_from(data, first)
    stride = RECORD_HEADER_SIZE + length
    start = entry.start_offset
    if (
        magic != RECORD_MAGIC
        or stream_id != entry.stream_id
        or length < 0
        or batch_count <= 0
        or start < 0
        or base_offset != start
        or size - first != count * stride
        or start + count * batch_count != entry.end_offset
        or entry.end_offset > I64_MAX
    ):
        return None
    # byte k of every header at once: the first header's byte, repeated
    for k in _CONSTANT_BYTES:
        at = first + k
        if data[at:size:stride] != data[at : at + 1] * count:
            return None
    base_offsets = list(range(start, entry.end_offset, batch_count))
    expected = _offsets_layout(count).pack(*base_offsets)
    at = first + _BASE_OFFSET_AT
    for k in range(_BASE_OFFSET_SIZE):
        if data[at + k : size : stride] != expected[k::_BASE_OFFSET_SIZE]:
            return None
    payloads: list[bytes] = []
    cursor = first
    left = count
    while left:
        rows = min(left, PAYLOAD_ROWS_MAX)
        payloads += _payloads_layout(length, rows).unpack_from(data, cursor)
        cursor += rows * stride
        left -= rows
    return build_records([stream_id] * count, [epoch] * count, base_offsets, [batch_count] * count, payloads)
