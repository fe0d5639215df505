"""One node of the cluster soak: a client that produces to every stream it owns, following assignments().

Usage: python -m tests.crash.soak_node DATA_DIR METADATA_URL BUCKET_URI NODE_ID LOG_PATH CONFIG_JSON

``CONFIG_JSON`` maps config key names (``s3.node.lease.ms``, ...) to values. The node opens its client
(retrying while ``open_node`` refuses with a retriable error: a takeover of this node is in flight),
prints ``READY epoch=<node epoch>`` and subscribes to ``client.streams.assignments()``. For every
``gained`` stream a producer appends single-record batches whose payload is a unique record id
``<node>.<node epoch>.<seq>`` (never reused, never retried); it stops at the first error that ends its
hold of the stream (moved, not owner, fenced, closed) or when the stream is ``lost``.

The log (one file per process, lines appended with ``os.write`` + ``os.fsync`` before the producer goes
on) says what happened to each id:

- ``T <stream> <id>``: about to append (written before the append starts);
- ``A <stream> <offset> <id> <node> <node epoch>``: acknowledged at ``offset``;
- ``U <stream> <id> <error>``: the append failed: the record may or may not be in the stream.

An id with a ``T`` line and no outcome (the process was killed) is unknown too. Exit codes: 0 after
SIGTERM (producers stopped, client closed cleanly), 3 once the node finds itself fenced (its session
is over; the driver starts a new process), 4 when the client could not be opened, 5 when the
engine failed otherwise (``assignments()`` ended without SIGTERM).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import signal
import sys
import time
import traceback
from typing import Any

from s3stream import RecordBatch
from s3stream.assembly import open_client
from s3stream.config import KEYS_BY_NAME, Config
from s3stream.engine.client import Client, Stream
from s3stream.errors import (
    ClosedError,
    FencedError,
    NotFoundError,
    NotOwnerError,
    S3StreamError,
    UnavailableError,
)

OPEN_RETRY_S = 90.0
"""How long the node retries a refused open (a takeover of its previous session in flight)."""
APPEND_PAUSE_S = 0.01
"""Pause between two appends of one producer: bounds the records a soak writes."""
FENCE_POLL_S = 0.1
EXIT_FENCED = 3
EXIT_OPEN_FAILED = 4
EXIT_FAILED = 5
ENDS_HOLD = (NotOwnerError, FencedError, ClosedError, NotFoundError)
"""Append errors after which this node no longer holds the stream (MovedError is a NotOwnerError)."""


class AckLog:
    """Appends lines to the node's log, each written and fsynced on one thread before the caller goes on."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ack-log")

    def _write(self, line: str) -> None:
        os.write(self._fd, (line + "\n").encode())
        os.fsync(self._fd)

    async def write(self, line: str) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._write, line)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        os.close(self._fd)


class Node:
    """The producers of one node session, one per stream it holds."""

    def __init__(self, client: Client, node_id: int, log: AckLog) -> None:
        self.client = client
        self.node_id = node_id
        self.epoch = client.engine.node_epoch
        self.log = log
        self.seq = 0
        self.fenced = asyncio.Event()
        self.stopping = False
        self.producers: dict[int, tuple[asyncio.Task[None], list[bool]]] = {}

    def next_id(self) -> str:
        self.seq += 1
        return f"{self.node_id}.{self.epoch}.{self.seq}"

    async def follow(self) -> None:
        """Starts a producer for every stream gained, stops it when the stream is lost."""
        async for event in self.client.streams.assignments():
            sid = int(event.stream_id)
            if event.kind == "gained" and event.stream is not None:
                self.stop_producer(sid)
                stop_flag = [False]
                task = asyncio.create_task(self.produce(event.stream, stop_flag))
                self.producers[sid] = (task, stop_flag)
            elif event.kind == "lost":
                self.stop_producer(sid)

    def stop_producer(self, sid: int) -> None:
        entry = self.producers.pop(sid, None)
        if entry is not None:
            entry[1][0] = True  # it ends after its append in flight (never cancelled mid-append)

    async def produce(self, stream: Stream, stop_flag: list[bool]) -> None:
        sid = int(stream.stream_id)
        while not stop_flag[0] and not self.stopping and not self.fenced.is_set():
            record_id = self.next_id()
            await self.log.write(f"T {sid} {record_id}")
            try:
                offset = await stream.append(RecordBatch(record_id.encode()))
            except S3StreamError as exc:
                await self.log.write(f"U {sid} {record_id} {type(exc).__name__}")
                if isinstance(exc, FencedError):
                    self.fenced.set()
                if isinstance(exc, ENDS_HOLD):
                    return
                await asyncio.sleep(0.05)
                continue
            await self.log.write(f"A {sid} {offset} {record_id} {self.node_id} {self.epoch}")
            await asyncio.sleep(APPEND_PAUSE_S)

    async def watch_fence(self) -> None:
        while not self.client.engine.fenced:
            await asyncio.sleep(FENCE_POLL_S)
        self.fenced.set()

    async def stop_producers(self) -> None:
        self.stopping = True
        tasks = [task for task, _ in self.producers.values()]
        self.producers.clear()
        await asyncio.gather(*tasks, return_exceptions=True)


def build_config(node_id: int, metadata_url: str, keys: dict[str, Any]) -> Config:
    fields = {KEYS_BY_NAME[name].field: value for name, value in keys.items()}
    return Config().replace(node_id=node_id, metadata_url=metadata_url, **fields)


async def open_with_retry(data_dir: str, bucket_uri: str, config: Config) -> Client:
    deadline = time.monotonic() + OPEN_RETRY_S
    while True:
        try:
            return await open_client(data_dir, bucket_uri=bucket_uri, config=config)
        except UnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def setup_logging() -> None:
    """Warnings of every component, and what the cluster layer does, to stderr (the driver keeps it)."""
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("s3stream.cluster").setLevel(logging.INFO)


async def main(argv: list[str]) -> int:
    setup_logging()
    data_dir, metadata_url, bucket_uri, node_id, log_path, keys = argv
    config = build_config(int(node_id), metadata_url, json.loads(keys))
    try:
        client = await open_with_retry(data_dir, bucket_uri, config)
    except S3StreamError:
        traceback.print_exc()
        return EXIT_OPEN_FAILED
    log = AckLog(log_path)
    node = Node(client, int(node_id), log)
    terminate = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, terminate.set)
    background = [asyncio.create_task(node.follow()), asyncio.create_task(node.watch_fence())]
    print(f"READY epoch={node.epoch}", flush=True)
    waits = [asyncio.create_task(terminate.wait()), asyncio.create_task(node.fenced.wait())]
    await asyncio.wait([*waits, background[0]], return_when=asyncio.FIRST_COMPLETED)
    if background[0].done() and background[0].exception() is not None:
        print("assignments() ended:", repr(background[0].exception()), file=sys.stderr, flush=True)
    await node.stop_producers()
    for task in [*background, *waits]:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    fenced = node.fenced.is_set() or client.engine.fenced
    try:
        await client.close()
    except S3StreamError:
        if not fenced:
            raise
    log.close()
    if fenced:
        print("EXIT fenced", flush=True)
        return EXIT_FENCED
    if not terminate.is_set():
        print("EXIT failed: assignments() ended without SIGTERM (the engine failed)", flush=True)
        return EXIT_FAILED
    print("EXIT clean", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
