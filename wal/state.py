"""The state the parts of the block WAL share: what is queued, sealed, in flight and durable.

:class:`WalState` holds every field of a :class:`wal.service.BlockWAL` (set in one place, each with
what it means); the parts (:mod:`wal.intake`, :mod:`wal.groups`, :mod:`wal.writer`,
:mod:`wal.headers`) are its subclasses, and ``BlockWAL`` combines them. The calls one part makes into
another are declared here, so each part reads (and type-checks) on its own.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from wal.adaptive import PathChooser
from wal.aio import Aio
from wal.config import WalConfig
from wal.device import Device, aligned_buffer
from wal.format import Body, RecordPacker, WalHeader
from wal.recovery import Layout
from wal.uring import Uring

SPLIT_MIN_BYTES = 256 << 10
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


class Req:
    """One append_many call: its bodies, how many are sealed and completed, and its future.

    (A single append is queued as its body and its future in two parallel lists: the hot path
    allocates no object of its own. An append_many is queued as the Req and None.)
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


Queued = Body | tuple[Body, ...] | Req
"""What the queue holds for one append: its body, its parts, or an append_many call."""


class Group:
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
        self.reqs: list[tuple[Req, list[int]]] = []  # append_many slices and their offsets
        self.nbytes = 0
        self.req_bytes = 0  # of ``nbytes``: records of append_many calls
        self.records = 0
        self.end = 0  # aligned length of the write
        self.done = False  # its write returned (durable unless ``error``)
        self.error: BaseException | None = None
        self.submitted = 0.0  # when its write was handed over (perf_counter; only if timed)
        self.on_aio = False  # written by AIO or io_uring from the loop (else on an I/O thread)


class WalState:
    """Every field of the WAL, and the calls its parts make into each other."""

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
        self._pending: list[Queued] = []  # queued, not sealed
        self._pending_futs: list[asyncio.Future[int] | None] = []  # their futures (None: append_many)
        self._pending_many = 0  # of them, append_many calls (Req; one partly sealed counts until done)
        self._pending_bytes = 0  # what they take in the log (headers included; of a Req: unsealed)
        self._accepting = False  # recovered, writer running, not closing or failed: append's fast path
        self._record_max_bytes = config.record_max_bytes
        self._inflight_max_bytes = config.inflight_max_bytes
        self._inflight_bytes = 0
        self._admit_max_bytes = config.inflight_max_bytes  # -1 while appends wait for room (FIFO)
        self._new_future = self._loop.create_future
        # appends waiting for room below inflight_max_bytes: (bytes, the append's future, and the
        # single append's queue item, or None for an append_many waiting on its future)
        self._admit_waiters: collections.deque[tuple[int, asyncio.Future[Any], Queued | None]] = (
            collections.deque()
        )
        self._header_waiters: list[asyncio.Future[None]] = []
        self._k_max = config.groups_inflight_max
        self._split_min_bytes = SPLIT_MIN_BYTES if self._k_max > 1 else 1 << 62
        self._inflight: collections.deque[Group] = collections.deque()  # submitted, not completed
        self._scheduled = False  # a pump is scheduled on the loop
        self._started = False  # the I/O threads run
        self._header_busy = False  # a header write is in flight (groups may be too, unless closing)
        self._close_waiter: asyncio.Future[None] | None = None
        self._packer = RecordPacker(0)  # (of the WAL's wal_id once the writer starts)
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
        self._aio_groups: dict[int, Group] = {}
        self._stop_aio: weakref.finalize[Any, Any] | None = None
        self.group_write_s: list[float] | None = None
        """For benchmarks: when a list, each group write's time from its hand-over to its completion
        reaching the loop is appended (seconds)."""

    # --- the calls one part makes into another (each defined by the part named) -----------------
    def _schedule(self) -> None:  # wal.intake
        raise NotImplementedError

    def _check_writable(self) -> None:  # wal.intake
        raise NotImplementedError

    def _release_inflight(self, size: int) -> None:  # wal.intake
        raise NotImplementedError

    def _take(self, limit: int) -> tuple[list[Queued], list[asyncio.Future[int] | None], int]:  # wal.intake
        raise NotImplementedError

    def _fail_pending(self, exc: BaseException) -> None:  # wal.intake
        raise NotImplementedError

    def _pump(self) -> None:  # wal.groups
        raise NotImplementedError

    def _write_done(self, group: Group, error: BaseException | None) -> None:  # wal.groups
        raise NotImplementedError

    def _fail(self, exc: BaseException) -> None:  # wal.groups
        raise NotImplementedError

    def _submit(self, group: Group) -> None:  # wal.writer
        raise NotImplementedError

    def _start_header(self, *, clean: bool) -> None:  # wal.headers
        raise NotImplementedError
