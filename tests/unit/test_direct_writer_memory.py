"""The direct writer's memory does not grow with the object: a 48 MiB object written from a generator
to the local store peaks well below its size (chunks of 4 MiB, parts handed over as they fill)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from pathlib import Path

from s3stream.direct.writer import CHUNK_MAX_BYTES, PART_SIZE_BYTES, write_object
from s3stream.objectformat.writer import RecordFields

MiB = 1 << 20
OBJECT_BYTES = 48 * MiB
BATCH_BYTES = 64 * 1024


def batches() -> Iterator[RecordFields]:
    for i in range(OBJECT_BYTES // BATCH_BYTES):
        yield (7, 0, i, 1, bytes([i % 251]) * BATCH_BYTES)


def test_a_large_object_is_written_in_bounded_memory(tmp_path: Path) -> None:
    uri = (tmp_path / "objects").absolute().as_uri()
    write_object(uri, "mem-bound", 1, [(7, 0, 0, 1, b"warm")])  # the worker and its store exist
    tracemalloc.start()
    try:
        info = write_object(uri, "mem-bound", 2, batches())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.size_bytes > OBJECT_BYTES
    assert info.ranges[0].end_offset == OBJECT_BYTES // BATCH_BYTES
    bound = 2 * CHUNK_MAX_BYTES + 2 * PART_SIZE_BYTES
    assert peak < bound <= OBJECT_BYTES / 2, (peak / MiB, bound / MiB)
