"""One node of the node-session tests: a client on its own data dir, shared metadata (by URL) and bucket.

Usage: python -m tests.crash.node_driver DATA_DIR METADATA_URL BUCKET_URI NODE_ID LEASE_MS

Reads one command per stdin line and answers one line on stdout (``OK ...`` or ``ERR <ErrorKind>``):

- ``create`` -> ``OK <stream id>``; ``open <stream id> <epoch>`` -> ``OK``
- ``append <stream id> <payload>`` -> ``OK <offset>``; ``upload`` (force every stream up) -> ``OK``
- ``read <stream id>`` -> ``OK <payload>,<payload>,...`` (every record from the start)
- ``status`` -> ``OK epoch=<node epoch> fenced=<0|1> maint=<0|1> jobs=<0|1> recovered=<batches>``
- ``scan`` -> ``OK <orphans deleted>``: one garbage collection pass with an orphan scan whose orphan
  TTL is 0 (only the metadata rule protects objects), through the maintenance store
- ``close`` -> closes the client, ``OK``, exits.

On start it prints ``READY epoch=<node epoch>``; with ``--watch`` it also prints ``MAINT <0|1> <wall
time s>`` whenever its maintenance jobs start or stop (polled every 10 ms). The env var
``S3STREAM_TEST_CLOCK_OFFSET_S`` moves this process's wall clock (a clock stepped back or forward).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time

from s3stream import RecordBatch, S3StreamError
from s3stream.assembly import open_client
from s3stream.config import Config
from s3stream.engine.client import Client, Stream

CONFIG = Config(
    wal_capacity_bytes=4 << 20,
    wal_record_max_bytes=1 << 20,
    record_max_bytes=1 << 20,
    wal_upload_interval_ms=3_600_000,  # uploads only when asked (``upload``)
)


def _shift_clock(offset_s: float) -> None:
    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: real_time() + offset_s
    time.time_ns = lambda: real_time_ns() + int(offset_s * 1e9)


def _jobs_running(client: Client) -> bool:
    compactor, reaper = client.components["compactor"], client.components["reaper"]
    tasks = [getattr(compactor, "_task", None), getattr(reaper, "_task", None)]
    return all(t is not None and not t.done() for t in tasks)


async def _watch(client: Client) -> None:
    maintenance = client.components["maintenance"]
    shown = None
    while True:
        running = bool(getattr(maintenance, "running", False)) and _jobs_running(client)
        if running != shown:
            print(f"MAINT {int(running)} {time.time():.3f}", flush=True)
            shown = running
        await asyncio.sleep(0.01)


async def _command(client: Client, streams: dict[int, Stream], words: list[str]) -> str:
    op = words[0]
    if op == "create":
        return f"OK {await client.streams.create_stream()}"
    if op == "open":
        stream = await client.streams.open_stream(int(words[1]), epoch=int(words[2]))  # type: ignore[arg-type]
        streams[stream.stream_id] = stream
        return "OK"
    if op == "append":
        return f"OK {await streams[int(words[1])].append(RecordBatch(words[2].encode()))}"
    if op == "upload":
        await client.engine.force_upload(None)
        return "OK"
    if op == "read":
        stream = streams[int(words[1])]
        payloads, offset = [], stream.start_offset
        while offset < stream.confirm_offset:
            for batch in await stream.fetch(offset, stream.confirm_offset):
                payloads.append(batch.payload.decode())
                offset = batch.end_offset
        return "OK " + ",".join(payloads)
    if op == "status":
        heartbeat = client.components["heartbeat"]
        maintenance = client.components["maintenance"]
        return (
            f"OK epoch={client.engine.node_epoch} fenced={int(client.engine.fenced)} "
            f"maint={int(bool(getattr(maintenance, 'running', False)))} jobs={int(_jobs_running(client))} "
            f"recovered={client.engine.stats.recovered_records} hb={getattr(heartbeat, 'renewal_count', -1)}"
        )
    if op == "scan":
        gc = client.components["compactor"].gc  # type: ignore[attr-defined]
        gc.orphan_ttl_ms = 0
        report = await gc.collect(scan_orphans=True)
        return f"OK {report.orphan_deleted_count}"
    raise ValueError(f"unknown command {words!r}")


async def main(argv: list[str]) -> None:
    watch = "--watch" in argv
    args = [a for a in argv if a != "--watch"]
    data_dir, metadata_url, bucket_uri, node_id, lease_ms = (
        args[0],
        args[1],
        args[2],
        int(args[3]),
        int(args[4]),
    )
    config = CONFIG.replace(node_id=node_id, node_lease_ms=lease_ms, metadata_url=metadata_url)
    client = await open_client(data_dir, bucket_uri=bucket_uri, config=config)
    print(f"READY epoch={client.engine.node_epoch}", flush=True)
    watcher = asyncio.create_task(_watch(client)) if watch else None
    streams: dict[int, Stream] = {}
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            words = line.split()
            if not words or words[0] == "close":
                break
            try:
                answer = await _command(client, streams, words)
            except S3StreamError as exc:
                answer = f"ERR {type(exc).__name__} {str(exc)[:200]}"
            print(answer, flush=True)
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await client.close()
    print("OK closed", flush=True)


if __name__ == "__main__":
    offset = os.environ.get("S3STREAM_TEST_CLOCK_OFFSET_S")
    if offset:
        _shift_clock(float(offset))
    asyncio.run(main(sys.argv[1:]))
