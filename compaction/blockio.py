"""Verified block reads for compaction: position-contiguous blocks of one object share one ranged GET.

Every GET is at most ``READ_SIZE_MAX_BYTES`` (a single larger block is read alone); every block is
verified before it is handed on: its CRC32C and header when the object has a checksum section, a
full decode otherwise. Blocks are returned as views into the GET buffers (no copy).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from compaction.plan import READ_SIZE_MAX_BYTES
from s3stream.errors import CorruptionError
from s3stream.objectformat import IndexEntry, ObjectReader, decode_block
from s3stream.objectformat.block import check_block_header
from s3stream.objectformat.codec import verify_crc
from s3stream.storage.base import ObjectStorage

READ_CONCURRENCY_MAX = 8
"""Ranged GETs of one step in flight at once."""


def read_runs(entries: Sequence[IndexEntry], read_size_max_bytes: int) -> list[list[IndexEntry]]:
    """Entries sorted by position, cut into runs of adjacent blocks of at most ``read_size_max_bytes``."""
    runs: list[list[IndexEntry]] = []
    for e in sorted(entries, key=lambda e: e.start_position):
        if (
            runs
            and runs[-1][-1].end_position == e.start_position
            and e.end_position - runs[-1][0].start_position <= read_size_max_bytes
        ):
            runs[-1].append(e)
        else:
            runs.append([e])
    return runs


async def read_verified_blocks(
    storage: ObjectStorage,
    requests: Mapping[str, tuple[Sequence[IndexEntry], Mapping[int, int] | None]],
    *,
    read_size_max_bytes: int = READ_SIZE_MAX_BYTES,
    concurrency: int = READ_CONCURRENCY_MAX,
) -> dict[tuple[str, int], memoryview]:
    """Read the blocks of several objects. ``requests``: key -> (entries, CRC by start position or
    None). Returns (key, start position) -> the block's bytes."""
    slots = asyncio.Semaphore(concurrency)
    out: dict[tuple[str, int], memoryview] = {}

    async def one(key: str, run: list[IndexEntry], crcs: Mapping[int, int] | None) -> None:
        start, end = run[0].start_position, run[-1].end_position
        async with slots:
            data = await storage.get(key, start, end)
        if len(data) != end - start:
            raise CorruptionError(
                f"short read: {len(data)} of {end - start} bytes at [{start}, {end})",
                source=key,
                position=start + len(data),
            )
        view = memoryview(data)
        for e in run:
            at = e.start_position - start
            block = view[at : at + e.size_bytes]
            if crcs is not None:
                verify_crc(
                    block, crcs[e.start_position], what="data block", source=key, position=e.start_position
                )
                check_block_header(block, 0, e, source=key)
            else:
                decode_block(data, at, e, source=key)
            out[(key, e.start_position)] = block

    await asyncio.gather(
        *(
            one(key, run, crcs)
            for key, (entries, crcs) in requests.items()
            for run in read_runs(entries, read_size_max_bytes)
        )
    )
    return out


def crcs_by_position(
    reader_index: Sequence[IndexEntry], block_crcs: Sequence[int] | None
) -> dict[int, int] | None:
    """CRC of each block keyed by its start position (None for an object without checksums)."""
    if block_crcs is None:
        return None
    return {e.start_position: crc for e, crc in zip(reader_index, block_crcs, strict=True)}


async def open_reader(storage: ObjectStorage, key: str, size_bytes: int) -> ObjectReader:
    """Open an object's verified tail (footer, index, checksum section)."""
    return await ObjectReader.open(storage, key, size_bytes)
