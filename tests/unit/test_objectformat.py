"""Object format: golden bytes of docs/format.md section 2, writer rules, find, verified reads."""

from __future__ import annotations

import asyncio

import pytest
from crc32c import crc32c

from s3stream.errors import (
    ClosedError,
    CorruptionError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from s3stream.ids import StreamId
from s3stream.metadata.base import StreamOffsetRange
from s3stream.objectformat import (
    IndexEntry,
    ObjectReader,
    ObjectReaderCache,
    ObjectWriter,
    encode_block,
    encode_tail,
)
from s3stream.objectformat.codec import FOOTER_SIZE, Footer, NeedBytes, tail_guess_bytes
from s3stream.objectformat.tail import decode_footer, decode_tail, encode_footer
from s3stream.record import StreamRecordBatch
from s3stream.storage.base import Upload
from s3stream.storage.memory import MemoryObjectStorage
from tests.unit.test_record import RECORD_A, RECORD_A_HEX, RECORD_B, RECORD_B_HEX, RECORD_C, RECORD_C_HEX

# -- the worked example of docs/format.md section 2 ---------------------------------------------------

BLOCK0_HEX = "5a02000000020000004a" + RECORD_A_HEX + RECORD_B_HEX
BLOCK1_HEX = "5a020000000100000023" + RECORD_C_HEX
INDEX_HEX = (
    "0000000000000007" "0000000000000064" "00000003" "00000002" "0000000000000000" "00000054"
    "0000000000000009" "0000000000000000" "00000005" "00000001" "0000000000000054" "0000002d"
)  # fmt: skip
AUTOMQ_FOOTER_HEX = "000000000000008100000048" + "00" * 28 + "88e241b785f4cff7"
AUTOMQ_OBJECT = bytes.fromhex(BLOCK0_HEX + BLOCK1_HEX + INDEX_HEX + AUTOMQ_FOOTER_HEX)

CHECKSUM_SECTION_HEX = "5333435300010000000000020e5616d156438ea9446b01ce"
FOOTER_HEX = (
    "0000000000000081" "00000048" "53334558" "0001" "0000" "00000018" "ea603a55" "0000000000000000"
    "513c0ee1" "88e241b785f4cff7"
)  # fmt: skip
OBJECT = bytes.fromhex(BLOCK0_HEX + BLOCK1_HEX + INDEX_HEX + CHECKSUM_SECTION_HEX + FOOTER_HEX)
# positions in OBJECT
BLOCK0_AT, BLOCK1_AT, INDEX_AT, SECTION_AT, FOOTER_AT, OBJECT_SIZE = 0, 84, 129, 201, 225, 273

ENTRY0 = IndexEntry(7, 100, 103, 2, 0, 84)
ENTRY1 = IndexEntry(9, 0, 5, 1, 84, 45)


def test_example_blocks_index_and_footer_are_automq_golden_bytes() -> None:
    assert len(AUTOMQ_OBJECT) == 249
    assert encode_block([RECORD_A, RECORD_B]) == bytes.fromhex(BLOCK0_HEX)
    assert encode_block([RECORD_C]) == bytes.fromhex(BLOCK1_HEX)
    assert encode_tail([ENTRY0, ENTRY1], None, index_position=129) == bytes.fromhex(
        INDEX_HEX + AUTOMQ_FOOTER_HEX
    )


def test_example_checksum_section_and_footer_are_golden_bytes() -> None:
    assert len(OBJECT) == OBJECT_SIZE
    assert int(CHECKSUM_SECTION_HEX[24:32], 16) == crc32c(bytes.fromhex(INDEX_HEX))
    assert int(CHECKSUM_SECTION_HEX[32:40], 16) == crc32c(bytes.fromhex(BLOCK0_HEX))
    assert int(CHECKSUM_SECTION_HEX[40:48], 16) == crc32c(bytes.fromhex(BLOCK1_HEX))
    assert int(FOOTER_HEX[48:56], 16) == crc32c(bytes.fromhex(CHECKSUM_SECTION_HEX))
    assert int(FOOTER_HEX[72:80], 16) == crc32c(bytes.fromhex(FOOTER_HEX)[:36])
    crcs = [crc32c(bytes.fromhex(BLOCK0_HEX)), crc32c(bytes.fromhex(BLOCK1_HEX))]
    assert encode_tail([ENTRY0, ENTRY1], crcs, index_position=129) == OBJECT[INDEX_AT:]


async def test_writer_produces_the_golden_example_object() -> None:
    storage = MemoryObjectStorage()
    writer = ObjectWriter(storage.upload("obj"))
    await writer.write([RECORD_A, RECORD_B])
    await writer.write([RECORD_C])
    written = await writer.close()
    assert await storage.get("obj") == OBJECT
    assert written.key == "obj"
    assert written.size_bytes == OBJECT_SIZE
    assert written.index == (ENTRY0, ENTRY1)
    assert written.stream_ranges == (
        StreamOffsetRange(StreamId(7), 100, 103, 8),
        StreamOffsetRange(StreamId(9), 0, 5, 2),
    )


async def test_reader_walks_the_example_like_automq() -> None:
    storage = MemoryObjectStorage()
    await storage.put("obj", OBJECT)
    reader = await ObjectReader.open(storage, "obj", OBJECT_SIZE)
    assert reader.has_checksums
    assert reader.index == (ENTRY0, ENTRY1)
    assert reader.footer == Footer(129, 72, 24, 0xEA603A55)
    found = reader.find(7, 101)
    assert found.entries == (ENTRY0,)
    assert found.next_offset == 103
    assert not found.fulfilled
    [block] = await reader.read_blocks(found.entries)
    assert block.records == (RECORD_A, RECORD_B)
    assert reader.index_bytes == 72 + 24


async def test_automq_object_without_checksum_section_is_readable() -> None:
    storage = MemoryObjectStorage()
    await storage.put("automq", AUTOMQ_OBJECT)
    reader = await ObjectReader.open(storage, "automq", len(AUTOMQ_OBJECT))
    assert not reader.has_checksums
    assert reader.index == (ENTRY0, ENTRY1)
    blocks = await reader.read_blocks(reader.index)
    assert [b.records for b in blocks] == [(RECORD_A, RECORD_B), (RECORD_C,)]
    assert await reader.read_block_bytes([ENTRY1]) == [bytes.fromhex(BLOCK1_HEX)]
    assert reader.index_bytes == 72


async def test_bytes_between_index_and_footer_are_ignored_without_checksums() -> None:
    """AutoMQ's reader ignores them; so do we (that is where our checksum section hides from it)."""
    obj = AUTOMQ_OBJECT[:INDEX_AT] + bytes.fromhex(INDEX_HEX) + b"junk" + AUTOMQ_OBJECT[-FOOTER_SIZE:]
    storage = MemoryObjectStorage()
    await storage.put("o", obj)
    reader = await ObjectReader.open(storage, "o", len(obj))
    assert [b.records for b in await reader.read_blocks(reader.index)] == [(RECORD_A, RECORD_B), (RECORD_C,)]


# -- byte surgery ----------------------------------------------------------------------------------


async def _open_and_read_all(data: bytes, size: int | None = None) -> None:
    storage = MemoryObjectStorage()
    await storage.put("obj", data)
    reader = await ObjectReader.open(storage, "obj", len(data) if size is None else size)
    await reader.read_blocks(reader.index)
    await reader.read_block_bytes(reader.index)


def _flip(data: bytes, position: int, mask: int = 0x01) -> bytes:
    out = bytearray(data)
    out[position] ^= mask
    return bytes(out)


@pytest.mark.parametrize(
    ("position", "damaged_at", "match"),
    [
        (5, BLOCK0_AT, "data block CRC32C"),
        (60, BLOCK0_AT, "data block CRC32C"),
        (BLOCK1_AT, BLOCK1_AT, "data block CRC32C"),
        (128, BLOCK1_AT, "data block CRC32C"),
        (INDEX_AT, INDEX_AT, "index block CRC32C"),
        (170, INDEX_AT, "index block CRC32C"),
        (SECTION_AT, SECTION_AT, "checksum section CRC32C"),
        (220, SECTION_AT, "checksum section CRC32C"),
        (FOOTER_AT, FOOTER_AT, "footer CRC32C"),
        (FOOTER_AT + 13, FOOTER_AT, "unknown extension"),
        (FOOTER_AT + 30, FOOTER_AT, "footer CRC32C"),
        (FOOTER_AT + 38, FOOTER_AT, "footer CRC32C"),
        (FOOTER_AT + 45, FOOTER_AT, "footer magic"),
    ],
)
async def test_flipped_byte_is_corruption_naming_key_and_position(
    position: int, damaged_at: int, match: str
) -> None:
    with pytest.raises(CorruptionError, match=match) as info:
        await _open_and_read_all(_flip(OBJECT, position))
    assert info.value.source == "obj"
    assert info.value.position == damaged_at
    assert f"obj at byte {damaged_at}" in str(info.value)


@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
async def test_every_single_byte_flip_of_the_example_is_detected(mask: int) -> None:
    for position in range(OBJECT_SIZE):
        with pytest.raises(CorruptionError):
            await _open_and_read_all(_flip(OBJECT, position, mask))


@pytest.mark.parametrize("keep", [0, 1, 47, 48, 100, 224, 272])
async def test_truncated_object_is_corruption(keep: int) -> None:
    with pytest.raises(CorruptionError) as info:
        await _open_and_read_all(OBJECT[:keep], size=keep)
    assert info.value.source == "obj"
    assert info.value.position is not None


@pytest.mark.parametrize("keep", [0, 100, 272])
async def test_object_shorter_than_its_recorded_size_is_corruption(keep: int) -> None:
    with pytest.raises(CorruptionError) as info:
        await _open_and_read_all(OBJECT[:keep], size=OBJECT_SIZE)
    assert info.value.source == "obj"


@pytest.mark.parametrize(
    ("position", "byte", "match"),
    [
        (0, 0x5B, "data block magic"),
        (2, 0x01, "records"),
        (9, 0x4B, "length"),
        (10, 0x21, "record batch magic"),
        (17, 0x08, "stream"),
        (33, 0x65, "starts at offset"),
        (INDEX_AT + 7, 0x0A, "index entries out of"),
        (INDEX_AT + 35, 0x55, "previous block ends"),
        (AUTOMQ_OBJECT.index(bytes.fromhex("88e241b7")), 0x00, "footer magic"),
        (INDEX_AT + 72 + 12, 0x01, "unknown extension"),
    ],
)
async def test_automq_object_structural_damage_is_corruption(position: int, byte: int, match: str) -> None:
    data = bytearray(AUTOMQ_OBJECT)
    data[position] = byte
    with pytest.raises(CorruptionError, match=match) as info:
        await _open_and_read_all(bytes(data))
    assert info.value.source == "obj"


def _automq_object(block: bytes, entry: IndexEntry) -> bytes:
    """A one-block object without checksum section, so only the structural checks stand guard."""
    return block + encode_tail([entry], None, index_position=len(block))


def _automq_block(records: list[StreamRecordBatch], trailing: bytes = b"") -> bytes:
    """``encode_block(records)`` with ``trailing`` bytes inside the block (header length adjusted)."""
    body = encode_block(records)[10:] + trailing
    return bytes.fromhex("5a02") + len(records).to_bytes(4, "big") + len(body).to_bytes(4, "big") + body


@pytest.mark.parametrize(
    ("records", "trailing", "end_offset", "match"),
    [
        ([RECORD_A, RECORD_B], b"\0" * 5, 103, "unexpected bytes after the last record"),
        ([RECORD_A, StreamRecordBatch(7, 1, 101, 2, b"abc")], b"", 103, "overlaps the previous one"),
        ([RECORD_A, RECORD_B], b"", 110, "block records end at offset 103"),
    ],
)
async def test_automq_block_whose_records_disagree_with_the_block_is_corruption(
    records: list[StreamRecordBatch], trailing: bytes, end_offset: int, match: str
) -> None:
    block = _automq_block(records, trailing)
    entry = IndexEntry(7, 100, end_offset, len(records), 0, len(block))
    with pytest.raises(CorruptionError, match=match) as info:
        await _open_and_read_all(_automq_object(block, entry))
    assert info.value.source == "obj"


async def test_automq_index_block_reaching_into_the_footer_is_corruption() -> None:
    data = bytearray(AUTOMQ_OBJECT)
    footer_at = len(data) - FOOTER_SIZE
    data[footer_at + 8 : footer_at + 12] = (72 + 36).to_bytes(4, "big")  # index length: one entry more
    with pytest.raises(CorruptionError, match="do not fit before the footer") as info:
        await _open_and_read_all(bytes(data))
    assert info.value.position == footer_at


async def test_corrupt_block_is_never_returned_even_beside_good_ones() -> None:
    storage = MemoryObjectStorage()
    await storage.put("obj", _flip(OBJECT, 100))  # inside block 1
    reader = await ObjectReader.open(storage, "obj", OBJECT_SIZE)
    assert (await reader.read_blocks([ENTRY0]))[0].records == (RECORD_A, RECORD_B)
    with pytest.raises(CorruptionError):
        await reader.read_blocks([ENTRY0, ENTRY1])
    with pytest.raises(CorruptionError):
        await reader.read_block_bytes([ENTRY1])


# -- sans-IO tail parsing ----------------------------------------------------------------------------


def test_short_tail_asks_for_bytes_from_the_index_block() -> None:
    assert decode_tail(OBJECT[-100:], object_size=OBJECT_SIZE, source="o") == NeedBytes(INDEX_AT)
    tail = decode_tail(OBJECT[INDEX_AT:], object_size=OBJECT_SIZE, source="o")
    assert not isinstance(tail, NeedBytes)
    assert tail.index == (ENTRY0, ENTRY1)


def test_footer_round_trips_both_kinds() -> None:
    for footer in (Footer(129, 72), Footer(129, 72, 24, 0xEA603A55)):
        assert decode_footer(encode_footer(footer), position=0, source="o") == footer
    assert encode_footer(Footer(129, 72)) == bytes.fromhex(AUTOMQ_FOOTER_HEX)


def test_tail_guess_is_automq_guess_plus_four_bytes_per_mib() -> None:
    assert tail_guess_bytes(249) == 249
    assert tail_guess_bytes(100 << 20) == 8192 + 100 * 40


class _GetCounter(MemoryObjectStorage):
    def __init__(self) -> None:
        super().__init__()
        self.ranges: list[tuple[int, int | None]] = []

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self.ranges.append((start, end))
        return await super().get(key, start, end)


async def _write(
    storage: MemoryObjectStorage, key: str, batches: list[StreamRecordBatch], **kw: int
) -> tuple[IndexEntry, ...]:
    writer = ObjectWriter(storage.upload(key), **kw)
    await writer.write(batches)
    return (await writer.close()).index


async def test_large_index_needs_exactly_one_reread() -> None:
    storage = _GetCounter()
    batches = [StreamRecordBatch(1, 0, i, 1, b"x") for i in range(400)]  # 400 blocks of 1 record
    index = await _write(storage, "big", batches, block_size_bytes=1)
    assert len(index) == 400
    size = (await storage.head("big")).size_bytes
    storage.ranges.clear()
    reader = await ObjectReader.open(storage, "big", size)
    assert storage.ranges == [
        (size - tail_guess_bytes(size), size),
        (index[-1].end_position, size - tail_guess_bytes(size)),
    ]
    assert reader.index == index


# -- writer rules ------------------------------------------------------------------------------------


def _batch(stream: int, offset: int, payload_bytes: int, count: int = 1) -> StreamRecordBatch:
    return StreamRecordBatch(stream, 1, offset, count, bytes([offset % 251]) * payload_bytes)


async def test_block_is_cut_when_payload_reaches_block_size_and_counter_resets_per_stream() -> None:
    storage = MemoryObjectStorage()
    batches = [_batch(1, o, 40) for o in range(5)] + [_batch(2, o, 40) for o in range(3)]
    index = await _write(storage, "o", batches, block_size_bytes=100)
    # stream 1: 40+40+40 >= 100 -> block of 3, then a final block of 2; stream 2 starts afresh: block of 3
    assert [(e.stream_id, e.start_offset, e.end_offset, e.record_count) for e in index] == [
        (1, 0, 3, 3),
        (1, 3, 5, 2),
        (2, 0, 3, 3),
    ]
    assert [e.payload_bytes for e in index] == [120, 80, 120]


async def test_huge_record_forms_its_own_block() -> None:
    storage = MemoryObjectStorage()
    index = await _write(
        storage, "o", [_batch(1, 0, 10), _batch(1, 1, 5000), _batch(1, 2, 10)], block_size_bytes=100
    )
    assert [e.record_count for e in index] == [2, 1]
    assert index[0].payload_bytes == 5010


async def test_offset_gaps_inside_a_stream_are_kept() -> None:
    storage = MemoryObjectStorage()
    batches = [_batch(1, 0, 3, count=2), _batch(1, 10, 3, count=5)]
    index = await _write(storage, "o", batches)
    assert [(e.start_offset, e.end_offset) for e in index] == [(0, 15)]
    reader = await ObjectReader.open(storage, "o", index[-1].end_position + 36 + 20 + 48)
    assert (await reader.read_blocks(index))[0].records == tuple(batches)


@pytest.mark.parametrize(
    "batches",
    [
        [_batch(2, 0, 1), _batch(1, 0, 1)],
        [_batch(1, 5, 1), _batch(1, 4, 1)],
        [_batch(1, 5, 1, count=3), _batch(1, 7, 1)],
        [StreamRecordBatch(-1, 0, 0, 1, b"")],
        [StreamRecordBatch(1, 0, -1, 1, b"")],
        [StreamRecordBatch(1, 0, 0, 0, b"")],
        [StreamRecordBatch(1, 0, 0, 1 << 31, b"")],
        ["not a batch"],
    ],
)
async def test_bad_or_out_of_order_batches_are_invalid_argument_and_change_nothing(
    batches: list[StreamRecordBatch],
) -> None:
    storage = MemoryObjectStorage()
    writer = ObjectWriter(storage.upload("o"))
    await writer.write([_batch(0, 0, 1)])
    with pytest.raises(InvalidArgumentError):
        await writer.write(batches)
    await writer.write([_batch(3, 0, 1)])  # the failed call left no trace
    written = await writer.close()
    assert [e.stream_id for e in written.index] == [0, 3]


async def test_order_is_checked_across_calls() -> None:
    writer = ObjectWriter(MemoryObjectStorage().upload("o"))
    await writer.write([_batch(1, 0, 1, count=10)])
    with pytest.raises(InvalidArgumentError, match="order"):
        await writer.write([_batch(1, 9, 1)])
    await writer.write([_batch(1, 10, 1)])


@pytest.mark.parametrize(("block_size", "part_size"), [(0, 1 << 20), (1 << 31, 1 << 20), (1024, 0)])
def test_bad_writer_config_is_invalid_argument(block_size: int, part_size: int) -> None:
    with pytest.raises(InvalidArgumentError):
        ObjectWriter(
            MemoryObjectStorage().upload("o"), block_size_bytes=block_size, part_size_bytes=part_size
        )


class _RecordingUpload:
    """Forwards to a real upload and keeps the size of every write."""

    def __init__(self, inner: Upload) -> None:
        self.inner = inner
        self.key = inner.key
        self.writes: list[int] = []

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(len(data))
        await self.inner.write(data)

    async def copy(self, source_key: str, start: int, end: int) -> None:
        await self.inner.copy(source_key, start, end)

    async def complete(self) -> int:
        return await self.inner.complete()

    async def abort(self) -> None:
        await self.inner.abort()


async def test_writer_streams_parts_of_at_least_part_size_as_blocks_complete() -> None:
    storage = MemoryObjectStorage()
    upload = _RecordingUpload(storage.upload("o"))
    writer = ObjectWriter(upload, block_size_bytes=256 << 10, part_size_bytes=1)  # clamped to 5 MiB
    payload = b"p" * (100 << 10)
    for i in range(130):  # 13 MiB of payload
        await writer.write([StreamRecordBatch(1, 0, i, 1, payload)])
        held_back = (i + 1) * (len(payload) + 43) - sum(upload.writes)
        assert held_back < (5 << 20) + (256 << 10) + 4096  # finished parts go out as soon as they fill
    assert len(upload.writes) == 2
    assert all(n >= 5 << 20 for n in upload.writes)
    assert all(n < (5 << 20) + (300 << 10) for n in upload.writes)
    written = await writer.close()
    assert len(upload.writes) == 3
    assert sum(upload.writes) == written.size_bytes
    reader = await ObjectReader.open(storage, "o", written.size_bytes)
    blocks = await reader.read_blocks(reader.find(1, 0).entries)
    assert [r.base_offset for b in blocks for r in b.records] == list(range(130))


async def test_parts_go_out_while_many_small_streams_are_written_in_one_call() -> None:
    storage = MemoryObjectStorage()
    upload = _RecordingUpload(storage.upload("o"))
    writer = ObjectWriter(upload, part_size_bytes=5 << 20)
    batches = [StreamRecordBatch(s, 0, 0, 1, b"q" * 1024) for s in range(6000)]  # 6000 blocks, 6.2 MiB
    await writer.write(batches)
    assert len(upload.writes) == 1
    assert upload.writes[0] >= 5 << 20
    written = await writer.close()
    assert len(written.index) == 6000
    reader = await ObjectReader.open(storage, "o", written.size_bytes)
    [block] = await reader.read_blocks(reader.find(5999, 0).entries)
    assert block.records == (batches[-1],)


async def test_closed_writer_refuses_calls_and_abort_publishes_nothing() -> None:
    storage = MemoryObjectStorage()
    writer = ObjectWriter(storage.upload("a"))
    await writer.write([_batch(1, 0, 1)])
    await writer.abort()
    with pytest.raises(ClosedError):
        await writer.write([_batch(1, 1, 1)])
    with pytest.raises(NotFoundError):
        await storage.head("a")
    writer = ObjectWriter(storage.upload("b"))
    await writer.close()
    with pytest.raises(ClosedError):
        await writer.close()


class _FailingUpload(_RecordingUpload):
    async def write(self, data: bytes | bytearray | memoryview) -> None:
        raise UnavailableError("injected upload failure")


async def test_failed_upload_write_closes_the_writer_and_abort_still_works() -> None:
    storage = MemoryObjectStorage()
    writer = ObjectWriter(_FailingUpload(storage.upload("f")))
    await writer.write([_batch(1, 0, 10)])
    with pytest.raises(UnavailableError):
        await writer.close()
    with pytest.raises(ClosedError):
        await writer.close()
    await writer.abort()
    with pytest.raises(NotFoundError):
        await storage.head("f")


async def test_empty_object_has_an_empty_index() -> None:
    storage = MemoryObjectStorage()
    written = await ObjectWriter(storage.upload("e")).close()
    assert written.index == ()
    assert written.stream_ranges == ()
    reader = await ObjectReader.open(storage, "e", written.size_bytes)
    assert reader.find(1, 0).entries == ()


async def test_write_block_copies_verified_blocks_and_rebases_positions() -> None:
    storage = MemoryObjectStorage()
    await storage.put("src", OBJECT)
    src = await ObjectReader.open(storage, "src", OBJECT_SIZE)
    raw = await src.read_block_bytes([ENTRY1])
    writer = ObjectWriter(storage.upload("dst"))
    await writer.write([_batch(3, 0, 4)])  # an open block of stream 3, cut by write_block
    await writer.write_block(ENTRY1, raw[0])
    await writer.write([_batch(9, 5, 4)])  # continues stream 9 after the copied block
    written = await writer.close()
    assert [(e.stream_id, e.start_offset, e.start_position) for e in written.index] == [
        (3, 0, 0),
        (9, 0, 47),
        (9, 5, 92),
    ]
    dst = await ObjectReader.open(storage, "dst", written.size_bytes)
    blocks = await dst.read_blocks(dst.find(9, 0).entries)
    assert [r for b in blocks for r in b.records] == [RECORD_C, _batch(9, 5, 4)]


@pytest.mark.parametrize(
    ("entry", "block"),
    [
        (ENTRY1, bytes.fromhex(BLOCK1_HEX)[:-1]),
        (IndexEntry(9, 1, 5, 1, 84, 45), bytes.fromhex(BLOCK1_HEX)),
        (IndexEntry(8, 0, 5, 1, 84, 45), bytes.fromhex(BLOCK1_HEX)),
        (IndexEntry(9, 0, 5, 2, 84, 45), bytes.fromhex(BLOCK1_HEX)),
        (ENTRY1, b"\x00" + bytes.fromhex(BLOCK1_HEX)[1:]),
    ],
)
async def test_write_block_rejects_a_block_that_does_not_match_its_entry(
    entry: IndexEntry, block: bytes
) -> None:
    writer = ObjectWriter(MemoryObjectStorage().upload("o"))
    with pytest.raises(InvalidArgumentError):
        await writer.write_block(entry, block)


# -- find ---------------------------------------------------------------------------------------------


async def _reader_with_blocks() -> tuple[_GetCounter, ObjectReader]:
    """Stream 1: blocks [0,10) [10,20) [20,30) of 100 payload bytes each; stream 2: [5,8); stream 3: [0,1)."""
    storage = _GetCounter()
    batches = (
        [_batch(1, o, 10) for o in range(30)] + [_batch(2, o, 10) for o in range(5, 8)] + [_batch(3, 0, 10)]
    )
    writer = ObjectWriter(storage.upload("o"), block_size_bytes=100)
    await writer.write(batches)
    written = await writer.close()
    return storage, await ObjectReader.open(storage, "o", written.size_bytes)


async def test_find_takes_contiguous_blocks_until_end_offset() -> None:
    _, reader = await _reader_with_blocks()
    found = reader.find(1, 12, 25)
    assert [(e.start_offset, e.end_offset) for e in found.entries] == [(10, 20), (20, 30)]
    assert (found.next_offset, found.fulfilled) == (30, True)
    found = reader.find(1, 0)
    assert len(found.entries) == 3
    assert (found.next_offset, found.fulfilled) == (30, False)


async def test_find_misses_give_an_empty_result_at_the_start_offset() -> None:
    _, reader = await _reader_with_blocks()
    for stream, offset in [(1, 30), (2, 4), (2, 8), (0, 0), (4, 0), (3, 1)]:
        found = reader.find(stream, offset)
        assert (found.entries, found.next_offset, found.fulfilled) == ((), offset, False)


async def test_find_max_bytes_skips_the_first_partial_block() -> None:
    _, reader = await _reader_with_blocks()
    found = reader.find(1, 5, max_bytes=100)  # block [0,10) is partial: not counted; [10,20) uses 100
    assert [e.start_offset for e in found.entries] == [0, 10]
    assert found.fulfilled
    found = reader.find(1, 0, max_bytes=150)  # [0,10) counts 100, [10,20) takes the rest
    assert [e.start_offset for e in found.entries] == [0, 10]
    assert found.fulfilled


@pytest.mark.parametrize(("start", "end", "max_bytes"), [(-1, -1, 10), (5, 4, 10), (0, -1, -1)])
async def test_find_bad_arguments_are_invalid(start: int, end: int, max_bytes: int) -> None:
    _, reader = await _reader_with_blocks()
    with pytest.raises(InvalidArgumentError):
        reader.find(1, start, end, max_bytes)


async def test_adjacent_blocks_share_one_ranged_get() -> None:
    storage, reader = await _reader_with_blocks()
    index = reader.index
    storage.ranges.clear()
    blocks = await reader.read_blocks([index[0], index[1], index[2], index[4]])
    assert storage.ranges == [(0, index[2].end_position), (index[4].start_position, index[4].end_position)]
    assert [b.entry for b in blocks] == [index[0], index[1], index[2], index[4]]
    assert [r.base_offset for r in blocks[3].records] == [0]


async def test_entries_of_another_object_are_refused() -> None:
    _, reader = await _reader_with_blocks()
    with pytest.raises(InvalidArgumentError):
        await reader.read_blocks([IndexEntry(1, 0, 10, 10, 0, 999)])


# -- cache ---------------------------------------------------------------------------------------------


async def test_cache_opens_each_key_once_for_concurrent_gets() -> None:
    storage = _GetCounter()
    await storage.put("obj", OBJECT)
    cache = ObjectReaderCache(storage)
    readers = await asyncio.gather(*(cache.get("obj", OBJECT_SIZE) for _ in range(10)))
    assert all(r is readers[0] for r in readers)
    assert len(storage.ranges) == 1
    assert await cache.get("obj", OBJECT_SIZE) is readers[0]
    assert cache.used_bytes == readers[0].index_bytes
    cache.invalidate("obj")
    assert await cache.get("obj", OBJECT_SIZE) is not readers[0]


async def test_cache_evicts_least_recently_used_by_index_bytes() -> None:
    storage = MemoryObjectStorage()
    for key in "abc":
        await storage.put(key, OBJECT)
    cache = ObjectReaderCache(storage, capacity_bytes=2 * 96)
    a = await cache.get("a", OBJECT_SIZE)
    await cache.get("b", OBJECT_SIZE)
    assert await cache.get("a", OBJECT_SIZE) is a  # a is now the most recent
    await cache.get("c", OBJECT_SIZE)
    assert "a" in cache
    assert "b" not in cache
    assert cache.used_bytes == 2 * 96
    tiny = ObjectReaderCache(storage, capacity_bytes=10)
    await tiny.get("a", OBJECT_SIZE)
    assert len(tiny) == 0


async def test_cache_failed_open_reaches_every_waiter_and_is_not_cached() -> None:
    storage = MemoryObjectStorage()
    await storage.put("bad", _flip(OBJECT, 170))
    cache = ObjectReaderCache(storage)
    results = await asyncio.gather(*(cache.get("bad", OBJECT_SIZE) for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, CorruptionError) for r in results)
    assert len(cache) == 0
    await storage.put("bad", OBJECT)
    assert (await cache.get("bad", OBJECT_SIZE)).index == (ENTRY0, ENTRY1)
