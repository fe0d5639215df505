"""Device adapters under the WAL: a preallocated file, a raw block device, and memory.

A device is a fixed-size array of bytes with positional reads and writes and a durability barrier
(``sync``). The service only issues writes and reads whose position and length are multiples of the
block size, from page-aligned buffers (:func:`aligned_buffer`), so O_DIRECT works wherever the file
system allows it. Methods block: the service calls them from its I/O threads, never from the loop.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import stat
from typing import Protocol

from wal.config import WalConfig
from wal.errors import InvalidWalConfig, WalCorruptionError, WalIOError, WalLockedError
from wal.format import decode_wal_header

_FILL_CHUNK_BYTES = 8 << 20


def aligned_buffer(size_bytes: int) -> mmap.mmap:
    """A zeroed, page-aligned anonymous buffer (usable for O_DIRECT reads and writes)."""
    return mmap.mmap(-1, max(size_bytes, mmap.PAGESIZE))


class Device(Protocol):
    size_bytes: int
    mode: str
    """How writes become durable, e.g. ``O_DIRECT+fdatasync``, ``buffered+fdatasync``, ``memory``."""

    def write(self, pos: int, data: bytes | bytearray | memoryview | mmap.mmap) -> None: ...

    def read_into(self, pos: int, buf: memoryview) -> int:
        """Fill ``buf`` from ``pos``; returns the bytes read (short only at the end of the device)."""
        ...

    def sync(self) -> None: ...

    def close(self) -> None: ...


class MemoryDevice:
    """A device in memory: everything written is durable at once. ``data`` survives ``close``."""

    mode = "memory"

    def __init__(self, size_bytes: int, data: bytearray | None = None) -> None:
        self.size_bytes = size_bytes
        self.data = data if data is not None else bytearray(size_bytes)
        if len(self.data) != size_bytes:
            raise InvalidWalConfig(f"memory device of {len(self.data)} bytes, expected {size_bytes}")
        self.closed = False

    def write(self, pos: int, data: bytes | bytearray | memoryview | mmap.mmap) -> None:
        if self.closed:
            raise WalIOError("memory device is closed")
        view = memoryview(data)
        if pos < 0 or pos + len(view) > self.size_bytes:
            raise WalIOError(f"write of {len(view)} bytes at {pos} beyond device end {self.size_bytes}")
        self.data[pos : pos + len(view)] = view

    def read_into(self, pos: int, buf: memoryview) -> int:
        if self.closed:
            raise WalIOError("memory device is closed")
        n = max(0, min(len(buf), self.size_bytes - pos))
        buf[:n] = self.data[pos : pos + n]
        return n

    def sync(self) -> None:
        if self.closed:
            raise WalIOError("memory device is closed")

    def close(self) -> None:
        self.closed = True


class _FdDevice:
    """Shared read/write/sync over a file descriptor; translates OSError to WalIOError."""

    def __init__(self, fd: int, size_bytes: int, direct: bool, path: str) -> None:
        self.fd = fd
        self.size_bytes = size_bytes
        self.direct = direct
        self.path = path
        # The descriptor is opened with O_DSYNC: every write returns once its data is durable (one
        # syscall instead of pwrite + fdatasync), so sync() has nothing left to do.
        self.mode = "O_DIRECT+O_DSYNC" if direct else "buffered+O_DSYNC"

    def write(self, pos: int, data: bytes | bytearray | memoryview | mmap.mmap) -> None:
        view = memoryview(data)
        try:
            while len(view):
                n = os.pwrite(self.fd, view, pos)
                view = view[n:]
                pos += n
        except OSError as exc:
            raise WalIOError(f"write at {pos} of {self.path} failed: {exc}") from exc

    def read_into(self, pos: int, buf: memoryview) -> int:
        total = 0
        try:
            while total < len(buf):
                n = os.preadv(self.fd, [buf[total:]], pos + total)
                if n == 0:
                    break
                total += n
        except OSError as exc:
            raise WalIOError(f"read at {pos} of {self.path} failed: {exc}") from exc
        return total

    def sync(self) -> None:
        """Nothing to do: the descriptor has O_DSYNC (see __init__)."""

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)  # releases the flock as well


def _lock(fd: int, path: str) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise WalLockedError(f"WAL {path} is open in another process or handle") from exc


def _open_maybe_direct(path: str, flags: int, direct_io: str) -> tuple[int, bool]:
    if direct_io != "off":
        try:
            return os.open(path, flags | os.O_DIRECT), True
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            if direct_io == "on":
                raise InvalidWalConfig(f"cannot open {path} with O_DIRECT: {exc}") from exc
    return os.open(path, flags), False


def _recorded_capacity(path: str, block_size: int) -> int | None:
    """The capacity the newest valid header copy of the WAL file records (None: no valid copy)."""
    with open(path, "rb") as f:
        head = f.read(2 * block_size)
    copies = [decode_wal_header(head[k * block_size : (k + 1) * block_size]) for k in (0, 1)]
    valid = [h for h in copies if h is not None]
    return max(valid, key=lambda h: h.seq).capacity if valid else None


class FileDevice(_FdDevice):
    """A regular file of exactly the device size, created preallocated and zero-filled."""

    @classmethod
    def open(cls, path: str, config: WalConfig) -> FileDevice:
        size = config.device_bytes
        if not os.path.exists(path):
            cls._create(path, size)
        try:
            fd, direct = _open_maybe_direct(path, os.O_RDWR | os.O_CLOEXEC | os.O_DSYNC, config.direct_io)
        except OSError as exc:
            raise InvalidWalConfig(f"cannot open WAL file {path}: {exc}") from exc
        _lock(fd, path)
        actual = os.fstat(fd).st_size
        if actual != size:
            os.close(fd)
            recorded = _recorded_capacity(path, config.block_size_bytes)
            if recorded is not None and recorded > actual:
                raise WalCorruptionError(
                    f"WAL file {path} is truncated: it has {actual} bytes, its header records {recorded}",
                    position=actual,
                )
            raise InvalidWalConfig(
                f"WAL file {path} has {actual} bytes but the configured capacity is {size} "
                "(capacity cannot change after creation)"
            )
        return cls(fd, size, direct, path)

    @staticmethod
    def _create(path: str, size: int) -> None:
        """Zero-fill a temporary file, sync it, and rename it into place (a crash leaves no half file)."""
        tmp = f"{path}.creating"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            _lock(fd, tmp)
            with contextlib.suppress(OSError):
                os.posix_fallocate(fd, 0, size)
            zeros = bytes(min(_FILL_CHUNK_BYTES, size))
            pos = 0
            while pos < size:
                n = os.pwrite(fd, memoryview(zeros)[: size - pos], pos)
                pos += n
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            raise InvalidWalConfig(f"cannot create WAL file {path}: {exc}") from exc
        os.close(fd)
        os.rename(tmp, path)
        dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


class BlockDevice(_FdDevice):
    """A raw block device (``/dev/...``), opened exclusively; the WAL uses its first ``capacity`` bytes."""

    @classmethod
    def open(cls, path: str, config: WalConfig) -> BlockDevice:
        try:
            fd, direct = _open_maybe_direct(
                path, os.O_RDWR | os.O_CLOEXEC | os.O_EXCL | os.O_DSYNC, config.direct_io
            )
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                raise WalLockedError(f"block device {path} is in use") from exc
            raise InvalidWalConfig(f"cannot open block device {path}: {exc}") from exc
        _lock(fd, path)
        size = os.lseek(fd, 0, os.SEEK_END)
        if size < config.device_bytes:
            os.close(fd)
            raise InvalidWalConfig(
                f"block device {path} has {size} bytes, below capacity {config.device_bytes}"
            )
        return cls(fd, config.device_bytes, direct, path)


def open_device(path: str | os.PathLike[str], config: WalConfig) -> Device:
    """A block device when ``path`` is one, else a (possibly new) preallocated file."""
    name = os.fspath(path)
    try:
        is_block = stat.S_ISBLK(os.stat(name).st_mode)
    except FileNotFoundError:
        is_block = False
    if is_block:
        return BlockDevice.open(name, config)
    return FileDevice.open(name, config)
