"""One node of the failover tests: a client on its own data dir, shared metadata (by URL) and bucket.

Usage: python -m tests.crash.cluster_node DATA_DIR METADATA_URL BUCKET_URI NODE_ID LEASE_MS [options]

Options: ``--kill-at POINT`` kills this process (SIGKILL, by itself) at a point of a takeover it runs
(``after_streams_taken``, ``after_commit`` (the first), ``before_finish``); ``--hold-at POINT
--hold-s S`` holds the takeover there S seconds instead; ``--hold-before-commit S``
holds every upload of its own engine S seconds between the object writes and the commit (a node paused
there by SIGSTOP writes objects that it may never commit); ``--threshold BYTES`` sets
``s3.wal.upload.threshold`` (the size of a takeover's upload groups); ``--attach CMD`` sets
``s3.wal.failover.attach.cmd``.

Reads one command per stdin line and answers one line on stdout (``OK ...`` or ``ERR <ErrorKind> ...``):

- ``create`` -> ``OK <stream id>``; ``open <stream id> <epoch>`` -> ``OK``
- ``append <stream id> <payload>`` -> ``OK <offset>``; ``fill <stream id> <count> <size>`` appends
  ``count`` records ``<stream id>-<offset>-`` padded with ``x`` to ``size`` bytes -> ``OK <last offset>``
- ``upload`` (force every stream up) -> ``OK``
- ``held`` -> ``OK <stream id>:<epoch>,...`` (the streams open here)
- ``read <stream id>`` -> ``OK <start> <payload>,<payload>,...`` (every record of a stream open here)
- ``status`` -> ``OK epoch=.. fenced=.. controller=.. takeovers=.. recovered=..``
- ``close`` -> closes the client, ``OK``, exits.

On start it prints ``READY epoch=<node epoch>``. Every assignment event is printed as
``EVENT <kind> <stream id> <wall time s>`` (a gained stream is then open here for ``append``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time

from s3stream import RecordBatch, S3StreamError
from s3stream.assembly import open_client
from s3stream.cluster.takeover import TakeoverObserver
from s3stream.config import Config
from s3stream.engine.client import Client, Stream
from s3stream.engine.pipeline import UploadObserver
from s3stream.metadata.base import TakeoverInfo

CONFIG = Config(
    wal_capacity_bytes=16 << 20,
    wal_record_max_bytes=1 << 20,
    record_max_bytes=1 << 20,
    wal_upload_interval_ms=3_600_000,  # uploads only when asked (``upload``) or when a block is full
    cluster_poll_ms=50,
)


class AtPoint(TakeoverObserver):
    """Kills this process, or holds the takeover ``hold_s`` seconds, at one point of a takeover it runs."""

    def __init__(self, point: str, *, hold_s: float = 0.0) -> None:
        self.point = point
        self.hold_s = hold_s

    async def _reached(self, point: str) -> None:
        if point != self.point:
            return
        if self.hold_s:
            print(f"HOLDING at {point}", flush=True)
            await asyncio.sleep(self.hold_s)
            return
        print(f"KILLING at {point}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    async def after_streams_taken(self, takeover: TakeoverInfo) -> None:
        await self._reached("after_streams_taken")

    async def after_commit(self, takeover: TakeoverInfo, commit_count: int) -> None:
        await self._reached("after_commit")

    async def before_finish(self, takeover: TakeoverInfo) -> None:
        await self._reached("before_finish")


class HoldBeforeCommit(UploadObserver):
    """Holds every upload between its object writes and its commit."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s

    async def before_commit(self) -> None:
        print("HOLDING before commit", flush=True)
        await asyncio.sleep(self.hold_s)


async def _events(client: Client, streams: dict[int, Stream]) -> None:
    with contextlib.suppress(S3StreamError):
        async for event in client.streams.assignments():
            if event.kind == "gained" and event.stream is not None:
                streams[event.stream_id] = event.stream  # a lost stream stays: its appends show the error
            print(f"EVENT {event.kind} {event.stream_id} {time.time():.3f}", flush=True)


def _status(client: Client) -> str:
    controller = client.components.get("controller")
    taker = client.components.get("taker")
    return (
        f"OK epoch={client.engine.node_epoch} fenced={int(client.engine.fenced)} "
        f"controller={int(bool(getattr(controller, 'running', False)))} "
        f"takeovers={len(getattr(taker, 'results', ()))} recovered={client.engine.stats.recovered_records}"
    )


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
    if op == "fill":
        stream, count, size = streams[int(words[1])], int(words[2]), int(words[3])
        offset = -1
        for _ in range(count):
            head = f"{stream.stream_id}-{stream.next_offset}-".encode()
            offset = await stream.append(RecordBatch(head.ljust(size, b"x")))
        return f"OK {offset}"
    if op == "upload":
        await client.engine.force_upload(None)
        return "OK"
    if op == "held":
        return "OK " + ",".join(f"{sid}:{h.epoch}" for sid, h in sorted(client.engine.streams.items()))
    if op == "read":
        stream = streams[int(words[1])]
        payloads, offset = [], stream.start_offset
        while offset < stream.confirm_offset:
            for batch in await stream.fetch(offset, stream.confirm_offset):
                payloads.append(batch.payload.decode())
                offset = batch.end_offset
        return f"OK {stream.start_offset} " + ",".join(payloads)
    if op == "status":
        return _status(client)
    raise ValueError(f"unknown command {words!r}")


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    for name in ("data_dir", "metadata_url", "bucket_uri"):
        parser.add_argument(name)
    parser.add_argument("node_id", type=int)
    parser.add_argument("lease_ms", type=int)
    parser.add_argument("--kill-at", default="")
    parser.add_argument("--hold-at", default="")
    parser.add_argument("--hold-s", type=float, default=5.0)
    parser.add_argument("--hold-before-commit", type=float, default=0.0)
    parser.add_argument("--threshold", type=int, default=0)
    parser.add_argument("--attach", default="")
    args = parser.parse_args(argv)
    config = CONFIG.replace(
        node_id=args.node_id,
        node_lease_ms=args.lease_ms,
        metadata_url=args.metadata_url,
        wal_failover_attach_cmd=args.attach,
    )
    if args.threshold:
        config = config.replace(wal_upload_threshold_bytes=args.threshold)
    client = await open_client(
        args.data_dir,
        bucket_uri=args.bucket_uri,
        config=config,
        takeover_observer=(
            AtPoint(args.kill_at)
            if args.kill_at
            else AtPoint(args.hold_at, hold_s=args.hold_s)
            if args.hold_at
            else None
        ),
        upload_observer=HoldBeforeCommit(args.hold_before_commit) if args.hold_before_commit else None,
    )
    print(f"READY epoch={client.engine.node_epoch}", flush=True)
    streams: dict[int, Stream] = {}
    events = asyncio.create_task(_events(client, streams))
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
        events.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await events
        await client.close()
    print("OK closed", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
