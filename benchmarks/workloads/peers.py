"""Workload ``peers``: the engine beside its peers on the same durable writes, and the raw ceilings.

- durable 1 KiB writes with the same producers and streams on the same object store: s3stream
  (``Stream.append``, which returns once the record is in the WAL on the local disk, fdatasync'ed;
  uploads to the object store follow, drained at the end) vs SlateDB (``put`` + ``await_durable``: in
  the object store) and vs the naive writer (one object per stream per flush: in the object store),
  and SlateDB vs the naive writer. The durability points differ by design (AutoMQ's WAL on a block
  device); S3 requests per GiB include the engine's uploads after the drain;
- raw aiobotocore PUT and GET of 16 MiB objects with 4 in flight vs 1 in flight (S3 target only);
- raw PUT of 4 KiB objects with 32 in flight vs 1 (request rate; S3 target only);
- raw O_DIRECT sequential 1 MiB writes vs buffered writes + one fdatasync (the local disk).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import mmap
import os
import time
from pathlib import Path

from benchmarks.baselines import (
    DurableWriteSpec,
    Measured,
    MeasureWindow,
    naive_writer,
    odirect_write,
    raw_s3_put_get,
    requests_per_gib,
    slatedb_writer,
)
from benchmarks.core import Context, Result
from benchmarks.measure import MIB, CountingStorage, RequestCounter, ResourceMeter, per_gib

NAME = "peers"


def _compare(metric: str, unit: str, value: Measured, baseline: Measured, *, per: str) -> Result:
    def pick(measured: Measured) -> float:
        if unit == "MiB/s":
            return measured.mib_per_s
        if unit == "MB/s":
            return measured.mb_per_s
        return measured.ops_per_s

    extra = {
        "latency_ms": value.latency.summary_ms(),
        "s3_requests_per_gib": requests_per_gib(value),
        "what": per,
        "subject": value.name,
        **baseline.extra("baseline_"),
        **{key: item for key, item in value.extra("").items() if key not in ("latency_ms",)},
    }
    extra["baseline_s3_requests_per_gib"] = requests_per_gib(baseline)
    return Result(
        workload=NAME,
        metric=metric,
        value=pick(value),
        unit=unit,
        baseline=baseline.name,
        baseline_value=pick(baseline),
        extra=extra,
        cpu_s_per_gib=_cpu_s_per_gib(value),
        baseline_cpu_s_per_gib=_cpu_s_per_gib(baseline),
    )


def _cpu_s_per_gib(measured: Measured) -> float | None:
    """CPU s per GiB of payload of a measured run (its :class:`ResourceMeter`), None if not metered."""
    if measured.usage is None or not measured.payload_bytes:
        return None
    return per_gib(measured.usage.cpu_s, measured.payload_bytes)


def _buffered_write_sync(path: Path, total_bytes: int, block_bytes: int) -> Measured:
    result = Measured(name=f"buffered write + fdatasync ({block_bytes // 1024} KiB writes)")
    buffer = mmap.mmap(-1, block_bytes)
    buffer.write(os.urandom(block_bytes))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with ResourceMeter() as meter:
            started = time.perf_counter()
            for offset in range(0, total_bytes, block_bytes):
                write_started = time.perf_counter()
                if os.pwrite(fd, buffer, offset) != block_bytes:
                    raise OSError(errno.EIO, "short write")
                result.latency.record(time.perf_counter() - write_started)
            os.fdatasync(fd)
            result.elapsed_s = time.perf_counter() - started
        result.usage = meter.usage
        result.payload_bytes, result.op_count = total_bytes, total_bytes // block_bytes
    finally:
        os.close(fd)
        buffer.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return result


async def _engine_writer(ctx: Context, spec: DurableWriteSpec) -> Measured:
    """``spec``'s producers append to s3stream streams (default Config) until the deadline, then the
    uploads are drained so every record is in the object store."""
    from s3stream.assembly import open_client
    from s3stream.config import Config
    from s3stream.model import RecordBatch

    counter = RequestCounter()
    result = Measured(name=f"s3stream append ({spec.label()}, WAL on local disk)", requests=counter)
    storage = CountingStorage(ctx.open_storage(f"{NAME}-engine"), counter)
    client = await open_client(ctx.scratch(f"{NAME}-engine"), config=Config(), storage=storage)
    payload = os.urandom(spec.record_bytes)
    try:
        streams = [await client.streams.create_and_open_stream() for _ in range(spec.stream_count)]
        window = MeasureWindow(spec, result)

        async def producer(index: int) -> None:
            stream = streams[index % spec.stream_count]
            while not window.done():
                started = time.perf_counter()
                await stream.append(RecordBatch(payload))
                window.record(started, time.perf_counter())

        with ResourceMeter() as meter:
            await asyncio.gather(*(producer(i) for i in range(spec.producer_count)))
            ctx.status("durable writes: s3stream, draining uploads")
            drain_started = time.perf_counter()
            await client.engine.force_upload(None)
            result.notes.append(
                f"upload drain after the run took {time.perf_counter() - drain_started:.2f} s"
            )
        result.usage = meter.usage
        result.elapsed_s = spec.duration_s
    finally:
        await client.close()
    return result


async def run(ctx: Context) -> list[Result]:
    results: list[Result] = []
    scratch = ctx.scratch(NAME)

    ctx.status("disk: O_DIRECT vs buffered sequential writes")
    disk_bytes = ctx.scale(quick=128 * MIB, full=1024 * MIB)
    direct = await odirect_write(scratch / "direct.bin", total_bytes=disk_bytes, block_bytes=MIB)
    buffered = await asyncio.to_thread(_buffered_write_sync, scratch / "buffered.bin", disk_bytes, MIB)
    results.append(_compare("raw O_DIRECT sequential write", "MB/s", direct, buffered, per="local disk"))
    ctx.notes.extend(direct.notes)

    spec = DurableWriteSpec(
        stream_count=ctx.param("streams", 16),
        record_bytes=ctx.param("record_bytes", 1024),
        producer_count=ctx.param("producers", 256),
        flush_interval_ms=ctx.param("flush_ms", 100),
        warmup_s=ctx.scale(quick=0.5, full=2.0),
        duration_s=ctx.scale(quick=2.0, full=15.0),
    )
    ctx.status(f"durable writes: s3stream ({spec.label()})")
    engine = await _engine_writer(ctx, spec)
    ctx.status(f"durable writes: naive writer ({spec.label()})")
    storage = ctx.open_storage(f"{NAME}-naive")
    try:
        naive = await naive_writer(storage, spec)
    finally:
        await storage.close()
    ctx.status(f"durable writes: SlateDB ({spec.label()})")
    slate = await slatedb_writer(
        spec, target=ctx.s3, prefix=ctx.key_prefix(f"{NAME}-slatedb"), local_dir=scratch / "slatedb"
    )
    ctx.notes.extend(slate.notes)
    what = f"durable {spec.record_bytes} B appends"
    results.append(_compare("s3stream durable appends", "records/s", engine, slate, per=what))
    results.append(_compare("s3stream durable appends", "records/s", engine, naive, per=what))
    results.append(_compare("SlateDB durable writes", "records/s", slate, naive, per=what))
    p99 = Result(
        workload=NAME,
        metric="s3stream append p99 latency",
        value=engine.latency.percentile_s(0.99) * 1000,
        unit="ms",
        baseline=slate.name,
        baseline_value=slate.latency.percentile_s(0.99) * 1000,
        higher_is_better=False,
        extra={"subject": engine.name},
    )
    results.append(p99)
    ctx.notes.extend(f"s3stream: {note}" for note in engine.notes)

    if ctx.s3 is None:
        ctx.notes.append("peers: raw S3 PUT/GET skipped (target local)")
        return results

    big_count = ctx.scale(quick=8, full=48)
    prefix = ctx.key_prefix(NAME)
    ctx.status("raw S3: 16 MiB PUT/GET, 1 in flight")
    put_1, get_1 = await raw_s3_put_get(
        ctx.s3, prefix=prefix + "c1/", object_count=big_count, object_bytes=16 * MIB, concurrency=1
    )
    ctx.status("raw S3: 16 MiB PUT/GET, 4 in flight")
    put_4, get_4 = await raw_s3_put_get(
        ctx.s3, prefix=prefix + "c4/", object_count=big_count, object_bytes=16 * MIB, concurrency=4
    )
    assert get_1 is not None
    assert get_4 is not None
    results.append(_compare("raw PUT 16 MiB, 4 in flight", "MiB/s", put_4, put_1, per="object store"))
    results.append(_compare("raw GET 16 MiB, 4 in flight", "MiB/s", get_4, get_1, per="object store"))

    small_count = ctx.scale(quick=200, full=2000)
    ctx.status("raw S3: 4 KiB PUT, 1 and 32 in flight")
    small_1, _ = await raw_s3_put_get(
        ctx.s3,
        prefix=prefix + "s1/",
        object_count=small_count // 4,
        object_bytes=4096,
        concurrency=1,
        get=False,
    )
    small_32, _ = await raw_s3_put_get(
        ctx.s3, prefix=prefix + "s32/", object_count=small_count, object_bytes=4096, concurrency=32, get=False
    )
    results.append(_compare("raw PUT 4 KiB, 32 in flight", "ops/s", small_32, small_1, per="object store"))
    return results
