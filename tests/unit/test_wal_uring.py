"""wal.uring: the io_uring ring under the WAL's ``aio="uring"`` (write linked to an fdatasync)."""

from __future__ import annotations

import errno
import mmap
import os
import resource
import select
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from wal import BlockWAL, WalConfig
from wal.aio import buffer_address
from wal.uring import RingFullError, Uring, reopen_plain

BLOCK = 4096


@pytest.fixture
def ring() -> Iterator[Uring]:
    created = Uring.create(4)
    if created is None:
        pytest.skip("no io_uring here")
    yield created
    created.close()


@pytest.fixture
def buf() -> Iterator[tuple[mmap.mmap, int]]:
    data = mmap.mmap(-1, 4 * BLOCK)
    data.write(bytes(range(256)) * (4 * BLOCK // 256))
    address, pin = buffer_address(data)
    yield data, address
    del pin
    data.close()


@pytest.fixture
def direct_fd(tmp_path: Path) -> Iterator[int]:
    path = tmp_path / "data.dat"
    path.write_bytes(bytes(16 * BLOCK))
    try:
        fd = os.open(path, os.O_RDWR | os.O_DIRECT | os.O_DSYNC)
    except OSError:
        pytest.skip("no O_DIRECT here")
    plain = reopen_plain(fd)
    os.close(fd)
    yield plain
    os.close(plain)


def _read(fd: int, nbytes: int, pos: int) -> bytes:
    """Bytes of ``fd``'s file, read through a buffered descriptor (``fd`` has O_DIRECT)."""
    with open(f"/proc/self/fd/{fd}", "rb") as f:
        f.seek(pos)
        return f.read(nbytes)


def test_a_second_descriptor_has_o_direct_without_o_dsync(direct_fd: int) -> None:
    import fcntl

    flags = fcntl.fcntl(direct_fd, fcntl.F_GETFL)
    assert flags & os.O_DIRECT
    assert not flags & os.O_DSYNC


def test_writes_complete_once_each_with_their_bytes_and_signal_the_eventfd(
    ring: Uring, buf: tuple[mmap.mmap, int], direct_fd: int
) -> None:
    data, address = buf
    for tag in range(4):
        ring.submit_write(direct_fd, address + tag * BLOCK, BLOCK, (tag + 2) * BLOCK, tag)
    assert ring.inflight == 4
    readable, _, _ = select.select([ring.fd], [], [], 10)
    assert readable == [ring.fd]
    done = ring.wait()
    assert sorted(done) == [(tag, BLOCK) for tag in range(4)]
    assert ring.inflight == 0
    assert ring.reap() == []
    assert _read(direct_fd, 4 * BLOCK, 2 * BLOCK) == data[: 4 * BLOCK]


def test_a_full_ring_refuses_a_write_and_queues_nothing(
    ring: Uring, buf: tuple[mmap.mmap, int], direct_fd: int
) -> None:
    _, address = buf
    for tag in range(4):
        ring.submit_write(direct_fd, address, BLOCK, tag * BLOCK, tag)
    with pytest.raises(RingFullError):
        ring.submit_write(direct_fd, address, BLOCK, 0, 9)
    assert sorted(tag for tag, _ in ring.wait()) == [0, 1, 2, 3]
    ring.submit_write(direct_fd, address, BLOCK, 0, 9)
    assert ring.wait() == [(9, BLOCK)]


@pytest.mark.parametrize("skip", [True, False], ids=["one-cqe", "two-cqes"])
def test_a_failed_write_reports_its_errno_once(
    ring: Uring, buf: tuple[mmap.mmap, int], direct_fd: int, tmp_path: Path, skip: bool
) -> None:
    """Whether the kernel skips the write's CQE on success (5.17+) or not (then the fsync of a failed
    write completes with -ECANCELED), each write is reported once, with the write's error."""
    _, address = buf
    if skip and not ring._skip:
        pytest.skip("kernel without IOSQE_CQE_SKIP_SUCCESS")
    ring._skip = skip
    read_only = os.open(tmp_path / "data.dat", os.O_RDONLY)
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        ring.submit_write(read_only, address, BLOCK, 0, 1)
        ring.submit_write(full, address, BLOCK, 0, 2)
        ring.submit_write(direct_fd, address + 1, BLOCK, 0, 3)  # misaligned for O_DIRECT
        ring.submit_write(direct_fd, address, BLOCK, 0, 4)
        assert sorted(ring.wait()) == [(1, -errno.EBADF), (2, -errno.ENOSPC), (3, -errno.EINVAL), (4, BLOCK)]
    finally:
        os.close(read_only)
        os.close(full)
    assert ring.inflight == 0
    assert ring.reap() == []


def test_a_short_write_reports_its_count(ring: Uring, buf: tuple[mmap.mmap, int], tmp_path: Path) -> None:
    """A file size limit cuts a write short: its fsync does not run, the count tells."""
    _, address = buf
    fd = os.open(tmp_path / "short.dat", os.O_RDWR | os.O_CREAT)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (BLOCK, hard))
    try:
        ring.submit_write(fd, address, 2 * BLOCK, 0, 7)
        done = ring.wait()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
        os.close(fd)
    assert done == [(7, BLOCK)]
    assert ring.reap() == []


def test_close_waits_for_writes_in_flight_and_releases_the_descriptors(
    buf: tuple[mmap.mmap, int], direct_fd: int
) -> None:
    data, address = buf
    fds_before = len(os.listdir("/proc/self/fd"))
    ring = Uring.create(2)
    if ring is None:
        pytest.skip("no io_uring here")
    assert len(os.listdir("/proc/self/fd")) > fds_before  # the ring, the eventfd, the maps' copies
    ring.submit_write(direct_fd, address, BLOCK, 0, 0)
    ring.submit_write(direct_fd, address + BLOCK, BLOCK, BLOCK, 1)
    ring.close()
    assert ring.inflight == 0
    assert len(os.listdir("/proc/self/fd")) == fds_before
    assert _read(direct_fd, 2 * BLOCK, 0) == data[: 2 * BLOCK]
    ring.close()  # (again: nothing)


def test_no_ring_where_the_platform_has_no_io_uring(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("wal.uring.platform.machine", lambda: "sparc64")
    assert Uring.create(2) is None


@pytest.mark.parametrize("missing", ["ring", "descriptor"])
async def test_a_uring_wal_writes_on_its_io_threads_where_it_cannot_have_a_ring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    if missing == "ring":
        monkeypatch.setattr("wal.writer.Uring.create", classmethod(lambda cls, depth: None))
    else:

        def refuse(fd: int) -> int:
            raise PermissionError(errno.EACCES, "no")

        monkeypatch.setattr("wal.writer.reopen_plain", refuse)
    fds_before = len(os.listdir("/proc/self/fd"))
    config = WalConfig(
        capacity_bytes=2 << 20, batch_max_bytes=64 << 10, record_max_bytes=64 << 10, aio="uring"
    )
    wal = await BlockWAL.open(tmp_path / "wal.dat", config)
    if not getattr(wal._device, "direct", False):
        await wal.close()
        pytest.skip("no O_DIRECT here")
    assert wal.mode == "O_DIRECT+O_DSYNC"
    offset = await wal.append(b"threads")
    assert wal.stats["aio_writes"] == 0
    await wal.close()
    assert len(os.listdir("/proc/self/fd")) == fds_before
    wal = await BlockWAL.open(tmp_path / "wal.dat", config)
    assert [(r.offset, r.data) async for r in wal.recover()] == [(offset, b"threads")]
    await wal.close()
