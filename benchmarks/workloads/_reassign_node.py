"""One node process of the ``reassign`` workload: ``python -m benchmarks.workloads._reassign_node``.

Its spec is a JSON object in ``$S3STREAM_BENCH_NODE_SPEC`` (:class:`NodeSpec`). It opens a client (its
own data dir and node id, the shared metadata URL and bucket), creates and opens ``streams`` streams of
its own, prints ``READY <stream ids>`` and then, by ``mode``:

* ``append``: waits for ``GO`` on stdin, appends 1 KiB records as fast as ``producers`` concurrent
  producers can for ``duration_s`` (round robin over its streams), prints one JSON line
  ``{"appends", "elapsed_s", "cpu_s"}`` and closes;
* ``hold``: appends one record to each of its streams every ``hold_interval_s`` until it is killed
  (the failover measurement kill -9s it); the appends keep un-uploaded data in its WAL.
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


@dataclass(frozen=True)
class NodeSpec:
    metadata_url: str
    bucket_uri: str
    data_dir: str
    node_id: int
    mode: str
    streams: int = 1
    producers: int = 32
    duration_s: float = 5.0
    hold_interval_s: float = 0.01
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


async def _main(spec: NodeSpec) -> None:
    from s3stream.assembly import open_client
    from s3stream.model import RecordBatch

    client = await open_client(spec.data_dir, bucket_uri=spec.bucket_uri, config=node_config(spec))
    try:
        streams = [await client.streams.create_and_open_stream() for _ in range(spec.streams)]
        print("READY " + " ".join(str(s.stream_id) for s in streams), flush=True)
        payload = os.urandom(PAYLOAD_BYTES)
        if spec.mode == "hold":
            while True:
                await asyncio.gather(*(s.append(RecordBatch(payload)) for s in streams))
                await asyncio.sleep(spec.hold_interval_s)
        line = await asyncio.to_thread(sys.stdin.readline)
        if line.strip() != "GO":
            raise RuntimeError(f"expected GO, got {line!r}")
        appends = 0
        deadline = time.perf_counter() + spec.duration_s
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
        report = {"appends": appends, "elapsed_s": elapsed_s, "cpu_s": time.process_time() - cpu_started}
        print(json.dumps(report), flush=True)
    finally:
        await client.close()


if __name__ == "__main__":
    from s3stream._loop import run

    run(_main(NodeSpec.from_env()))
