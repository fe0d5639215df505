"""The block WAL's write paths from the loop, Linux AIO (wal.aio, ``aio="auto"``), io_uring
(wal.uring, ``aio="uring"``) and AIO beside the I/O threads (``aio="adaptive"``): used for O_DIRECT
devices, same log as the I/O threads."""

from __future__ import annotations

import asyncio
import errno
import gc
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.directio import loop_writes_work
from wal import BlockWAL, MemoryDevice, WalClosedError, WalConfig, WalIOError
from wal.adaptive import PathChooser
from wal.aio import Aio
from wal.uring import Uring

CONFIG = WalConfig(
    capacity_bytes=2 << 20,
    record_max_bytes=64 << 10,
    batch_max_bytes=64 << 10,
    inflight_max_bytes=1 << 20,
    on_full="wait",
    aio="auto",
)


MODES = {
    "auto": "O_DIRECT+O_DSYNC",
    "uring": "O_DIRECT+io_uring(write+fdatasync)",
    "adaptive": "O_DIRECT+O_DSYNC+adaptive(aio|threads,now=aio,switches=0)",  # (see _open)
}
"""Each loop write path and the mode the WAL reports with it."""


@pytest.fixture(params=sorted(MODES))
def mode(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def _config(mode: str, **changes: Any) -> WalConfig:
    return WalConfig(**{**CONFIG.__dict__, "aio": mode, **changes})


def _aio_or_skip(path: Path, mode: str = "auto") -> None:
    if not loop_writes_work(path.parent, mode):
        pytest.skip(f"no {mode} write path or no O_DIRECT here")


async def _open(path: Path, config: WalConfig = CONFIG) -> tuple[BlockWAL, list[tuple[int, bytes]]]:
    wal = await BlockWAL.open(path, config)
    if wal._chooser is not None:
        # aio="adaptive" without its CPU reading, so it starts on AIO: on a busy test machine the
        # reading would keep the groups on the threads (tests/unit/test_wal_adaptive.py tests it)
        wal._chooser = PathChooser(load=None)
    return wal, [(r.offset, r.data) async for r in wal.recover()]


async def test_an_o_direct_wal_writes_its_groups_from_the_loop_and_recovers_them_across_wraps(
    tmp_path: Path, mode: str
) -> None:
    path = tmp_path / "wal.dat"
    _aio_or_skip(path, mode)
    wal, _ = await _open(path, _config(mode))
    assert wal.mode == MODES[mode]
    written: list[tuple[int, bytes]] = []
    for round_ in range(120):  # ~6 MiB through a 2 MiB ring: wraps (padding records) several times
        bodies = [os.urandom(100 + (round_ * 37 + i * 911) % 9000) for i in range(16)]
        offsets = await asyncio.gather(*(wal.append(b) for b in bodies))
        written += zip(offsets, bodies, strict=True)
        if wal.used_bytes > CONFIG.record_area_bytes // 2:
            await wal.trim(offsets[0])
            written = [(o, b) for o, b in written if o >= offsets[0]]
    assert wal.stats["aio_writes"] > 0
    assert wal.stats["aio_writes"] < wal.stats["groups"]  # a wrapping group goes to an I/O thread
    await wal.close()
    wal, recovered = await _open(path, _config(mode))
    assert recovered == written
    await wal.close()


async def test_with_aio_off_the_io_threads_write(tmp_path: Path) -> None:
    path = tmp_path / "wal.dat"
    _aio_or_skip(path)
    config = _config("off")
    assert WalConfig().aio == "adaptive"  # (the default; off is asked for)
    wal, _ = await _open(path, config)
    offset = await wal.append(b"threads")
    assert wal.stats["aio_writes"] == 0
    await wal.close()
    wal, recovered = await _open(path, config)
    assert recovered == [(offset, b"threads")]
    await wal.close()


async def test_a_memory_device_has_no_aio(mode: str) -> None:
    wal = await BlockWAL.open(MemoryDevice(CONFIG.device_bytes), _config(mode))
    await wal.append(b"x")
    assert wal.stats["aio_writes"] == 0
    await wal.close()


class _FakeAio:
    """Stands in for the kernel: records submissions, completes them with the given results."""

    def __init__(self, real: Aio | Uring, *, refuse: bool = False) -> None:
        self.fd = real.fd
        self.real = real
        self.refuse = refuse
        self.submitted: list[tuple[int, int]] = []  # (tag, nbytes)
        self.results: list[tuple[int, int]] = []

    def submit_write(self, fd: int, address: int, nbytes: int, pos: int, tag: int) -> None:
        if self.refuse:
            raise OSError(errno.EAGAIN, "io_submit: try again")
        self.submitted.append((tag, nbytes))

    def reap(self) -> list[tuple[int, int]]:
        done, self.results = self.results, []
        return done

    def close(self) -> None:
        self.real.close()


async def _one_write_completing_with(
    tmp_path: Path, mode: str, result: Callable[[int], int]
) -> tuple[BlockWAL, asyncio.Future[int]]:
    """A WAL whose one AIO write (of one append) the kernel reports as ``result(bytes submitted)``."""
    path = tmp_path / "wal.dat"
    _aio_or_skip(path, mode)
    wal, _ = await _open(path, _config(mode))
    assert wal._aio is not None
    fake: Any = _FakeAio(wal._aio)
    wal._aio = fake
    fut = wal.append(b"lost")
    await asyncio.sleep(0)  # the pump seals and submits
    ((tag, nbytes),) = fake.submitted
    fake.results = [(tag, result(nbytes))]
    wal._aio_reap()
    return wal, fut


async def test_a_failed_aio_write_fails_the_wal(tmp_path: Path, mode: str) -> None:
    wal, fut = await _one_write_completing_with(tmp_path, mode, lambda nbytes: -errno.EIO)
    with pytest.raises(WalIOError, match="Input/output error"):
        await fut
    with pytest.raises(WalClosedError):
        wal.append(b"after")
    await wal.close()


async def test_a_short_aio_write_fails_the_wal(tmp_path: Path, mode: str) -> None:
    wal, fut = await _one_write_completing_with(tmp_path, mode, lambda nbytes: nbytes - 512)
    with pytest.raises(WalIOError, match="bytes written"):
        await fut
    await wal.close()


async def test_a_refused_submission_goes_to_an_io_thread(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "wal.dat"
    _aio_or_skip(path, mode)
    wal, _ = await _open(path, _config(mode))
    assert wal._aio is not None
    wal._aio = _FakeAio(wal._aio, refuse=True)  # type: ignore[assignment]
    offsets = await asyncio.gather(*(wal.append(b"x" * i) for i in range(1, 50)))
    assert wal.stats["aio_writes"] == 0
    await wal.close()
    wal, recovered = await _open(path, _config(mode))
    assert recovered == [(o, b"x" * i) for i, o in enumerate(offsets, 1)]
    await wal.close()


async def test_a_dropped_aio_wal_releases_its_file_and_lock(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "wal.dat"
    _aio_or_skip(path, mode)
    fds_before = len(os.listdir("/proc/self/fd"))
    wal, _ = await _open(path, _config(mode))
    offset = await wal.append(b"kept")
    assert wal.stats["aio_writes"] == 1
    threads = list(wal._threads)
    del wal
    gc.collect()
    for thread in threads:
        thread.join(timeout=5)
    await asyncio.sleep(0)  # the loop drops the eventfd's reader and the AIO context or the ring
    assert len(os.listdir("/proc/self/fd")) == fds_before  # device, eventfd, ring, second descriptor
    wal, recovered = await _open(path, _config(mode))  # no WalLockedError
    assert recovered == [(offset, b"kept")]
    await wal.close()
    assert len(os.listdir("/proc/self/fd")) == fds_before
