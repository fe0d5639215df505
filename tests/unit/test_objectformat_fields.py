"""ObjectWriter.write_fields (the engine's upload path: LogCache field tuples, checked as encoded)
produces exactly the bytes of ``write`` with StreamRecordBatch objects, and rejects what ``write``
rejects."""

from __future__ import annotations

import random

import pytest

from s3stream.errors import ClosedError, InvalidArgumentError
from s3stream.objectformat import ObjectWriter
from s3stream.objectformat.writer import RecordFields
from s3stream.record import StreamRecordBatch
from s3stream.storage.memory import MemoryObjectStorage
from tests.unit.test_objectformat import OBJECT
from tests.unit.test_record import RECORD_A, RECORD_B, RECORD_C


def _fields(b: StreamRecordBatch) -> RecordFields:
    return (b.stream_id, b.epoch, b.base_offset, b.count, b.payload)


async def test_write_fields_produces_the_golden_example_object() -> None:
    storage = MemoryObjectStorage()
    writer = ObjectWriter(storage.upload("obj"))
    records = [_fields(RECORD_A), _fields(RECORD_B), _fields(RECORD_C)]
    await writer.write_fields(records, 0, 2)
    await writer.write_fields(records, 2)
    written = await writer.close()
    assert await storage.get("obj") == OBJECT
    assert written.stream_ranges[0].stream_id == RECORD_A.stream_id


@pytest.mark.parametrize("seed", range(8))
async def test_write_fields_matches_write_byte_for_byte(seed: int) -> None:
    rng = random.Random(seed)
    batches: list[StreamRecordBatch] = []
    for stream_id in sorted(rng.sample(range(1000), rng.randint(1, 20))):
        offset = rng.randint(0, 100)
        for _ in range(rng.randint(1, 30)):
            count = rng.randint(1, 5)
            batches.append(
                StreamRecordBatch(stream_id, 3, offset, count, rng.randbytes(rng.randint(0, 3000)))
            )
            offset += count + rng.choice((0, 0, 0, 2))  # gaps are allowed, overlaps are not
    block = rng.choice((1, 512, 4096, 1 << 20))
    storage = MemoryObjectStorage()
    plain = ObjectWriter(storage.upload("plain"), block_size_bytes=block, part_size_bytes=1)
    await plain.write(batches)
    fields = ObjectWriter(storage.upload("fields"), block_size_bytes=block, part_size_bytes=1)
    records = [_fields(b) for b in batches]
    cut = rng.randint(0, len(records))
    await fields.write_fields(records, 0, cut)
    await fields.write_fields(records, cut, len(records))
    a, b = await plain.close(), await fields.close()
    assert await storage.get("plain") == await storage.get("fields")
    assert (a.index, a.stream_ranges) == (b.index, b.stream_ranges)


@pytest.mark.parametrize(
    "bad",
    [
        [(5, 0, 10, 1, b"a"), (5, 0, 9, 1, b"b")],  # overlaps the previous record
        [(5, 0, 10, 1, b"a"), (4, 0, 11, 1, b"b")],  # stream id goes back
        [(5, 0, 10, 0, b"a")],  # count 0
        [(5, 0, -1, 1, b"a")],  # negative offset
        [(-1, 0, 0, 1, b"a")],  # negative stream id
    ],
)
async def test_write_fields_rejects_bad_records_and_closes_the_writer(bad: list[RecordFields]) -> None:
    storage = MemoryObjectStorage()
    writer = ObjectWriter(storage.upload("obj"))
    with pytest.raises(InvalidArgumentError):
        await writer.write_fields(bad)
    with pytest.raises(ClosedError):
        await writer.write_fields([(9, 0, 0, 1, b"x")])
    await writer.abort()
    assert [info.key async for info in storage.list()] == []
