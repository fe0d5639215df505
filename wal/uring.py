"""Linux io_uring for the block WAL's group writes, through ctypes and mmap (no extension).

A group write is two linked submissions: an ``IORING_OP_WRITE`` of the group to the O_DIRECT
descriptor, then (``IOSQE_IO_LINK``) an ``IORING_OP_FSYNC`` with ``IORING_FSYNC_DATASYNC``: the
durability of ``pwrite`` + ``fdatasync``. The descriptor must not have O_DSYNC (:func:`reopen_plain`
gives one without it): an O_DSYNC direct write completes through the kernel's dio completion
workqueue, a worker bound to the CPU that took the interrupt, which waits to run when other processes
keep that CPU busy (the reason ``aio="auto"`` stays off by default, see :class:`wal.config.WalConfig`).
A plain direct overwrite of a preallocated, written extent completes from the interrupt; the
``fdatasync`` runs on an io-wq worker, a kernel thread of this process that any CPU may run and that
needs no GIL. Completions reach the loop through an eventfd registered with the ring
(``IORING_REGISTER_EVENTFD``), which the loop polls like a socket.

Layout of the structures: linux/io_uring.h (x86-64 and arm64, little-endian). :meth:`Uring.create`
returns None where io_uring is not available (old kernel, seccomp, ``kernel.io_uring_disabled``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import platform
from typing import Any

# syscall numbers of io_uring_setup, io_uring_enter, io_uring_register (the same on both)
_SYSCALLS = {"x86_64": (425, 426, 427), "aarch64": (425, 426, 427), "arm64": (425, 426, 427)}
_OP_FSYNC = 3
_OP_WRITE = 23
_FSYNC_DATASYNC = 1
_SQE_IO_LINK = 1 << 2  # the next submission starts once this one succeeded (else it is cancelled)
_ENTER_GETEVENTS = 1
_REGISTER_EVENTFD = 4
_SQE_CQE_SKIP_SUCCESS = 1 << 6  # no CQE if it succeeds
_SETUP_SUBMIT_ALL = 1 << 7  # consume every entry, even past one that fails to start
_FEAT_SINGLE_MMAP = 1
_FEAT_CQE_SKIP = 1 << 11
_OFF_SQ_RING = 0
_OFF_CQ_RING = 0x8000000
_OFF_SQES = 0x10000000

FSYNC_BIT = 1 << 63
"""Set in the tag a completion carries when it is the linked fsync's (see :meth:`Uring.reap`)."""


class _SqringOffsets(ctypes.Structure):
    _fields_ = [
        ("head", ctypes.c_uint32),
        ("tail", ctypes.c_uint32),
        ("ring_mask", ctypes.c_uint32),
        ("ring_entries", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("dropped", ctypes.c_uint32),
        ("array", ctypes.c_uint32),
        ("resv1", ctypes.c_uint32),
        ("user_addr", ctypes.c_uint64),
    ]


class _CqringOffsets(ctypes.Structure):
    _fields_ = [
        ("head", ctypes.c_uint32),
        ("tail", ctypes.c_uint32),
        ("ring_mask", ctypes.c_uint32),
        ("ring_entries", ctypes.c_uint32),
        ("overflow", ctypes.c_uint32),
        ("cqes", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("resv1", ctypes.c_uint32),
        ("user_addr", ctypes.c_uint64),
    ]


class _Params(ctypes.Structure):
    """struct io_uring_params: 120 bytes."""

    _fields_ = [
        ("sq_entries", ctypes.c_uint32),
        ("cq_entries", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("sq_thread_cpu", ctypes.c_uint32),
        ("sq_thread_idle", ctypes.c_uint32),
        ("features", ctypes.c_uint32),
        ("wq_fd", ctypes.c_uint32),
        ("resv", ctypes.c_uint32 * 3),
        ("sq_off", _SqringOffsets),
        ("cq_off", _CqringOffsets),
    ]


class _Sqe(ctypes.Structure):
    """struct io_uring_sqe: 64 bytes (the fields a write and an fsync use; the rest stay zero)."""

    _fields_ = [
        ("opcode", ctypes.c_uint8),
        ("flags", ctypes.c_uint8),
        ("ioprio", ctypes.c_uint16),
        ("fd", ctypes.c_int32),
        ("off", ctypes.c_uint64),
        ("addr", ctypes.c_uint64),
        ("len", ctypes.c_uint32),
        ("op_flags", ctypes.c_uint32),  # rw_flags of a write, fsync_flags of an fsync
        ("user_data", ctypes.c_uint64),
        ("buf_index", ctypes.c_uint16),
        ("personality", ctypes.c_uint16),
        ("splice_fd_in", ctypes.c_int32),
        ("addr3", ctypes.c_uint64),
        ("pad2", ctypes.c_uint64),
    ]


class _Cqe(ctypes.Structure):
    """struct io_uring_cqe: the tag, the result (bytes written, 0, or -errno), flags."""

    _fields_ = [("user_data", ctypes.c_uint64), ("res", ctypes.c_int32), ("flags", ctypes.c_uint32)]


assert ctypes.sizeof(_Params) == 120
assert ctypes.sizeof(_Sqe) == 64
assert ctypes.sizeof(_Cqe) == 16


class RingFullError(OSError):
    """No room in the submission queue for a write and its fsync (nothing was queued)."""


class Uring:
    """One io_uring for at most ``depth`` group writes in flight, and the eventfd that signals their
    completions.

    The same interface as :class:`wal.aio.Aio`: :meth:`submit_write` starts a write (here: write +
    linked fdatasync), :meth:`reap` returns the finished ones as (tag, bytes written or -errno), one
    per write, in any order. Not thread-safe: the WAL uses it from its event loop only, and
    :meth:`close` once it stopped polling the eventfd.
    """

    def __init__(
        self, syscall: Any, numbers: tuple[int, int, int], ring_fd: int, p: _Params, depth: int
    ) -> None:
        self._syscall = syscall
        self._enter, self._register = numbers[1], numbers[2]
        self._ring_fd = ring_fd
        self._maps: list[mmap.mmap] = []
        self._depth = depth
        # a write whose CQE is skipped on success (IOSQE_CQE_SKIP_SUCCESS, Linux 5.17): one CQE per
        # group either way, the fsync's or the failed write's (which cancels the fsync's silently)
        self._skip = bool(p.features & _FEAT_CQE_SKIP)
        self._writes: dict[int, list[int]] = {}  # tag -> [CQEs still due, bytes, result so far]
        self.fd = -1
        try:
            sq_size = p.sq_off.array + p.sq_entries * 4
            cq_size = p.cq_off.cqes + p.cq_entries * ctypes.sizeof(_Cqe)
            if p.features & _FEAT_SINGLE_MMAP:
                sq = cq = self._map(max(sq_size, cq_size), _OFF_SQ_RING)
            else:
                sq, cq = self._map(sq_size, _OFF_SQ_RING), self._map(cq_size, _OFF_CQ_RING)
            sqes = self._map(p.sq_entries * ctypes.sizeof(_Sqe), _OFF_SQES)
            u32 = ctypes.c_uint32.from_buffer
            self._sq_head = u32(sq, p.sq_off.head)
            self._sq_tail = u32(sq, p.sq_off.tail)
            self._sq_mask = u32(sq, p.sq_off.ring_mask).value
            self._sq_entries = p.sq_entries
            self._sq_array = (ctypes.c_uint32 * p.sq_entries).from_buffer(sq, p.sq_off.array)
            self._sqes = (_Sqe * p.sq_entries).from_buffer(sqes)
            self._cq_head = u32(cq, p.cq_off.head)
            self._cq_tail = u32(cq, p.cq_off.tail)
            self._cq_mask = u32(cq, p.cq_off.ring_mask).value
            self._cqes = (_Cqe * p.cq_entries).from_buffer(cq, p.cq_off.cqes)
            self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            efd = ctypes.c_int32(self.fd)
            if self._syscall(self._register, ring_fd, _REGISTER_EVENTFD, ctypes.byref(efd), 1) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"io_uring_register(EVENTFD): {os.strerror(err)}")
        except BaseException:
            self.close(wait=False)
            raise

    def _map(self, size: int, offset: int) -> mmap.mmap:
        m = mmap.mmap(self._ring_fd, size, mmap.MAP_SHARED, offset=offset)
        self._maps.append(m)
        return m

    @classmethod
    def create(cls, depth: int) -> Uring | None:
        """A ring for ``depth`` writes in flight, or None where io_uring is not available (no
        io_uring_setup: ENOSYS; EPERM from kernel.io_uring_disabled or seccomp; a kernel before 5.18)."""
        numbers = _SYSCALLS.get(platform.machine())
        if numbers is None or not hasattr(os, "eventfd"):
            return None
        try:
            syscall = ctypes.CDLL(None, use_errno=True).syscall
        except (OSError, AttributeError):
            return None
        syscall.restype = ctypes.c_long
        p = _Params()
        p.flags = _SETUP_SUBMIT_ALL  # (EINVAL before 5.18: then no ring)
        ring_fd = syscall(numbers[0], 2 * depth, ctypes.byref(p))
        if ring_fd < 0:
            return None
        try:
            return cls(syscall, numbers, ring_fd, p, depth)
        except OSError:
            return None

    def _queue(
        self, opcode: int, flags: int, fd: int, address: int, nbytes: int, pos: int, op_flags: int, tag: int
    ) -> None:
        tail = self._sq_tail.value
        index = tail & self._sq_mask
        sqe = self._sqes[index]
        ctypes.memset(ctypes.addressof(sqe), 0, ctypes.sizeof(_Sqe))
        sqe.opcode = opcode
        sqe.flags = flags
        sqe.fd = fd
        sqe.off = pos
        sqe.addr = address
        sqe.len = nbytes
        sqe.op_flags = op_flags
        sqe.user_data = tag
        self._sq_array[index] = index
        # (the tail store follows the entry's stores in program order; the kernel reads the tail
        # inside io_uring_enter, a full barrier)
        self._sq_tail.value = (tail + 1) & 0xFFFFFFFF

    def submit_write(self, fd: int, address: int, nbytes: int, pos: int, tag: int) -> None:
        """Start one write of ``nbytes`` at ``address`` (memory that stays valid until it completes)
        to ``fd`` (not O_DSYNC) at ``pos``, linked to an fdatasync of ``fd``. RingFullError or
        OSError if the kernel refuses it (nothing started then)."""
        assert 0 <= tag < FSYNC_BIT
        assert tag not in self._writes
        if (
            len(self._writes) >= self._depth
            or self._sq_entries - (self._sq_tail.value - self._sq_head.value) % (1 << 32) < 2
        ):
            raise RingFullError(errno.EBUSY, "io_uring: as many writes in flight as the ring holds")
        self._queue(
            _OP_WRITE,
            _SQE_IO_LINK | (_SQE_CQE_SKIP_SUCCESS if self._skip else 0),
            fd,
            address,
            nbytes,
            pos,
            0,
            tag,
        )
        self._queue(_OP_FSYNC, 0, fd, 0, 0, 0, _FSYNC_DATASYNC, tag | FSYNC_BIT)
        while True:
            n = self._syscall(self._enter, self._ring_fd, 2, 0, 0, None, 0)
            if n >= 0:
                break
            err = ctypes.get_errno()
            if err != errno.EINTR:  # nothing was consumed: withdraw the two entries
                self._sq_tail.value = (self._sq_tail.value - 2) & 0xFFFFFFFF
                raise OSError(err, f"io_uring_enter: {os.strerror(err)}")
        # IORING_SETUP_SUBMIT_ALL: the kernel consumes every entry (one it cannot start completes
        # with an error), so both went
        assert n == 2, n
        self._writes[tag] = [1 if self._skip else 2, nbytes, nbytes]

    def reap(self) -> list[tuple[int, int]]:
        """The writes finished so far (write and fdatasync), as (tag, bytes written, or -errno of
        the write or the fdatasync, or a short count); never blocks."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.fd)
        head = self._cq_head.value
        tail = self._cq_tail.value
        done: list[tuple[int, int]] = []
        cqes, mask, writes = self._cqes, self._cq_mask, self._writes
        while head != tail:
            cqe = cqes[head & mask]
            data, res = cqe.user_data, cqe.res
            head = (head + 1) & 0xFFFFFFFF
            state = writes[data & ~FSYNC_BIT]
            if state[2] == state[1]:  # no error yet: the first one tells (the fsync after a failed
                if data & FSYNC_BIT:  # write only says -ECANCELED)
                    if res < 0:
                        state[2] = res
                elif res != state[1]:
                    state[2] = res
            state[0] -= 1
            if state[0] == 0:
                del writes[data & ~FSYNC_BIT]
                done.append((data & ~FSYNC_BIT, state[2]))
        self._cq_head.value = head  # (after the entries are read: the kernel may reuse them then)
        return done

    @property
    def inflight(self) -> int:
        """Writes started and not yet reaped."""
        return len(self._writes)

    def wait(self) -> list[tuple[int, int]]:
        """Block until every write in flight finished; returns them as :meth:`reap` does."""
        done: list[tuple[int, int]] = []
        while True:
            done += self.reap()
            if not self._writes:
                return done
            due = sum(state[0] for state in self._writes.values())
            if self._syscall(self._enter, self._ring_fd, 0, due, _ENTER_GETEVENTS, None, 0) < 0:
                err = ctypes.get_errno()
                if err != errno.EINTR:
                    raise OSError(err, f"io_uring_enter: {os.strerror(err)}")

    def close(self, *, wait: bool = True) -> None:
        """Wait for the writes in flight (unless not ``wait``: the kernel still finishes them before
        the ring goes), unmap the rings, close the ring and the eventfd."""
        if self._ring_fd < 0:
            return
        if wait:
            with contextlib.suppress(OSError):
                self.wait()
        for name in ("_sq_head", "_sq_tail", "_sq_array", "_sqes", "_cq_head", "_cq_tail", "_cqes"):
            self.__dict__.pop(name, None)  # (the ctypes views pin the maps)
        for m in self._maps:
            m.close()
        self._maps = []
        os.close(self._ring_fd)
        self._ring_fd = -1
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def reopen_plain(fd: int) -> int:
    """A second descriptor of ``fd``'s file with O_DIRECT and without O_DSYNC (Linux cannot clear
    O_DSYNC with fcntl): through /proc/self/fd, so the same inode even if the path was renamed, and
    without O_EXCL (which a block device open by ``fd`` would refuse). OSError if it cannot."""
    return os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_DIRECT | os.O_CLOEXEC)
