"""Workload ``ingest``: the engine's write path into 1,000 streams, against the WAL alone and a naive writer.

For 1 KiB and 64 KiB records, ``producers`` concurrent tasks append round-robin over ``streams``
streams of the embedded engine (block WAL file in the scratch dir, SQLite metadata, the target's
object store: S3 when given, the local store otherwise; default Config, so uploads start at
``s3.wal.upload.threshold`` = 32 MiB). Figures, each beside a baseline measured in the same run:

- **ingest MB/s** (acknowledged payload / time) vs the **WAL alone**: the same concurrency appending
  bodies of the same size straight to a :class:`wal.BlockWAL` (goal ratio >= 0.8).
- **ingest MB/s with uploads held back** (thresholds above the run's size, so no upload competes
  with the WAL for the disk and the CPU until the end) vs the WAL alone with the same capacity
  (:func:`_held_wal_capacity`: each byte written once into a fresh file of that size, as the engine
  does): the engine's own cost. For 1 KiB records, :data:`HELD_ROUNDS_1K` pairs in alternating order
  (``--param held_rounds=N``); the figures are the medians of each side, every round in the extras.
- **upload MB/s**: bytes the engine uploaded / wall time with at least one upload in flight, vs
  the store's **raw PUT ceiling**, measured right after that engine run
  (:func:`benchmarks.baselines.raw_put_ceiling`: warmed up, best of alternating rounds of 16 MiB
  PutObjects and of plain multipart uploads in the engine's shape, 4 in flight): do uploads keep up?
- **drain MB/s**: ingest plus the wait until everything is committed to object storage, vs the same
  raw PUT ceiling (uploads keep up when the ratio is near or above the ingest ratio: the upload path
  is not the bottleneck).
- **PUT requests per GiB** vs a **naive writer** that, on the same schedule (every upload the engine
  made), writes one object per stream present (goal <= 1/100).
- **append p99 latency** while uploads run, at half the measured maximum rate (1 KiB records,
  ``s3.wal.upload.threshold`` 8 MiB so several uploads overlap the run), vs the minimal group-commit
  loop of the ``wal`` workload at the same rate in a file on the same disk (it meets the same disk
  stalls; goal ratio <= 1.5, and <= 3 ms). Disk stalls, group writes over :data:`DISK_STALL_S` of
  the engine's WAL and of the minimal loop, are counted apart (``disk_stalls`` in the extras, and in
  the goal table beside the p99); the WAL alone's p99 at the same rate stays in the extras. Both targets first run :data:`WARMUP_S` of unrecorded paced appends,
  then call :func:`s3stream.heap.freeze_startup_heap` (what docs/architecture.md, "Latency and
  Python's garbage collector", tells a long-running application to do once it has started): the
  harness, the WAL or the engine with its S3 client (created at open), streams and first uploads
  are out of the collector's scans; everything the recorded run allocates is collected as usual.
  Open loop without coordinated omission: every latency runs from the earlier of its send slot's
  due time and the actual call, so a loop that falls behind shows in the figure (as in the ``wal``
  workload). The extras give the generator's send lag, the method's floor (a no-op target at the same rate),
  the full garbage collections of the recorded engine run, its young ones (per generation: count,
  collector CPU in all and at most) and the objects frozen; for the engine and the WAL alone, how
  busy the generator's producers were (:class:`PacerStats`) and the loop thread's CPU and run-queue
  wait beside the other threads' CPU (:class:`ThreadTimes`); and ``wal_under_put_load``: the WAL
  alone again, at the same rate, while another process PUTs 8 MiB objects into the same store at the
  engine run's upload rate (:func:`_wal_alone_under_put_load`): what the uploads cost the appends
  through the machine (the store's CPU, its disk) without any upload work on the loop.
  ``--param latency_rate=N`` runs this section alone at N appends/s (``latency_s=S``: its duration).

``--param wal_aio=adaptive|auto|uring|off`` sets ``s3.wal.aio`` (default: the Config default) for every WAL of the
run: the engine's and the WAL-alone baseline's alike, so each ratio compares like with like.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.baselines import Measured, PutCeilingSpec, raw_put_ceiling
from benchmarks.core import Context, Result
from benchmarks.measure import CountingStorage, LatencyRecorder, RequestCounter, ResourceMeter, per_gib
from s3stream.assembly import open_block_wal, open_client
from s3stream.config import Config
from s3stream.engine.client import Client, Stream
from s3stream.heap import freeze_startup_heap
from s3stream.model import RecordBatch
from s3stream.record import RECORD_HEADER_SIZE
from s3stream.storage.base import ObjectStorage
from s3stream.storage.s3 import S3ObjectStorage
from wal import BlockWAL

KiB = 1 << 10
MiB = 1 << 20
W = "ingest"


async def _open_engine(ctx: Context, name: str, config: Config) -> tuple[Client, RequestCounter]:
    counter = RequestCounter()
    inner = ctx.open_storage(name)
    if isinstance(inner, S3ObjectStorage):
        await inner.connect()  # what open_client does with a storage it opens itself
    storage: ObjectStorage = CountingStorage(inner, counter)
    client = await open_client(ctx.scratch(name), config=config, storage=storage)
    return client, counter


def _config(ctx: Context, **fields: Any) -> Config:
    """The run's Config: ``fields`` plus ``s3.wal.aio`` from ``--param wal_aio`` (both sides of a ratio)."""
    return Config(wal_aio=ctx.param("wal_aio", Config().wal_aio), **fields)


def _held_wal_capacity(total_bytes: int) -> int:
    """The WAL (and cache) size of the held-back run: room for all ``total_bytes`` twice over, so
    nothing is trimmed and every append lands in space the run has not written yet. Its WAL-alone
    baseline gets the same capacity: on this VM's disk, appends that wrap around a 256 MiB file
    (rewriting the same blocks four times for 1 GiB) ran 1.12-1.22x as fast (medians of two sets of
    alternating rounds, faster in 10 of 11), with 15-30 % less kernel CPU per append, as the same
    appends written once into a fresh 2 GiB file (64 KiB bodies, 128 producers): a difference of
    the disk, not of the engine."""
    return max(256 * MiB, 2 * total_bytes)


async def _engine_ingest(
    ctx: Context,
    *,
    record_bytes: int,
    total_bytes: int,
    stream_count: int,
    producers: int,
    hold_uploads: bool = False,
    tag: str = "",
) -> dict[str, float]:
    """One engine run; ``tag`` names its scratch directory and object prefix apart from other runs'."""
    config = _config(ctx)
    if hold_uploads:  # everything stays in the WAL and the LogCache until the final drain
        room = _held_wal_capacity(total_bytes)
        config = _config(
            ctx,
            wal_capacity_bytes=room,
            wal_cache_size_bytes=room,
            wal_upload_threshold_bytes=room,
            wal_upload_interval_ms=86_400_000,
        )
    name = f"engine-{record_bytes}" + ("-held" if hold_uploads else "") + tag
    client, counter = await _open_engine(ctx, name, config)
    try:
        streams = [await client.streams.create_and_open_stream() for _ in range(stream_count)]
        appends = total_bytes // record_bytes
        payload = os.urandom(record_bytes)

        async def producer(index: int) -> None:
            for n in range(index, appends, producers):
                await streams[n % stream_count].append(RecordBatch(payload))

        counter.reset()
        started = time.perf_counter()
        with ResourceMeter(interval_s=0) as drain_meter:
            with ResourceMeter(interval_s=0) as ingest_meter:
                await asyncio.gather(*(producer(i) for i in range(producers)))
            ingest_s = time.perf_counter() - started
            await client.engine.force_upload(None)
        drain_s = time.perf_counter() - started
        stats = client.engine.stats
        return {
            "cpu_s_per_gib_ingest": per_gib(ingest_meter.usage.cpu_s, appends * record_bytes),
            "cpu_s_per_gib_drain": per_gib(drain_meter.usage.cpu_s, appends * record_bytes),
            "ingest_mb_s": appends * record_bytes / 1e6 / ingest_s,
            "drain_mb_s": appends * record_bytes / 1e6 / drain_s,
            "payload_bytes": appends * record_bytes,
            "put_requests": counter.by_class.get("PUT", 0),
            "naive_puts": stats.uploaded_stream_count,
            "uploads": stats.uploads,
            "upload_mb_s": stats.uploaded_bytes / 1e6 / stats.upload_busy_s if stats.upload_busy_s else 0.0,
            "objects": stats.objects_committed,
        }
    finally:
        await client.close()


async def _wal_alone(
    ctx: Context,
    name: str,
    *,
    record_bytes: int,
    total_bytes: int,
    producers: int,
    rate_per_s: float = 0,
    capacity_bytes: int = Config().wal_capacity_bytes,
    times: ThreadTimes | None = None,
    pacer: PacerStats | None = None,
    cpu_s_per_gib: list[float] | None = None,
) -> tuple[float, LatencyRecorder]:
    """MB/s (or latency at ``rate_per_s`` appends/s) of BlockWAL appends of engine-sized bodies, in a
    WAL of ``capacity_bytes`` (trimmed by half of it whenever that much is written). ``times`` and
    ``pacer`` are filled in over the recorded paced run; the run's CPU s per GiB of payload is
    appended to ``cpu_s_per_gib``."""
    config = _config(ctx, wal_capacity_bytes=capacity_bytes)
    path = ctx.scratch(name) / "wal"
    wal = await open_block_wal(Path(path), config, node_epoch=1)
    await wal.recover()
    body = os.urandom(record_bytes + RECORD_HEADER_SIZE)
    appends = total_bytes // record_bytes
    latency = LatencyRecorder()
    trimmed = 0

    async def one(due: float = math.inf) -> None:
        nonlocal trimmed
        start = min(due, time.perf_counter())
        offset = await wal.append(body)
        latency.record(time.perf_counter() - start)
        if offset - trimmed > config.wal_capacity_bytes // 2:
            trimmed = offset
            await wal.trim(offset)

    try:
        if rate_per_s:  # the same warm-up and start-up heap freeze as the engine's latency run
            await _paced(one, int(rate_per_s * WARMUP_S), rate_per_s)
            freeze_startup_heap()
            latency = LatencyRecorder()
        started = time.perf_counter()
        with ResourceMeter(interval_s=0) as meter:
            if rate_per_s:
                with times if times is not None else contextlib.nullcontext():
                    await _paced(one, appends, rate_per_s, stats=pacer)
            else:

                async def producer(index: int) -> None:
                    for _ in range(index, appends, producers):
                        await one()

                await asyncio.gather(*(producer(i) for i in range(producers)))
        elapsed = time.perf_counter() - started
    finally:
        await wal.close()
    if cpu_s_per_gib is not None:
        cpu_s_per_gib.append(per_gib(meter.usage.cpu_s, appends * record_bytes))
    return appends * record_bytes / 1e6 / elapsed, latency


PACED_PRODUCERS = 256
WARMUP_S = 2.0
"""Paced appends before the latency run records anything (both targets): the first prepare and
commit, the caches' and the allocator's first growth are start-up costs, not the steady state the
figure is about (the S3 client is created when the engine opens). The heap is frozen after it."""


class PacerStats:
    """How busy :func:`_paced`'s producers were: a send slips either because the loop woke its producer
    late, or because every producer still waited for an earlier call (the generator's concurrency,
    ``PACED_PRODUCERS``, was used up: at 56,000 appends/s that happens once the calls in flight take
    256 / 56,000 s = 4.6 ms on average). ``all_busy_s`` is the wall time with every producer in a call,
    ``overdue_taken_count`` the slots that were already due when a producer came back for them from its
    previous call (they waited for a free producer, not for the loop)."""

    def __init__(self) -> None:
        self.busy = 0
        self.busy_max = 0
        self.all_busy_s = 0.0
        self.all_busy_since = 0.0
        self.overdue_taken_count = 0
        self.slot_count = 0

    def summary(self) -> dict[str, float]:
        return {
            "producers": PACED_PRODUCERS,
            "busy_max": self.busy_max,
            "all_busy_s": self.all_busy_s,
            "overdue_taken_share": self.overdue_taken_count / self.slot_count if self.slot_count else 0.0,
        }


async def _paced(
    one: object,
    count: int,
    rate_per_s: float,
    send_lag: LatencyRecorder | None = None,
    stats: PacerStats | None = None,
) -> None:
    """``count`` calls of ``one()`` at ``rate_per_s``: ``PACED_PRODUCERS`` coroutines take the next send
    slot, wait for its time, and call (no task per call; a producer that is late sends at once).

    ``one(due)`` gets its slot's due time and measures its latency from the earlier of that and the
    call (no coordinated omission: when every producer is busy or the loop is held, sends slip, and
    the lateness is part of the latency of the calls that slipped). ``send_lag`` records how late
    each call started against its slot: the generator's own share of those latencies; ``stats``
    tells which of the two made it late (:class:`PacerStats`)."""
    assert callable(one)
    slots = iter(range(count))
    started = time.perf_counter()
    pacer = stats if stats is not None else PacerStats()

    async def producer() -> None:
        returning = False  # back from a call: a slot already due waited for a free producer
        for n in slots:
            due = started + n / rate_per_s
            delay = due - time.perf_counter()
            pacer.slot_count += 1
            if delay > 0:
                await asyncio.sleep(delay)
            elif returning:
                pacer.overdue_taken_count += 1
            returning = True
            now = time.perf_counter()
            if send_lag is not None:
                send_lag.record(max(0.0, now - due))
            pacer.busy += 1
            if pacer.busy > pacer.busy_max:
                pacer.busy_max = pacer.busy
            if pacer.busy == PACED_PRODUCERS:
                pacer.all_busy_since = now
            try:
                await one(due)
            finally:
                if pacer.busy == PACED_PRODUCERS:
                    pacer.all_busy_s += time.perf_counter() - pacer.all_busy_since
                pacer.busy -= 1

    await asyncio.gather(*(producer() for _ in range(PACED_PRODUCERS)))


async def _paced_floor(rate_per_s: float, duration_s: float) -> LatencyRecorder:
    """The method's own floor: the latency :func:`_paced` reports for a target that does nothing but
    give the loop one turn (``await asyncio.sleep(0)``), at the same rate."""
    latency = LatencyRecorder()

    async def one(due: float) -> None:
        start = min(due, time.perf_counter())
        await asyncio.sleep(0)
        latency.record(time.perf_counter() - start)

    await _paced(one, int(rate_per_s * duration_s), rate_per_s)
    return latency


@contextlib.contextmanager
def _frozen_heap() -> Iterator[None]:
    """The ``wal`` workload's method: collect, then keep every object alive now (the harness, earlier
    sections' leftovers) out of the collector's scans until the block ends. What the measured run
    creates itself (for the engine: its S3 client, streams, caches) is still scanned as usual."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class GcPauses:
    """Full (generation 2) garbage collections while active: count, total and longest pause, in
    wall time and in the collecting thread's CPU time (the wall time includes any time the machine
    gave another process meanwhile; the CPU time is the collector's own work)."""

    def __init__(self) -> None:
        self.count = 0
        self.total_s = 0.0
        self.max_s = 0.0
        self.cpu_total_s = 0.0
        self.cpu_max_s = 0.0
        self._started = 0.0
        self._started_cpu = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
            self._started_cpu = time.thread_time()
            return
        pause = time.perf_counter() - self._started
        cpu = time.thread_time() - self._started_cpu
        self.count += 1
        self.total_s += pause
        self.max_s = max(self.max_s, pause)
        self.cpu_total_s += cpu
        self.cpu_max_s = max(self.cpu_max_s, cpu)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def summary_ms(self) -> dict[str, float]:
        return {
            "count": self.count,
            "total": self.total_s * 1000,
            "max": self.max_s * 1000,
            "cpu_total": self.cpu_total_s * 1000,
            "cpu_max": self.cpu_max_s * 1000,
        }


class ThreadTimes:
    """The calling (event-loop) thread's CPU time while active, the time Linux kept it runnable but
    off every CPU (``/proc/thread-self/schedstat``: a loop that is late without being busy was not
    run: other processes, such as the local Ceph RGW serving the uploads, or the process's own
    threads held the CPUs), and the CPU time of the process's other threads (WAL I/O, metadata,
    hashing: they share the cores and take the GIL). ``runqueue_wait_s`` is None where schedstat
    is not available."""

    def __init__(self) -> None:
        self.loop_cpu_s = 0.0
        self.runqueue_wait_s: float | None = None
        self.other_threads_cpu_s = 0.0
        self._start: tuple[float, float, int | None] = (0.0, 0.0, None)

    @staticmethod
    def _runqueue_wait_ns() -> int | None:
        try:
            with open("/proc/thread-self/schedstat", "rb") as f:
                return int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            return None

    def _now(self) -> tuple[float, float, int | None]:
        return time.thread_time(), time.process_time(), self._runqueue_wait_ns()

    def __enter__(self) -> ThreadTimes:
        self._start = self._now()
        return self

    def __exit__(self, *exc: object) -> None:
        thread_s, process_s, wait_ns = self._now()
        start_thread_s, start_process_s, start_wait_ns = self._start
        self.loop_cpu_s = thread_s - start_thread_s
        self.other_threads_cpu_s = max(0.0, (process_s - start_process_s) - self.loop_cpu_s)
        if wait_ns is not None and start_wait_ns is not None:
            self.runqueue_wait_s = (wait_ns - start_wait_ns) / 1e9

    def summary_s(self) -> dict[str, float | None]:
        return {
            "loop_thread_cpu": self.loop_cpu_s,
            "loop_thread_runqueue_wait": self.runqueue_wait_s,
            "other_threads_cpu": self.other_threads_cpu_s,
        }


class YoungCollections:
    """Young (generation 0 and 1) garbage collections while active, per generation: count, and the
    collecting thread's CPU time in all and at most. Uploads drive most of them in the latency run
    (1,000-stream blocks: the stream caches of each block, the rows it is frozen into, the commit's
    ranges); each holds the event loop like any other callback."""

    def __init__(self) -> None:
        self.count = [0, 0]
        self.cpu_total_s = [0.0, 0.0]
        self.cpu_max_s = [0.0, 0.0]
        self._started_cpu = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        generation = info.get("generation")
        if generation not in (0, 1):
            return
        if phase == "start":
            self._started_cpu = time.thread_time()
            return
        cpu = time.thread_time() - self._started_cpu
        self.count[generation] += 1
        self.cpu_total_s[generation] += cpu
        self.cpu_max_s[generation] = max(self.cpu_max_s[generation], cpu)

    def __enter__(self) -> YoungCollections:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def summary_ms(self) -> dict[str, dict[str, float]]:
        return {
            f"gen{g}": {
                "count": self.count[g],
                "cpu_total": self.cpu_total_s[g] * 1000,
                "cpu_max": self.cpu_max_s[g] * 1000,
            }
            for g in (0, 1)
        }


DISK_STALL_S = 0.020
"""A group write (hand-over to completion) longer than this is counted as a disk stall: the engine's
WAL and the minimal loop meet the same disk, so the stalls are told apart from the engine's latency."""
MINIMAL_LOOP_FILE_BYTES = 64 * MiB
"""The minimal loop's file (zero-filled and synced first, like the WAL's; written circularly)."""


def disk_stalls(group_write_s: list[float] | None) -> dict[str, float]:
    """Group writes over :data:`DISK_STALL_S`: their count, the writes seen, and the longest (ms)."""
    writes = group_write_s or []
    return {
        "threshold_ms": DISK_STALL_S * 1000,
        "count": sum(1 for seconds in writes if seconds > DISK_STALL_S),
        "group_writes": len(writes),
        "max_ms": max(writes, default=0.0) * 1000,
    }


async def _minimal_loop_latency(
    ctx: Context, *, record_bytes: int, rate_per_s: float, duration_s: float
) -> tuple[LatencyRecorder, dict[str, float]]:
    """The append-latency baseline: the ``wal`` workload's minimal group-commit loop (one pwrite +
    fdatasync per cycle, O_DIRECT, in a thread) in a file on the same disk as the engine's WAL, paced
    like the engine (:data:`WARMUP_S` unrecorded, then the heap frozen and the recorded run) with
    bodies of the WAL's record size. Returns its latency and its :func:`disk_stalls`."""
    from benchmarks.workloads.wal import MinimalGroupCommit

    loop = MinimalGroupCommit(ctx.scratch("minimal-loop") / "log", create_bytes=MINIMAL_LOOP_FILE_BYTES)
    body = os.urandom(record_bytes + RECORD_HEADER_SIZE)
    latency = LatencyRecorder()

    async def one(due: float) -> None:
        start = min(due, time.perf_counter())
        await loop.append(body)
        latency.record(time.perf_counter() - start)

    try:
        await _paced(one, int(rate_per_s * WARMUP_S), rate_per_s)
        freeze_startup_heap()
        latency = LatencyRecorder()
        loop.group_write_s = []
        await _paced(one, int(rate_per_s * duration_s), rate_per_s)
        stalls = disk_stalls(loop.group_write_s)
    finally:
        await loop.close()
    return latency, stalls


async def _engine_latency(
    ctx: Context,
    *,
    record_bytes: int,
    stream_count: int,
    rate_per_s: float,
    duration_s: float,
    times: ThreadTimes | None = None,
    pacer: PacerStats | None = None,
    stalls: dict[str, float] | None = None,
) -> tuple[LatencyRecorder, int, LatencyRecorder, GcPauses, int, YoungCollections]:
    """Append latency at ``rate_per_s`` after :data:`WARMUP_S` of unrecorded appends and
    :func:`~s3stream.heap.freeze_startup_heap`; also returns the uploads that ran, the
    generator's send lag, the full collections during the recorded run, the objects frozen and the
    young collections during the recorded run. ``times`` and ``pacer`` are filled in over the
    recorded run, ``stalls`` with the :func:`disk_stalls` of the engine's WAL over it."""
    config = _config(ctx, wal_upload_threshold_bytes=8 * MiB)
    client, _ = await _open_engine(ctx, "engine-latency", config)
    latency = LatencyRecorder()
    send_lag = LatencyRecorder()
    try:
        streams: list[Stream] = [await client.streams.create_and_open_stream() for _ in range(stream_count)]
        payload = os.urandom(record_bytes)
        counter = iter(range(1 << 62))

        async def one(due: float) -> None:
            stream = streams[next(counter) % stream_count]
            start = min(due, time.perf_counter())
            await stream.append(RecordBatch(payload))
            latency.record(time.perf_counter() - start)

        await _paced(one, int(rate_per_s * WARMUP_S), rate_per_s)
        frozen = freeze_startup_heap()  # start-up is over: what the application is told to do
        latency = LatencyRecorder()
        uploads_before = client.engine.stats.uploads
        wal = getattr(client.engine.wal, "block_wal", None)  # the BlockWAL behind the engine's adapter
        previous_samples = wal.group_write_s if isinstance(wal, BlockWAL) else None
        if isinstance(wal, BlockWAL):
            wal.group_write_s = []
        with (
            GcPauses() as gc_pauses,
            YoungCollections() as young,
            times if times is not None else contextlib.nullcontext(),
        ):
            await _paced(one, int(rate_per_s * duration_s), rate_per_s, send_lag, pacer)
        uploads = client.engine.stats.uploads - uploads_before
        if stalls is not None and isinstance(wal, BlockWAL):
            stalls.update(disk_stalls(wal.group_write_s))
            wal.group_write_s = previous_samples
    finally:
        await client.close()
    return latency, uploads, send_lag, gc_pauses, frozen, young


PUT_LOAD_ENV = "S3STREAM_BENCH_PUT_LOAD"
"""The environment variable handing :func:`put_load_main` its spec (JSON; it may hold S3 keys, so
not on the command line)."""


def _put_load_spec(
    ctx: Context, *, rate_per_s: float, object_bytes: int, duration_s: float
) -> dict[str, Any]:
    """What :func:`put_load_main` needs to PUT into the run's object store (the target's bucket under
    a key prefix of its own, or a local store in the scratch dir)."""
    spec: dict[str, Any] = {"rate_per_s": rate_per_s, "object_bytes": object_bytes, "duration_s": duration_s}
    if ctx.s3 is None:
        spec["local_root"] = str(ctx.scratch("objects-put-load"))
    else:
        spec["s3"] = {
            "bucket": ctx.s3.bucket,
            "endpoint": ctx.s3.endpoint,
            "region": ctx.s3.region,
            "path_style": True,
            "access_key": ctx.s3.access_key,
            "secret_key": ctx.s3.secret_key,
            "prefix": ctx.key_prefix("put-load"),
            "checksum_mode": os.environ.get("S3STREAM_BENCH_CHECKSUM_MODE", "when_required"),
        }
    return spec


async def _put_load(spec: dict[str, Any], stop: asyncio.Event) -> int:
    """PUT objects of ``object_bytes`` at ``rate_per_s`` for ``duration_s`` or until ``stop`` is set (each
    as the engine writes an object: ``upload`` / ``write`` / ``complete``); returns the count."""
    storage: ObjectStorage
    if "s3" in spec:
        from s3stream.storage.s3 import S3Config

        storage = S3ObjectStorage(S3Config(**spec["s3"]))
        await storage.connect()
    else:
        from s3stream.storage.local import LocalObjectStorage

        storage = LocalObjectStorage(Path(spec["local_root"]))
    body = os.urandom(spec["object_bytes"])
    rate, count = spec["rate_per_s"], 0
    started = time.perf_counter()
    try:
        while not stop.is_set() and (due := started + count / rate) < started + spec["duration_s"]:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, due - time.perf_counter()))
            if stop.is_set():
                break
            upload = storage.upload(f"put-load-{count}")
            await upload.write(body)
            await upload.complete()
            count += 1
    finally:
        await storage.close()
    return count


def put_load_main() -> None:
    """Entry of the PUT-load process (:func:`_wal_alone_under_put_load`): PUTs until its spec's duration
    ends or its stdin closes, then prints the PUTs made."""
    from s3stream._loop import run as run_loop

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def wait_for_eof() -> None:
            while os.read(0, 65536):  # the descriptor, not sys.stdin: no buffer lock held at exit
                pass
            with contextlib.suppress(RuntimeError):  # the loop is closed: the load is over anyway
                loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=wait_for_eof, daemon=True).start()
        return await _put_load(json.loads(os.environ[PUT_LOAD_ENV]), stop)

    print(json.dumps({"puts": run_loop(main())}), flush=True)


async def _wal_alone_under_put_load(
    ctx: Context, *, rate_per_s: float, duration_s: float, put_rate_per_s: float, object_bytes: int
) -> tuple[LatencyRecorder, ThreadTimes, PacerStats, int]:
    """The WAL alone at ``rate_per_s`` (as the latency baseline) while another process PUTs objects of
    ``object_bytes`` at ``put_rate_per_s`` into the run's object store: what the engine's uploads cost
    the machine outside the engine's process (the store's CPU and disk, e.g. a local Ceph RGW on the
    same cores and disk as the WAL), without any of the engine's own upload work on its loop. Returns
    the latency, the thread times, the pacer stats and the PUTs made."""
    spec = _put_load_spec(
        ctx, rate_per_s=put_rate_per_s, object_bytes=object_bytes, duration_s=WARMUP_S + duration_s + 1.0
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from benchmarks.workloads.ingest import put_load_main; put_load_main()",
        env={**os.environ, PUT_LOAD_ENV: json.dumps(spec)},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    times, pacer = ThreadTimes(), PacerStats()
    try:
        with _frozen_heap():
            _, latency = await _wal_alone(
                ctx, "wal-latency-put-load", record_bytes=1 * KiB, total_bytes=int(rate_per_s * duration_s) * KiB,
                producers=1, rate_per_s=rate_per_s, times=times, pacer=pacer,
            )  # fmt: skip
        out, _ = await process.communicate(b"")  # closes its stdin: the load stops
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"the PUT-load process failed with exit code {process.returncode}")
    return latency, times, pacer, int(json.loads(out)["puts"])


async def _raw_put(ctx: Context) -> tuple[str, Measured]:
    """The object store's PUT ceiling (:func:`benchmarks.baselines.raw_put_ceiling`) in the engine's
    request shapes, measured right after the engine run it is compared with; and its label."""
    config = Config()
    spec = PutCeilingSpec(
        total_bytes=ctx.scale(quick=64, full=256) * MiB,
        put_bytes=config.object_part_size_bytes,
        object_bytes=config.wal_upload_threshold_bytes,
        part_bytes=config.object_part_size_bytes,
        concurrency=config.upload_inflight_max,
    )
    storage = ctx.open_storage("raw-put")
    try:
        measured = await raw_put_ceiling(storage, ctx.s3, prefix=ctx.key_prefix("raw-put-mpu"), spec=spec)
        return spec.label(multipart=ctx.s3 is not None), measured
    finally:
        await storage.close()


HELD_ROUNDS_1K = 3
"""Alternating rounds of the 1 KiB held-back pair (WAL alone, engine; then engine, WAL alone; ...):
``--param held_rounds=N``. One pair is ~0.2-0.4 s per side, and the ratio of a single pair moved
0.49-2.6 on the loaded shared VM (the WAL's group write time, which both sides wait for once per
group of 128 appends, varied 0.2-3.6 ms between runs) and 0.59-0.67 on a quiet one."""


async def _held_back_rounds(
    ctx: Context,
    *,
    record_bytes: int,
    total_bytes: int,
    stream_count: int,
    producers: int,
    rounds: int,
    wal_cpu_s_per_gib: list[float] | None = None,
) -> tuple[list[float], list[dict[str, float]]]:
    """The held-back row's pairs: the WAL alone with the held-back capacity and the held-back engine,
    ``rounds`` times in alternating order (W E, E W, ...), each run in fresh scratch directories
    (removed after the round). Returns the WAL-alone MB/s and the engine results, in round order."""
    wal_runs: list[float] = []
    engine_runs: list[dict[str, float]] = []
    label = f"{record_bytes // KiB} KiB"
    for index in range(rounds):
        tag = f"-r{index}"
        for side in ("wal", "engine") if index % 2 == 0 else ("engine", "wal"):
            if side == "wal":
                ctx.status(f"ingest: WAL alone, held-back capacity, {label}, round {index + 1}/{rounds}")
                mb_s, _ = await _wal_alone(
                    ctx, f"wal-held-{record_bytes}{tag}", record_bytes=record_bytes, total_bytes=total_bytes,
                    producers=producers, capacity_bytes=_held_wal_capacity(total_bytes),
                    cpu_s_per_gib=wal_cpu_s_per_gib,
                )  # fmt: skip
                wal_runs.append(mb_s)
            else:
                ctx.status(f"ingest: engine with uploads held back, {label}, round {index + 1}/{rounds}")
                run = await _engine_ingest(
                    ctx, record_bytes=record_bytes, total_bytes=total_bytes, stream_count=stream_count,
                    producers=producers, hold_uploads=True, tag=tag,
                )  # fmt: skip
                engine_runs.append(run)
        for name in (f"wal-held-{record_bytes}{tag}", f"engine-{record_bytes}-held{tag}",
                     f"objects-engine-{record_bytes}-held{tag}"):  # fmt: skip
            shutil.rmtree(ctx.work_dir / name, ignore_errors=True)  # 2 x the run's size of WAL files
    return wal_runs, engine_runs


async def run(ctx: Context) -> list[Result]:
    stream_count = ctx.param("streams", 1000)
    producers = ctx.param("producers", 128)
    results: list[Result] = []
    backend = "s3" if ctx.s3 is not None else "local"
    wal_aio = _config(ctx).wal_aio
    max_rate_1k = 0.0
    latency_rate = ctx.param("latency_rate", 0.0)
    sizes: tuple[tuple[int, int, int], ...] = ((1 * KiB, 8, 64), (64 * KiB, 96, 1024))
    if latency_rate:  # the latency section alone, at this rate (the run's max_rate is not measured)
        sizes = ()
        max_rate_1k = 2 * latency_rate
    for record_bytes, quick_mib, full_mib in sizes:
        total = ctx.scale(quick=quick_mib, full=full_mib) * MiB
        label = f"{record_bytes // KiB} KiB records, {stream_count} streams"
        ctx.status(f"ingest: WAL alone, {label}")
        wal_cpu: list[float] = []
        wal_mb_s, _ = await _wal_alone(
            ctx, f"wal-{record_bytes}", record_bytes=record_bytes, total_bytes=total, producers=producers,
            cpu_s_per_gib=wal_cpu,
        )  # fmt: skip
        ctx.status(f"ingest: engine, {label}")
        eng = await _engine_ingest(
            ctx, record_bytes=record_bytes, total_bytes=total, stream_count=stream_count, producers=producers
        )
        ctx.status(f"ingest: raw PUT ceiling right after the engine's uploads, {label}")
        raw_shapes, raw = await _raw_put(ctx)
        rounds = ctx.param("held_rounds", HELD_ROUNDS_1K) if record_bytes == 1 * KiB else 1
        held_wal_cpu: list[float] = []
        held_wal_runs, held_runs = await _held_back_rounds(
            ctx, record_bytes=record_bytes, total_bytes=total, stream_count=stream_count, producers=producers,
            rounds=rounds, wal_cpu_s_per_gib=held_wal_cpu,
        )  # fmt: skip
        held_wal_mb_s = statistics.median(held_wal_runs)
        held_mb_s = [run["ingest_mb_s"] for run in held_runs]
        by_rate = sorted(range(rounds), key=held_mb_s.__getitem__)
        held_engine_mb_s = statistics.median(held_mb_s)
        held: dict[str, Any] = {
            **held_runs[by_rate[(rounds - 1) // 2]],  # the extras of the (lower) median engine run
            "rounds": rounds,
            "ingest_mb_s_rounds": held_mb_s,
            "wal_alone_mb_s_rounds": held_wal_runs,
            "ratio_rounds": [e / w if w else 0.0 for e, w in zip(held_mb_s, held_wal_runs, strict=True)],
        }
        held["ingest_mb_s"] = held_engine_mb_s
        if record_bytes == 1 * KiB:
            max_rate_1k = eng["ingest_mb_s"] * 1e6 / record_bytes
        extra = {"backend": backend, "wal_aio": wal_aio, "producers": producers, **eng}
        # CPU s/GiB: the engine's through the drain (every byte appended, uploaded and committed: the
        # uploads' cost included) vs the WAL alone's appends; the held-back row compares the ingest
        # sections only (the uploads all wait for the drain there)
        eng_cpu = eng.get("cpu_s_per_gib_drain")
        wal_cpu_gib = wal_cpu[0] if wal_cpu else None
        raw_cpu = per_gib(raw.usage.cpu_s, raw.payload_bytes) if raw.usage is not None else None
        held_cpu = statistics.median(run["cpu_s_per_gib_ingest"] for run in held_runs) if all("cpu_s_per_gib_ingest" in run for run in held_runs) else None  # fmt: skip
        held_wal_cpu_gib = statistics.median(held_wal_cpu) if held_wal_cpu else None
        results.append(Result(W, f"ingest MB/s ({label})", eng["ingest_mb_s"], "MB/s", "WAL alone (BlockWAL, same bodies and concurrency)", wal_mb_s, True, extra, eng_cpu, wal_cpu_gib))  # fmt: skip
        raw_label = f"raw PUT ceiling ({backend}, right after the engine run): {raw_shapes}"
        raw_extra = {**extra, **raw.extra("raw_put_")}
        results.append(Result(W, f"upload MB/s while uploads are in flight ({label})", eng["upload_mb_s"], "MB/s", raw_label, raw.mb_per_s, True, raw_extra, eng_cpu, raw_cpu))  # fmt: skip
        results.append(Result(W, f"ingest + upload drain MB/s ({label})", eng["drain_mb_s"], "MB/s", raw_label, raw.mb_per_s, True, raw_extra, eng_cpu, raw_cpu))  # fmt: skip
        results.append(Result(W, f"ingest MB/s, uploads held back until the end ({label})", held_engine_mb_s, "MB/s", "WAL alone (BlockWAL, same bodies, concurrency and capacity)", held_wal_mb_s, True, {"backend": backend, "wal_aio": wal_aio, "wal_capacity_bytes": _held_wal_capacity(total), "wal_alone_default_capacity_mb_s": wal_mb_s, **held}, held_cpu, held_wal_cpu_gib))  # fmt: skip
        puts_gib = per_gib(eng["put_requests"], int(eng["payload_bytes"]))
        naive_gib = per_gib(eng["naive_puts"], int(eng["payload_bytes"]))
        results.append(Result(W, f"PUT requests per GiB ({label})", puts_gib, "req/GiB", "naive writer: one object per stream per upload", naive_gib, False, extra))  # fmt: skip

    rate = max(max_rate_1k / 2, 100.0)
    duration = ctx.param("latency_s", ctx.scale(quick=3.0, full=10.0))
    ctx.status(f"ingest: append latency at {rate:.0f} appends/s (half of max), WAL alone")
    wal_times, wal_pacer = ThreadTimes(), PacerStats()
    with _frozen_heap():
        _, wal_lat = await _wal_alone(
            ctx, "wal-latency", record_bytes=1 * KiB, total_bytes=int(rate * duration) * KiB, producers=1,
            rate_per_s=rate, times=wal_times, pacer=wal_pacer,
        )  # fmt: skip
    ctx.status(f"ingest: append latency at {rate:.0f} appends/s, the minimal group-commit loop")
    with _frozen_heap():
        loop_lat, loop_stalls = await _minimal_loop_latency(
            ctx, record_bytes=1 * KiB, rate_per_s=rate, duration_s=duration
        )
    ctx.status("ingest: append latency, engine with uploads running")
    eng_times, eng_pacer = ThreadTimes(), PacerStats()
    eng_stalls: dict[str, float] = {}
    with _frozen_heap():
        eng_lat, uploads, send_lag, gc_pauses, frozen, young = await _engine_latency(
            ctx, record_bytes=1 * KiB, stream_count=stream_count, rate_per_s=rate, duration_s=duration,
            times=eng_times, pacer=eng_pacer, stalls=eng_stalls,
        )  # fmt: skip
    put_rate = uploads / duration
    ctx.status(f"ingest: append latency, WAL alone while another process PUTs {put_rate:.1f} 8 MiB objects/s")
    put_lat, put_times, put_pacer, puts = await _wal_alone_under_put_load(
        ctx, rate_per_s=rate, duration_s=duration, put_rate_per_s=max(put_rate, 0.1), object_bytes=8 * MiB
    )
    ctx.status("ingest: the latency method's floor (a target that only yields once)")
    with _frozen_heap():
        floor = await _paced_floor(rate, min(duration, 3.0))
    results.append(Result(W, "append p99 latency at half max rate (1 KiB records, uploads running)", eng_lat.percentile_s(0.99) * 1000, "ms", "minimal group-commit loop at the same rate, same disk", loop_lat.percentile_s(0.99) * 1000, False, {"disk_stalls": {"engine": eng_stalls, "minimal_loop": loop_stalls}, "minimal_loop_latency_ms": loop_lat.summary_ms(), "wal_alone_p99_ms": wal_lat.percentile_s(0.99) * 1000, "backend": backend, "wal_aio": wal_aio, "rate_per_s": rate, "uploads_during_run": uploads, "engine_latency_ms": eng_lat.summary_ms(), "wal_latency_ms": wal_lat.summary_ms(), "send_lag_ms": send_lag.summary_ms(), "pacer": eng_pacer.summary(), "wal_pacer": wal_pacer.summary(), "thread_times_s": eng_times.summary_s(), "wal_thread_times_s": wal_times.summary_s(), "wal_under_put_load": {"latency_ms": put_lat.summary_ms(), "put_rate_per_s": put_rate, "puts": puts, "object_bytes": 8 * MiB, "pacer": put_pacer.summary(), "thread_times_s": put_times.summary_s()}, "method_floor_ms": floor.summary_ms(), "gc_full_collections_ms": gc_pauses.summary_ms(), "gc_young_collections_ms": young.summary_ms(), "heap_frozen_after_warmup": True, "frozen_objects": frozen, "warmup_s": WARMUP_S, "goal_ms": 3.0}))  # fmt: skip
    return results
