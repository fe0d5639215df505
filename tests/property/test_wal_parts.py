"""A body appended in parts is the same record as the joined body: same offsets, same bytes back."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from wal import BlockWAL, MemoryDevice, WalConfig

CONFIG = WalConfig(
    capacity_bytes=128 << 10,
    record_max_bytes=2 << 10,
    batch_max_bytes=4 << 10,
    inflight_max_bytes=16 << 10,
    direct_io="off",
)

# each record: a list of parts (possibly empty parts, possibly no part at all)
RECORDS = st.lists(st.lists(st.binary(max_size=300), max_size=5), min_size=1, max_size=30)


async def _write(records: list[list[bytes]], in_parts: bool) -> tuple[list[int], list[tuple[int, bytes]]]:
    dev = MemoryDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    if in_parts:
        offsets = list(await asyncio.gather(*(wal.append([bytearray(p) for p in r]) for r in records)))
    else:
        offsets = list(await asyncio.gather(*(wal.append(b"".join(r)) for r in records)))
    await wal.close()
    wal = await BlockWAL.open(MemoryDevice(dev.size_bytes, dev.data), CONFIG)
    recovered = [(r.offset, r.data) async for r in wal.recover()]
    await wal.close()
    return offsets, recovered


@settings(max_examples=60, deadline=None)
@given(RECORDS)
def test_parts_and_joined_bodies_write_the_same_log(records: list[list[bytes]]) -> None:
    parts = asyncio.run(_write(records, in_parts=True))
    joined = asyncio.run(_write(records, in_parts=False))
    assert parts == joined
    offsets, recovered = parts
    assert recovered == [(o, b"".join(r)) for o, r in zip(offsets, records, strict=True)]
