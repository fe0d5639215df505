"""One node of the ``metadata`` workload's commit-rate rows: a process committing to a shared metadata store.

``python -m benchmarks.workloads._metadata_node`` reads its :class:`NodeSpec` (JSON) from the
environment variable :data:`SPEC_ENV` (the URL may hold a password: not on the command line), opens
the store, registers its own node id at node epoch 1, prepares what its operation needs (untimed),
prints ``READY`` and waits for a line on stdin. Then it runs its operation back to back, one at a time,
for ``warmup_s`` unrecorded and ``duration_s`` recorded, and prints one JSON line: the operations done,
the recorded window's wall time, each operation's latency in seconds and this process's CPU seconds.

Operations (each counted once):

- ``streamset``: ``prepare_objects(count=1)`` then ``commit_stream_set_object`` of that object with one
  range on each of the node's ``streams`` streams (every stream advances by :data:`STEP` offsets): what
  one WAL upload of the engine costs the metadata store.
- ``openclose``: ``close_stream`` at the stream's epoch, or ``open_stream`` at the next one (alternating on
  one stream of the node's own): a stream moving between owners.
- ``kv``: ``kv_put`` of a 64-byte value under one of :data:`KV_KEYS` keys of the node's own.

An operation refused as unavailable (SQLite's write lock held beyond its busy timeout by the other
processes, a PostgreSQL retry limit) is retried and counted in ``retries`` (the open and the setup
are retried too: opening a SQLite store takes its write lock, which 8 busy processes can keep from
it for more than the 5 s busy timeout); any other error ends the
process with a traceback and a non-zero exit status.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Literal, TypeVar, cast

from s3stream.errors import UnavailableError
from s3stream.ids import NodeId, ObjectId, StreamId
from s3stream.metadata.base import CommitStreamSetObjectRequest, MetadataStore, StreamOffsetRange
from s3stream.metadata.url import open_metadata_store

SPEC_ENV = "S3STREAM_BENCH_METADATA_NODE"
NODE_EPOCH = 1
STEP = 10
"""Offsets one StreamSet commit adds to each stream (and its payload bytes per range)."""
KV_KEYS = 64
KV_VALUE_BYTES = 64
PREPARE_TTL_MS = 3_600_000
SETUP_INFLIGHT_MAX = 32
"""Stream creations and opens in flight during the untimed setup."""
RETRIES_MAX = 100
"""Unavailable errors one operation may meet before the node gives up."""

Operation = Literal["streamset", "openclose", "kv"]
OPERATIONS: tuple[Operation, ...] = ("streamset", "openclose", "kv")


T = TypeVar("T")


async def retrying(call: Callable[[], Awaitable[T]]) -> tuple[T, int]:
    """``call()`` until the store stops answering unavailable (at most :data:`RETRIES_MAX` retries):
    its result and the retries it took."""
    for attempt in range(RETRIES_MAX + 1):
        try:
            return await call(), attempt
        except UnavailableError:
            if attempt == RETRIES_MAX:
                raise
    raise AssertionError("unreachable")


async def open_store(url: str) -> MetadataStore:
    """The store ``url`` names, typed as the protocol (:func:`open_metadata_store` returns the base class)."""
    return cast(MetadataStore, await open_metadata_store(url))


@dataclass(frozen=True)
class NodeSpec:
    url: str
    node_id: int
    operation: Operation
    streams: int
    warmup_s: float
    duration_s: float
    cpu: int | None = None
    """The core to pin this process to (``--pin``), else None."""

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls, text: str) -> NodeSpec:
        return cls(**json.loads(text))


class Node:
    """The node's state between operations: its streams' end offsets and epochs."""

    def __init__(self, store: MetadataStore, spec: NodeSpec) -> None:
        self.store = store
        self.spec = spec
        self.node_id = NodeId(spec.node_id)
        self.stream_ids: list[StreamId] = []
        self.end_offset = 0
        self.epoch = 0
        self.opened = True
        self.count = 0
        self.retries = 0

    async def setup(self) -> None:
        await retrying(lambda: self.store.register_node(node_id=self.node_id, node_epoch=NODE_EPOCH))
        wanted = self.spec.streams if self.spec.operation == "streamset" else 1
        if self.spec.operation == "kv":
            wanted = 0
        gate = asyncio.Semaphore(SETUP_INFLIGHT_MAX)

        async def create() -> StreamId:
            async with gate:
                stream_id, _ = await retrying(
                    lambda: self.store.create_stream(node_id=self.node_id, node_epoch=NODE_EPOCH)
                )
                await retrying(
                    lambda: self.store.open_stream(
                        node_id=self.node_id, node_epoch=NODE_EPOCH, stream_id=stream_id, epoch=0
                    )
                )
                return stream_id

        self.stream_ids = sorted(await asyncio.gather(*(create() for _ in range(wanted))))

    async def streamset(self) -> None:
        object_id = await self.store.prepare_objects(count=1, ttl_ms=PREPARE_TTL_MS)
        start = self.end_offset
        await self.store.commit_stream_set_object(
            CommitStreamSetObjectRequest(
                node_id=self.node_id,
                node_epoch=NODE_EPOCH,
                object_id=ObjectId(object_id),
                order_id=object_id,
                object_size_bytes=STEP * len(self.stream_ids),
                stream_ranges=tuple(StreamOffsetRange(s, start, start + STEP, STEP) for s in self.stream_ids),
            )
        )
        self.end_offset = start + STEP

    async def openclose(self) -> None:
        stream_id = self.stream_ids[0]
        if self.opened:
            await self.store.close_stream(
                node_id=self.node_id, node_epoch=NODE_EPOCH, stream_id=stream_id, epoch=self.epoch
            )
            self.opened = False
        else:
            await self.store.open_stream(
                node_id=self.node_id, node_epoch=NODE_EPOCH, stream_id=stream_id, epoch=self.epoch + 1
            )
            self.epoch += 1
            self.opened = True

    async def kv(self) -> None:
        key = f"bench/node-{self.node_id}/{self.count % KV_KEYS}"
        await self.store.kv_put(key, self.count.to_bytes(8, "big") * (KV_VALUE_BYTES // 8))

    async def one(self) -> None:
        """One operation, retried while the store answers unavailable."""
        operation: Callable[[], Awaitable[None]] = getattr(self, self.spec.operation)
        _, retries = await retrying(operation)
        self.retries += retries
        self.count += 1


async def _run(spec: NodeSpec) -> dict[str, object]:
    if spec.cpu is not None:
        os.sched_setaffinity(0, {spec.cpu})
    store, open_retries = await retrying(lambda: open_store(spec.url))
    try:
        node = Node(store, spec)
        await node.setup()
        print("READY", flush=True)
        if not await asyncio.to_thread(sys.stdin.readline):
            raise RuntimeError("stdin closed before the start signal")
        deadline = time.perf_counter() + spec.warmup_s
        while time.perf_counter() < deadline:
            await node.one()
        latencies: list[float] = []
        count_before, retries_before = node.count, node.retries
        cpu_before = time.process_time()
        started = time.perf_counter()
        deadline = started + spec.duration_s
        now = started
        while now < deadline:
            await node.one()
            latencies.append(time.perf_counter() - now)
            now = time.perf_counter()
        return {
            "node_id": spec.node_id,
            "ops": node.count - count_before,
            "elapsed_s": now - started,
            "cpu_s": time.process_time() - cpu_before,
            "retries": node.retries - retries_before,
            "latencies_s": latencies,
            "cpus": sorted(os.sched_getaffinity(0)),
            "open_retries": open_retries,
        }
    finally:
        await store.close()


def main() -> None:
    from s3stream._loop import run as run_loop

    spec = NodeSpec.from_env(os.environ[SPEC_ENV])
    print(json.dumps(run_loop(_run(spec))), flush=True)


if __name__ == "__main__":
    main()
