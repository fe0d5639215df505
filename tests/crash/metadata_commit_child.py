"""The child of ``test_metadata_commit_crash``: one node committing wide StreamSet objects in a loop.

``python -m tests.crash.metadata_commit_child URL NODE_EPOCH ROUNDS`` opens the store at ``URL``,
registers node 1 with ``NODE_EPOCH`` (each child a newer incarnation), reopens any stream a killed
predecessor left CLOSED (with ``REOPEN`` and ``OPENED`` lines as below), prints ``READY`` and loops (``ROUNDS`` rounds, 0 for forever): prepare one
object, print ``COMMIT <object id>``, commit it as a StreamSet object that extends EVERY stream by
:data:`STEP` offsets, print ``ACK <object id>``; then close and reopen :data:`REOPENS_PER_ROUND` streams
at the next epoch, printing ``REOPEN <stream id> <epoch>`` before and ``OPENED <stream id> <epoch>``
after. Every line is flushed before the next store call, so the parent knows what was in flight.
"""

from __future__ import annotations

import asyncio
import random
import sys

from s3stream.ids import NodeId, ObjectId, StreamId
from s3stream.metadata.base import CommitStreamSetObjectRequest, MetadataStore, StreamOffsetRange, StreamState
from tests.support.metadata_urls import open_store

NODE = NodeId(1)
STREAM_COUNT = 1_000
"""Streams every commit extends: one range each."""
STEP = 10
"""Offsets one commit adds to every stream."""
REOPENS_PER_ROUND = 3
PREPARE_TTL_MS = 3_600_000


async def setup(url: str) -> None:
    """Register node 1 (epoch 1), create :data:`STREAM_COUNT` streams and open them at epoch 0 (the
    calls issued together: the store runs them concurrently or group-commits them)."""
    store = await open_store(url)
    try:
        await store.register_node(node_id=NODE, node_epoch=1)
        created = await asyncio.gather(
            *(store.create_stream(node_id=NODE, node_epoch=1) for _ in range(STREAM_COUNT))
        )
        await asyncio.gather(
            *(store.open_stream(node_id=NODE, node_epoch=1, stream_id=s, epoch=0) for s in created)
        )
    finally:
        await store.close()


async def _reopen(store: MetadataStore, node_epoch: int, stream_id: StreamId, epoch: int) -> None:
    print(f"REOPEN {stream_id} {epoch + 1}", flush=True)
    await store.close_stream(node_id=NODE, node_epoch=node_epoch, stream_id=stream_id, epoch=epoch)
    await store.open_stream(node_id=NODE, node_epoch=node_epoch, stream_id=stream_id, epoch=epoch + 1)
    print(f"OPENED {stream_id} {epoch + 1}", flush=True)


async def run(url: str, node_epoch: int, rounds: int) -> None:
    store = await open_store(url)
    await store.register_node(node_id=NODE, node_epoch=node_epoch)
    streams = {s.stream_id: s for s in await store.list_streams()}
    assert len(streams) == STREAM_COUNT, f"expected {STREAM_COUNT} streams, found {len(streams)}"
    epochs = {sid: s.epoch for sid, s in streams.items()}
    for sid, stream in streams.items():
        if stream.state == StreamState.CLOSED:  # a predecessor died between close and open
            print(f"REOPEN {sid} {stream.epoch + 1}", flush=True)
            await store.open_stream(
                node_id=NODE, node_epoch=node_epoch, stream_id=sid, epoch=stream.epoch + 1
            )
            print(f"OPENED {sid} {stream.epoch + 1}", flush=True)
            epochs[sid] = stream.epoch + 1
    ends = {sid: s.end_offset for sid, s in streams.items()}
    order = sorted(streams)
    rng = random.Random(node_epoch)
    print("READY", flush=True)
    round_no = 0
    while rounds == 0 or round_no < rounds:
        round_no += 1
        object_id = await store.prepare_objects(count=1, ttl_ms=PREPARE_TTL_MS)
        request = CommitStreamSetObjectRequest(
            node_id=NODE,
            node_epoch=node_epoch,
            object_id=ObjectId(object_id),
            order_id=object_id,
            object_size_bytes=STEP * len(order),
            stream_ranges=tuple(StreamOffsetRange(s, ends[s], ends[s] + STEP, STEP) for s in order),
        )
        print(f"COMMIT {object_id}", flush=True)
        await store.commit_stream_set_object(request)
        print(f"ACK {object_id}", flush=True)
        for sid in order:
            ends[sid] += STEP
        for sid in rng.sample(order, REOPENS_PER_ROUND):
            await _reopen(store, node_epoch, sid, epochs[sid])
            epochs[sid] += 1
    await store.close()


if __name__ == "__main__":
    if sys.argv[1] == "setup":
        asyncio.run(setup(sys.argv[2]))
    else:
        asyncio.run(run(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
