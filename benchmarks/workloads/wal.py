"""Workload ``wal``: the block WAL against raw disk I/O and a minimal group-commit loop, same run.

- **64 KiB appends**: 16 producers append 64 KiB records durably; MB/s vs a raw O_DIRECT sequential
  write of the same bytes (64 KiB ``pwrite``s, one ``fdatasync`` at the end) to the same file
  (goal >= 0.5x).
- **1 KiB appends** with 1, 16 and 256 producers: appends/s vs a minimal asyncio group-commit loop
  (take everything queued, one aligned ``pwrite`` + ``fdatasync`` in a thread, resolve; goal >= 1.0x).
  Both stay open on files of their own and take turns in short slices (order alternating), so both
  see the same moments of the shared machine; per-slice ratios and their median are in ``extra``,
  with a third loop in the same turns: the minimal loop plus the WAL's per-record format work (header
  and two CRC32Cs), which tells the format's share of the gap from the WAL's own overhead, and a
  fourth: the WAL with the other ``aio`` setting (below).
- **append_many**: batches of 10,000 records of 100 bytes, records/s (goal >= 500k/s) vs a raw
  O_DIRECT write of the same record bytes in 1 MiB writes, counted in records.
- **latency at half load**: open-loop 1 KiB appends at half the best 1 KiB rate measured above;
  p50/p99 ms (goal p99 <= 2 ms) vs the p99 of a raw 4 KiB ``pwrite`` + ``fdatasync`` cycle. The
  generator is one pacer, woken every 0.5 ms by a timerfd (``PACER_TICK_S``: uvloop's millisecond
  timers sent bursts of ~2 ms of slots at once), that calls ``append`` itself for each due slot and
  takes completions with a done-callback (about 1 us of CPU per send, half the per-send producer task it replaced: at
  these rates the generator's own cost on the loop is part of every sample). The same
  generator against a no-op append gives the method's own floor, the send lag of both runs (how late
  each send went out against its slot) tells the generator's share of a latency, and a busy-loop
  probe counts how often this process was off the CPU, and the WAL times each group write of the
  paced run from its hand-over to its completion reaching the loop (``BlockWAL.group_write_s``; a
  device stall holds back every later completion; all in ``extra``): on a shared 2-core machine, scheduling
  stalls of 10-100 ms from other processes set the p99 more than the WAL does. Both paced runs start
  on a frozen heap (``gc.collect()`` + ``gc.freeze()``, unfrozen after): a full collection then scans
  only what the run itself allocates, not the harness's modules and earlier sections' leftovers.
  Without it, one full collection of that heap (5-50 ms on this machine) lands in a 3 s run now
  and then and, at 117k sends/s, alone decides the p99 of whichever run it hits (the no-op floor
  read 4.3 ms that way); the WAL's own garbage is still collected as usual.
- **recovery** of a full WAL of 64 KiB records (1 GiB; 128 MiB under --quick): MB/s of ``open`` +
  ``recover`` vs a raw O_DIRECT sequential read of the file in 1 MiB reads (goal >= 0.25x).

``--param aio=off`` (or ``auto``, ``uring``, ``adaptive``) runs every section with ``WalConfig.aio="off"``
(group writes on the I/O threads), ``"auto"`` (by Linux AIO from the loop), ``"uring"`` (io_uring
write + linked fdatasync from the loop) or ``"adaptive"`` (AIO while the CPUs have room, else the I/O
threads); the default is the WAL's default, ``adaptive``. The 1 KiB rates and the paced latency also
run a WAL with each other setting (rates in the same alternating slices, latency as one more paced
run each) and report them in ``extra`` under ``aio_<setting>_*``, the first other one (``off`` for
the default, ``off`` or ``auto`` otherwise) also under ``other_aio_*`` as before: the loop paths are faster on a quiet machine and
can be slower when other processes keep the CPUs busy (see ``WalConfig``), so all are measured each
run. The 1 KiB rows and the latency row also tell what the adaptive WAL's chooser did
(``adaptive_chooser``: its groups, of them by AIO, switches, probes, and how often CPU load sent its
groups to the threads), so a ratio of the adaptive setting can be read with the path it took.

``--param sections=small,latency`` runs only the named sections (of ``large``, ``small``, ``many``,
``latency``, ``recovery``; the latency run needs ``small``'s best rate), e.g. for quick comparisons.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import ctypes
import dataclasses
import gc
import mmap
import os
import statistics
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from crc32c import crc32c

from benchmarks.core import Context, Result
from benchmarks.measure import LatencyRecorder, ResourceMeter, per_gib
from wal import BlockWAL, WalConfig

KiB = 1024
MiB = 1024 * KiB
WORKLOAD = "wal"
SECTIONS = ("large", "small", "many", "latency", "recovery")
"""The sections in order: 64 KiB appends, 1 KiB appends, append_many, latency at half load, recovery."""


def _config(capacity_bytes: int, aio: str = WalConfig.aio) -> WalConfig:
    return WalConfig(
        capacity_bytes=capacity_bytes,
        record_max_bytes=4 * MiB,
        batch_max_bytes=1 * MiB,
        inflight_max_bytes=64 * MiB,
        aio=aio,  # type: ignore[arg-type]
    )


def _open_direct(path: Path, write: bool) -> int:
    flags = (os.O_RDWR if write else os.O_RDONLY) | os.O_CLOEXEC
    try:
        return os.open(path, flags | os.O_DIRECT)
    except OSError:
        return os.open(path, flags)


def _raw_write(path: Path, total_bytes: int, block_bytes: int, start: int = 8192) -> float:
    """Seconds to write ``total_bytes`` with O_DIRECT ``pwrite``s of ``block_bytes`` + one fdatasync."""
    fd = _open_direct(path, True)
    buf = mmap.mmap(-1, block_bytes)
    buf.write(os.urandom(block_bytes))
    try:
        started = time.perf_counter()
        pos = 0
        while pos < total_bytes:
            os.pwrite(fd, buf, start + pos)
            pos += block_bytes
        os.fdatasync(fd)
        return time.perf_counter() - started
    finally:
        buf.close()
        os.close(fd)


def _raw_read(path: Path, total_bytes: int) -> float:
    fd = _open_direct(path, False)
    buf = mmap.mmap(-1, MiB)
    try:
        started = time.perf_counter()
        pos = 0
        while pos < total_bytes:
            n = os.preadv(fd, [buf], pos)
            if n <= 0:
                break
            pos += n
        return time.perf_counter() - started
    finally:
        buf.close()
        os.close(fd)


def _raw_sync_latency(path: Path, count: int) -> LatencyRecorder:
    """The write + fdatasync cycle of one 4 KiB block in place: the floor under any durable append."""
    fd = _open_direct(path, True)
    buf = mmap.mmap(-1, 4 * KiB)
    rec = LatencyRecorder()
    try:
        for i in range(count):
            t = time.perf_counter()
            os.pwrite(fd, buf, 8192 + (i % 256) * 4096)
            os.fdatasync(fd)
            rec.record(time.perf_counter() - t)
    finally:
        buf.close()
        os.close(fd)
    return rec


WRAP_BYTES = 512 * MiB
"""The minimal loop writes circularly over this many bytes of its file (unless it created the file)."""


def _zero_fill(path: Path, size_bytes: int) -> None:
    zeros = bytes(MiB)
    with open(path, "wb") as f:
        for _ in range(-(-size_bytes // MiB)):
            f.write(zeros)
        f.flush()
        os.fsync(f.fileno())


class MinimalGroupCommit:
    """The baseline loop: queue (bytes, future); one task writes everything queued per cycle."""

    def __init__(self, path: Path, *, create_bytes: int = 0) -> None:
        """``create_bytes``: create ``path`` zero-filled and synced, like the WAL's own file (writes into
        a sparse or new file allocate blocks and cost the loop far more per fdatasync), and write
        circularly within it."""
        self.wrap_bytes = WRAP_BYTES
        if create_bytes:
            _zero_fill(path, create_bytes)
            self.wrap_bytes = create_bytes - 8192
        self.fd = _open_direct(path, True)
        self.buf = mmap.mmap(-1, 64 * MiB)
        self.queue: list[tuple[bytes, asyncio.Future[int]]] = []
        self.wake = asyncio.Event()
        self.pos = 0
        self.task = asyncio.get_running_loop().create_task(self._run())
        self.closing = False
        self.group_write_s: list[float] | None = None
        """When a list, each group write's time from its hand-over to the thread to its completion
        reaching the loop is appended (seconds), as ``BlockWAL.group_write_s`` times the WAL's."""

    async def append(self, data: bytes) -> int:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.queue.append((data, fut))
        self.wake.set()
        return await fut

    def _write(self, items: list[tuple[bytes, asyncio.Future[int]]]) -> None:
        n = 0
        for data, _ in items:
            self.buf[n : n + len(data)] = data
            n += len(data)
        n = -(-n // 4096) * 4096
        at = self.pos % self.wrap_bytes
        if at + n > self.wrap_bytes:
            at = self.pos = 0
        os.pwrite(self.fd, memoryview(self.buf)[:n], 8192 + at)
        os.fdatasync(self.fd)
        self.pos += n

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.closing:
            await self.wake.wait()
            self.wake.clear()
            items, self.queue = self.queue, []
            if items:
                started = time.perf_counter()
                await loop.run_in_executor(None, self._write, items)
                if self.group_write_s is not None:
                    self.group_write_s.append(time.perf_counter() - started)
                for i, (_, fut) in enumerate(items):
                    fut.set_result(i)

    async def close(self) -> None:
        self.closing = True
        self.wake.set()
        await self.task
        self.buf.close()
        os.close(self.fd)


async def _producers(append: Callable[[bytes], Any], count: int, duration_s: float, data: bytes) -> int:
    done = 0
    deadline = time.perf_counter() + duration_s

    async def one() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await append(data)
            done += 1

    await asyncio.gather(*(one() for _ in range(count)))
    return done


PAIRED_SLICES = 8
"""1 KiB appends: the WAL and the minimal loop take turns in this many slices each (order alternating)."""


class FormattedGroupCommit(MinimalGroupCommit):
    """The minimal loop plus the WAL's per-record format work (36-byte header, two CRC32Cs, done in
    its write thread under the GIL): how much of the gap to the minimal loop is the format itself."""

    _PREFIX = struct.Struct(">IBBHIQQI")  # the record header without its CRC (docs/format.md 4.3)
    _CRC = struct.Struct(">I")

    def _write(self, items: list[tuple[bytes, asyncio.Future[int]]]) -> None:
        pieces: list[bytes] = []
        off = 0
        for data, _ in items:
            head = self._PREFIX.pack(0x57414C52, 1, 0, 0, 1, len(data), off, crc32c(data))
            pieces += (head, self._CRC.pack(crc32c(head)), data)
            off += 36 + len(data)
        super()._write([(b"".join(pieces), items[0][1])])


AIO_SETTINGS = ("off", "auto", "uring", "adaptive")
"""The WAL's write paths (``WalConfig.aio``): I/O threads, Linux AIO from the loop, io_uring from the
loop, and AIO or the threads by measurement. Every run measures all four: the one chosen with
``--param aio`` in the rows, the others in
the extras (the first of them, ``other_aio_*``, as before io_uring existed)."""


def _other_settings(aio: str) -> list[str]:
    return [setting for setting in AIO_SETTINGS if setting != aio]


class PairedRates(NamedTuple):
    """What :func:`_paired_appends` measured."""

    rates: dict[str, float]
    """appends/s over all slices: ``wal``, ``base``, ``format``, and ``aio=<setting>`` per other setting"""
    ratios: list[float]
    """per slice: WAL / minimal loop"""
    other_ratios: dict[str, list[float]]
    """per other setting, per slice: that WAL / minimal loop"""
    loop_writes: dict[str, int]
    """per setting (the WAL's own too): groups written from the loop (AIO or io_uring)"""
    chooser: dict[str, int]
    """the ``aio="adaptive"`` WAL's (the row's or the other): :func:`_chooser_stats`"""
    cpu_s_per_gib: dict[str, float]
    """per name of ``rates``: this process's CPU s per GiB of appended payload over all its slices"""


def _chooser_stats(wal: BlockWAL) -> dict[str, int]:
    """What an ``aio="adaptive"`` WAL's chooser did (empty for the other settings, or without AIO):
    groups written, of them by AIO (the rest on the I/O threads), switches of path, probes of the
    path not in use, and how often CPU load sent the groups to the threads (``contended``)."""
    stats = wal.stats
    if "adaptive_switches" not in stats:
        return {}
    return {
        "groups": stats["groups"],
        "aio_groups": stats["aio_writes"],
        "switches": stats["adaptive_switches"],
        "probes": stats["adaptive_probes"],
        "contended": stats["adaptive_contended"],
    }


async def _paired_appends(
    work: Path, config: WalConfig, producers: int, duration_s: float, data: bytes
) -> PairedRates:
    """Appends/s of the WAL, of the minimal loop, of the minimal loop with the WAL's record format and
    of the WAL with each other ``aio`` setting, measured in turns in the same run.

    Each stays open on its own file of the same size, zero-filled; every slice runs all of them,
    ``duration_s / PAIRED_SLICES`` each, in an order that alternates, so all see the same moments of
    a noisy shared machine.
    """
    others = _other_settings(config.aio)
    wal_path = work / "wal-paired.dat"
    other_paths = {setting: work / f"wal-aio-{setting}-paired.dat" for setting in others}
    base_path = work / "baseline-paired.dat"
    fmt_path = work / "format-paired.dat"
    wal = await BlockWAL.open(wal_path, config)
    await wal.recover_all()
    other_wals: dict[str, BlockWAL] = {}
    for setting in others:
        setting_config = dataclasses.replace(config, aio=setting)  # type: ignore[arg-type]
        other_wals[setting] = await BlockWAL.open(other_paths[setting], setting_config)
        await other_wals[setting].recover_all()
    base = MinimalGroupCommit(base_path, create_bytes=config.device_bytes)
    fmt = FormattedGroupCommit(fmt_path, create_bytes=config.device_bytes)
    trimmers = [asyncio.ensure_future(_trimmer(w)) for w in (wal, *other_wals.values())]
    slice_s = duration_s / PAIRED_SLICES
    runs = [("wal", wal.append), ("base", base.append), ("format", fmt.append)]
    runs += [(f"aio={setting}", w.append) for setting, w in other_wals.items()]
    totals = {name: [0, 0.0] for name, _ in runs}
    cpu_s = dict.fromkeys(totals, 0.0)
    ratios: list[float] = []
    other_ratios: dict[str, list[float]] = {setting: [] for setting in others}
    loop_writes: dict[str, int] = {}
    chooser: dict[str, int] = {}
    try:
        for i in range(PAIRED_SLICES):
            rates: dict[str, float] = {}
            for name, append in runs if i % 2 == 0 else runs[::-1]:
                started = time.perf_counter()
                with ResourceMeter(interval_s=0) as meter:
                    n = await _producers(append, producers, slice_s, data)
                elapsed = time.perf_counter() - started
                cpu_s[name] += meter.usage.cpu_s
                totals[name][0] += n
                totals[name][1] += elapsed
                rates[name] = n / elapsed
            ratios.append(rates["wal"] / rates["base"])
            for setting in others:
                other_ratios[setting].append(rates[f"aio={setting}"] / rates["base"])
    finally:
        for trimmer in trimmers:
            trimmer.cancel()
        await asyncio.gather(*trimmers, return_exceptions=True)
        loop_writes[config.aio] = wal.stats["aio_writes"]
        chooser |= _chooser_stats(wal)
        await wal.close()
        for setting, w in other_wals.items():
            loop_writes[setting] = w.stats["aio_writes"]
            chooser |= _chooser_stats(w)
            await w.close()
        await base.close()
        await fmt.close()
        for path in (wal_path, *other_paths.values(), base_path, fmt_path):
            os.remove(path)
    return PairedRates(
        {name: n / elapsed for name, (n, elapsed) in totals.items()},
        ratios,
        other_ratios,
        loop_writes,
        chooser,
        {name: per_gib(cpu_s[name], int(n) * len(data)) for name, (n, _) in totals.items()},
    )


async def _trimmer(wal: BlockWAL) -> None:
    """Trim like the engine does after an upload: now and then, everything written so far."""
    while True:
        await asyncio.sleep(0.05)
        if wal.used_bytes > wal.capacity_bytes // 4:
            await wal.trim(wal.next_offset)


@contextlib.contextmanager
def _frozen_heap() -> Iterator[None]:
    """Collect, then move every object alive now out of the collector's scans until the block ends
    (see the module docstring: the harness's heap is not what a latency run measures)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class _NoopAppend:
    """An append that completes on the next loop turn: the load generator's own latency floor.

    Like the WAL, the first append of a loop turn schedules one callback that resolves every future
    queued in that turn: what remains is the generator's own cost (and the loop's).
    """

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queued: list[asyncio.Future[int]] = []

    def append(self, data: bytes) -> asyncio.Future[int]:
        fut: asyncio.Future[int] = self._loop.create_future()
        if not self._queued:
            self._loop.call_soon(self._resolve)
        self._queued.append(fut)
        return fut

    def _resolve(self) -> None:
        queued, self._queued = self._queued, []
        for fut in queued:
            fut.set_result(0)


PACER_TICK_S = 0.0005
"""How often the open-loop pacer sends the slots that fall due (one wake per tick, not per send).

The pacer used to sleep 1 ms with ``asyncio.sleep``, which uvloop (millisecond timers) fired about
every 2 ms: at 190k sends/s about 380 sends went out at once, bursts that no steady stream of
producers makes, and the slots that fell due while it slept were sent up to 2 ms late (their latency
still counted from their due time, as it must). A timerfd tick (:class:`_Ticker`) wakes the loop's
poll from a kernel timer at microsecond resolution, with no thread and no GIL hand-off: about 95
slots per tick at 190k/s. A wake costs the loop ~22 us of CPU on the shared VM (0.2 ms ticks: 10 % of
a core when idle, 0.5 ms: 5 %), so the tick is not finer. Against a no-op append at 190k/s (paired
runs on a loaded machine): latency p50 0.10-0.14 -> 0.04-0.05 ms, generator CPU 0.83-1.06 ->
1.10-1.29 us per send."""


class _Ticker:
    """A Linux timerfd expiring every ``interval_s`` (CLOCK_MONOTONIC, the clock of
    ``time.perf_counter``), for ``loop.add_reader``; :meth:`create` returns None where there is none."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def create(cls, interval_s: float) -> _Ticker | None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            timerfd_create, timerfd_settime = libc.timerfd_create, libc.timerfd_settime
        except (OSError, AttributeError):  # not Linux: the caller falls back to asyncio.sleep
            return None
        fd = timerfd_create(time.CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return None
        ns = max(1000, int(interval_s * 1e9))
        period = _Timespec(ns // 1_000_000_000, ns % 1_000_000_000)
        if timerfd_settime(fd, 0, ctypes.byref(_Itimerspec(period, period)), None) != 0:
            os.close(fd)
            return None
        return cls(fd)

    def expired(self) -> bool:
        """Consume the expirations so far; False if none (a spurious wake)."""
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            return False
        return True

    def close(self) -> None:
        os.close(self.fd)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


async def _paced_latency(
    target: Any,
    rate: float,
    duration_s: float,
    data: bytes,
    *,
    wal: BlockWAL | None = None,
    send_lag: LatencyRecorder | None = None,
    stats: dict[str, float] | None = None,
    tick_s: float = PACER_TICK_S,
    timerfd: bool = True,
) -> LatencyRecorder:
    """Open-loop load at ``rate``: send slot i is due at ``begin + i / rate``.

    ``target.append(data)`` returns a future (as :meth:`BlockWAL.append` does). A pacer woken every
    ``tick_s`` (by a timerfd, see :data:`PACER_TICK_S`; with ``timerfd=False`` or where there is
    none, by ``asyncio.sleep``) itself calls ``append`` for every slot due before the next tick (a
    slot may thus be sent up to one tick early); a done-callback on each future takes the completion
    time. Latency runs from the earlier of the slot's due time and the actual send, so a target that
    falls behind, or a pacer that wakes late because the loop is busy, pays for the lag (no
    coordinated omission); there is no cap on sends in flight. Every slot is sent and counted. The
    generator costs per send one ``append`` call, a clock read and a done-callback (no task, no
    hand-off), and its samples go to preallocated arrays, into ``LatencyRecorder`` only after the run.

    ``send_lag`` records how late each send went out against its slot (0 when early): the
    generator's own lateness (a pacer woken late by a busy loop), a part of every latency sample; a
    p99 send lag near the latency p99 says the loop, not the target's service time, set it.
    ``stats`` gets ``cpu_us_per_send``: this process's CPU time (every thread) from the first send
    to the last completion, per send; ``pacer_wakes``: wakes that sent at least one slot.
    """
    total = int(rate * duration_s)
    starts = array.array("d", bytes(8 * total))  # min(due, sent) of slot i
    ends = array.array("d", bytes(8 * total))  # completion of slot i
    lags = array.array("d", bytes(8 * total))  # max(0, sent - due) of slot i
    slot_of: dict[asyncio.Future[int], int] = {}
    clock = time.perf_counter
    append = target.append
    failures: list[BaseException] = []
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    wakes = 0
    sent = 0
    begin = 0.0

    def done(fut: asyncio.Future[int]) -> None:
        i = slot_of.pop(fut)
        ends[i] = clock()
        if fut.cancelled():
            failures.append(asyncio.CancelledError())
        elif fut.exception() is not None:
            failures.append(fut.exception())  # type: ignore[arg-type]
        if not slot_of and sent == total and not finished.done():
            finished.set_result(None)

    def send_due() -> None:
        nonlocal sent, wakes
        upto = min(total, int((clock() + tick_s - begin) * rate) + 1)
        if sent < upto:
            wakes += 1
        while sent < upto:
            due = begin + sent / rate
            now = clock()
            fut = append(data)
            if now < due:
                starts[sent] = now
            else:
                starts[sent] = due
                lags[sent] = now - due
            slot_of[fut] = sent
            fut.add_done_callback(done)
            sent += 1

    trimmer = asyncio.ensure_future(_trimmer(wal)) if wal is not None else None
    ticker = _Ticker.create(tick_s) if timerfd else None
    begin = clock() + 0.01
    cpu_s = time.process_time()
    try:
        if ticker is not None:
            all_sent = loop.create_future()

            def on_tick() -> None:
                if all_sent.done() or not ticker.expired():
                    return
                try:
                    send_due()
                except BaseException as exc:  # a failed append fails the run
                    all_sent.set_exception(exc)
                    return
                if sent == total:
                    all_sent.set_result(None)

            loop.add_reader(ticker.fd, on_tick)
            try:
                await all_sent
            finally:
                loop.remove_reader(ticker.fd)
        else:
            while sent < total:
                send_due()
                await asyncio.sleep(tick_s)
        if slot_of:
            await finished
        cpu_s = time.process_time() - cpu_s
    finally:
        if ticker is not None:
            ticker.close()
        if trimmer is not None:
            trimmer.cancel()
            await asyncio.gather(trimmer, return_exceptions=True)
    if failures:
        raise failures[0]
    if stats is not None:
        stats["cpu_us_per_send"] = cpu_s / total * 1e6
        stats["pacer_wakes"] = wakes
    rec = LatencyRecorder()
    rec.extend([end - start for start, end in zip(starts, ends, strict=True)])
    if send_lag is not None:
        send_lag.extend(lags)
    return rec


def _stall_probe(duration_s: float) -> dict[str, float]:
    """How long this process went without the CPU: gaps in a busy loop on a thread (machine noise)."""
    gaps_over_5ms = 0
    gap_max_s = 0.0
    t = time.perf_counter()
    end = t + duration_s
    while t < end:
        now = time.perf_counter()
        gap = now - t
        if gap > 0.005:
            gaps_over_5ms += 1
        gap_max_s = max(gap_max_s, gap)
        t = now
    return {"stalls_over_5ms_count": gaps_over_5ms, "stall_max_ms": gap_max_s * 1e3}


async def run(ctx: Context) -> list[Result]:
    work = ctx.scratch(WORKLOAD)
    results: list[Result] = []
    capacity = ctx.scale(quick=256 * MiB, full=1024 * MiB + 8192)
    # --param aio=off|auto|uring|adaptive: the WAL's write path (WalConfig.aio; by default the WAL's
    # default, adaptive); every run measures the other settings too
    config = _config(capacity, ctx.param("aio", WalConfig.aio))
    path = work / "wal.dat"
    duration_s = ctx.scale(quick=1.0, full=3.0)
    # --param sections=small,latency runs only those (the latency run needs the 1 KiB rates)
    sections = set(ctx.param("sections", ",".join(SECTIONS)).split(","))
    if not sections <= set(SECTIONS) or ("latency" in sections and "small" not in sections):
        raise ValueError(f"sections: a subset of {SECTIONS} (latency with small), got {sections}")

    # 1. 64 KiB durable appends vs raw O_DIRECT 64 KiB writes of the same bytes to the same file
    if "large" in sections:
        ctx.status("wal: 64 KiB appends")
        total = ctx.scale(quick=128 * MiB, full=512 * MiB)
        record = os.urandom(64 * KiB)
        wal = await BlockWAL.open(path, config)
        count = total // len(record)
        per_producer = count // 16

        async def producer() -> None:
            for _ in range(per_producer):
                await wal.append(record)

        started = time.perf_counter()
        with ResourceMeter(interval_s=0) as wal_meter:
            await asyncio.gather(*(producer() for _ in range(16)))
        wal_s = time.perf_counter() - started
        groups = wal.stats["groups"]
        mode = wal.mode  # (after the run: the adaptive WAL's path then, not before its first reading)
        chooser = _chooser_stats(wal)
        await wal.close()
        written = per_producer * 16 * len(record)
        with ResourceMeter(interval_s=0) as raw_meter:
            raw_s = await asyncio.to_thread(_raw_write, path, written, 64 * KiB)
        results.append(
            Result(
                WORKLOAD,
                "durable 64 KiB appends (16 producers)",
                written / wal_s / 1e6,
                "MB/s",
                "raw O_DIRECT sequential 64 KiB writes + one fdatasync, same bytes, same file",
                written / raw_s / 1e6,
                extra={"mode": mode, "groups": groups, "goal_ratio": 0.5, "adaptive_chooser": chooser},
                cpu_s_per_gib=per_gib(wal_meter.usage.cpu_s, written),
                baseline_cpu_s_per_gib=per_gib(raw_meter.usage.cpu_s, written),
            )
        )
        os.remove(path)

    # 2. 1 KiB appends with 1, 16, 256 producers vs a minimal group-commit loop
    if "small" in sections:
        small = os.urandom(1 * KiB)
        best_rate = 0.0
        for producers in (1, 16, 256):
            ctx.status(f"wal: 1 KiB appends, {producers} producers")
            paired = await _paired_appends(work, config, producers, 3 * duration_s, small)
            rates, ratios = paired.rates, paired.ratios
            rate, base = rates["wal"], rates["base"]
            best_rate = max(best_rate, rate)
            others = _other_settings(config.aio)
            extra: dict[str, Any] = {
                "goal_ratio": 1.0,
                "slice_ratios": ratios,
                "median_slice_ratio": statistics.median(ratios),
                "format_loop_appends_per_s": rates["format"],
                "ratio_vs_format_loop": rate / rates["format"],
                # the same WAL with the first other WalConfig.aio setting, in the same turns
                # (wal_aio_writes: groups written from the loop by both; 0 where the kernel offers none)
                "other_aio_setting": others[0],
                "other_aio_appends_per_s": rates[f"aio={others[0]}"],
                "other_aio_ratio": rates[f"aio={others[0]}"] / base,
                "other_aio_median_slice_ratio": statistics.median(paired.other_ratios[others[0]]),
                "wal_aio_writes": paired.loop_writes[config.aio] + paired.loop_writes[others[0]],
            }
            # every other setting, in the same turns: aio_<setting>_* (loop_writes: groups written
            # from the loop, by AIO or io_uring, the rest on I/O threads)
            for setting in others:
                extra[f"aio_{setting}_appends_per_s"] = rates[f"aio={setting}"]
                extra[f"aio_{setting}_ratio"] = rates[f"aio={setting}"] / base
                extra[f"aio_{setting}_median_slice_ratio"] = statistics.median(paired.other_ratios[setting])
                extra[f"aio_{setting}_slice_ratios"] = paired.other_ratios[setting]
                extra[f"aio_{setting}_loop_writes"] = paired.loop_writes[setting]
            # what the adaptive WAL's chooser did over all slices (the row's WAL or the other one):
            # groups, of them by AIO, switches, probes, times CPU load sent its groups to the threads
            extra["adaptive_chooser"] = paired.chooser
            results.append(
                Result(
                    WORKLOAD,
                    f"durable 1 KiB appends, {producers} producers",
                    rate,
                    "appends/s",
                    "minimal asyncio group-commit loop (one pwrite + fdatasync per cycle), own file, alternating slices",
                    base,
                    extra=extra,
                    cpu_s_per_gib=paired.cpu_s_per_gib["wal"],
                    baseline_cpu_s_per_gib=paired.cpu_s_per_gib["base"],
                )
            )

    # 3. append_many
    if "many" in sections:
        ctx.status("wal: append_many")
        wal = await BlockWAL.open(path, config)
        await wal.recover_all()
        batch = [os.urandom(100) for _ in range(10_000)]
        rounds = ctx.scale(quick=20, full=100)
        started = time.perf_counter()
        for _ in range(rounds):
            offsets = await wal.append_many(batch)
            if wal.used_bytes > config.record_area_bytes // 2:
                await wal.trim(offsets[-1])
        many_rate = rounds * len(batch) / (time.perf_counter() - started)
        await wal.close()
        raw_bytes = rounds * len(batch) * 100
        raw_s = await asyncio.to_thread(_raw_write, path, -(-raw_bytes // MiB) * MiB, MiB)
        os.remove(path)
        results.append(
            Result(
                WORKLOAD,
                "append_many, 100-byte records in batches of 10,000",
                many_rate,
                "records/s",
                "raw O_DIRECT write of the same record bytes in 1 MiB writes, as records/s",
                rounds * len(batch) / raw_s,
                extra={"goal_records_per_s": 500_000},
            )
        )

    # 4. latency at half of the best 1 KiB rate, paced producers
    if "latency" in sections:
        ctx.status("wal: latency at half load")
        target_rate = best_rate / 2
        wal = await BlockWAL.open(path, config)
        await wal.recover_all()
        wal_lag, floor_lag = LatencyRecorder(), LatencyRecorder()
        wal_stats: dict[str, float] = {}
        floor_stats: dict[str, float] = {}
        groups, headers, aio_writes = wal.stats["groups"], wal.stats["headers"], wal.stats["aio_writes"]
        wal.group_write_s = []
        with _frozen_heap():
            rec = await _paced_latency(
                wal, target_rate, duration_s, small, wal=wal, send_lag=wal_lag, stats=wal_stats
            )
        groups, headers = wal.stats["groups"] - groups, wal.stats["headers"] - headers
        aio_writes = wal.stats["aio_writes"] - aio_writes
        chooser = _chooser_stats(wal)  # (the paced run's WAL only wrote that run: no other groups)
        group_writes = LatencyRecorder()
        group_writes.extend(wal.group_write_s)
        await wal.close()
        with _frozen_heap():
            floor = await _paced_latency(
                _NoopAppend(), target_rate, duration_s, small, send_lag=floor_lag, stats=floor_stats
            )
        # the same paced run on a WAL with each other WalConfig.aio setting (its own file)
        other_runs: dict[str, dict[str, Any]] = {}
        for setting in _other_settings(config.aio):
            other_path = work / f"wal-aio-{setting}.dat"
            other = await BlockWAL.open(other_path, dataclasses.replace(config, aio=setting))  # type: ignore[arg-type]
            await other.recover_all()
            other.group_write_s = []
            other_lag = LatencyRecorder()
            with _frozen_heap():
                other_rec = await _paced_latency(
                    other, target_rate, duration_s, small, wal=other, send_lag=other_lag
                )
            other_groups = LatencyRecorder()
            other_groups.extend(other.group_write_s)
            other_runs[setting] = {
                "latency_ms": other_rec.summary_ms(),
                "send_lag_ms": other_lag.summary_ms(),
                "group_write_ms": other_groups.summary_ms(),
                "loop_writes": other.stats["aio_writes"],
                "mode": other.mode,
            }
            chooser = chooser or _chooser_stats(other)
            await other.close()
            os.remove(other_path)
        first_other = _other_settings(config.aio)[0]
        stalls = await asyncio.to_thread(_stall_probe, 1.0)
        raw_lat = await asyncio.to_thread(_raw_sync_latency, path, 2000)
        summary = rec.summary_ms()
        results.append(
            Result(
                WORKLOAD,
                f"p99 latency of 1 KiB appends at {target_rate:,.0f}/s (half the best rate)",
                summary["p99"],
                "ms",
                "p99 of a raw 4 KiB pwrite + fdatasync cycle",
                raw_lat.summary_ms()["p99"],
                higher_is_better=False,
                extra={
                    "latency_ms": summary,
                    "baseline_latency_ms": raw_lat.summary_ms(),
                    "goal_p99_ms": 2.0,
                    # the same generator against an append that completes on the next loop turn: what
                    # the method and the machine add on their own (scheduling noise from other processes)
                    "generator_floor_latency_ms": floor.summary_ms(),
                    # how late the sends went out against their slots (part of each latency sample)
                    "send_lag_ms": wal_lag.summary_ms(),
                    "generator_floor_send_lag_ms": floor_lag.summary_ms(),
                    # CPU of this process (all threads) per send: WAL run, and the generator alone
                    "cpu_us_per_send": wal_stats["cpu_us_per_send"],
                    "generator_floor_cpu_us_per_send": floor_stats["cpu_us_per_send"],
                    # the pacer's tick and how often it woke with slots to send (timerfd; see PACER_TICK_S)
                    "pacer_tick_ms": PACER_TICK_S * 1e3,
                    "pacer_wakes": wal_stats["pacer_wakes"],
                    # how the WAL wrote them: group writes (records per group) and header writes (trims)
                    "wal_groups": groups,
                    "wal_records_per_group": rec.count / groups if groups else 0.0,
                    "wal_header_writes": headers,
                    # how many groups went to the device by Linux AIO from the loop (the rest, and the
                    # headers, on the WAL's I/O threads), and each group write's time from its hand-over
                    # to its completion reaching the loop: the device's stalls, which in-order
                    # completion passes on to every later append
                    "wal_aio_writes": aio_writes,
                    "group_write_ms": group_writes.summary_ms(),
                    "group_writes_over_5ms_count": sum(1 for w in wal.group_write_s if w > 0.005),
                    # what the adaptive WAL's chooser did in its paced run (this row's or the other's)
                    "adaptive_chooser": chooser,
                    # the same paced run (after the floor's) on a WAL with the first other aio setting,
                    # and on one with each other setting (aio_<setting>_*)
                    "other_aio_setting": first_other,
                    "other_aio_latency_ms": other_runs[first_other]["latency_ms"],
                    "other_aio_send_lag_ms": other_runs[first_other]["send_lag_ms"],
                    "other_aio_group_write_ms": other_runs[first_other]["group_write_ms"],
                    "other_aio_wal_aio_writes": other_runs[first_other]["loop_writes"],
                    **{
                        f"aio_{setting}_{key}": value
                        for setting, run in other_runs.items()
                        for key, value in run.items()
                    },
                    **stalls,
                },
            )
        )
        os.remove(path)

    # 5. recovery of a full WAL vs a raw sequential read
    if "recovery" in sections:
        ctx.status("wal: recovery")
        wal = await BlockWAL.open(path, config)
        fill = config.record_area_bytes - config.write_max_bytes
        records = [os.urandom(64 * KiB) for _ in range(16)]
        while wal.next_offset + 16 * (64 * KiB + 64) < fill:
            await wal.append_many(records)
        filled = wal.next_offset
        await wal.close()
        started = time.perf_counter()
        wal = await BlockWAL.open(path, config)
        n = 0
        async for _ in wal.recover():
            n += 1
        rec_s = time.perf_counter() - started
        await wal.close()
        raw_s = await asyncio.to_thread(_raw_read, path, config.device_bytes)
        results.append(
            Result(
                WORKLOAD,
                f"recovery of a full {filled / MiB:,.0f} MiB WAL ({n} records of 64 KiB)",
                filled / rec_s / 1e6,
                "MB/s",
                "raw O_DIRECT sequential read of the file, 1 MiB reads",
                config.device_bytes / raw_s / 1e6,
                extra={"goal_ratio": 0.25, "recovery_s": rec_s},
            )
        )
        os.remove(path)
    return results
