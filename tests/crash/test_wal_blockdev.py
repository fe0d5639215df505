"""The WAL on a raw block device: a loop device over a zero-filled file (needs root and losetup)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from wal import BlockWAL, WalConfig, WalLockedError

CONFIG = WalConfig(capacity_bytes=8 << 20, record_max_bytes=256 << 10, inflight_max_bytes=4 << 20)


@pytest.fixture
def loop_device(tmp_path: Path) -> Iterator[str]:
    if os.geteuid() != 0 or shutil.which("losetup") is None:
        pytest.skip("loop devices need root and losetup")
    backing = tmp_path / "disk.img"
    with open(backing, "wb") as f:
        f.truncate(16 << 20)
    attach = subprocess.run(["losetup", "-f", "--show", str(backing)], capture_output=True, text=True)
    if attach.returncode != 0:
        pytest.skip(f"losetup cannot attach here: {attach.stderr.strip()}")
    device = attach.stdout.strip()
    try:
        yield device
    finally:
        subprocess.run(["losetup", "-d", device], check=True)


async def test_wal_on_a_block_device_round_trips_and_is_exclusive(loop_device: str) -> None:
    wal = await BlockWAL.open(loop_device, CONFIG)
    assert "O_DSYNC" in wal.mode  # (the default aio="adaptive" appends "+adaptive(...)")
    with pytest.raises(WalLockedError):
        await BlockWAL.open(loop_device, CONFIG)
    offsets = await wal.append_many([bytes([i]) * (1000 + i) for i in range(100)])
    last = await wal.append(b"last")
    await wal.close()
    wal = await BlockWAL.open(loop_device, CONFIG)
    got = [(r.offset, r.data) async for r in wal.recover()]
    assert got == [*((o, bytes([i]) * (1000 + i)) for i, o in enumerate(offsets)), (last, b"last")]
    await wal.close()
