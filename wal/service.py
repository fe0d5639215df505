"""The block WAL service: pipelined group commit, in-order completions, trim, recovery, close.

Write path: ``append`` queues the body (or its parts) and returns a future; the first append of a
loop turn schedules the *pump* (a plain callback, no task), which runs after everything already
ready in that turn, so the appends of one turn form one group. The pump seals the queued records
into a *write group* (up to ``batch_max_bytes``, 4 KiB aligned, never across the physical end of
the device), assigns their offsets and, in the same pass, packs headers, CRC32Cs and bodies into a
reused aligned buffer; then hands the group to the WAL's own I/O threads through a queue (the
descriptor is O_DSYNC: one ``pwrite`` is durable on return, and the thread needs the GIL only
around that call and the hand-back). A finished write comes back with one
``call_soon_threadsafe``. Up to ``groups_inflight_max`` (K) groups are written at once, one per I/O
thread; they complete (futures resolve) strictly in offset order, and group n + K starts only after
group n completed, which bounds what a crash can leave behind (the recovery rule in
docs/format.md section 4.6 and :mod:`wal.recovery` depends on this). The pump runs again after
the appenders a completion woke, so what they append next joins the next group. When nothing is in
flight and a large queue (256 KiB) waits, it is sealed as two groups written at once
(:data:`_SPLIT_MIN_BYTES`).

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

The I/O threads hold the job queue, not the WAL: a WAL dropped without ``close()`` stops them and
closes its device (descriptor and lock) once it is unreachable (``weakref.finalize``), as ``close()``
does.

A trim writes the header (alternating slots, sequence counter) on its own I/O thread while group
writes go on: the header's ``start_offset`` is a sealed group's start (in flight or not) or the
aligned end of the log, and space freed by a trim is reused only once that header write is durable
(a group is sealed against the start of the last *durable* header), so an overlapping header write
changes neither what a crash can leave behind nor the recovery rule (docs/format.md 4.2, 4.6).
Close writes its clean-close header once no group is in flight.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import itertools
import operator
import os
import queue
import random
import threading
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from crc32c import crc32c

from wal.adaptive import CpuLoad, PathChooser
from wal.aio import Aio, buffer_address
from wal.config import WalConfig
from wal.device import Device, aligned_buffer, open_device
from wal.errors import (
    InvalidWalConfig,
    WalArgumentError,
    WalCapacityError,
    WalClosedError,
    WalCorruptionError,
    WalError,
    WalFencedError,
    WalIOError,
    WalStateError,
)
from wal.format import (
    _CRC,
    _RECORD_HEADER_CRC_SPAN,
    _RECORD_HEADER_FIXED,
    _RECORD_HEADER_VARYING,
    DATA_MAGIC,
    FLAG_FIRST,
    FORMAT_VERSION,
    NO_CLEAN_END,
    RECORD_HEADER_SIZE,
    WalHeader,
    decode_wal_header,
    encode_padding,
    encode_wal_header,
)
from wal.recovery import Layout, Scanner, WalRecord, align_up
from wal.uring import Uring, reopen_plain

_H = RECORD_HEADER_SIZE
_JOIN_BODY_MAX = 4096
"""Bodies up to this size are joined with their headers before the copy into the write buffer (the
extra copy costs less than packing in place does); larger bodies are copied in place."""


_SPLIT_MIN_BYTES = 256 << 10
"""When nothing is in flight and at least this much is queued, the queue is sealed as two groups of
about half each, written at once (K >= 2). A device writes two such groups in about the time of one,
and the two halves then stay apart: the appenders woken by one group's completion run while the other
group is written, so the loop's work overlaps the device's instead of alternating with it. (An I/O
thread needs the GIL to start and to hand back a write, so a group sealed in the middle of a busy
loop turn would wait for the turn's end anyway: splitting at the end of a turn costs nothing.)

Below 256 KiB a split does not pay: the second write brings its own GIL hand-offs and completion
callback, and the device time it saves is small. 1 KiB appends paced at half load (about 188k/s, bursts
of 190-380 KiB): 256 KiB instead of 64 KiB took p99 2.8 -> 2.3 ms, p50 0.95 -> 0.86 ms and CPU per
append 2.6 -> 2.3 us (median of 6 paired runs, 5 pairs better); 256 closed-loop producers of 1 KiB
(about 270 KiB queued) and 16 of 64 KiB (about 1 MiB queued) ran at the same rates. A higher bound
costs the 64 KiB appends: at 512 KiB they were about 6 % slower, without a split 8 %."""


Body = bytes | bytearray | memoryview
"""A record body: any C-contiguous bytes-like object (one-dimensional, byte-sized items)."""
BodyParts = Body | Sequence[Body]
"""What :meth:`BlockWAL.append` takes: a body, or a list or tuple of parts written back to back as one
record (e.g. a header and a payload: no concatenation copy on the caller's side)."""


class _Req:
    """One append_many call: its bodies, how many are sealed and completed, and its future.

    (A single append is queued as its body and its future in two parallel lists: the hot path
    allocates no object of its own. An append_many is queued as the _Req and None.)
    """

    __slots__ = ("bodies", "cum", "done", "fut", "nbytes", "offsets", "sealed", "take")

    def __init__(self, bodies: Sequence[Body], cum: list[int], fut: asyncio.Future[list[int]]) -> None:
        self.bodies = bodies
        self.cum = cum  # cum[i] = bytes of records 0..i, headers included
        self.sealed = 0
        self.take = len(cum)  # records below this go into the group being sealed
        self.done = 0
        self.fut = fut
        self.nbytes = cum[-1]
        self.offsets: list[int] = []


_Queued = Body | tuple[Body, ...] | _Req
"""What the queue holds for one append: its body, its parts, or an append_many call."""


class _Group:
    """One sealed, packed write: where it starts, and whom to complete with which offsets."""

    __slots__ = (
        "done",
        "end",
        "error",
        "first_offset",
        "futs",
        "nbytes",
        "offs",
        "on_aio",
        "pad_len",
        "records",
        "req_bytes",
        "reqs",
        "slot",
        "submitted",
    )

    def __init__(self, first_offset: int, pad_len: int, slot: int) -> None:
        self.first_offset = first_offset
        self.pad_len = pad_len
        self.slot = slot
        self.futs: list[asyncio.Future[int]] = []  # single appends, and their offsets in ``offs``
        self.offs: list[int] = []
        self.reqs: list[tuple[_Req, list[int]]] = []  # append_many slices and their offsets
        self.nbytes = 0
        self.req_bytes = 0  # of ``nbytes``: records of append_many calls
        self.records = 0
        self.end = 0  # aligned length of the write
        self.done = False  # its write returned (durable unless ``error``)
        self.error: BaseException | None = None
        self.submitted = 0.0  # when its write was handed over (perf_counter; only if timed)
        self.on_aio = False  # written by AIO or io_uring from the loop (else on an I/O thread)


class BlockWAL:
    """A durable circular log of opaque records. Create with :meth:`open`, then run :meth:`recover`."""

    def __init__(self, device: Device, config: WalConfig, pool: ThreadPoolExecutor) -> None:
        self._device = device
        self._config = config
        self._pool = pool
        self._layout = Layout(config.block_size_bytes, config.device_bytes)
        self._loop = asyncio.get_running_loop()
        self._header: WalHeader | None = None
        self._seq = 0
        self._wal_id = 0
        self._recovered = False
        self._closed = False
        self._closing = False
        self._failure: BaseException | None = None
        self._tail = 0  # end of the last sealed record
        self._trim_offset = 0
        self._requested_start = 0
        self._flushed_start = 0  # start offset of the last durable header: space below is free
        self._durable_trim = 0
        self._groups: collections.deque[tuple[int, int]] = collections.deque()
        self._pending: list[_Queued] = []  # queued, not sealed
        self._pending_futs: list[asyncio.Future[int] | None] = []  # their futures (None: append_many)
        self._pending_bytes = 0  # what they take in the log (headers included; of a _Req: unsealed)
        self._accepting = False  # recovered, writer running, not closing or failed: append's fast path
        self._record_max_bytes = config.record_max_bytes
        self._inflight_max_bytes = config.inflight_max_bytes
        self._inflight_bytes = 0
        self._admit_max_bytes = config.inflight_max_bytes  # -1 while appends wait for room (FIFO)
        self._new_future = self._loop.create_future
        # appends waiting for room below inflight_max_bytes: (bytes, the append's future, and the
        # single append's queue item, or None for an append_many waiting on its future)
        self._admit_waiters: collections.deque[tuple[int, asyncio.Future[Any], _Queued | None]] = (
            collections.deque()
        )
        self._header_waiters: list[asyncio.Future[None]] = []
        self._k_max = config.groups_inflight_max
        self._split_min_bytes = _SPLIT_MIN_BYTES if self._k_max > 1 else 1 << 62
        self._inflight: collections.deque[_Group] = collections.deque()  # submitted, not completed
        self._scheduled = False  # a pump is scheduled on the loop
        self._started = False  # the I/O threads run
        self._header_busy = False  # a header write is in flight (groups may be too, unless closing)
        self._close_waiter: asyncio.Future[None] | None = None
        # a data record header's fixed part and its CRC32C, for a group's first record and the rest
        self._fixed_first = self._fixed_rest = (b"", 0)
        self._header_job: tuple[list[asyncio.Future[None]], bool] = ([], False)  # its waiters, clean?
        self._jobs: queue.SimpleQueue[tuple[Any, Any, Any] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._wbufs = [aligned_buffer(config.write_max_bytes) for _ in range(config.groups_inflight_max)]
        self._wviews = [memoryview(b) for b in self._wbufs]
        self._free_slots = list(range(config.groups_inflight_max))
        self._pbuf = aligned_buffer(config.block_size_bytes)  # a wrapping group's padding record
        self._hbuf = aligned_buffer(config.block_size_bytes)  # header writes (may overlap a padding write)
        self._zeros = bytes(config.block_size_bytes)
        self._mode = device.mode
        self.stats = {"groups": 0, "records": 0, "bytes_written": 0, "headers": 0, "aio_writes": 0}
        self._chooser: PathChooser | None = None  # aio="adaptive" with AIO available
        # A WAL dropped without close() closes its device (a file's descriptor and lock) once it is
        # unreachable: no job is queued or running then (every job holds the WAL), so nothing can
        # still use the descriptor. Not at interpreter exit (the process releases it anyway, and a
        # WAL still alive then may be mid-write on a daemon I/O thread).
        self._close_device = weakref.finalize(self, device.close)
        self._close_device.atexit = False
        # Linux AIO or io_uring (see _start_writer): the context or ring, the descriptor it writes to
        # (io_uring: its own), the write buffers' addresses (and the ctypes views that pin them), the
        # groups in flight by write slot
        self._aio: Aio | Uring | None = None
        self._aio_fd = -1
        self._aio_addrs: list[int] = []
        self._aio_pins: list[object] = []
        self._aio_groups: dict[int, _Group] = {}
        self._stop_aio: weakref.finalize[Any, Any] | None = None
        self.group_write_s: list[float] | None = None
        """For benchmarks: when a list, each group write's time from its hand-over to its completion
        reaching the loop is appended (seconds)."""

    # ------------------------------------------------------------------ open / recover / close
    @classmethod
    async def open(cls, path: str | os.PathLike[str] | Device, config: WalConfig) -> BlockWAL:
        """Open (creating if needed) the WAL at ``path`` (file or block device) or on a Device object.

        A new WAL is ready for appends; an existing one needs :meth:`recover` first. Raises
        WalLockedError when another handle has it open, WalFencedError when its header has a newer node
        epoch, InvalidWalConfig when the device does not match ``config``.
        """
        loop = asyncio.get_running_loop()
        pool = ThreadPoolExecutor(max_workers=config.groups_inflight_max, thread_name_prefix="wal-io")
        try:
            if isinstance(path, (str, os.PathLike)):
                device = await loop.run_in_executor(pool, open_device, path, config)
            else:
                device = path
                if device.size_bytes < config.device_bytes:
                    raise InvalidWalConfig(
                        f"device of {device.size_bytes} bytes below capacity {config.device_bytes}"
                    )
        except BaseException:
            pool.shutdown(wait=False)
            raise
        self = cls(device, config, pool)
        try:
            await loop.run_in_executor(pool, self._load_header)
            if self._recovered:
                self._start_writer()
        except BaseException:
            await self._release()
            raise
        return self

    def _load_header(self) -> None:
        cfg = self._config
        block = cfg.block_size_bytes
        buf = aligned_buffer(2 * block)
        self._device.read_into(0, memoryview(buf)[: 2 * block])
        copies = [decode_wal_header(memoryview(buf)[k * block : k * block + block]) for k in (0, 1)]
        blank = buf[: 2 * block] == bytes(2 * block)
        buf.close()
        valid = [h for h in copies if h is not None]
        if not valid and not blank:
            raise WalCorruptionError(
                "neither header slot holds a valid WAL header and they are not zero: refusing to treat the "
                "device as new (zero its first 2 blocks to create a WAL there)",
                position=0,
            )
        if not valid:
            self._wal_id = random.getrandbits(32) | 1
            header = WalHeader(
                0,
                self._wal_id,
                block,
                cfg.device_bytes,
                cfg.node_id,
                cfg.groups_inflight_max,
                cfg.node_epoch,
                0,
                0,
                cfg.window_bytes,
                NO_CLEAN_END,
            )
            # Both slots from the start: until the first trim or close writes the second copy, a
            # damaged single copy would make every record of the new WAL unreadable.
            self._write_header_sync(header)
            self._write_header_sync(header._replace(seq=1))
            self._seq = 1
            self._recovered = True
            return
        h = max(valid, key=lambda c: c.seq)
        if h.block_size != block or h.capacity != cfg.device_bytes:
            raise InvalidWalConfig(
                f"WAL was created with capacity {h.capacity} and block size {h.block_size}; configured "
                f"{cfg.device_bytes} and {block} (capacity cannot change after creation)"
            )
        if h.node_epoch > cfg.node_epoch:
            raise WalFencedError(
                f"WAL header has node epoch {h.node_epoch}, newer than ours ({cfg.node_epoch})"
            )
        self._header = h
        self._seq = h.seq
        self._wal_id = h.wal_id

    async def recover(self) -> AsyncIterator[WalRecord]:
        """Every durable, untrimmed record in offset order. Iterate to the end before appending.

        Raises WalCorruptionError (with the physical position) for damage the recovery rule does not
        explain. Yields nothing for a new WAL or when called again.
        """
        if self._closed or self._closing:
            raise WalClosedError("WAL is closed")
        if self._recovered or self._header is None:
            return
        scanner = Scanner(self._device, self._layout, self._header)
        while not scanner.done:
            batch = await self._loop.run_in_executor(self._pool, scanner.next_batch)
            for rec in batch:
                yield rec
        assert scanner.result is not None
        await self._loop.run_in_executor(self._pool, self._finish_recovery, scanner)
        self._start_writer()

    async def recover_all(self) -> list[WalRecord]:
        return [rec async for rec in self.recover()]

    def _finish_recovery(self, scanner: Scanner) -> None:
        h = self._header
        assert h is not None
        assert scanner.result is not None
        end = scanner.result.end_offset
        layout = self._layout
        tail = end
        starts = scanner.result.group_starts
        groups = [(s, e) for s, e in itertools.pairwise([*starts, end])]
        bridge = align_up(end, layout.block)
        if h.clean_end_offset == NO_CLEAN_END and bridge < h.start_offset + layout.area:
            # The last session may have left torn groups anywhere below end + window: bridge over them
            # with a padding record so that no byte it wrote is ever read as part of the log.
            new_start = min(bridge + h.window, h.start_offset + layout.area)
            pad = encode_padding(offset=bridge, length=new_start - bridge, wal_id=self._wal_id)
            self._write_padding_sync(bridge, pad)
            groups.append((bridge, new_start))
            tail = new_start
        self._groups = collections.deque(groups)
        self._tail = tail
        self._trim_offset = self._durable_trim = h.trim_offset
        self._flushed_start = self._requested_start = h.start_offset
        cfg = self._config
        header = h._replace(
            seq=self._seq + 1,
            node_id=cfg.node_id,
            inflight_groups=cfg.groups_inflight_max,
            node_epoch=cfg.node_epoch,
            window=cfg.window_bytes,
            clean_end_offset=NO_CLEAN_END,
        )
        self._write_header_sync(header)
        self._seq += 1
        self._recovered = True

    async def close(self) -> None:
        """Finish every queued append, write a clean-close header, release the device and its lock."""
        if self._closed:
            return
        self._closing = True
        self._accepting = False
        try:
            if self._started and self._failure is None:
                waiter = self._close_waiter = self._loop.create_future()
                self._schedule()
                await waiter
        finally:
            self._closed = True
            await self._release()

    async def _release(self) -> None:
        try:
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
            await self._loop.run_in_executor(self._pool, self._close_device)  # (once: a finalizer)
        finally:
            self._pool.shutdown(wait=True)
            for view in self._wviews:
                view.release()
            with contextlib.suppress(BufferError):  # a failed write's traceback may still hold a view
                for buf in self._wbufs:
                    buf.close()
                self._pbuf.close()
                self._hbuf.close()

    def _join_threads(self) -> None:
        for thread in self._threads:
            thread.join()
        self._threads = []

    # ------------------------------------------------------------------ properties
    @property
    def mode(self) -> str:
        """How groups are written: the device's mode, the loop write path if any and, with
        ``aio="adaptive"``, the path in use now and how often it switched."""
        chooser = self._chooser
        if chooser is None:
            return self._mode
        return f"{self._mode}+adaptive(aio|threads,now={chooser.path},switches={chooser.switches})"

    @property
    def next_offset(self) -> int:
        """The end of the last appended record: every assigned offset is below it."""
        return self._tail

    @property
    def trim_offset(self) -> int:
        """Records with an offset below this are trimmed."""
        return self._trim_offset

    @property
    def capacity_bytes(self) -> int:
        return self._config.device_bytes

    @property
    def used_bytes(self) -> int:
        """Bytes of the record area that are not yet reusable (sealed data above the durable start)."""
        return align_up(self._tail, self._layout.block) - self._flushed_start

    # ------------------------------------------------------------------ append
    def _check_writable(self) -> None:
        if self._failure is not None:
            raise WalClosedError(f"WAL failed: {self._failure}") from self._failure
        if self._closed or self._closing:
            raise WalClosedError("WAL is closed")
        if not self._recovered:
            raise WalStateError("recover() must run to the end before the first append")

    def append(self, data: BodyParts) -> asyncio.Future[int]:
        """Append one record; the returned future resolves to its logical offset once it is durable.

        ``data`` is the body (bytes-like), or a list or tuple of bytes-like parts that make the body
        back to back (e.g. a header and a payload, so the caller need not concatenate them; recovery
        returns the joined body). The bytes must not change until the future is done. Use as
        ``offset = await wal.append(data)``: a plain method, not a coroutine, so an append costs no
        coroutine frame; an invalid call or a closed WAL raises at once. Offsets follow call order.
        Cancelling the future does not withdraw the record: it may still become durable.
        """
        if not self._accepting:
            self._check_writable()
        cls = data.__class__
        if cls is bytes or cls is bytearray:
            n = len(data)
        else:
            data, n = _as_body(data)
        if n > self._record_max_bytes:
            raise WalArgumentError(f"record of {n} bytes above record_max_bytes {self._record_max_bytes}")
        size = n + _H
        fut: asyncio.Future[int] = self._new_future()
        inflight = self._inflight_bytes + size
        if inflight > self._admit_max_bytes and (self._admit_waiters or self._inflight_bytes):
            self._admit_waiters.append((size, fut, data))  # type: ignore[arg-type]
            self._admit_max_bytes = -1  # later appends queue behind this one
            return fut
        self._inflight_bytes = inflight
        self._pending_bytes += size
        self._pending.append(data)  # type: ignore[arg-type]
        self._pending_futs.append(fut)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._pump)
        return fut

    async def append_many(self, records: Sequence[Body]) -> list[int]:
        """Append records in order (in as few group writes as fit); returns their offsets once durable.

        Not atomic: on an error, a prefix of the records may be durable and come back on recovery.
        """
        self._check_writable()
        if not records:
            return []
        if not all(r.__class__ is bytes or r.__class__ is bytearray for r in records):
            records = [
                r if r.__class__ is bytes or r.__class__ is bytearray else _as_view(r) for r in records
            ]
        rmax = self._config.record_max_bytes
        if max(map(len, records)) > rmax:
            raise WalArgumentError(f"a record is above record_max_bytes {rmax}")
        cum = list(itertools.accumulate(map(_H.__add__, map(len, records))))
        size = cum[-1]
        await self._admit(size)
        fut: asyncio.Future[list[int]] = self._loop.create_future()
        self._pending.append(_Req(records, cum, fut))
        self._pending_futs.append(None)
        self._pending_bytes += size
        self._schedule()
        return await fut

    async def _admit(self, size: int) -> None:
        cap = self._config.inflight_max_bytes
        if not self._admit_waiters and (self._inflight_bytes + size <= cap or not self._inflight_bytes):
            self._inflight_bytes += size
            return
        fut: asyncio.Future[None] = self._loop.create_future()
        self._admit_waiters.append((size, fut, None))
        self._admit_max_bytes = -1
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release_inflight(size)
            raise
        self._check_writable()

    def _release_inflight(self, size: int) -> None:
        self._inflight_bytes -= size
        cap = self._config.inflight_max_bytes
        waiters = self._admit_waiters
        while waiters:
            need, fut, item = waiters[0]
            if fut.done():  # cancelled while waiting: it takes no room
                waiters.popleft()
                continue
            if self._inflight_bytes + need > cap and self._inflight_bytes:
                break
            waiters.popleft()
            self._inflight_bytes += need
            if item is None:
                fut.set_result(None)
            else:
                self._pending.append(item)
                self._pending_futs.append(fut)
                self._pending_bytes += need
                self._schedule()
        if not waiters:
            self._admit_max_bytes = self._inflight_max_bytes

    def _schedule(self) -> None:
        """Run the pump soon: after the callbacks that are ready now (an appender woken in this turn
        appends before the pump seals)."""
        if not self._scheduled and self._started:
            self._scheduled = True
            self._loop.call_soon(self._pump)

    # ------------------------------------------------------------------ trim
    async def trim(self, offset: int) -> None:
        """Drop every record whose offset is ``< offset``; returns once that is durable.

        ``offset`` may be any value up to :attr:`next_offset` (usually a record offset, or the offset
        just past the last record to drop). Space is reclaimed by whole write groups.
        """
        self._check_writable()
        if offset > self._tail:
            raise WalArgumentError(f"trim offset {offset} beyond the end of the log {self._tail}")
        if offset <= self._durable_trim:
            return
        if offset > self._trim_offset:
            self._trim_offset = offset
        fut: asyncio.Future[None] = self._loop.create_future()
        self._header_waiters.append(fut)
        self._schedule()
        await fut

    # ------------------------------------------------------------------ the pump and the I/O threads
    def _start_writer(self) -> None:
        fixed = [
            _RECORD_HEADER_FIXED.pack(DATA_MAGIC, FORMAT_VERSION, flags, 0, self._wal_id)
            for flags in (FLAG_FIRST, 0)
        ]
        self._fixed_first, self._fixed_rest = ((f, crc32c(f)) for f in fixed)
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

    def _pump(self) -> None:
        """The writer's one step, run as a loop callback: start a header write for the waiting trims
        (one at a time, beside the group writes), seal and submit groups while fewer than K are in
        flight, and start the clean-close header once nothing is. Re-run by appends, completions,
        trims, header writes and close."""
        self._scheduled = False
        if self._failure is not None:
            return
        try:
            self._pump_once()
        except BaseException as exc:  # a bug: fail every waiter rather than hang them
            self._fail(exc if isinstance(exc, WalError) else WalIOError(f"WAL writer died: {exc!r}"))
            if not isinstance(exc, Exception):
                raise

    def _pump_once(self) -> None:
        inflight = self._inflight
        if self._header_waiters and not self._header_busy:
            self._start_header(clean=False)
        while self._pending and len(inflight) < self._k_max:
            split = 0
            if not inflight and self._pending_bytes >= self._split_min_bytes:
                split = self._pending_bytes // 2
            if self._submit(split):
                continue
            if self._header_busy:
                return  # the trim being written may free room: its completion runs the pump again
            if self._config.on_full == "error" or self._closing:
                self._fail_pending(
                    WalCapacityError(
                        f"WAL full: {self.used_bytes} of {self._layout.area} bytes hold untrimmed records"
                    )
                )
            return  # on_full="wait": a trim runs the pump again
        if (
            self._closing
            and self._close_waiter is not None
            and not self._pending
            and not self._admit_waiters
            and not inflight
            and not self._header_busy
            and not self._header_waiters
        ):
            self._start_header(clean=True)

    def _submit(self, split: int = 0) -> bool:
        """Seal and pack the queued records into one group (of at most ``split`` bytes if not 0) and
        hand its write to an I/O thread. False when the ring has no room for the first queued record.
        """
        group = self._seal_and_pack(self._free_slots[-1], split)
        if group is None:
            return False
        self._free_slots.pop()
        self._inflight.append(group)
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
                return True
        self._jobs.put((self._write_group, group, self._write_done))
        return True

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
                self._write_done(group, error)
        except BaseException as exc:  # a bug or a failed io_getevents: fail every waiter, not hang them
            self._fail(
                exc if isinstance(exc, WalError) else WalIOError(f"WAL write completion failed: {exc!r}")
            )
            if not isinstance(exc, Exception):
                raise

    def _write_done(self, group: _Group, error: BaseException | None) -> None:
        """On the loop: a group write finished. Complete what is now in order; then let the pump run
        after the appenders just woken (what they append next, in this turn, joins one group)."""
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
        group.error = error
        group.done = True
        if error is None:
            stats = self.stats
            stats["groups"] += 1
            stats["records"] += group.records
            stats["bytes_written"] += group.end
        inflight = self._inflight
        while inflight and inflight[0].done:
            head = inflight[0]
            if head.error is not None:
                exc = head.error
                self._fail(exc if isinstance(exc, WalError) else WalIOError(f"WAL write failed: {exc!r}"))
                return
            inflight.popleft()
            self._free_slots.append(head.slot)
            self._complete(head)
        if self._pending or self._header_waiters or self._closing:
            self._schedule()

    def _fail(self, exc: BaseException) -> None:
        """The WAL is failed: every pending, in-flight and waiting call raises ``exc``; close only
        releases the device."""
        if self._failure is not None:
            return
        self._failure = exc
        self._accepting = False
        self._fail_all(exc)
        waiter = self._close_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail_pending(self, exc: BaseException) -> None:
        while self._pending:
            items, futs = self._pending, self._pending_futs
            self._pending, self._pending_futs = [], []
            self._pending_bytes = 0
            for data, single in zip(items, futs, strict=True):
                fut: asyncio.Future[Any]
                if single is None:
                    req: _Req = data  # type: ignore[assignment]
                    self._release_inflight(req.nbytes)
                    fut = req.fut
                else:
                    self._release_inflight(_body_len(data) + _H)  # type: ignore[arg-type]
                    fut = single
                if not fut.done():
                    fut.set_exception(exc)

    def _fail_all(self, exc: BaseException) -> None:
        while self._inflight:
            group = self._inflight.popleft()
            futs: list[asyncio.Future[Any]] = [*group.futs, *(req.fut for req, _ in group.reqs)]
            for fut in futs:
                if not fut.done():
                    fut.set_exception(exc)
        waiters: list[asyncio.Future[Any]] = [f for _, f, _ in self._admit_waiters]
        self._admit_waiters.clear()
        self._admit_max_bytes = self._inflight_max_bytes
        self._fail_pending(exc)
        waiters += self._header_waiters
        self._header_waiters = []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(exc)

    def _seal_and_pack(self, slot: int, split: int = 0) -> _Group | None:
        """Take queued records into one group at the next aligned offset and pack their headers, CRCs
        and bodies into write buffer ``slot``; None if the ring is full.

        One pass over the records, on the event loop: the I/O thread then needs the GIL only around
        one ``pwrite``, so the two threads do not hand the GIL back and forth while a group is written.
        """
        layout = self._layout
        area = layout.area
        start = align_up(self._tail, layout.block)
        room_cycle = area - start % area
        room_ring = self._flushed_start + area - start
        first = self._pending[0]
        if first.__class__ is _Req:
            req: _Req = first
            k = req.sealed
            first_size = req.cum[k] - (req.cum[k - 1] if k else 0)
        else:
            first_size = _body_len(first) + _H  # type: ignore[arg-type]
        pad_len = 0
        if first_size > room_cycle:
            pad_len = room_cycle
            start += room_cycle
            room_cycle = area
            room_ring -= pad_len
        if first_size > min(room_cycle, room_ring):
            return None
        limit = max(min(self._config.batch_max_bytes, room_cycle, room_ring, split or room_ring), first_size)
        items, item_futs = self._take(limit)
        group = _Group(start, pad_len, slot)
        off = self._pack_small(group, items, item_futs)
        if off < 0:
            off = self._pack(group, items, item_futs)
        pos = off - start
        group.nbytes = pos
        group.records += len(group.futs)
        self._tail = off
        self._groups.append((start, off))
        end = align_up(pos, layout.block)
        if end != pos:
            self._wviews[slot][pos:end] = self._zeros[: end - pos]
        group.end = end
        return group

    def _pack_small(
        self, group: _Group, items: list[_Queued], item_futs: list[asyncio.Future[int] | None]
    ) -> int:
        """The usual group, packed with C-level loops: every item a single append of one bytes-like
        body of at most :data:`_JOIN_BODY_MAX` bytes. Returns the offset past the last record, or -1
        (nothing changed) when the group holds anything else.

        The same bytes as :meth:`_pack`, about half its CPU per 1 KiB record: ``map`` runs each step
        (body CRCs, lengths, offsets, varying parts, header CRCs) over the whole group without a
        bytecode round per record, and the pieces are interleaved by slice assignment.
        """
        try:
            # TypeError: a body given as parts (a tuple) or an append_many (_Req) is queued
            crcs = list(map(crc32c, items))  # type: ignore[arg-type]
        except TypeError:
            return -1
        lens = list(map(len, items))  # type: ignore[arg-type]
        if max(lens) > _JOIN_BODY_MAX:
            return -1
        count = len(lens)
        offs: list[int] = list(
            map(
                operator.add,
                itertools.accumulate(lens, initial=group.first_offset),
                range(0, _H * count + 1, _H),
            )
        )
        end = offs.pop()
        varying = list(map(_RECORD_HEADER_VARYING.pack, lens, offs, crcs))
        fixed, fixed_crc = self._fixed_rest
        pieces: list[Any] = [fixed] * (4 * count)
        pieces[1::4] = varying
        pieces[2::4] = map(_CRC.pack, map(crc32c, varying, itertools.repeat(fixed_crc, count)))
        pieces[3::4] = items
        first, first_crc = self._fixed_first  # the group's first record has the FIRST flag
        pieces[0] = first
        pieces[2] = _CRC.pack(crc32c(varying[0], first_crc))
        self._wviews[group.slot][: end - group.first_offset] = b"".join(pieces)
        group.futs = item_futs  # type: ignore[assignment]
        group.offs = offs
        return end

    def _pack(self, group: _Group, items: list[_Queued], item_futs: list[asyncio.Future[int] | None]) -> int:
        """Pack ``items`` (any kind) into the group's write buffer; returns the offset past the last."""
        start = group.first_offset
        futs = group.futs
        offs = group.offs
        view = self._wviews[group.slot]
        # A record header is packed as its fixed part (magic .. wal_id; packed and CRCed once per WAL,
        # FIRST flag or not), its varying part and the header CRC, continued from the fixed part's.
        fixed, fixed_crc = self._fixed_first
        fixed_rest = self._fixed_rest
        varying = _RECORD_HEADER_VARYING.pack
        crc_bytes = _CRC.pack
        join_max = _JOIN_BODY_MAX
        hsize = _H
        # Records with a body up to _JOIN_BODY_MAX go into ``pieces`` (header parts, body) and reach
        # the buffer in one join and one copy: a third less CPU per small record than packing each in
        # place. Larger bodies are copied in place once (a join would copy them twice).
        pieces: list[Body] = []
        joined_from = 0  # buffer position where ``pieces`` begin
        off = start
        add_fut = futs.append
        add_off = offs.append
        for data, fut in zip(items, item_futs, strict=True):
            cls = data.__class__
            if cls is bytes or cls is bytearray or cls is memoryview:
                n = len(data)  # type: ignore[arg-type]
                var = varying(n, off, crc32c(data))  # type: ignore[arg-type]
                if n <= join_max:
                    pieces += (fixed, var, crc_bytes(crc32c(var, fixed_crc)), data)  # type: ignore[arg-type]
                else:
                    joined_from = self._flush_pieces(view, pieces, joined_from, off - start)
                    self._put_in_place(view, off - start, fixed + var, data)  # type: ignore[arg-type]
                    joined_from = off - start + hsize + n
                add_fut(fut)  # type: ignore[arg-type]
                add_off(off)
                off += hsize + n
                fixed, fixed_crc = fixed_rest
                continue
            if cls is _Req:  # an append_many: its records from ``sealed`` to ``take``
                req: _Req = data  # type: ignore[assignment]
                req_offs: list[int] = []
                for body in req.bodies[req.sealed : req.take]:
                    n = len(body)
                    var = varying(n, off, crc32c(body))
                    if n <= join_max:
                        pieces += (fixed, var, crc_bytes(crc32c(var, fixed_crc)), body)
                    else:
                        joined_from = self._flush_pieces(view, pieces, joined_from, off - start)
                        self._put_in_place(view, off - start, fixed + var, body)
                        joined_from = off - start + hsize + n
                    req_offs.append(off)
                    off += hsize + n
                    fixed, fixed_crc = fixed_rest
                group.reqs.append((req, req_offs))
                group.records += req.take - req.sealed
                group.req_bytes += req.cum[req.take - 1] - (req.cum[req.sealed - 1] if req.sealed else 0)
                req.sealed = req.take
                req.take = len(req.cum)
                continue
            parts: tuple[Body, ...] = data  # type: ignore[assignment]
            crc = 0
            n = 0
            for part in parts:
                crc = crc32c(part, crc)
                n += len(part)
            var = varying(n, off, crc)
            if n <= join_max:
                pieces += (fixed, var, crc_bytes(crc32c(var, fixed_crc)))
                pieces += parts
            else:
                joined_from = self._flush_pieces(view, pieces, joined_from, off - start)
                self._put_in_place(view, off - start, fixed + var, parts)
                joined_from = off - start + hsize + n
            add_fut(fut)  # type: ignore[arg-type]
            add_off(off)
            off += hsize + n
            fixed, fixed_crc = fixed_rest
        if pieces:
            view[joined_from : off - start] = b"".join(pieces)
        return off

    def _take(self, limit: int) -> tuple[list[_Queued], list[asyncio.Future[int] | None]]:
        """The queued items (and their futures) that fill at most ``limit`` bytes, taken off the
        queue, in order; the first always fits. An append_many that fits in part is taken with
        ``take`` below its end and also stays first in the queue for the rest."""
        pending, futs = self._pending, self._pending_futs
        if self._pending_bytes <= limit:  # the usual case: everything queued fits
            self._pending, self._pending_futs = [], []
            self._pending_bytes = 0
            return pending, futs
        used = 0
        count = 0
        partial = False
        for data in pending:
            if data.__class__ is not _Req:
                size = _body_len(data) + _H  # type: ignore[arg-type]
                if used + size > limit:
                    break
                used += size
                count += 1
                continue
            req: _Req = data
            cum = req.cum
            base = cum[req.sealed - 1] if req.sealed else 0
            if used + cum[-1] - base <= limit:
                used += cum[-1] - base
                count += 1
                continue
            j = bisect.bisect_right(cum, base + limit - used, lo=req.sealed)
            if j > req.sealed:
                req.take = j
                used += cum[j - 1] - base
                partial = True
                count += 1
            break
        items, item_futs = pending[:count], futs[:count]
        keep = count - 1 if partial else count
        del pending[:keep]
        del futs[:keep]
        self._pending_bytes -= used
        return items, item_futs

    @staticmethod
    def _flush_pieces(view: memoryview, pieces: list[Body], joined_from: int, pos: int) -> int:
        """Copy the joined ``pieces`` to ``view[joined_from:pos]`` and clear them; returns ``pos``."""
        if pieces:
            view[joined_from:pos] = b"".join(pieces)
            pieces.clear()
        return pos

    @staticmethod
    def _put_in_place(view: memoryview, pos: int, head: bytes, data: Body | tuple[Body, ...]) -> None:
        """A record with a large body: header, header CRC and body copied once into ``view`` at ``pos``."""
        view[pos : pos + _RECORD_HEADER_CRC_SPAN] = head
        _CRC.pack_into(view, pos + _RECORD_HEADER_CRC_SPAN, crc32c(head))
        p = pos + _H
        for part in data if isinstance(data, tuple) else (data,):
            view[p : p + len(part)] = part
            p += len(part)

    def _write_group(self, group: _Group) -> None:
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

    def _complete(self, group: _Group) -> None:
        released = group.nbytes - group.req_bytes
        for fut, off in zip(group.futs, group.offs, strict=True):
            if not fut.done():  # (cancelled by its caller)
                fut.set_result(off)
        for req, offsets in group.reqs:
            req.offsets += offsets
            req.done += len(offsets)
            if req.done == len(req.cum):
                released += req.nbytes
                if not req.fut.done():
                    req.fut.set_result(req.offsets)
        if released:
            self._release_inflight(released)

    def _start_header(self, *, clean: bool) -> None:
        """Hand a header write to an I/O thread. Groups sealed meanwhile still count the ring's room
        from the last durable header's start (:attr:`_flushed_start`), which only its completion moves:
        the space it frees is not written before it is durable. ``start`` is the first sealed group
        holding a record at or past the trim offset, durable or in flight: after a crash the scan
        from there finds the end at the first torn group, as it would from an earlier start."""
        trim = self._trim_offset
        groups = self._groups
        while groups and groups[0][1] <= trim:
            groups.popleft()
        start = groups[0][0] if groups else align_up(self._tail, self._layout.block)
        cfg = self._config
        header = WalHeader(
            self._seq + 1,
            self._wal_id,
            cfg.block_size_bytes,
            cfg.device_bytes,
            cfg.node_id,
            cfg.groups_inflight_max,
            cfg.node_epoch,
            trim,
            start,
            cfg.window_bytes,
            align_up(self._tail, self._layout.block) if clean else NO_CLEAN_END,
        )
        self._header_job = (self._header_waiters, clean)
        self._header_waiters = []
        self._header_busy = True
        self._jobs.put((self._write_header_sync, header, self._header_done))

    def _header_done(self, header: WalHeader, error: BaseException | None) -> None:
        """On the loop: a header write finished; wake its trims (or close), run the pump again."""
        self._header_busy = False
        waiters, clean = self._header_job
        self._header_job = ([], False)
        if self._failure is not None:
            return
        if error is not None:
            self._header_waiters[:0] = waiters
            self._fail(
                error if isinstance(error, WalError) else WalIOError(f"WAL header write failed: {error!r}")
            )
            return
        self._seq = header.seq
        self._flushed_start = header.start_offset
        self._durable_trim = header.trim_offset
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        if clean:
            waiter = self._close_waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            return
        self._schedule()

    def _write_header_sync(self, header: WalHeader) -> None:
        block = self._layout.block
        buf = self._hbuf
        buf[:block] = self._zeros
        data = encode_wal_header(header)
        buf[: len(data)] = data
        with memoryview(buf) as view:
            self._device.write((header.seq % 2) * block, view[:block])
        self._device.sync()
        self.stats["headers"] += 1


def _io_thread(jobs: queue.SimpleQueue[tuple[Any, Any, Any] | None], loop: asyncio.AbstractEventLoop) -> None:
    """An I/O thread: run each job ``(fn, arg, done)`` as ``fn(arg)``; hand ``done(arg, error)`` to
    the loop. A ``None`` job stops the thread. (A plain function: between jobs the thread holds no
    reference to the WAL, see :meth:`BlockWAL._start_writer`.)"""
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


def _aio_ready(ref: weakref.ref[BlockWAL]) -> None:
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


def _body_len(data: Body | tuple[Body, ...]) -> int:
    """Bytes of a queued body or of its parts (views are flat: see :func:`_as_body`)."""
    return sum(map(len, data)) if data.__class__ is tuple else len(data)


def _as_view(data: Body) -> memoryview:
    """``data`` as a flat byte view (lengths are then byte counts); a typed error if it is not one."""
    try:
        return memoryview(data).cast("B")
    except TypeError as exc:
        raise WalArgumentError(
            f"a record body must be C-contiguous bytes-like, got {type(data).__name__}"
        ) from exc


def _as_body(data: BodyParts) -> tuple[Body | tuple[Body, ...], int]:
    """A body given as a bytes-like object or as parts: what the write path packs, and its byte count."""
    if data.__class__ is tuple and len(data) == 2:  # (header, payload) of bytes: the engine's large appends
        head, tail = data
        if head.__class__ is bytes and tail.__class__ is bytes:
            return data, len(head) + len(tail)
    if isinstance(data, (list, tuple)):
        parts = tuple(p if p.__class__ is bytes or p.__class__ is bytearray else _as_view(p) for p in data)
        return parts, sum(map(len, parts))
    view = _as_view(data)  # type: ignore[arg-type]
    return view, len(view)
