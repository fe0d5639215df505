"""Workload ``storage``: PUT/GET throughput of 16 and 64 MiB objects through S3ObjectStorage vs raw
aiobotocore calls on the same server (goal >= 0.9x).

For each object size and concurrency (1 and 4 requests in flight) and each of ``rounds`` rounds,
the same objects are PUT and then GET through (a) a plain aiobotocore client doing ``put_object`` /
``get_object`` + ``read()`` (the baseline, same checksum mode, no retries) and (b)
``S3ObjectStorage.put`` / ``get`` with its defaults (single PUT up to 32 MiB, above it multipart
with 16 MiB parts, 4 in flight). The two alternate in every round (A-B, then B-A) so server noise
hits both; figures are MiB/s over all rounds, ratio = engine / raw.

Without an S3 target it compares LocalObjectStorage with a plain ``write`` + ``fsync`` + ``rename``
of the same bytes in a thread, and says so in a note.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks.baselines import raw_s3_client
from benchmarks.core import Context, Result
from s3stream.storage.base import ObjectStorage

MiB = 1024 * 1024
WORKLOAD = "storage"


async def _timed(concurrency: int, keys: list[str], one: Callable[[str], Awaitable[None]]) -> float:
    limit = asyncio.Semaphore(concurrency)

    async def guarded(key: str) -> None:
        async with limit:
            await one(key)

    started = time.perf_counter()
    await asyncio.gather(*(guarded(key) for key in keys))
    return time.perf_counter() - started


async def _s3(ctx: Context) -> list[Result]:
    assert ctx.s3 is not None
    target = ctx.s3
    storage = ctx.open_storage(WORKLOAD)
    raw_prefix = ctx.key_prefix(f"{WORKLOAD}-raw")
    rounds = ctx.scale(quick=1, full=2)
    results: list[Result] = []
    async with raw_s3_client(target) as client:
        try:
            for size_mib, count in ((16, ctx.scale(quick=4, full=8)), (64, ctx.scale(quick=2, full=4))):
                body = os.urandom(size_mib * MiB)
                for concurrency in (1, 4):
                    keys = [f"o-{size_mib}-{i:03d}" for i in range(count)]
                    elapsed: dict[str, float] = {"raw put": 0, "engine put": 0, "raw get": 0, "engine get": 0}

                    async def raw_put(key: str, body: bytes = body) -> None:
                        await client.put_object(Bucket=target.bucket, Key=raw_prefix + key, Body=body)

                    async def raw_get(key: str, body: bytes = body) -> None:
                        response = await client.get_object(Bucket=target.bucket, Key=raw_prefix + key)
                        async with response["Body"] as stream:
                            data = await stream.read()
                        assert len(data) == len(body)

                    async def engine_put(key: str, body: bytes = body) -> None:
                        await storage.put(key, body)

                    async def engine_get(key: str, body: bytes = body) -> None:
                        data = await storage.get(key)
                        assert len(data) == len(body)

                    steps: list[tuple[str, Callable[[str], Awaitable[None]]]] = [
                        ("raw put", raw_put),
                        ("engine put", engine_put),
                        ("raw get", raw_get),
                        ("engine get", engine_get),
                    ]
                    for round_index in range(rounds):
                        ctx.status(f"{size_mib} MiB c={concurrency} round {round_index + 1}/{rounds}")
                        order = steps if round_index % 2 == 0 else [steps[1], steps[0], steps[3], steps[2]]
                        for name, fn in order:
                            elapsed[name] += await _timed(concurrency, keys, fn)
                    moved_mib = size_mib * count * rounds
                    for op in ("put", "get"):
                        results.append(
                            Result(
                                workload=WORKLOAD,
                                metric=f"{op} {size_mib} MiB c={concurrency}",
                                value=moved_mib / elapsed[f"engine {op}"],
                                unit="MiB/s",
                                baseline=f"raw aiobotocore {op}_object",
                                baseline_value=moved_mib / elapsed[f"raw {op}"],
                                extra={"objects": count, "rounds": rounds, "object_mib": size_mib},
                            )
                        )
                    await storage.delete(keys)
                    for start in range(0, len(keys), 1000):
                        await client.delete_objects(
                            Bucket=target.bucket,
                            Delete={"Objects": [{"Key": raw_prefix + k} for k in keys[start : start + 1000]]},
                        )
            stats: Any = getattr(storage, "stats", None)
            if stats is not None:
                ctx.notes.append(f"S3ObjectStorage requests: {dict(stats.counts)}")
        finally:
            await storage.close()
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

            raw_s = await _timed(1, keys, raw_put)
            engine_s = await _timed(1, keys, engine_put)
            results.append(
                Result(
                    workload=WORKLOAD,
                    metric=f"put {size_mib} MiB c=1 (local)",
                    value=size_mib * count / engine_s,
                    unit="MiB/s",
                    baseline="write+fsync+rename in a thread",
                    baseline_value=size_mib * count / raw_s,
                )
            )
            await storage.delete(keys)
    finally:
        await storage.close()
    return results


async def run(ctx: Context) -> list[Result]:
    return await _s3(ctx) if ctx.s3 is not None else await _local(ctx)
