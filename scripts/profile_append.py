"""Loop-thread CPU per append of the 1 KiB ingest, layer by layer (docs/benchmarks.md, "Append path CPU").

Run from the repository root: ``python scripts/profile_append.py [target ...]`` (pin it with
``taskset -c 0`` on a shared machine). Each target appends ``--count`` 1 KiB records from 128
concurrent producers (round-robin over 1,000 streams for the engine) and prints the loop thread's CPU
microseconds per append (``time.thread_time``: what the shared machine's load barely moves) and the
process's CPU seconds per GiB (all threads). Targets, from the floor up:

- ``floor``: each append awaits a future of its own, resolved by one callback per loop turn (the
  minimal group-commit loop: no I/O, no encoding);
- ``shared``: the same with one future per loop turn that every append of the turn awaits;
- ``wal``: the block WAL alone (what the ``ingest`` workload's baseline does);
- ``held``: the engine with uploads held back (thresholds above the run's size);
- ``uploads``: the engine with the default upload threshold (local object store);
- ``profile``: ``held`` under cProfile (the 30 functions with the most own time).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from s3stream._loop import run as run_loop
from s3stream.assembly import open_block_wal, open_client
from s3stream.config import Config
from s3stream.model import RecordBatch
from s3stream.record import RECORD_HEADER_SIZE

MiB = 1 << 20
RECORD_BYTES = 1024
PRODUCERS = 128
STREAMS = 1000


async def _drive(count: int, one: Callable[[int], Awaitable[object]]) -> tuple[float, float]:
    """``count`` calls of ``one(n)`` from PRODUCERS tasks; (loop thread CPU s, process CPU s)."""

    async def producer(index: int) -> None:
        for n in range(index, count, PRODUCERS):
            await one(n)

    loop0, cpu0 = time.thread_time(), time.process_time()
    await asyncio.gather(*(producer(i) for i in range(PRODUCERS)))
    return time.thread_time() - loop0, time.process_time() - cpu0


async def _floor(count: int, shared: bool) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    pending: list[asyncio.Future[int]] = []
    current: list[asyncio.Future[int]] = []

    def resolve() -> None:
        if shared:
            current.pop().set_result(0)
        for future in pending:
            future.set_result(0)
        pending.clear()

    def append(_: int) -> asyncio.Future[int]:
        if shared:
            if not current:
                current.append(loop.create_future())
                loop.call_soon(resolve)
            return current[0]
        future: asyncio.Future[int] = loop.create_future()
        if not pending:
            loop.call_soon(resolve)
        pending.append(future)
        return future

    return await _drive(count, append)


async def _wal(count: int, scratch: Path) -> tuple[float, float]:
    config = Config(wal_capacity_bytes=max(256 * MiB, 2 * count * RECORD_BYTES))
    wal = await open_block_wal(scratch / "wal", config, node_epoch=1)
    await wal.recover()
    body = os.urandom(RECORD_BYTES + RECORD_HEADER_SIZE)
    try:
        return await _drive(count, lambda _: wal.append(body))
    finally:
        await wal.close()


async def _engine(
    count: int, scratch: Path, *, held: bool, profile: cProfile.Profile | None
) -> tuple[float, float]:
    config = Config()
    if held:
        room = max(256 * MiB, 2 * count * RECORD_BYTES)
        config = Config(
            wal_capacity_bytes=room,
            wal_cache_size_bytes=room,
            wal_upload_threshold_bytes=room,
            wal_upload_interval_ms=86_400_000,
        )
    client = await open_client(scratch, config=config)
    try:
        streams = [await client.streams.create_and_open_stream() for _ in range(STREAMS)]
        payload = os.urandom(RECORD_BYTES)
        if profile is not None:
            profile.enable()
        try:
            return await _drive(count, lambda n: streams[n % STREAMS].append(RecordBatch(payload)))
        finally:
            if profile is not None:
                profile.disable()
    finally:
        await client.close()


async def _main(targets: list[str], count: int) -> None:
    gib = count * RECORD_BYTES / (1 << 30)
    for target in targets:
        scratch = Path(tempfile.mkdtemp(prefix="s3stream-profile-append-"))
        profile = cProfile.Profile() if target == "profile" else None
        try:
            if target in ("floor", "shared"):
                loop_s, cpu_s = await _floor(count, shared=target == "shared")
            elif target == "wal":
                loop_s, cpu_s = await _wal(count, scratch)
            elif target in ("held", "uploads", "profile"):
                loop_s, cpu_s = await _engine(count, scratch, held=target != "uploads", profile=profile)
            else:
                raise SystemExit(f"unknown target {target!r}")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        print(
            f"{target:8s} loop {loop_s / count * 1e6:6.2f} us/append  process CPU {cpu_s / gib:6.2f} s/GiB",
            flush=True,
        )
        if profile is not None:
            pstats.Stats(profile).sort_stats("tottime").print_stats(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", default=["floor", "shared", "wal", "held", "uploads"])
    parser.add_argument("--count", type=int, default=32768, help="appends per target (default 32768)")
    args = parser.parse_args()
    run_loop(_main(args.targets, args.count))


if __name__ == "__main__":
    main()
