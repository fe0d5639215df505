"""ObjectWriter keeps its index as encoded bytes while it writes: no object per data block for the
garbage collector, and the same index block, tail and entries as encoding IndexRow tuples at the end."""

from __future__ import annotations

import gc
from array import array
from dataclasses import dataclass, field

from s3stream.objectformat import ObjectWriter
from s3stream.objectformat.codec import INDEX_ENTRY_SIZE
from s3stream.objectformat.tail import (
    decode_index,
    encode_index_rows,
    encode_tail_index,
    encode_tail_rows,
    index_row,
)
from s3stream.storage.memory import MemoryObjectStorage


@dataclass
class Columns:
    stream_id: int
    epoch: int | None = 1
    epochs: None = None
    bases: array[int] = field(default_factory=lambda: array("q", [0, 1]))
    end: int = 2
    payloads: list[bytes] = field(default_factory=lambda: [b"a" * 10, b"b" * 12])


async def test_writing_many_small_streams_keeps_no_object_per_data_block() -> None:
    storage = MemoryObjectStorage()
    writer = ObjectWriter(storage.upload("o"), block_size_bytes=1 << 20, handover_bytes=1 << 20)
    streams = [Columns(stream_id) for stream_id in range(600)]
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        await writer.write_streams(streams)
        added = len(gc.get_objects()) - before
    finally:
        gc.enable()
    assert added < 100  # an index tuple per stream's data block made it 600 more


async def test_the_written_index_and_entries_match_the_data_blocks() -> None:
    storage = MemoryObjectStorage()
    writer = ObjectWriter(storage.upload("o"), block_size_bytes=1 << 20, handover_bytes=1 << 20)
    await writer.write_streams([Columns(5), Columns(9, bases=array("q", [7, 9]), end=12)])
    written = await writer.close()
    data = await storage.get("o")
    entries = written.index
    assert [(e.stream_id, e.start_offset, e.end_offset, e.record_count) for e in entries] == [
        (5, 0, 2, 2),
        (9, 7, 12, 2),
    ]
    index_position = entries[-1].end_position
    index = data[index_position : index_position + len(entries) * INDEX_ENTRY_SIZE]
    assert decode_index(index, index_position=index_position, source="o") == entries
    rows = [index_row(e) for e in entries]
    assert encode_tail_index(encode_index_rows(rows), [1, 2], index_position=9) == encode_tail_rows(
        rows, [1, 2], index_position=9
    )
