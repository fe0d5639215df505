"""The write paths of a sealed group: the WAL's own I/O threads, Linux AIO, io_uring, and the adaptive
choice between AIO and the threads.

By default a group goes to the WAL's own I/O threads through a queue (the descriptor is O_DSYNC: one
``pwrite`` is durable on return, and the thread needs the GIL only around that call and the
hand-back); a finished write comes back with one ``call_soon_threadsafe``. One thread per group in
flight, and one for header writes.

With ``aio="auto"`` (not the default: see :class:`WalConfig`), on an O_DIRECT file or block device
(Linux) a group is instead written with native
AIO (:mod:`wal.aio`): the pump submits it itself and the kernel signals its completion on an eventfd
the loop polls, so neither the write's start nor its completion waits for the GIL (an I/O thread gets
the GIL only once the loop blocks: a write sealed in a busy loop turn waited for the turn's end to
start, and a finished one for the next idle moment to report). A group that wraps (its padding record
first), header writes and any submission the kernel refuses still go to the I/O threads.
``aio="uring"`` does the same with io_uring (:mod:`wal.uring`): the pump submits the group's write,
linked to an fdatasync, on a second O_DIRECT descriptor without O_DSYNC, and one completion per group
comes back on the ring's eventfd; ``stats["aio_writes"]`` counts the groups either path wrote.
``aio="adaptive"`` (the default) uses Linux AIO and the I/O threads side by side and writes each
group with the one that suits the machine now (:mod:`wal.adaptive`): the threads while other
processes leave less than about one CPU free (read from ``/proc/stat`` every 0.1 s), else AIO unless
the threads measure twice as fast (each path's latency from hand-over to completion on the loop,
compared per group-size class; the other path probed with one group now and then; switches with
hysteresis); ``mode`` tells the path in use and ``stats`` counts ``adaptive_switches``,
``adaptive_probes`` and ``adaptive_contended`` (how often CPU load sent the groups to the threads).

The I/O threads hold the job queue, not the WAL: a WAL dropped without ``close()`` stops them (and an
AIO context or ring) once it is unreachable (``weakref.finalize``), as ``close()`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
import time
import weakref
from typing import Any

from wal.adaptive import CpuLoad, PathChooser
from wal.aio import Aio, buffer_address
from wal.errors import WalError, WalIOError
from wal.format import RecordPacker, encode_padding
from wal.state import Group, WalState
from wal.uring import Uring, reopen_plain


class WritePaths(WalState):
    """Writes sealed groups and padding records: I/O threads, Linux AIO or io_uring, and their stop."""

    @property
    def mode(self) -> str:
        """How groups are written: the device's mode, the loop write path if any and, with
        ``aio="adaptive"``, the path in use now and how often it switched."""
        chooser = self._chooser
        if chooser is None:
            return self._mode
        return f"{self._mode}+adaptive(aio|threads,now={chooser.path},switches={chooser.switches})"

    def _start_writer(self) -> None:
        """Start the I/O threads and, as configured, the loop write path; appends are accepted from now."""
        self._packer = RecordPacker(self._wal_id)
        for k in range(self._k_max + 1):  # one per group in flight, one for a header write
            thread = threading.Thread(
                target=_io_thread, args=(self._jobs, self._loop), name=f"wal-io-{k}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        # The threads hold the job queue, not the WAL: a WAL dropped without close() becomes
        # unreachable once no job is queued or running, and then stops its threads.
        self._stop_threads = weakref.finalize(self, _stop_io_threads, self._jobs, self._k_max + 1)
        fd = getattr(self._device, "fd", None)
        if self._config.aio != "off" and getattr(self._device, "direct", False) and isinstance(fd, int):
            aio, aio_fd = self._open_aio(fd)
            if aio is not None:
                pinned = [buffer_address(buf) for buf in self._wbufs]
                self._aio_addrs = [address for address, _ in pinned]
                self._aio_pins = [pin for _, pin in pinned]
                self._aio, self._aio_fd = aio, aio_fd
                # (the reader holds the WAL weakly: a WAL dropped without close() stays unreachable)
                self._loop.add_reader(aio.fd, _aio_ready, weakref.ref(self))
                self._stop_aio = weakref.finalize(
                    self, _drop_aio, self._loop, aio, aio_fd if aio_fd != fd else -1
                )
                self._stop_aio.atexit = False
        self._started = True
        self._accepting = True

    def _open_aio(self, fd: int) -> tuple[Aio | Uring | None, int]:
        """The loop's write path for the O_DIRECT descriptor ``fd`` as configured (``aio``), and the
        descriptor it writes to; (None, -1) where the kernel does not offer it (the I/O threads write)."""
        if self._config.aio in ("auto", "adaptive"):
            aio = Aio.create(self._k_max)
            if aio is not None and self._config.aio == "adaptive":
                load = CpuLoad.open()  # (None without /proc/stat: by latency alone)
                if load is not None:
                    load.free_cpus(time.perf_counter())  # the first window starts now
                self._chooser = PathChooser(load=load)
                self.stats["adaptive_switches"] = self.stats["adaptive_probes"] = 0
                self.stats["adaptive_contended"] = 0
            return aio, fd
        ring = Uring.create(self._k_max)
        if ring is None:
            return None, -1
        try:
            plain_fd = reopen_plain(fd)  # io_uring writes without O_DSYNC, then fdatasyncs
        except OSError:
            ring.close()
            return None, -1
        self._mode = f"{self._mode.replace('+O_DSYNC', '')}+io_uring(write+fdatasync)"
        return ring, plain_fd

    def _submit(self, group: Group) -> None:
        """Hand a sealed group's write to AIO or io_uring from the loop if it is in use (and, with
        ``aio="adaptive"``, chosen now) and the group does not wrap; else to an I/O thread."""
        chooser = self._chooser
        if self.group_write_s is not None or chooser is not None:
            group.submitted = time.perf_counter()
        aio = self._aio
        if aio is not None and not group.pad_len and (chooser is None or chooser.use_aio(group.submitted)):
            try:
                aio.submit_write(
                    self._aio_fd,
                    self._aio_addrs[group.slot],
                    group.end,
                    self._layout.phys(group.first_offset),
                    group.slot,
                )
            except OSError:
                pass  # (e.g. EAGAIN) this one goes to an I/O thread, which reports any lasting error
            else:
                self._aio_groups[group.slot] = group
                group.on_aio = True
                self.stats["aio_writes"] += 1
                return
        self._jobs.put((self._write_group, group, self._group_written))

    def _aio_reap(self) -> None:
        """On the loop (the AIO eventfd is readable): finish the group writes the kernel completed."""
        if self._aio is None:
            return
        try:
            for slot, result in self._aio.reap():
                group = self._aio_groups.pop(slot)
                error: BaseException | None = None
                if result != group.end:
                    at = self._layout.phys(group.first_offset)
                    error = WalIOError(
                        f"write of {group.end} bytes at {at} failed: "
                        + (os.strerror(-result) if result < 0 else f"{result} bytes written")
                    )
                self._group_written(group, error)
        except BaseException as exc:  # a bug or a failed io_getevents: fail every waiter, not hang them
            self._fail(
                exc if isinstance(exc, WalError) else WalIOError(f"WAL write completion failed: {exc!r}")
            )
            if not isinstance(exc, Exception):
                raise

    def _group_written(self, group: Group, error: BaseException | None) -> None:
        """On the loop: a group write finished. Time it (for the adaptive chooser and
        :attr:`group_write_s`), then complete it (:mod:`wal.groups`)."""
        if self._failure is not None:
            return
        if self.group_write_s is not None or self._chooser is not None:
            now = time.perf_counter()
            if self.group_write_s is not None:
                self.group_write_s.append(now - group.submitted)
            chooser = self._chooser
            if chooser is not None and error is None and not group.pad_len:
                # (a wrapping group writes its padding record first: not comparable)
                chooser.record(group.on_aio, group.end, now - group.submitted, now)
                self.stats["adaptive_switches"] = chooser.switches
                self.stats["adaptive_probes"] = chooser.probes
                self.stats["adaptive_contended"] = chooser.contended_count
        self._write_done(group, error)

    def _write_group(self, group: Group) -> None:
        """Runs on an I/O thread: the padding record if the group wraps, then one write of the group."""
        if group.pad_len:
            pad_at = group.first_offset - group.pad_len
            self._write_padding_sync(
                pad_at, encode_padding(offset=pad_at, length=group.pad_len, wal_id=self._wal_id)
            )
        self._device.write(self._layout.phys(group.first_offset), self._wviews[group.slot][: group.end])
        self._device.sync()

    def _write_padding_sync(self, offset: int, pad: bytes) -> None:
        block = self._layout.block
        buf = self._pbuf
        buf[:block] = self._zeros
        buf[: len(pad)] = pad
        with memoryview(buf) as view:
            self._device.write(self._layout.phys(offset), view[:block])
        self._device.sync()

    async def _stop_writer(self) -> None:
        """Stop the loop write path (waiting for its writes in flight) and the I/O threads."""
        aio = self._aio
        if aio is not None:
            # (both wait for the writes still in flight before they let go of the buffers)
            self._aio = None
            self._loop.remove_reader(aio.fd)
            if self._stop_aio is not None:
                self._stop_aio.detach()
            try:
                await self._loop.run_in_executor(self._pool, aio.close)
            finally:
                self._aio_pins = []
                if isinstance(aio, Uring):
                    os.close(self._aio_fd)
                self._aio_fd = -1
        if self._threads:
            self._stop_threads()
            await self._loop.run_in_executor(self._pool, self._join_threads)

    def _join_threads(self) -> None:
        for thread in self._threads:
            thread.join()
        self._threads = []


def _io_thread(jobs: queue.SimpleQueue[tuple[Any, Any, Any] | None], loop: asyncio.AbstractEventLoop) -> None:
    """An I/O thread: run each job ``(fn, arg, done)`` as ``fn(arg)``; hand ``done(arg, error)`` to
    the loop. A ``None`` job stops the thread. (A plain function: between jobs the thread holds no
    reference to the WAL, see :meth:`WritePaths._start_writer`.)"""
    call = loop.call_soon_threadsafe
    while True:
        job = jobs.get()
        if job is None:
            return
        fn, arg, done = job
        del job
        error: BaseException | None = None
        try:
            fn(arg)
        except BaseException as exc:  # noqa: BLE001 - thread boundary: the loop fails the WAL with it
            error = exc
        try:
            call(done, arg, error)
        except RuntimeError:  # the loop is closed: nobody is left to tell
            return
        finally:
            del fn, arg, done, error


def _aio_ready(ref: weakref.ref[WritePaths]) -> None:
    """The AIO eventfd's reader: completions for the WAL, if it is still alive."""
    wal = ref()
    if wal is not None:
        wal._aio_reap()


def _drop_aio(loop: asyncio.AbstractEventLoop, aio: Aio | Uring, own_fd: int) -> None:
    """A WAL with AIO or io_uring was dropped without close(): stop polling its eventfd, destroy the
    context or ring and close the descriptor it wrote to if it has its own (``own_fd``, else -1), on
    the loop's thread; at once if the loop is closed. Both wait for writes still in flight (their
    buffers' pages stay pinned by the kernel until then)."""

    def stop() -> None:
        with contextlib.suppress(Exception):
            loop.remove_reader(aio.fd)
        aio.close()
        if own_fd >= 0:
            os.close(own_fd)

    try:
        loop.call_soon_threadsafe(stop)
    except RuntimeError:  # the loop is closed
        stop()


def _stop_io_threads(jobs: queue.SimpleQueue[tuple[Any, Any, Any] | None], count: int) -> None:
    """Stop ``count`` I/O threads (at close, or once a WAL that was never closed is unreachable)."""
    for _ in range(count):
        jobs.put(None)
