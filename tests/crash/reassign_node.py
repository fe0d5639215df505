"""One node of the cluster tests: a client on its own data dir, shared metadata (by URL) and bucket.

Usage: python -m tests.crash.reassign_node DATA_DIR METADATA_URL BUCKET_URI NODE_ID LEASE_MS ACKS_FILE

Every acknowledged append is written to ACKS_FILE as ``<stream id> <offset> <payload>`` and fsynced
before anything else happens, so the test sees each acknowledgement the moment it is given. Commands,
one per stdin line, each answered with one line (``OK ...`` or ``ERR <ErrorKind> <owner node or -1>``):

- ``create`` -> ``OK <stream id>``; ``open <stream id>`` (at its stored epoch + 1) -> ``OK <epoch>``
- ``append <stream id> <payload>`` -> ``OK <offset>``
- ``flood <stream id> <prefix> <in flight>``: appends ``<prefix>-<n>`` without pause, ``in flight`` at a
  time, until ``stop``; -> ``OK``. ``stop`` -> ``OK acked=<n> failed=<n> kinds=<Kind:count,...>``
- ``reassign <id,id,...> <node>`` -> ``OK`` once held open there
- ``events`` -> ``OK <kind>:<stream id>,...`` (every assignment event since start; gained streams are
  kept for ``append``); ``owned`` -> ``OK <stream id>,...`` (streams open in the engine)
- ``status`` -> ``OK epoch=<node epoch> fenced=<0|1>``; ``close`` -> ``OK closed``, exits.

Prints ``READY epoch=<node epoch>`` once open. Config overrides come from the ``S3STREAM_*`` environment.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import sys
from typing import IO

from s3stream import RecordBatch, S3StreamError
from s3stream.assembly import open_client
from s3stream.config import Config
from s3stream.engine.client import Client, Stream
from s3stream.errors import NotOwnerError
from s3stream.ids import StreamId


def node_config(node_id: int, lease_ms: int, metadata_url: str) -> Config:
    return Config.from_sources(
        wal_capacity_bytes=16 << 20,
        wal_record_max_bytes=1 << 20,
        record_max_bytes=1 << 20,
        wal_upload_interval_ms=3_600_000,  # uploads only when a stream moves or closes
        cluster_poll_ms=50,
        node_id=node_id,
        node_lease_ms=lease_ms,
        metadata_url=metadata_url,
    )


class Node:
    def __init__(self, client: Client, acks: IO[str]) -> None:
        self.client = client
        self.acks = acks
        self.streams: dict[int, Stream] = {}
        self.events: list[str] = []
        self.flooding: list[asyncio.Task[None]] = []
        self.flood_stop = False
        self.flood_acked = 0
        self.flood_failed: collections.Counter[str] = collections.Counter()

    def record_ack(self, stream_id: int, offset: int, payload: str) -> None:
        self.acks.write(f"{stream_id} {offset} {payload}\n")
        self.acks.flush()
        os.fsync(self.acks.fileno())

    async def follow(self) -> None:
        async for event in self.client.streams.assignments():
            self.events.append(f"{event.kind}:{event.stream_id}")
            if event.stream is not None:
                self.streams[event.stream_id] = event.stream

    async def append(self, stream: Stream, payload: str) -> int:
        offset = await stream.append(RecordBatch(payload.encode()))
        self.record_ack(stream.stream_id, offset, payload)
        return offset

    async def flood_one(self, stream: Stream, prefix: str, counter: list[int]) -> None:
        while not self.flood_stop:
            counter[0] += 1
            payload = f"{prefix}-{counter[0]}"
            try:
                await self.append(stream, payload)
                self.flood_acked += 1
            except S3StreamError as exc:
                self.flood_failed[type(exc).__name__] += 1
                await asyncio.sleep(0.01)

    async def command(self, words: list[str]) -> str:
        op = words[0]
        if op == "create":
            return f"OK {await self.client.streams.create_stream()}"
        if op == "open":
            sid = StreamId(int(words[1]))
            meta = await self.client.engine.metadata.describe_stream(sid)
            stream = await self.client.streams.open_stream(sid, epoch=meta.epoch + 1)
            self.streams[sid] = stream
            return f"OK {stream.epoch}"
        if op == "append":
            return f"OK {await self.append(self.streams[int(words[1])], words[2])}"
        if op == "flood":
            stream, prefix, width = self.streams[int(words[1])], words[2], int(words[3])
            self.flood_stop = False
            counter = [0]
            self.flooding = [
                asyncio.create_task(self.flood_one(stream, prefix, counter)) for _ in range(width)
            ]
            return "OK"
        if op == "stop":
            self.flood_stop = True
            await asyncio.gather(*self.flooding)
            kinds = ",".join(f"{k}:{v}" for k, v in sorted(self.flood_failed.items()))
            return f"OK acked={self.flood_acked} failed={sum(self.flood_failed.values())} kinds={kinds}"
        if op == "reassign":
            ids = [StreamId(int(s)) for s in words[1].split(",")]
            await self.client.streams.reassign(ids, int(words[2]), timeout_s=60)
            return "OK"
        if op == "events":
            return "OK " + ",".join(self.events)
        if op == "owned":
            return "OK " + ",".join(str(s) for s in sorted(self.client.engine.streams))
        if op == "status":
            return f"OK epoch={self.client.engine.node_epoch} fenced={int(self.client.engine.fenced)}"
        raise ValueError(f"unknown command {words!r}")


async def main(argv: list[str]) -> None:
    data_dir, metadata_url, bucket_uri, node_id, lease_ms, acks_path = argv[:6]
    config = node_config(int(node_id), int(lease_ms), metadata_url)
    client = await open_client(data_dir, bucket_uri=bucket_uri, config=config)
    print(f"READY epoch={client.engine.node_epoch}", flush=True)
    with open(acks_path, "a") as acks:
        node = Node(client, acks)
        follower = asyncio.create_task(node.follow())
        loop = asyncio.get_running_loop()
        try:
            while True:
                line = await loop.run_in_executor(None, sys.stdin.readline)
                words = line.split()
                if not words or words[0] == "close":
                    break
                try:
                    answer = await node.command(words)
                except NotOwnerError as exc:
                    answer = f"ERR {type(exc).__name__} {exc.owner_node_id}"
                except S3StreamError as exc:
                    answer = f"ERR {type(exc).__name__} -1 {exc}".replace("\n", " ")
                print(answer, flush=True)
        finally:
            node.flood_stop = True
            await asyncio.gather(*node.flooding, return_exceptions=True)
            with contextlib.suppress(S3StreamError):
                await client.close()
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError, S3StreamError):
                await follower
    print("OK closed", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
