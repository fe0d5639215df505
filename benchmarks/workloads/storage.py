"""Workload ``storage``: PUT/GET throughput of 16 and 64 MiB objects through S3ObjectStorage vs raw
aiobotocore calls on the same server (goal >= 0.9x).

For each object size and concurrency (1 and 4 requests in flight) and each of ``rounds`` rounds,
the same objects are PUT and then GET through (a) a plain aiobotocore client doing ``put_object`` /
``get_object`` + ``read()`` (the baseline, same client settings) and (b) ``S3ObjectStorage.put`` /
``get`` with its defaults (single PUT up to 32 MiB, above it multipart with 16 MiB parts, 4 in
flight). Raw and engine run back to back per batch of ``concurrency`` objects, alternating which
goes first, so the (heavy) noise of a shared machine hits both; figures are MiB/s over all rounds,
ratio = engine / raw. One more case PUTs 64 MiB objects through an engine whose multipart threshold
is 64 MiB (one PUT, like the baseline) to separate the cost of multipart on the server from ours.

Without an S3 target it compares LocalObjectStorage with a plain ``write`` + ``fsync`` + ``rename``
of the same bytes in a thread, and says so in a note.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from benchmarks.baselines import raw_s3_client
from benchmarks.core import Context, Result
from benchmarks.measure import ResourceMeter
from s3stream.storage.base import ObjectStorage

MiB = 1024 * 1024
WORKLOAD = "storage"


async def _timed_local(concurrency: int, keys: list[str], one: Callable[[str], Awaitable[None]]) -> float:
    limit = asyncio.Semaphore(concurrency)

    async def guarded(key: str) -> None:
        async with limit:
            await one(key)

    started = time.perf_counter()
    await asyncio.gather(*(guarded(key) for key in keys))
    return time.perf_counter() - started


async def _measure_pairs(
    ctx: Context,
    label: str,
    keys: list[str],
    concurrency: int,
    rounds: int,
    fns: dict[str, Callable[[str], Awaitable[None]]],
) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds and CPU seconds (this process's) spent per ``"<raw|engine> <put|get>"``: batches of
    ``concurrency`` objects, raw and engine back to back on the same keys, the order alternating
    batch by batch (noise hits both)."""
    elapsed = dict.fromkeys(fns, 0.0)
    cpu_s = dict.fromkeys(fns, 0.0)
    batches = [keys[i : i + concurrency] for i in range(0, len(keys), concurrency)]
    for round_index in range(rounds):
        ctx.status(f"{label} round {round_index + 1}/{rounds}")
        for op in ("put", "get"):
            for batch_index, batch in enumerate(batches):
                pair = [f"raw {op}", f"engine {op}"]
                if (round_index + batch_index) % 2:
                    pair.reverse()
                for name in pair:
                    started = time.perf_counter()
                    with ResourceMeter(interval_s=0) as meter:
                        await asyncio.gather(*(fns[name](key) for key in batch))
                    elapsed[name] += time.perf_counter() - started
                    cpu_s[name] += meter.usage.cpu_s
    return elapsed, cpu_s


async def _s3(ctx: Context) -> list[Result]:
    from s3stream.storage.s3 import S3ObjectStorage

    assert ctx.s3 is not None
    target = ctx.s3
    storage = ctx.open_storage(WORKLOAD)
    assert isinstance(storage, S3ObjectStorage)
    single_put = S3ObjectStorage(
        replace(
            storage.config, multipart_threshold_bytes=64 * MiB, prefix=ctx.key_prefix(f"{WORKLOAD}-single")
        )
    )
    raw_prefix = ctx.key_prefix(f"{WORKLOAD}-raw")
    rounds = ctx.scale(quick=1, full=2)
    count_16 = ctx.scale(quick=4, full=8)
    count_64 = ctx.scale(quick=2, full=4)
    cases: list[tuple[str, int, int, int, S3ObjectStorage]] = [
        ("16 MiB c=1", 16, count_16, 1, storage),
        ("16 MiB c=4", 16, count_16, 4, storage),
        ("64 MiB c=1", 64, count_64, 1, storage),
        ("64 MiB c=4", 64, count_64, 4, storage),
        ("64 MiB c=1, engine as one PUT (threshold 64 MiB)", 64, count_64, 1, single_put),
    ]
    results: list[Result] = []
    bodies = {size_mib: os.urandom(size_mib * MiB) for size_mib in (16, 64)}
    async with raw_s3_client(target) as client:
        try:
            # Warm-up: clients, connection pools and the server's caches, outside any timing.
            for engine in (storage, single_put):
                await engine.put("warm-up", b"w")
                await engine.get("warm-up")
                await engine.delete(["warm-up"])
            await client.put_object(Bucket=target.bucket, Key=raw_prefix + "warm-up", Body=b"w")
            await client.delete_object(Bucket=target.bucket, Key=raw_prefix + "warm-up")
            for label, size_mib, count, concurrency, engine in cases:
                body = bodies[size_mib]
                keys = [f"o-{size_mib}-{i:03d}" for i in range(count)]

                async def raw_put(key: str, body: bytes = body) -> None:
                    await client.put_object(Bucket=target.bucket, Key=raw_prefix + key, Body=body)

                async def raw_get(key: str, body: bytes = body) -> None:
                    response = await client.get_object(Bucket=target.bucket, Key=raw_prefix + key)
                    async with response["Body"] as stream:
                        data = await stream.read()
                    assert len(data) == len(body)

                async def engine_put(key: str, body: bytes = body, engine: S3ObjectStorage = engine) -> None:
                    await engine.put(key, body)

                async def engine_get(key: str, body: bytes = body, engine: S3ObjectStorage = engine) -> None:
                    data = await engine.get(key)
                    assert len(data) == len(body)

                fns: dict[str, Callable[[str], Awaitable[None]]] = {
                    "raw put": raw_put,
                    "engine put": engine_put,
                    "raw get": raw_get,
                    "engine get": engine_get,
                }
                elapsed, cpu_s = await _measure_pairs(ctx, label, keys, concurrency, rounds, fns)
                moved_mib = size_mib * count * rounds
                for op in ("put", "get"):
                    if engine is single_put and op == "get":
                        continue  # same GET path as the case above
                    results.append(
                        Result(
                            workload=WORKLOAD,
                            metric=f"{op} {label}",
                            value=moved_mib / elapsed[f"engine {op}"],
                            unit="MiB/s",
                            baseline=f"raw aiobotocore {op}_object",
                            baseline_value=moved_mib / elapsed[f"raw {op}"],
                            extra={"objects": count, "rounds": rounds, "object_mib": size_mib},
                            cpu_s_per_gib=cpu_s[f"engine {op}"] * 1024 / moved_mib,
                            baseline_cpu_s_per_gib=cpu_s[f"raw {op}"] * 1024 / moved_mib,
                        )
                    )
                await engine.delete(keys)
                await client.delete_objects(
                    Bucket=target.bucket, Delete={"Objects": [{"Key": raw_prefix + k} for k in keys]}
                )
            ctx.notes.append(f"S3ObjectStorage requests: {dict(storage.stats.counts)}")
        finally:
            await storage.close()
            await single_put.close()
    return results


def _raw_file_put(directory: Path, key: str, body: bytes) -> None:
    temp = directory / f".{key}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, directory / key)


async def _local(ctx: Context) -> list[Result]:
    ctx.notes.append("storage: no S3 target; compared LocalObjectStorage with plain write+fsync+rename")
    storage: ObjectStorage = ctx.open_storage(WORKLOAD)
    raw_dir = ctx.scratch(f"{WORKLOAD}-raw")
    loop = asyncio.get_running_loop()
    results: list[Result] = []
    try:
        for size_mib, count in ((16, ctx.scale(quick=4, full=16)), (64, ctx.scale(quick=2, full=8))):
            body = os.urandom(size_mib * MiB)
            keys = [f"o-{size_mib}-{i:03d}" for i in range(count)]

            async def raw_put(key: str, body: bytes = body) -> None:
                await loop.run_in_executor(None, _raw_file_put, raw_dir, key, body)

            async def engine_put(key: str, body: bytes = body) -> None:
                await storage.put(key, body)

            with ResourceMeter(interval_s=0) as raw_meter:
                raw_s = await _timed_local(1, keys, raw_put)
            with ResourceMeter(interval_s=0) as engine_meter:
                engine_s = await _timed_local(1, keys, engine_put)
            results.append(
                Result(
                    workload=WORKLOAD,
                    metric=f"put {size_mib} MiB c=1 (local)",
                    value=size_mib * count / engine_s,
                    unit="MiB/s",
                    baseline="write+fsync+rename in a thread",
                    baseline_value=size_mib * count / raw_s,
                    cpu_s_per_gib=engine_meter.usage.cpu_s * 1024 / (size_mib * count),
                    baseline_cpu_s_per_gib=raw_meter.usage.cpu_s * 1024 / (size_mib * count),
                )
            )
            await storage.delete(keys)
    finally:
        await storage.close()
    return results


async def run(ctx: Context) -> list[Result]:
    return await _s3(ctx) if ctx.s3 is not None else await _local(ctx)
