"""The uniform-block decode: a block whose payloads all have one length is decoded column-wise,
to the same records, the same gap verdict and the same errors as the record-by-record loop."""

from __future__ import annotations

import itertools

import pytest

from s3stream.errors import CorruptionError
from s3stream.objectformat import block
from s3stream.objectformat.block import UNIFORM_ROWS_MAX, decode_block_gapless, encode_block
from s3stream.objectformat.codec import DATA_BLOCK_HEADER_SIZE, IndexEntry
from s3stream.record import RECORD_HEADER_SIZE, StreamRecordBatch, build_records

STREAM = 7


def _records(
    sizes: list[int], *, base: int = 100, counts: list[int] | None = None
) -> list[StreamRecordBatch]:
    out = []
    offset = base
    for i, size in enumerate(sizes):
        count = counts[i] if counts else 1
        out.append(StreamRecordBatch(STREAM, i % 3, offset, count, bytes([i % 251]) * size))
        offset += count
    return out


def _block(records: list[StreamRecordBatch]) -> tuple[IndexEntry, bytes]:
    data = encode_block(records)
    end = records[-1].base_offset + records[-1].count
    return IndexEntry(STREAM, records[0].base_offset, end, len(records), 0, len(data)), data


def _outcome(data: bytes, entry: IndexEntry) -> object:
    try:
        return decode_block_gapless(data, 0, entry, source="x")
    except CorruptionError as exc:
        return ("error", str(exc), exc.position)


def _loop_outcome(data: bytes, entry: IndexEntry, monkeypatch: pytest.MonkeyPatch) -> object:
    with monkeypatch.context() as m:
        m.setattr(block, "_decode_uniform", lambda *_: None)
        return _outcome(data, entry)


@pytest.mark.parametrize("size", [0, 1, 1024])
@pytest.mark.parametrize("count", [1, 5, UNIFORM_ROWS_MAX, 2 * UNIFORM_ROWS_MAX + 3])
def test_a_uniform_block_is_decoded_column_wise_to_the_records(size: int, count: int) -> None:
    records = _records([size] * count, counts=[1 + i % 4 for i in range(count)])
    entry, data = _block(records)
    fast = block._decode_uniform(data, DATA_BLOCK_HEADER_SIZE, len(data), entry)
    assert fast == tuple(records)
    assert decode_block_gapless(data, 0, entry, source="x") == (tuple(records), True)


@pytest.mark.parametrize(
    "records",
    [
        _records([10, 10, 11, 10]),  # sizes vary
        [
            *_records([10, 10, 10], counts=[1, 1, 1])[:1],
            StreamRecordBatch(STREAM, 0, 105, 1, b"x" * 10),
        ],  # gap
    ],
    ids=["sizes-vary", "gap"],
)
def test_other_blocks_are_left_to_the_record_loop(records: list[StreamRecordBatch]) -> None:
    entry, data = _block(records)
    assert block._decode_uniform(data, DATA_BLOCK_HEADER_SIZE, len(data), entry) is None
    gapless = all(a.base_offset + a.count == b.base_offset for a, b in itertools.pairwise(records))
    assert decode_block_gapless(data, 0, entry, source="x") == (tuple(records), gapless)


UNIFORM_ENTRY, UNIFORM_DATA = _block(_records([8] * 4))


@pytest.mark.parametrize("position", range(len(UNIFORM_DATA)))
@pytest.mark.parametrize("byte", [0x00, 0x80, 0xFF])
def test_every_byte_change_of_a_uniform_block_decodes_or_fails_as_the_record_loop_does(
    position: int, byte: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = bytearray(UNIFORM_DATA)
    data[position] = byte
    changed = bytes(data)
    assert _outcome(changed, UNIFORM_ENTRY) == _loop_outcome(changed, UNIFORM_ENTRY, monkeypatch)


def test_a_bad_record_in_a_uniform_block_is_reported_at_its_position() -> None:
    entry, data = _block(_records([16] * 6))
    at = DATA_BLOCK_HEADER_SIZE + 3 * (RECORD_HEADER_SIZE + 16)  # fourth record's magic
    with pytest.raises(CorruptionError, match="bad record batch magic") as info:
        decode_block_gapless(data[:at] + b"\x00" + data[at + 1 :], 0, entry, source="x")
    assert info.value.position == at


def test_build_records_makes_the_records_the_constructor_makes() -> None:
    records = _records([3, 0, 5], counts=[2, 1, 7])
    built = build_records(
        [r.stream_id for r in records],
        [r.epoch for r in records],
        [r.base_offset for r in records],
        [r.count for r in records],
        [r.payload for r in records],
    )
    assert built == tuple(records)
    assert build_records([], [], [], [], []) == ()
