"""A node process of ``test_metadata_races``: runs operation scripts against a shared metadata store.

``python -m tests.property.metadata_race_worker NODE_ID`` reads one JSON job per stdin line:
``{"url": ..., "start_at": <time.monotonic() value>, "node_epoch": E, "streams": [ids],
"ops": [[name, ...args, delay_ms], ...]}``; it opens the store, waits until ``start_at`` (so every
worker starts together), runs the ops and answers one JSON line ``{"log": [entry, ...]}``. An empty
line ends it.

Operations (the node is ``NODE_ID``; a stream is named by its index in ``streams``):

- ``commit [indexes] length``: read the streams' end offsets and owners, prepare one object, commit
  it as a StreamSet object extending by ``length``, from the end offset it read, each of those streams
  this node owned as read (all of them if it owned none). The reads may be stale by then: the store
  must refuse the commit rather than lose or overlap an update or accept a fenced owner.
- ``open index``: take the stream over at its epoch + 1. If another node holds it open, that is a
  failover: fence that node (register it with a newer node epoch), close the stream as that node,
  then open it. Each store call is its own log entry.
- ``close index``: close the stream at the epoch last read, as this node.
- ``fence node``: register ``node`` with a newer node epoch (its current incarnation is fenced).
- ``rejoin``: register this node with a newer node epoch (a restart).
- ``kv_put key``: put a value no other put writes (``<node>-<count>``) under ``key-<key>``;
  ``kv_get key``: read it (logged as ``read``).

A call refused with NODE_EPOCH_EXPIRED makes the node rejoin at once. Node epochs are
``time.monotonic_ns()`` values, so each is newer than any registered before it on this machine.

Log entry: ``{"node", "op", "t0", "t1", "result", "code", ...}``; ``t0`` and ``t1`` are
``time.monotonic()`` before the call and after its answer (comparable across processes: Linux's
CLOCK_MONOTONIC is system-wide), ``result`` is ``ok``, an error kind (``FencedError``, ...) or
``unknown`` (UnavailableError: the call may or may not have taken effect); ``value`` is an
integer result (the first id of a prepare). Any other exception ends
the job with ``{"error": ...}``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from s3stream.errors import (
    ConflictError,
    ErrorCode,
    FencedError,
    NotFoundError,
    NotOwnerError,
    UnavailableError,
)
from s3stream.ids import NodeId, ObjectId, StreamId
from s3stream.metadata.base import (
    CommitStreamSetObjectRequest,
    MetadataStore,
    StreamOffsetRange,
    StreamState,
)
from tests.support.metadata_urls import open_store

PREPARE_TTL_MS = 3_600_000
EXPECTED_ERRORS = (FencedError, ConflictError, NotFoundError, NotOwnerError)


def new_node_epoch() -> int:
    return time.monotonic_ns()


class Worker:
    """One node's side of a job; ``log`` collects what each store call did."""

    def __init__(self, store: MetadataStore, node_id: NodeId, node_epoch: int, streams: list[int]) -> None:
        self.store = store
        self.node_id = node_id
        self.node_epoch = node_epoch
        self.streams = [StreamId(s) for s in streams]
        self.log: list[dict[str, Any]] = []
        self.puts = 0

    async def call(self, op: str, fn: Callable[[], Awaitable[Any]], **details: Any) -> tuple[bool, Any]:
        """Run one store call, log it; (True, its value) or (False, None)."""
        entry: dict[str, Any] = {"node": self.node_id, "op": op, **details}
        entry["t0"] = time.monotonic()
        try:
            value = await fn()
        except EXPECTED_ERRORS as exc:
            entry.update(t1=time.monotonic(), result=type(exc).__name__, code=exc.code.name)
            self.log.append(entry)
            if exc.code == ErrorCode.NODE_EPOCH_EXPIRED and op != "register":
                await self.register(self.node_id)
            return False, None
        except UnavailableError as exc:
            entry.update(t1=time.monotonic(), result="unknown", code=exc.code.name, message=str(exc)[:300])
            self.log.append(entry)
            return False, None
        entry.update(t1=time.monotonic(), result="ok", code="NONE")
        if isinstance(value, int):
            entry["value"] = value
        self.log.append(entry)
        return True, value

    async def register(self, node_id: NodeId) -> None:
        epoch = new_node_epoch()
        ok, _ = await self.call(
            "register",
            lambda: self.store.register_node(node_id=node_id, node_epoch=epoch),
            target=node_id,
            epoch=epoch,
        )
        if ok and node_id == self.node_id:
            self.node_epoch = epoch

    async def commit(self, indexes: list[int], length: int) -> None:
        ends: dict[StreamId, int] = {}
        owned: dict[StreamId, int] = {}
        for index in indexes:
            sid = self.streams[index]
            ok, stream = await self.call(
                "describe", functools.partial(self.store.describe_stream, sid), stream=sid
            )
            if not ok:
                return
            ends[sid] = stream.end_offset
            if stream.state == StreamState.OPENED and stream.ranges[-1].node_id == self.node_id:
                owned[sid] = stream.end_offset
        ends = owned or ends  # mostly the streams it owns as read; others' streams to be refused
        ok, object_id = await self.call(
            "prepare", lambda: self.store.prepare_objects(count=1, ttl_ms=PREPARE_TTL_MS)
        )
        if not ok:
            return
        ranges = tuple(StreamOffsetRange(s, e, e + length, length) for s, e in sorted(ends.items()))
        request = CommitStreamSetObjectRequest(
            node_id=self.node_id,
            node_epoch=self.node_epoch,
            object_id=ObjectId(object_id),
            order_id=object_id,
            object_size_bytes=length * len(ranges),
            stream_ranges=ranges,
        )
        await self.call(
            "commit",
            lambda: self.store.commit_stream_set_object(request),
            object_id=object_id,
            node_epoch=self.node_epoch,
            ranges=[[r.stream_id, r.start_offset, r.end_offset] for r in ranges],
        )

    async def open(self, index: int) -> None:
        sid = self.streams[index]
        ok, stream = await self.call("describe", lambda: self.store.describe_stream(sid), stream=sid)
        if not ok:
            return
        owner = stream.ranges[-1].node_id if stream.ranges else self.node_id
        if stream.state == StreamState.OPENED and owner != self.node_id:  # failover from ``owner``
            owner_epoch = new_node_epoch()
            ok, _ = await self.call(
                "register",
                lambda: self.store.register_node(node_id=owner, node_epoch=owner_epoch),
                target=owner,
                epoch=owner_epoch,
            )
            if not ok:
                return
            await self.close_as(owner, owner_epoch, sid, stream.epoch)
        elif stream.state == StreamState.OPENED:
            await self.close_as(self.node_id, self.node_epoch, sid, stream.epoch)
        epoch = stream.epoch + 1
        node_epoch = self.node_epoch
        await self.call(
            "open",
            lambda: self.store.open_stream(
                node_id=self.node_id, node_epoch=node_epoch, stream_id=sid, epoch=epoch
            ),
            stream=sid,
            epoch=epoch,
            node_epoch=node_epoch,
        )

    async def close_as(self, node_id: NodeId, node_epoch: int, sid: StreamId, epoch: int) -> None:
        await self.call(
            "close",
            lambda: self.store.close_stream(
                node_id=node_id, node_epoch=node_epoch, stream_id=sid, epoch=epoch
            ),
            stream=sid,
            epoch=epoch,
            as_node=node_id,
            node_epoch=node_epoch,
        )

    async def close(self, index: int) -> None:
        sid = self.streams[index]
        ok, stream = await self.call("describe", lambda: self.store.describe_stream(sid), stream=sid)
        if ok:
            await self.close_as(self.node_id, self.node_epoch, sid, stream.epoch)

    async def kv_put(self, key_index: int) -> None:
        self.puts += 1
        key, value = f"key-{key_index}", f"{self.node_id}-{self.puts}"
        await self.call("kv_put", lambda: self.store.kv_put(key, value.encode()), key=key, written=value)

    async def kv_get(self, key_index: int) -> None:
        key = f"key-{key_index}"
        ok, value = await self.call("kv_get", lambda: self.store.kv_get(key), key=key)
        if ok:
            self.log[-1]["read"] = None if value is None else value.decode()

    async def run(self, ops: list[list[Any]]) -> None:
        for name, *args, delay_ms in ops:
            await asyncio.sleep(delay_ms / 1000)
            if name == "commit":
                await self.commit(args[0], args[1])
            elif name == "open":
                await self.open(args[0])
            elif name == "close":
                await self.close(args[0])
            elif name == "fence":
                await self.register(NodeId(args[0]))
            elif name == "rejoin":
                await self.register(self.node_id)
            elif name == "kv_put":
                await self.kv_put(args[0])
            elif name == "kv_get":
                await self.kv_get(args[0])
            else:
                raise ValueError(f"unknown operation {name!r}")


async def job(node_id: NodeId, spec: dict[str, Any]) -> dict[str, Any]:
    store = await open_store(spec["url"])
    try:
        worker = Worker(store, node_id, spec["node_epoch"], spec["streams"])
        await asyncio.sleep(max(0.0, spec["start_at"] - time.monotonic()))
        try:
            await worker.run(spec["ops"])
        except Exception:  # the job's boundary: reported to the parent, which fails
            return {"log": worker.log, "error": traceback.format_exc()}
        return {"log": worker.log}
    finally:
        await store.close()


def main() -> None:
    node_id = NodeId(int(sys.argv[1]))
    print("READY", flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        print(json.dumps(asyncio.run(job(node_id, json.loads(line)))), flush=True)


if __name__ == "__main__":
    main()
