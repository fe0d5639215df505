"""Linux native AIO (``io_submit``) for the block WAL's group writes, through ctypes (no extension).

Why: a group write handed to an I/O thread needs the GIL twice, to start the ``pwrite`` and to hand
the completion back, and a thread waiting for the GIL gets it only once the event loop blocks (or
after the 5 ms switch interval): while the loop runs Python, a write waits to start and a finished
write waits to report. With AIO the loop submits the write itself (``io_submit`` of an O_DIRECT
write, about 10-50 us in the kernel with the GIL released) and the kernel signals its completion on an
eventfd that the loop polls like a socket: no thread, no GIL hand-off. The descriptor has O_DSYNC,
so a completion means durable, as for ``pwrite``.

Only for O_DIRECT descriptors (on a buffered one ``io_submit`` would write synchronously) on x86-64
and arm64 Linux; :meth:`Aio.create` returns None anywhere else and the WAL keeps its I/O threads.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
from typing import Any

# syscall numbers of io_setup, io_destroy, io_getevents, io_submit
_SYSCALLS = {"x86_64": (206, 207, 208, 209), "aarch64": (0, 1, 4, 2), "arm64": (0, 1, 4, 2)}
_IOCB_CMD_PWRITE = 1
_IOCB_FLAG_RESFD = 1  # signal the completion on aio_resfd (an eventfd)


class _Iocb(ctypes.Structure):
    """struct iocb (linux/aio_abi.h), little-endian layout: 64 bytes."""

    _fields_ = [
        ("aio_data", ctypes.c_uint64),  # returned in the io_event: the write's tag
        ("aio_key", ctypes.c_uint32),
        ("aio_rw_flags", ctypes.c_int32),
        ("aio_lio_opcode", ctypes.c_uint16),
        ("aio_reqprio", ctypes.c_int16),
        ("aio_fildes", ctypes.c_uint32),
        ("aio_buf", ctypes.c_uint64),
        ("aio_nbytes", ctypes.c_uint64),
        ("aio_offset", ctypes.c_int64),
        ("aio_reserved2", ctypes.c_uint64),
        ("aio_flags", ctypes.c_uint32),
        ("aio_resfd", ctypes.c_uint32),
    ]


class _IoEvent(ctypes.Structure):
    """struct io_event: the tag, the iocb, the result (bytes written or -errno), res2."""

    _fields_ = [
        ("data", ctypes.c_uint64),
        ("obj", ctypes.c_uint64),
        ("res", ctypes.c_int64),
        ("res2", ctypes.c_int64),
    ]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class Aio:
    """One AIO context of ``depth`` writes at most in flight, and the eventfd that signals completions.

    Not thread-safe: the WAL uses it from its event loop only (and :meth:`close` once nothing is in
    flight, or to wait for what is).
    """

    def __init__(self, syscall: Any, numbers: tuple[int, int, int, int], ctx: int, depth: int) -> None:
        self._syscall = syscall
        self._setup, self._destroy, self._getevents, self._submit = numbers
        self._ctx = ctypes.c_ulong(ctx)
        self._depth = depth
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._iocb = _Iocb()
        self._iocbs = (ctypes.POINTER(_Iocb) * 1)(ctypes.pointer(self._iocb))
        self._events = (_IoEvent * depth)()
        self._zero = _Timespec(0, 0)

    @classmethod
    def create(cls, depth: int) -> Aio | None:
        """A context for ``depth`` writes in flight, or None where Linux AIO is not available."""
        numbers = _SYSCALLS.get(platform.machine())
        if numbers is None or not hasattr(os, "eventfd"):
            return None
        try:
            syscall = ctypes.CDLL(None, use_errno=True).syscall
        except (OSError, AttributeError):
            return None
        syscall.restype = ctypes.c_long
        ctx = ctypes.c_ulong(0)
        if syscall(numbers[0], depth, ctypes.byref(ctx)) != 0:  # EAGAIN past fs.aio-max-nr, ENOSYS
            return None
        return cls(syscall, numbers, ctx.value, depth)

    def submit_write(self, fd: int, address: int, nbytes: int, pos: int, tag: int) -> None:
        """Start one write of ``nbytes`` at ``address`` (memory that stays valid until it completes) to
        ``fd`` at ``pos``; OSError if the kernel refuses it (nothing started then)."""
        cb = self._iocb
        cb.aio_data = tag
        cb.aio_lio_opcode = _IOCB_CMD_PWRITE
        cb.aio_fildes = fd
        cb.aio_buf = address
        cb.aio_nbytes = nbytes
        cb.aio_offset = pos
        cb.aio_flags = _IOCB_FLAG_RESFD
        cb.aio_resfd = self.fd
        if self._syscall(self._submit, self._ctx, 1, self._iocbs) != 1:
            err = ctypes.get_errno()
            raise OSError(err, f"io_submit: {os.strerror(err)}")

    def reap(self) -> list[tuple[int, int]]:
        """The writes completed so far, as (tag, bytes written or -errno); never blocks."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.fd)
        done: list[tuple[int, int]] = []
        events = self._events
        while True:
            n = self._syscall(self._getevents, self._ctx, 0, self._depth, events, ctypes.byref(self._zero))
            if n < 0:
                err = ctypes.get_errno()
                if err == errno.EINTR:
                    continue
                raise OSError(err, f"io_getevents: {os.strerror(err)}")
            done += [(events[i].data, events[i].res) for i in range(n)]
            if n < self._depth:
                return done

    def close(self) -> None:
        """Destroy the context (the kernel waits for the writes still in flight) and the eventfd."""
        if self._ctx.value:
            self._syscall(self._destroy, self._ctx)
            self._ctx = ctypes.c_ulong(0)
            os.close(self.fd)


def buffer_address(buf: object) -> tuple[int, object]:
    """The address of a writable buffer (an mmap) and the ctypes view that pins it: drop the view
    before closing the buffer."""
    view = ctypes.c_char.from_buffer(buf)  # type: ignore[arg-type]
    return ctypes.addressof(view), view
