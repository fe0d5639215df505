"""Crash-test producer: appends to the embedded engine and prints every acknowledgement, until killed.

Usage: python -m tests.crash.engine_producer DATA_DIR STREAMS RUN SEED [KILL_AT KILL_COUNT]

Prints ``OPENING`` before it opens the engine (restart recovery), ``READY`` once open, then one line ``ACK <stream_id> <base_offset> <count>`` per acknowledged
append (flushed before the next append). ``KILL_AT`` is ``before_upload``, ``before_commit`` or
``after_commit``: the process SIGKILLs itself the ``KILL_COUNT``-th time it reaches that point, so
the test controls exactly where the crash happens. The object store and WAL write path come from
the environment (:mod:`tests.crash.backend`). Streams are created on the first run and their
ids kept in the KV store; run ``RUN`` opens them with epoch ``2 * RUN`` (each run fences the last).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from typing import Any

from s3stream import RecordBatch
from s3stream.assembly import open_client
from s3stream.engine.client import Stream
from s3stream.engine.core import UploadObserver
from tests.crash.backend import bucket_uri, engine_config
from tests.support.configs import small_config

CONFIG = small_config(
    record_max_bytes=256 << 10,
    wal_upload_threshold_bytes=64 << 10,
    wal_upload_interval_ms=100,
    upload_retry_backoff_ms=10,
    upload_retry_backoff_max_ms=100,
    object_prepared_ttl_ms=1500,
    object_delete_retention_minutes=0,
    stream_object_split_size_bytes=48 << 10,
)


def payload(stream_id: int, base: int, count: int, size: int) -> bytes:
    """Deterministic, self-describing payload: the verifier recomputes it from the offsets."""
    head = f"{stream_id}/{base}/{count}/".encode()
    return (head * (size // len(head) + 1))[:size]


class KillObserver(UploadObserver):
    def __init__(self, kill_at: str, kill_count: int) -> None:
        self.kill_at = kill_at
        self.remaining = kill_count

    async def _point(self, name: str) -> None:
        if name == self.kill_at:
            self.remaining -= 1
            if self.remaining <= 0:
                print(f"KILL {name}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    async def before_upload(self) -> None:
        await self._point("before_upload")

    async def before_commit(self) -> None:
        await self._point("before_commit")

    async def after_commit(self) -> None:
        await self._point("after_commit")


async def main(argv: list[str]) -> None:
    data_dir, streams_count, run, seed = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    observer = KillObserver(argv[4], int(argv[5])) if len(argv) > 5 else None
    rng = random.Random(seed)
    print("OPENING", flush=True)
    client = await open_client(
        data_dir, config=engine_config(CONFIG), upload_observer=observer, bucket_uri=bucket_uri()
    )
    ids_blob = await client.kv.get("crash/streams")
    if ids_blob is None:
        ids = [await client.streams.create_stream() for _ in range(streams_count)]
        await client.kv.put("crash/streams", ",".join(map(str, ids)).encode())
    else:
        ids = [int(x) for x in ids_blob.decode().split(",")]  # type: ignore[misc]
    streams = [await client.streams.open_stream(i, epoch=2 * run) for i in ids]  # type: ignore[arg-type]
    print("READY", flush=True)

    # Streams 0 and 1 get plain appends and atomic groups from two coroutines. The engine assigns
    # offsets when an append is admitted, which under back-pressure is not call order, and payloads
    # name their base offset: so each append holds its streams' locks until its offsets are assigned
    # (not until it is acknowledged: plain appends and groups stay in flight together).
    locks = [asyncio.Lock() for _ in streams]

    async def assigned(task: asyncio.Future[Any], claims: list[tuple[Stream, int]]) -> None:
        await asyncio.sleep(0)  # the common case: assigned in the append's first step
        while not task.done() and any(s.next_offset == base for s, base in claims):
            await asyncio.sleep(0.001)  # waiting for room (back-pressure)

    async def producer(stream_index: int) -> None:
        stream = streams[stream_index]
        while True:
            count = rng.randint(1, 4)
            size = rng.choice([100, 1000, 8000, 30000])
            async with locks[stream_index]:
                base = stream.next_offset
                task = asyncio.ensure_future(
                    stream.append(RecordBatch(payload(stream.stream_id, base, count, size), count))
                )
                await assigned(task, [(stream, base)])
            got = await task
            assert got == base
            sys.stdout.write(f"ACK {stream.stream_id} {base} {count}\n")
            sys.stdout.flush()

    async def atomic_producer() -> None:
        """Atomic pairs across the first two streams with a KV put: all or nothing after a crash.
        Each is followed by a plain ``kv.put`` of the same key (value ``n.1`` after the group's
        ``n.0``): a replayed group must never put its older value back over the plain one."""
        n = int((await client.kv.get("crash/atomic") or b"0").decode().split(".")[0])
        while True:
            n += 1
            a, b = streams[0], streams[1]
            async with locks[0], locks[1]:
                base_a, base_b = a.next_offset, b.next_offset
                task = asyncio.ensure_future(client.append_atomic(
                    [(a, RecordBatch(payload(a.stream_id, base_a, 1, 500))),
                     (b, RecordBatch(payload(b.stream_id, base_b, 1, 500)))],
                    kv={"crash/atomic": f"{n}.0".encode()},
                ))  # fmt: skip
                await assigned(task, [(a, base_a), (b, base_b)])
            got = await task
            assert got == [base_a, base_b]
            sys.stdout.write(f"ACK {a.stream_id} {base_a} 1\nACK {b.stream_id} {base_b} 1\nKV {n} 0\n")
            sys.stdout.flush()
            await client.kv.put("crash/atomic", f"{n}.1".encode())
            sys.stdout.write(f"KV {n} 1\n")
            sys.stdout.flush()
            await asyncio.sleep(0.02)  # most kills land here: the group is in the WAL, the plain put after it

    await asyncio.gather(*(producer(i) for i in range(len(streams))), atomic_producer())


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
