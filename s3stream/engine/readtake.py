"""How a read takes records out of decoded data blocks: contiguous from its start offset, up to its
end offset and byte budget, anything else reported as corruption.

Pure: the reader (:mod:`s3stream.engine.reader`) hands each block of its window in offset order to
:func:`take_slice` (a block without gaps: one slice) or :func:`take_each` (record by record).
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Sequence
from typing import NoReturn

from s3stream.engine.readstate import BlockRef
from s3stream.errors import CorruptionError
from s3stream.objectformat import DataBlock
from s3stream.record import StreamRecordBatch

_BASE_OFFSET = operator.attrgetter("base_offset")


def first_index(
    records: Sequence[StreamRecordBatch], out: list[StreamRecordBatch], start_offset: int, next_offset: int
) -> int:
    """Index of the first record to take: the one at ``next_offset`` (or, for the first record of
    the result, the one holding ``start_offset``; a record ending before it is skipped)."""
    i = max(0, bisect.bisect_right(records, next_offset, key=_BASE_OFFSET) - 1)
    if not out and i < len(records) and records[i].base_offset + records[i].count <= start_offset:
        i += 1  # ends before the start: the start lies in a later record or block
    return i


def take_slice(
    out: list[StreamRecordBatch],
    block: DataBlock,
    ref: BlockRef,
    start_offset: int,
    next_offset: int,
    end_offset: int,
    budget: int,
) -> tuple[int, int, bool]:
    """Take records of a contiguous block as one slice: from the record at ``next_offset`` while
    they start before ``end_offset`` and the budget before each is positive (the first one always).
    Returns the new next offset, the budget left and whether the read is done."""
    records = block.records
    n = len(records)
    i = first_index(records, out, start_offset, next_offset)
    if i == n:
        return next_offset, budget, False
    base = records[i].base_offset
    if base >= end_offset or (out and budget <= 0):
        return next_offset, budget, True
    if base != next_offset if out else base > start_offset:
        raise_unexpected(ref, records[i], next_offset)
    prefix = block.payload_prefix
    j = bisect.bisect_left(records, end_offset, i, n, key=_BASE_OFFSET)
    j = min(j, bisect.bisect_left(prefix, budget + prefix[i], i + 1, n))
    out.extend(records[i:j])
    return records[j - 1].base_offset + records[j - 1].count, budget - (prefix[j] - prefix[i]), j < n


def take_each(
    out: list[StreamRecordBatch],
    block: DataBlock,
    ref: BlockRef,
    start_offset: int,
    next_offset: int,
    end_offset: int,
    budget: int,
) -> tuple[int, int, bool]:
    """:func:`take_slice` record by record, for a block with a gap (reported once it is reached)."""
    records = block.records
    n = len(records)
    i = first_index(records, out, start_offset, next_offset)
    while i < n:
        record = records[i]
        base = record.base_offset
        if base >= end_offset or (out and budget <= 0):
            return next_offset, budget, True
        if base != next_offset if out else base > start_offset:
            raise_unexpected(ref, record, next_offset)
        out.append(record)
        next_offset = base + record.count
        budget -= len(record.payload)
        i += 1
    return next_offset, budget, False


def raise_unexpected(ref: BlockRef, record: StreamRecordBatch, next_offset: int) -> NoReturn:
    base = record.base_offset
    raise CorruptionError(
        f"stream {record.stream_id}: batch [{base}, {base + record.count}) where offset "
        f"{next_offset} was expected",
        source=ref.key,
        position=ref.entry.start_position,
    )
