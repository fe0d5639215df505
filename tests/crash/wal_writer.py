"""Crash-test writer: recover a WAL, log what came back, then append and trim until SIGKILLed.

Usage: python -m tests.crash.wal_writer WAL_PATH LOG_DIR ITERATION SEED [AIO [KILL_AFTER_WRITES]]

Writes ``LOG_DIR/recovered.<ITERATION>`` (one ``offset crc length`` line per recovered record, renamed
into place when complete), prints ``READY``, its next offset and the WAL's write mode, and then logs, to ``LOG_DIR/log.<ITERATION>``:
``I crc length`` before each append (intent), ``A offset crc length`` after it is acknowledged,
``t offset`` before a trim and ``T offset`` after it returned. Lines are written with one
``os.write`` each: a SIGKILL loses nothing already written (the page cache outlives the process).
``KILL_AFTER_WRITES`` n >= 1: the process SIGKILLs itself right after the n-th device write of its
recovery (1: the bridge over the last session's torn tail, 2: the new header), a crash while replaying.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import os
import random
import signal
import sys
from typing import Any

from crc32c import crc32c

from wal import BlockWAL, WalConfig

CONFIG = WalConfig(
    capacity_bytes=4 << 20,
    record_max_bytes=32 << 10,
    batch_max_bytes=64 << 10,
    inflight_max_bytes=512 << 10,
    on_full="wait",
)
PRODUCERS = 32


def kill_after_writes(wal: BlockWAL, count: int) -> None:
    """SIGKILL this process right after the ``count``-th write to ``wal``'s device from now."""
    device: Any = wal._device  # the test reaches in: a crash at an exact write of the recovery
    write = device.write
    done = 0

    def counted(pos: int, data: Any) -> None:
        nonlocal done
        write(pos, data)
        done += 1
        if done >= count:
            os.kill(os.getpid(), signal.SIGKILL)

    device.write = counted


async def main(
    wal_path: str, log_dir: str, iteration: int, seed: int, aio: str = "off", kill_after: int = 0
) -> None:
    rng = random.Random(seed)
    wal = await BlockWAL.open(wal_path, dataclasses.replace(CONFIG, aio=aio))  # type: ignore[arg-type]
    if kill_after > 0:
        kill_after_writes(wal, kill_after)
    recovered = [r async for r in wal.recover()]
    lines = [f"{r.offset} {crc32c(r.data)} {len(r.data)}\n" for r in recovered]
    tmp = os.path.join(log_dir, f"recovered.{iteration}.tmp")
    with open(tmp, "w") as f:
        f.writelines(lines)
    os.rename(tmp, os.path.join(log_dir, f"recovered.{iteration}"))
    log = os.open(os.path.join(log_dir, f"log.{iteration}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    acked: list[int] = [r.offset for r in recovered]  # trimmable too: a full ring must not stall us
    print("READY", wal.next_offset, wal.mode, flush=True)

    async def producer(p: int) -> None:
        n = 0
        while True:
            count = 1 if rng.random() < 0.8 else rng.randrange(2, 20)
            batch = []
            for _ in range(count):
                size = rng.choice(
                    (rng.randrange(1, 200), rng.randrange(200, 4000), rng.randrange(4000, 32 << 10))
                )
                data = f"{iteration}:{p}:{n}:".encode() + rng.randbytes(max(0, size - 16))
                n += 1
                batch.append(data)
                os.write(log, f"I {crc32c(data)} {len(data)}\n".encode())
            offsets = [await wal.append(batch[0])] if count == 1 else await wal.append_many(batch)
            out = "".join(f"A {o} {crc32c(d)} {len(d)}\n" for o, d in zip(offsets, batch, strict=True))
            os.write(log, out.encode())
            acked.extend(offsets)

    async def trimmer() -> None:
        while True:
            await asyncio.sleep(0.01)
            if wal.used_bytes > CONFIG.record_area_bytes // 2 and acked:
                keep_from = wal.next_offset - CONFIG.record_area_bytes // 4
                k = bisect.bisect_right(acked, keep_from)
                target = acked[k - 1] if k else 0
                if target > wal.trim_offset:
                    os.write(log, f"t {target}\n".encode())
                    await wal.trim(target)
                    os.write(log, f"T {target}\n".encode())

    await asyncio.gather(trimmer(), *(producer(p) for p in range(PRODUCERS)))


if __name__ == "__main__":
    kill = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    asyncio.run(
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:6], kill_after=kill)
    )
