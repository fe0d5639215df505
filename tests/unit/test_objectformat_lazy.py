"""Lazy data blocks (``ObjectReader.read_blocks(decode=False)``): what is checked at load, what on first read."""

from __future__ import annotations

import pytest

from s3stream.errors import CorruptionError, InvalidArgumentError
from s3stream.objectformat import DataBlock, IndexEntry, ObjectReader, encode_block
from s3stream.objectformat.block import decode_block_gapless
from s3stream.record import StreamRecordBatch
from s3stream.storage.memory import MemoryObjectStorage
from tests.unit.test_objectformat import (
    AUTOMQ_OBJECT,
    ENTRY0,
    ENTRY1,
    OBJECT,
    _automq_block,
    _automq_object,
    _flip,
)
from tests.unit.test_record import RECORD_A, RECORD_B, RECORD_C


async def _reader(data: bytes) -> ObjectReader:
    storage = MemoryObjectStorage()
    await storage.put("obj", data)
    return await ObjectReader.open(storage, "obj", len(data))


async def test_lazy_blocks_decode_on_first_read_to_the_eager_records() -> None:
    reader = await _reader(OBJECT)
    lazy = await reader.read_blocks(reader.index, decode=False)
    assert [b.decoded for b in lazy] == [False, False]
    assert [b.records for b in lazy] == [(RECORD_A, RECORD_B), (RECORD_C,)]
    assert [b.decoded for b in lazy] == [True, True]
    assert lazy[0].records is lazy[0].records  # decoded once, then kept
    eager = await reader.read_blocks(reader.index)
    assert all(b.decoded for b in eager)
    assert [b.records for b in eager] == [b.records for b in lazy]


async def test_each_lazy_block_holds_exactly_its_own_bytes_not_the_merged_get() -> None:
    reader = await _reader(OBJECT)
    blocks = await reader.read_blocks(reader.index, decode=False)  # one GET for both blocks
    # a block kept in a cache must not pin the buffer of the whole GET it came with
    assert [len(b._data or b"") for b in blocks] == [ENTRY0.size_bytes, ENTRY1.size_bytes]
    assert blocks[0].records == (RECORD_A, RECORD_B)
    assert blocks[0]._data is None  # decoded: the bytes are dropped, the payloads are copies


@pytest.mark.parametrize("position", range(ENTRY1.end_position))
async def test_every_byte_flip_of_a_block_fails_a_lazy_load_by_its_crc(position: int) -> None:
    reader = await _reader(_flip(OBJECT, position, 0xFF))  # index and footer intact: it opens
    with pytest.raises(CorruptionError, match="data block CRC32C") as info:
        await reader.read_blocks(reader.index, decode=False)
    assert info.value.position == (0 if position < ENTRY1.start_position else ENTRY1.start_position)


@pytest.mark.parametrize(
    ("position", "byte", "match"),
    [(0, 0x5B, "data block magic"), (2, 0x01, "records"), (9, 0x4B, "length")],
)
async def test_without_checksums_block_header_damage_fails_the_lazy_load(
    position: int, byte: int, match: str
) -> None:
    data = bytearray(AUTOMQ_OBJECT)
    data[position] = byte
    reader = await _reader(bytes(data))
    with pytest.raises(CorruptionError, match=match) as info:
        await reader.read_blocks(reader.index, decode=False)
    assert (info.value.source, info.value.position) == ("obj", 0)


@pytest.mark.parametrize(
    ("position", "byte", "match", "at"),
    [(10, 0x21, "record batch magic", 10), (17, 0x08, "stream", 10), (33, 0x65, "starts at offset", 10)],
)
async def test_without_checksums_record_damage_raises_on_every_read_of_the_records(
    position: int, byte: int, match: str, at: int
) -> None:
    data = bytearray(AUTOMQ_OBJECT)
    data[position] = byte
    reader = await _reader(bytes(data))
    [block, _] = await reader.read_blocks(reader.index, decode=False)  # header fine: loads
    for _ in range(2):  # a failed decode keeps nothing: the next read fails the same way
        with pytest.raises(CorruptionError, match=match) as info:
            _ = block.records
        assert (info.value.source, info.value.position) == ("obj", at)
    assert not block.decoded


async def test_without_checksums_trailing_bytes_in_a_lazy_block_are_corruption() -> None:
    block_bytes = _automq_block([RECORD_A, RECORD_B], b"\0" * 5)
    entry = IndexEntry(7, 100, 103, 2, 0, len(block_bytes))
    reader = await _reader(_automq_object(block_bytes, entry))
    [block] = await reader.read_blocks(reader.index, decode=False)
    with pytest.raises(CorruptionError, match="unexpected bytes after the last record"):
        _ = block.records


def test_contiguity_and_payload_prefix() -> None:
    s = 4
    gapped = [StreamRecordBatch(s, 0, 0, 2, b"ab"), StreamRecordBatch(s, 0, 3, 2, b"cde")]
    data = encode_block(gapped)
    block = DataBlock(IndexEntry(s, 0, 5, 2, 0, len(data)), data=data, source="x")
    assert not block.contiguous
    assert block.payload_prefix == [0, 2, 5]
    whole = [StreamRecordBatch(s, 0, 0, 3, b""), StreamRecordBatch(s, 0, 3, 2, b"x" * 7)]
    assert DataBlock(IndexEntry(s, 0, 5, 2, 0, 0), whole).contiguous
    assert DataBlock(IndexEntry(s, 0, 5, 2, 0, 0), whole).payload_prefix == [0, 0, 7]


def test_a_data_block_takes_records_or_bytes_of_its_size() -> None:
    entry = IndexEntry(7, 100, 103, 2, 0, 84)
    with pytest.raises(InvalidArgumentError):
        DataBlock(entry)
    with pytest.raises(InvalidArgumentError):
        DataBlock(entry, [RECORD_A], data=b"x" * 84)
    with pytest.raises(InvalidArgumentError):
        DataBlock(entry, data=b"x" * 83)
    assert "not decoded" in repr(DataBlock(entry, data=b"x" * 84))


def test_decode_reports_whether_the_block_has_offset_gaps() -> None:
    s = 4
    for records, gapless in [
        ([StreamRecordBatch(s, 0, 0, 2, b"ab"), StreamRecordBatch(s, 0, 2, 3, b"c")], True),
        ([StreamRecordBatch(s, 0, 0, 2, b"ab"), StreamRecordBatch(s, 0, 3, 2, b"c")], False),
    ]:
        data = encode_block(records)
        entry = IndexEntry(s, 0, 5, 2, 0, len(data))
        assert decode_block_gapless(data, 0, entry, source="x") == (tuple(records), gapless)
        assert DataBlock(entry, data=data).contiguous is gapless
