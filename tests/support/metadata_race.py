"""One node of a metadata race: a process that opens, commits to, closes and takes over shared streams.

``python -m tests.support.metadata_race --url URL --node-id N --streams 0,1,2 --seconds S --seed X
--out FILE`` opens the store with ``open_metadata_store(url)`` and, until ``--iterations`` rounds or
``--seconds`` have passed: takes one or two of the shared streams (closing them for their current
owner first when they are opened: a forced takeover) with the next epoch, commits StreamSet objects
covering all the streams it holds in turn, sometimes creates a stream of its own, then closes what it
holds. It writes one JSON line per event to ``--out``; :func:`check_race` checks the lines of every
node against the store's final state. Times are ``time.monotonic_ns()`` (one clock for every
process of the machine): ``sent`` before the call, ``acked`` after its answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from s3stream.errors import ConflictError, FencedError, NotFoundError, NotOwnerError, UnavailableError
from s3stream.ids import NodeId, ObjectId, StreamId
from s3stream.metadata.base import (
    CommitStreamSetObjectRequest,
    MetadataStore,
    ObjectState,
    StreamOffsetRange,
    StreamState,
)
from s3stream.metadata.url import open_metadata_store

NODE_EPOCH = 1
TTL_MS = 600_000
REFUSALS = (ConflictError, FencedError, NotFoundError, NotOwnerError)


class RaceNode:
    def __init__(
        self, store: MetadataStore, node_id: NodeId, streams: Sequence[StreamId], rng: random.Random
    ):
        self.store = store
        self.node_id = node_id
        self.shared = list(streams)
        self.rng = rng
        self.events: list[dict[str, Any]] = []
        self.held: dict[StreamId, tuple[int, int]] = {}
        """Stream -> (epoch, end offset) of the streams this node opened and still believes it owns."""

    def log(self, kind: str, **fields: Any) -> None:
        self.events.append({"kind": kind, "node": self.node_id, **fields})

    async def take(self, stream_id: StreamId) -> None:
        meta = await self.store.describe_stream(stream_id)
        if meta.state == StreamState.OPENED and meta.ranges:
            owner = meta.ranges[-1].node_id
            with contextlib.suppress(*REFUSALS):  # forced takeover: close it for its owner
                await self.store.close_stream(
                    node_id=owner, node_epoch=NODE_EPOCH, stream_id=stream_id, epoch=meta.epoch
                )
        epoch = meta.epoch + 1
        sent = time.monotonic_ns()
        try:
            opened = await self.store.open_stream(
                node_id=self.node_id, node_epoch=NODE_EPOCH, stream_id=stream_id, epoch=epoch
            )
        except REFUSALS as exc:
            self.log("open_refused", stream=stream_id, epoch=epoch, error=type(exc).__name__)
            return
        acked = time.monotonic_ns()
        self.held[stream_id] = (epoch, opened.end_offset)
        self.log("open", stream=stream_id, epoch=epoch, sent=sent, acked=acked, end=opened.end_offset)

    async def commit(self) -> None:
        object_id = await self.store.prepare_objects(count=1, ttl_ms=TTL_MS)
        self.log("prepare", object=object_id)
        ranges = []
        for stream_id in sorted(self.held):
            _, end = self.held[stream_id]
            ranges.append((stream_id, end, end + self.rng.randint(1, 50)))
        request = CommitStreamSetObjectRequest(
            node_id=self.node_id,
            node_epoch=NODE_EPOCH,
            object_id=ObjectId(object_id),
            order_id=object_id,
            object_size_bytes=100,
            stream_ranges=tuple(StreamOffsetRange(StreamId(s), a, b, b - a) for s, a, b in ranges),
        )
        epochs = {str(s): self.held[StreamId(s)][0] for s, _, _ in ranges}
        sent = time.monotonic_ns()
        outcome, error = "accepted", ""
        try:
            await self.store.commit_stream_set_object(request)
        except REFUSALS as exc:
            outcome, error = "refused", type(exc).__name__
        except UnavailableError as exc:
            outcome, error = "unknown", str(exc)
        acked = time.monotonic_ns()
        self.log("commit", object=object_id, ranges=ranges, epochs=epochs, sent=sent, acked=acked,
                 outcome=outcome, error=error)  # fmt: skip
        if outcome == "accepted":
            for stream_id, _, end in ranges:
                epoch, _ = self.held[StreamId(stream_id)]
                self.held[StreamId(stream_id)] = (epoch, end)
        else:  # keep only the streams still ours, at their stored end
            for stream_id in list(self.held):
                meta = await self.store.describe_stream(stream_id)
                epoch, _ = self.held[stream_id]
                ours = (
                    meta.state == StreamState.OPENED
                    and meta.epoch == epoch
                    and meta.ranges
                    and meta.ranges[-1].node_id == self.node_id
                )
                if ours:
                    self.held[stream_id] = (epoch, meta.end_offset)
                else:
                    del self.held[stream_id]

    async def release(self) -> None:
        for stream_id, (epoch, _) in list(self.held.items()):
            with contextlib.suppress(*REFUSALS):
                await self.store.close_stream(
                    node_id=self.node_id, node_epoch=NODE_EPOCH, stream_id=stream_id, epoch=epoch
                )
        self.held.clear()

    async def create(self) -> None:
        created = await self.store.create_stream(node_id=self.node_id, node_epoch=NODE_EPOCH)
        self.log("create", stream=created)

    async def round(self) -> None:
        if self.rng.random() < 0.2:
            await self.create()
        for stream_id in self.rng.sample(self.shared, self.rng.choice((1, 1, 2))):
            await self.take(stream_id)
        for _ in range(self.rng.randint(1, 4)):
            if not self.held:
                break
            await self.commit()
        if self.rng.random() < 0.7:
            await self.release()


async def run_node(
    url: str, *, node_id: NodeId, streams: Sequence[StreamId], seconds: float, iterations: int, seed: int,
    start_at: float, out: Path,
) -> None:  # fmt: skip
    store = await open_metadata_store(url)
    node = RaceNode(store, node_id, streams, random.Random(seed))
    try:
        await store.register_node(node_id=node_id, node_epoch=NODE_EPOCH)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        deadline = time.monotonic() + seconds
        for _ in range(iterations):
            if time.monotonic() > deadline:
                break
            await node.round()
        await node.release()
        node.log("retries", count=getattr(store, "conflict_retries", 0))
    finally:
        await store.close()
        out.write_text("".join(json.dumps(e) + "\n" for e in node.events))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--node-id", type=int, required=True)
    parser.add_argument("--streams", required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--iterations", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-at", type=float, default=0.0, help="wall-clock time to start at")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    asyncio.run(
        run_node(
            args.url,
            node_id=NodeId(args.node_id),
            streams=[StreamId(int(s)) for s in args.streams.split(",")],
            seconds=args.seconds,
            iterations=args.iterations,
            seed=args.seed,
            start_at=args.start_at,
            out=args.out,
        )
    )


async def check_race(
    store: MetadataStore, events: Sequence[dict[str, Any]], streams: Sequence[StreamId]
) -> dict[str, int]:
    """Assert the race's invariants against the store; returns counts of what happened."""
    commits = [e for e in events if e["kind"] == "commit"]
    accepted = [e for e in commits if e["outcome"] == "accepted"]
    assert not [e for e in commits if e["outcome"] == "unknown"], "a commit ended without an answer"
    # ids unique: streams created, objects prepared
    created = [e["stream"] for e in events if e["kind"] == "create"]
    assert len(created) == len(set(created)), f"a stream id was handed out twice: {sorted(created)}"
    assert not set(created) & set(streams)
    prepared = [e["object"] for e in events if e["kind"] == "prepare"]
    assert len(prepared) == len(set(prepared)), "an object id was handed out twice"
    # no lost update: the accepted commits of each stream tile [0, end offset) exactly
    by_stream: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for e in accepted:
        for s, a, b in e["ranges"]:
            by_stream[s].append((a, b))
    for stream_id in streams:
        spans = sorted(by_stream[stream_id])
        meta = await store.describe_stream(stream_id)
        position = 0
        for a, b in spans:
            assert a == position, (
                f"stream {stream_id}: accepted commits {spans} leave a gap or overlap at {a}"
            )
            position = b
        assert meta.end_offset == position == sum(b - a for a, b in spans), (
            f"stream {stream_id}: end offset {meta.end_offset}, accepted commits reach {position}"
        )
    # every accepted commit's object is COMMITTED with its ranges; a refused one is still PREPARED
    objects = {o.object_id: o for o in await store.list_objects()}
    for e in commits:
        state = objects[e["object"]].state
        want = ObjectState.COMMITTED if e["outcome"] == "accepted" else ObjectState.PREPARED
        assert state == want, f"commit {e} left its object {state.name}"
    stored_ranges = {}
    for node_id in {e["node"] for e in events}:
        for sso in await store.get_stream_set_objects(NodeId(node_id)):
            stored_ranges[sso.object_id] = [[r.stream_id, r.start_offset, r.end_offset] for r in sso.ranges]
    assert stored_ranges == {e["object"]: [list(r) for r in e["ranges"]] for e in accepted}
    # every fence holds: no commit sent after a higher epoch's open was acknowledged is accepted
    opens = [e for e in events if e["kind"] == "open"]
    for c in accepted:
        for s, epoch in c["epochs"].items():
            for o in opens:
                if o["stream"] == int(s) and o["epoch"] > epoch and o["acked"] < c["sent"]:
                    raise AssertionError(f"commit {c} was accepted after the open {o} fenced it")
    return {
        "opens": len(opens),
        "commits_accepted": len(accepted),
        "commits_refused": len(commits) - len(accepted),
        "takeovers_refused": sum(e["kind"] == "open_refused" for e in events),
        "created": len(created),
        "conflict_retries": sum(e["count"] for e in events if e["kind"] == "retries"),
    }


if __name__ == "__main__":
    main()
