"""One node process of the ``reassign`` workload: ``python -m benchmarks.workloads._reassign_node``.

Its spec is a JSON object in ``$S3STREAM_BENCH_NODE_SPEC`` (:class:`NodeSpec`). It opens a client (its
own data dir and node id, the shared metadata URL and bucket), creates and opens ``streams`` streams of
its own, prints ``READY <stream ids>`` and then, by ``mode``:

* ``append``: for each ``GO <seconds>`` line on stdin, appends 1 KiB records as fast as ``producers``
  concurrent producers can for that long (round robin over its streams) and prints one JSON line
  ``{"appends", "elapsed_s", "cpu_s"}``; closes at ``EXIT`` or the end of stdin;
* ``hold``: appends one record to each of its streams every ``hold_interval_s`` until it is killed
  (the failover measurement kill -9s it); the appends keep un-uploaded data in its WAL;
* ``move``: one of the two nodes streams are reassigned between. It follows
  ``client.streams.assignments()``: on each "gained" event it appends one record to the stream at once
  and prints ``GAINED <stream id> <event time> <acknowledgement time>``; on each "lost" event (the
  stream closed here after its upload) ``LOST <stream id> <event time>``. Times are
  ``time.monotonic()``: CLOCK_MONOTONIC is system-wide, so the driver compares them with its own
  request time. Commands on stdin, each answered
  by one line: ``CREATE <n>`` -> ``CREATED <ids>`` (n new streams open here); ``FILL <bytes> <ids>``
  -> ``FILLED`` (that many bytes in 1 MiB records spread over those streams, which must be open here);
  ``EXIT`` (or the end of stdin) closes.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

SPEC_ENV = "S3STREAM_BENCH_NODE_SPEC"
PAYLOAD_BYTES = 1024
FILL_RECORD_BYTES = 1 << 20


@dataclass(frozen=True)
class NodeSpec:
    metadata_url: str
    bucket_uri: str
    data_dir: str
    node_id: int
    mode: str
    streams: int = 1
    producers: int = 32
    hold_interval_s: float = 0.01
    cpu: int | None = None
    """``--pin``: the one core this process runs on."""
    config: dict[str, Any] = field(default_factory=dict)
    """Config field overrides (names as in :class:`s3stream.config.Config`)."""

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> NodeSpec:
        return cls(**json.loads(os.environ[SPEC_ENV]))


def node_config(spec: NodeSpec) -> Any:
    from s3stream.config import Config

    return Config.from_sources(env={}, node_id=spec.node_id, metadata_url=spec.metadata_url, **spec.config)


async def _fill(streams: list[Any], pending_bytes: int) -> None:
    """``pending_bytes`` in 1 MiB records spread over ``streams`` (smaller records for a smaller share)."""
    from s3stream.model import RecordBatch

    if pending_bytes <= 0 or not streams:
        return
    per_stream = max(1, pending_bytes // len(streams))
    record = os.urandom(min(FILL_RECORD_BYTES, per_stream))
    appends = []
    for stream in streams:
        left = per_stream
        while left > 0:
            appends.append(stream.append(RecordBatch(record[: min(left, len(record))])))
            left -= min(left, len(record))
    await asyncio.gather(*appends)


async def _lines() -> Any:
    """stdin's lines, read on a thread (the loop never blocks on the pipe); ends at EXIT or EOF."""
    while True:
        line = (await asyncio.to_thread(sys.stdin.readline)).strip()
        if not line or line == "EXIT":
            return
        yield line


async def _move(client: Any) -> None:
    from s3stream.model import RecordBatch

    owned: dict[int, Any] = {}
    appending: set[asyncio.Task[None]] = set()
    out_lock = asyncio.Lock()

    async def say(text: str) -> None:
        async with out_lock:
            print(text, flush=True)

    async def follow() -> None:
        async for event in client.streams.assignments():
            if event.kind == "lost":
                owned.pop(event.stream_id, None)
                await say(f"LOST {event.stream_id} {time.monotonic()!r}")
            elif event.stream is not None:
                owned[event.stream_id] = event.stream
                task = asyncio.create_task(first_append(event.stream, time.monotonic()))
                appending.add(task)
                task.add_done_callback(appending.discard)

    async def first_append(stream: Any, gained: float) -> None:
        await stream.append(RecordBatch(b"first append on the new owner"))
        acked = time.monotonic()
        await say(f"GAINED {stream.stream_id} {gained!r} {acked!r}")

    follower = asyncio.create_task(follow())
    print("READY", flush=True)
    try:
        async for line in _lines():
            command, *args = line.split()
            if command == "CREATE":
                streams = [await client.streams.create_and_open_stream() for _ in range(int(args[0]))]
                owned.update((s.stream_id, s) for s in streams)
                await say("CREATED " + " ".join(str(s.stream_id) for s in streams))
            elif command == "FILL":
                await _fill([owned[int(sid)] for sid in args[1:]], int(args[0]))
                await say("FILLED")
            else:
                raise RuntimeError(f"unknown command {line!r}")
    finally:
        follower.cancel()


async def _append_round(spec: NodeSpec, streams: list[Any], duration_s: float) -> dict[str, float]:
    """``spec.producers`` producers appending 1 KiB records round robin for ``duration_s``."""
    from s3stream.model import RecordBatch

    payload = os.urandom(PAYLOAD_BYTES)
    appends = 0
    deadline = time.perf_counter() + duration_s
    cpu_started = time.process_time()
    started = time.perf_counter()

    async def producer(index: int) -> None:
        nonlocal appends
        n = index
        while time.perf_counter() < deadline:
            await streams[n % len(streams)].append(RecordBatch(payload))
            appends += 1
            n += spec.producers

    await asyncio.gather(*(producer(i) for i in range(spec.producers)))
    elapsed_s = time.perf_counter() - started
    return {"appends": appends, "elapsed_s": elapsed_s, "cpu_s": time.process_time() - cpu_started}


async def _append_rounds(spec: NodeSpec, streams: list[Any]) -> None:
    async for line in _lines():
        command, *args = line.split()
        if command != "GO":
            raise RuntimeError(f"expected GO, got {line!r}")
        print(json.dumps(await _append_round(spec, streams, float(args[0]))), flush=True)


async def _main(spec: NodeSpec) -> None:
    from s3stream.assembly import open_client
    from s3stream.model import RecordBatch

    if spec.cpu is not None:
        os.sched_setaffinity(0, {spec.cpu})
    client = await open_client(spec.data_dir, bucket_uri=spec.bucket_uri, config=node_config(spec))
    try:
        if spec.mode == "move":
            await _move(client)
            return
        streams = [await client.streams.create_and_open_stream() for _ in range(spec.streams)]
        print("READY " + " ".join(str(s.stream_id) for s in streams), flush=True)
        if spec.mode == "hold":
            payload = os.urandom(PAYLOAD_BYTES)
            while True:
                await asyncio.gather(*(s.append(RecordBatch(payload)) for s in streams))
                await asyncio.sleep(spec.hold_interval_s)
        await _append_rounds(spec, streams)
    finally:
        await client.close()


if __name__ == "__main__":
    from s3stream._loop import run

    run(_main(NodeSpec.from_env()))
