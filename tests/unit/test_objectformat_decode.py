"""The fast data-block decode (records that differ only in offsets and payloads, checked column by
column on the bytes): the same records, gap verdict and errors as codec.decode_block_gapless for
every block, damaged ones included; it takes only the blocks it can."""

from __future__ import annotations

import itertools
import random

import pytest

from s3stream.errors import CorruptionError
from s3stream.objectformat import DataBlock, decode
from s3stream.objectformat.block import decode_block_gapless, encode_block
from s3stream.objectformat.codec import DATA_BLOCK_HEADER_SIZE, IndexEntry
from s3stream.objectformat.decode import PAYLOAD_ROWS_MAX, decode_data_block
from s3stream.record import RECORD_HEADER_SIZE, StreamRecordBatch

STREAM = 7


def _records(
    count: int, size: int, *, base: int = 100, batch_count: int = 1, epochs: list[int] | None = None
) -> list[StreamRecordBatch]:
    return [
        StreamRecordBatch(
            STREAM, epochs[i] if epochs else 3, base + i * batch_count, batch_count, bytes([i % 251]) * size
        )
        for i in range(count)
    ]


def _block(records: list[StreamRecordBatch], position: int = 4096) -> tuple[IndexEntry, bytes]:
    data = encode_block(records)
    end = records[-1].base_offset + records[-1].count
    return IndexEntry(STREAM, records[0].base_offset, end, len(records), position, len(data)), data


def _outcome(fn: object, data: bytes, entry: IndexEntry) -> object:
    try:
        if fn is decode_block_gapless:
            return decode_block_gapless(data, 0, entry, source="k")
        return decode_data_block(data, entry, source="k")[:2]
    except CorruptionError as exc:
        return ("error", str(exc), exc.source, exc.position)


def _same_as_codec(data: bytes, entry: IndexEntry) -> object:
    expected = _outcome(decode_block_gapless, data, entry)
    assert _outcome(decode_data_block, data, entry) == expected
    return expected


@pytest.mark.parametrize("size", [0, 1, 1024])
@pytest.mark.parametrize("count", [1, 5, PAYLOAD_ROWS_MAX, 2 * PAYLOAD_ROWS_MAX + 3])
@pytest.mark.parametrize("batch_count", [1, 3])
def test_a_block_of_like_records_is_decoded_column_wise(size: int, count: int, batch_count: int) -> None:
    records = _records(count, size, batch_count=batch_count)
    entry, data = _block(records)
    fast = decode._decode_offsets_and_payloads(data, entry)
    assert fast == tuple(records)
    assert all(type(r.payload) is bytes for r in fast)
    assert decode_data_block(data, entry, source="k") == (tuple(records), True, size)


@pytest.mark.parametrize(
    "records",
    [
        _records(4, 10, epochs=[1, 1, 2, 2]),  # the epoch changes within the block
        [*_records(2, 10), StreamRecordBatch(STREAM, 3, 102, 2, b"x" * 10)],  # counts vary
        [*_records(2, 10), StreamRecordBatch(STREAM, 3, 102, 1, b"x" * 11)],  # sizes vary
        [*_records(2, 10), StreamRecordBatch(STREAM, 3, 105, 1, b"x" * 10)],  # a gap
        _records(3, 10, batch_count=0),  # empty batches
    ],
    ids=["epochs-vary", "counts-vary", "sizes-vary", "gap", "zero-counts"],
)
def test_other_blocks_go_to_the_codec(records: list[StreamRecordBatch]) -> None:
    entry, data = _block(records)
    assert decode._decode_offsets_and_payloads(data, entry) is None
    _same_as_codec(data, entry)


def test_a_buffer_that_is_not_bytes_goes_to_the_codec() -> None:
    entry, data = _block(_records(20, 16))
    assert decode._decode_offsets_and_payloads(bytearray(data), entry) is None  # type: ignore[arg-type]
    decoded = decode_data_block(bytearray(data), entry, source="k")  # type: ignore[arg-type]
    assert decoded == (tuple(_records(20, 16)), True, None)


@pytest.mark.parametrize("size", [0, 1, 40])
def test_every_damaged_header_byte_gives_what_the_codec_gives(size: int) -> None:
    entry, data = _block(_records(6, size))
    stride = RECORD_HEADER_SIZE + size
    positions = list(range(DATA_BLOCK_HEADER_SIZE + 3 * stride))  # block header, first three records
    positions += [DATA_BLOCK_HEADER_SIZE + 5 * stride + k for k in range(RECORD_HEADER_SIZE)]  # the last
    errors = 0
    for pos in positions:
        for flip in (0x01, 0x80, 0xFF):
            damaged = bytearray(data)
            damaged[pos] ^= flip
            outcome = _same_as_codec(bytes(damaged), entry)
            errors += isinstance(outcome, tuple) and outcome[0] == "error"
    assert errors > len(positions)  # most damage is reported, the rest decodes as the codec does


def test_random_damage_and_entries_give_what_the_codec_gives() -> None:
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    for _ in range(300):
        count, size = rng.randint(1, 300), rng.choice([0, 1, 7, 64, 1024])
        entry, data = _block(
            _records(count, size, base=rng.randint(0, 1 << 40), batch_count=rng.randint(1, 4))
        )
        damaged = bytearray(data)
        for _ in range(rng.randint(0, 3)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        fields = [entry.stream_id, entry.start_offset, entry.end_offset, entry.record_count, entry.size_bytes]
        if rng.random() < 0.3:
            k = rng.randrange(len(fields))
            fields[k] += rng.choice([-1, 1])
        sid, start, end, records, size_bytes = fields
        bent = IndexEntry(sid, start, end, records, entry.start_position, size_bytes)
        if size_bytes != len(damaged):
            continue  # the reader never hands a block of another size (DataBlock checks it)
        assert _outcome(decode_data_block, bytes(damaged), bent) == _outcome(
            decode_block_gapless, bytes(damaged), bent
        ), f"seed {seed}"


@pytest.mark.parametrize("sizes", [[7] * 9, [0] * 4, [3, 7, 7, 1]])
def test_a_lazy_blocks_payload_prefix_sums_its_payloads(sizes: list[int]) -> None:
    records = [StreamRecordBatch(STREAM, 3, 100 + i, 1, b"p" * n) for i, n in enumerate(sizes)]
    entry, data = _block(records)
    block = DataBlock(entry, data=data, source="k")
    assert list(block.payload_prefix) == list(itertools.accumulate(sizes, initial=0))
    assert block.records == tuple(records)
