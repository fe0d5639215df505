"""Hypothesis: object round trips through writer, find and read_blocks; every decoder's fuzz contract."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s3stream.errors import CorruptionError
from s3stream.objectformat import ObjectReader, ObjectWriter
from s3stream.objectformat.block import decode_block
from s3stream.objectformat.codec import INDEX_ENTRY_SIZE, IndexEntry
from s3stream.objectformat.tail import decode_checksum_section, decode_footer, decode_index, decode_tail
from s3stream.record import StreamRecordBatch, decode_record
from s3stream.storage.memory import MemoryObjectStorage

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def stream_batches(draw: st.DrawFn) -> list[StreamRecordBatch]:
    """Batches in (stream, offset) order: a few streams, offsets with occasional gaps."""
    batches: list[StreamRecordBatch] = []
    for stream_id in sorted(draw(st.sets(st.integers(0, 2**40), min_size=1, max_size=4))):
        offset = draw(st.integers(0, 2**40))
        for _ in range(draw(st.integers(1, 12))):
            offset += draw(st.sampled_from([0, 0, 0, 1, 7]))
            count = draw(st.integers(1, 50))
            payload = draw(st.binary(max_size=300))
            batches.append(StreamRecordBatch(stream_id, draw(st.integers(-1, 5)), offset, count, payload))
            offset += count
    return batches


async def _write_and_open(
    batches: list[StreamRecordBatch], block_size: int, splits: list[int]
) -> tuple[ObjectReader, MemoryObjectStorage]:
    storage = MemoryObjectStorage()
    writer = ObjectWriter(storage.upload("obj"), block_size_bytes=block_size)
    start = 0
    for cut in [*sorted(splits), len(batches)]:
        await writer.write(batches[start:cut])
        start = max(start, cut)
    written = await writer.close()
    reader = await ObjectReader.open(storage, "obj", written.size_bytes)
    assert reader.index == written.index
    return reader, storage


@SETTINGS
@given(stream_batches(), st.integers(1, 2000), st.lists(st.integers(0, 50), max_size=3))
def test_every_batch_reads_back_through_find_and_read_blocks(
    batches: list[StreamRecordBatch], block_size: int, splits: list[int]
) -> None:
    async def check() -> None:
        reader, _ = await _write_and_open(batches, block_size, splits)
        for stream_id in sorted({b.stream_id for b in batches}):
            mine = [b for b in batches if b.stream_id == stream_id]
            # AutoMQ's forward scan stops at an offset gap: read each contiguous run separately
            got: list[StreamRecordBatch] = []
            offset = mine[0].base_offset
            while True:
                found = reader.find(stream_id, offset)
                if not found.entries:
                    break
                got.extend(r for block in await reader.read_blocks(found.entries) for r in block.records)
                later = [b.base_offset for b in mine if b.base_offset >= found.next_offset]
                if not later:
                    break
                offset = later[0]
            assert got == mine
        for batch in batches:  # a fetch from inside any batch starts with the block holding it
            found = reader.find(batch.stream_id, batch.base_offset, batch.end_offset)
            assert found.fulfilled
            [first, *_] = await reader.read_blocks(found.entries[:1])
            assert batch in first.records

    asyncio.run(check())


async def _open_and_read_all(storage: MemoryObjectStorage, size: int) -> None:
    reader = await ObjectReader.open(storage, "obj", size)
    await reader.read_blocks(reader.index)


@SETTINGS
@given(stream_batches(), st.integers(1, 2000), st.data())
def test_any_flipped_byte_of_an_object_is_detected(
    batches: list[StreamRecordBatch], block_size: int, data: st.DataObject
) -> None:
    async def check() -> None:
        _, storage = await _write_and_open(batches, block_size, [])
        blob = bytearray(await storage.get("obj"))
        position = data.draw(st.integers(0, len(blob) - 1))
        blob[position] ^= data.draw(st.integers(1, 255))
        await storage.put("obj", bytes(blob))
        with pytest.raises(CorruptionError) as info:
            await _open_and_read_all(storage, len(blob))
        assert info.value.source == "obj"
        assert info.value.position is not None
        assert 0 <= info.value.position <= position

    asyncio.run(check())


# -- fuzz contract: any bytes give a value or CorruptionError ---------------------------------------


@given(
    st.builds(
        StreamRecordBatch,
        st.integers(0, 2**63 - 1),
        st.integers(-(2**63), 2**63 - 1),
        st.integers(0, 2**63 - 1),
        st.integers(0, 2**31 - 1),
        st.binary(max_size=100),
    )
)
def test_record_encode_decode_identity(record: StreamRecordBatch) -> None:
    encoded = record.encode()
    assert len(encoded) == record.encoded_size
    assert decode_record(b"xx" + encoded, 2) == (record, len(encoded) + 2)


@given(st.binary(max_size=200), st.integers(0, 10))
def test_decode_record_fuzz(data: bytes, pos: int) -> None:
    with contextlib.suppress(CorruptionError):
        decode_record(data, min(pos, len(data)))


@given(st.binary(min_size=48, max_size=48))
def test_decode_footer_fuzz(data: bytes) -> None:
    with contextlib.suppress(CorruptionError):
        decode_footer(data, position=0, source="x")


@given(st.binary(max_size=4 * INDEX_ENTRY_SIZE), st.integers(0, 500))
def test_decode_index_fuzz(data: bytes, index_position: int) -> None:
    with contextlib.suppress(CorruptionError):
        decode_index(data, index_position=index_position, source="x")


@given(st.binary(max_size=64))
def test_decode_checksum_section_fuzz(data: bytes) -> None:
    with contextlib.suppress(CorruptionError):
        decode_checksum_section(data, position=0, source="x")


@given(st.binary(max_size=300), st.integers(0, 400))
def test_decode_tail_fuzz(data: bytes, extra: int) -> None:
    with contextlib.suppress(CorruptionError):
        decode_tail(data, object_size=len(data) + extra, source="x")


@given(
    st.binary(max_size=200),
    st.builds(
        IndexEntry,
        st.integers(0, 3),
        st.integers(0, 3),
        st.integers(0, 9),
        st.integers(0, 4),
        st.integers(0, 50),
        st.integers(0, 220),
    ),
    st.integers(0, 20),
)
def test_decode_block_fuzz(data: bytes, entry: IndexEntry, pos: int) -> None:
    with contextlib.suppress(CorruptionError):
        decode_block(data, min(pos, len(data)), entry, source="x")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_object_reader_fuzz(data: bytes) -> None:
    async def check() -> None:
        storage = MemoryObjectStorage()
        await storage.put("obj", data)
        with contextlib.suppress(CorruptionError):
            await _open_and_read_all(storage, len(data))

    asyncio.run(check())
