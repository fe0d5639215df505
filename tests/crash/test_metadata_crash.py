"""SIGKILL a process that is committing to a SQLite metadata store, reopen, check the state.

The child (``python -m tests.crash.test_metadata_crash DB``) loops: prepare, commit a StreamSet
object extending streams 0 and 1 plus a stream object for stream 2, with a KV write and a prepare
in the same group commit; every fifth round it compacts the two oldest StreamSet objects, every
seventh it trims stream 1. It prints ``ACK <ends>`` after each acknowledged commit.

After each kill: the database opens (quick_check passes); every acknowledged end offset is there and
at most one more commit landed; every stream reads back contiguously from its start to its end;
StreamSet rows and COMMITTED StreamSet objects match one to one.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from s3stream.ids import NodeId, ObjectId, StreamId
from s3stream.metadata.base import (
    CommitStreamSetObjectRequest,
    NewStreamObject,
    ObjectKind,
    ObjectState,
    StreamOffsetRange,
    StreamSetObject,
)
from s3stream.metadata.sqlite import SqliteMetadataStore

NODE = NodeId(1)
NODE_EPOCH = 1
STREAMS = (StreamId(0), StreamId(1), StreamId(2))
STEP = 10
"""Offsets one round adds to each stream."""
KILLS = int(os.environ.get("S3STREAM_METADATA_CRASH_KILLS", "4"))
"""Kills per run (CI: 4; S3STREAM_METADATA_CRASH_KILLS for long runs)."""
REPO = Path(__file__).resolve().parents[2]


async def _setup(store: SqliteMetadataStore) -> None:
    await store.register_node(node_id=NODE, node_epoch=NODE_EPOCH)
    while len(await store.list_streams()) < len(STREAMS):
        stream_id = await store.create_stream(node_id=NODE, node_epoch=NODE_EPOCH)
        await store.open_stream(node_id=NODE, node_epoch=NODE_EPOCH, stream_id=stream_id, epoch=0)


async def _compact(store: SqliteMetadataStore, ssos: list[StreamSetObject]) -> None:
    spans: dict[StreamId, tuple[int, int]] = {}
    for sso in ssos:
        for r in sso.ranges:
            start, end = spans.get(r.stream_id, (r.start_offset, r.end_offset))
            spans[r.stream_id] = (min(start, r.start_offset), max(end, r.end_offset))
    merged = await store.prepare_objects(count=1, ttl_ms=3_600_000)
    await store.commit_stream_set_object(
        CommitStreamSetObjectRequest(
            node_id=NODE,
            node_epoch=NODE_EPOCH,
            object_id=merged,
            order_id=-1,
            object_size_bytes=sum(s.size_bytes for s in ssos),
            stream_ranges=tuple(StreamOffsetRange(s, a, b, b - a) for s, (a, b) in sorted(spans.items())),
            compacted_object_ids=tuple(s.object_id for s in ssos),
        )
    )


async def child(path: str) -> None:
    store = await SqliteMetadataStore.open(path)
    await _setup(store)
    print("READY", flush=True)
    for round_no in range(1_000_000):
        ends = {s.stream_id: s.end_offset for s in await store.list_streams()}
        first = await store.prepare_objects(count=2, ttl_ms=3_600_000)
        request = CommitStreamSetObjectRequest(
            node_id=NODE,
            node_epoch=NODE_EPOCH,
            object_id=first,
            order_id=first,
            object_size_bytes=2 * STEP,
            stream_ranges=tuple(StreamOffsetRange(s, ends[s], ends[s] + STEP, STEP) for s in STREAMS[:2]),
            stream_objects=(NewStreamObject(ObjectId(first + 1), STREAMS[2], ends[2], ends[2] + STEP, STEP),),
        )
        await asyncio.gather(
            store.commit_stream_set_object(request),
            store.kv_put("round", str(round_no).encode()),
            store.prepare_objects(count=1, ttl_ms=1),
        )
        print("ACK " + json.dumps({s: e + STEP for s, e in ends.items()}), flush=True)
        if round_no % 5 == 4:
            ssos = await store.get_stream_set_objects(NODE)
            if len(ssos) >= 2:
                await _compact(store, ssos[:2])
        if round_no % 7 == 6:
            await store.trim_stream(
                node_id=NODE, node_epoch=NODE_EPOCH, stream_id=STREAMS[1], epoch=0, new_start_offset=ends[1]
            )


async def _check(path: Path, acked: dict[int, int] | None) -> None:
    store = await SqliteMetadataStore.open(path)
    try:
        streams = {s.stream_id: s for s in await store.list_streams()}
        for stream_id, stream in streams.items():
            if acked is not None:
                assert acked[stream_id] <= stream.end_offset <= acked[stream_id] + STEP, (acked, stream)
            if stream.end_offset == stream.start_offset:
                continue
            slices = await store.get_objects(
                stream_id=stream_id, start_offset=stream.start_offset, end_offset=-1, limit=100_000
            )
            assert slices, stream
            assert slices[0].start_offset <= stream.start_offset
            assert slices[-1].end_offset == stream.end_offset
            assert all(a.end_offset == b.start_offset for a, b in itertools.pairwise(slices))
        ssos = {s.object_id for s in await store.get_stream_set_objects(NODE)}
        committed = await store.list_objects([ObjectState.COMMITTED])
        assert ssos == {o.object_id for o in committed if o.kind == ObjectKind.STREAM_SET}
    finally:
        await store.close()


def _run_until_killed(path: Path, rng: random.Random, stderr_path: Path) -> list[str]:
    """Start a child on ``path``, SIGKILL it a random while after it printed READY; every whole line
    it printed after READY. One thread reads stdout from the start to EOF through one file object, so
    no line is lost between reading READY and reading the rest."""
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.crash.test_metadata_crash", str(path)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.endswith("\n"):  # a torn last line was never printed whole
                lines.append(line.rstrip("\n"))
                if lines[-1] == "READY":
                    ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not ready.wait(0.1) and proc.poll() is None and time.monotonic() < deadline:
            pass
        assert ready.is_set(), f"the child never got ready: {stderr_path.read_text()[-3000:]}"
        time.sleep(rng.uniform(0.05, 0.6))
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(30)
        reader.join(30)
    assert not reader.is_alive()
    assert proc.returncode == -signal.SIGKILL, stderr_path.read_text()[-3000:]
    assert lines[0] == "READY", lines[:3]
    return lines[1:]


async def _stored_ends(path: Path) -> dict[int, int]:
    if not path.exists():
        return {int(s): 0 for s in STREAMS}
    store = await SqliteMetadataStore.open(path)
    try:
        return {s.stream_id: s.end_offset for s in await store.list_streams()}
    finally:
        await store.close()


@pytest.mark.crash
async def test_sigkill_mid_commit_leaves_a_consistent_store(tmp_path: Path, rng_seed: int) -> None:
    rng = random.Random(rng_seed)
    path = tmp_path / "meta.db"
    acked: dict[int, int] | None = None
    rounds_seen = 0
    for kill in range(KILLS):
        ends = await _stored_ends(path)  # the child starts from what is stored
        lines = _run_until_killed(path, rng, tmp_path / f"child-{kill}.err")
        acks = [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith("ACK ")]
        # every acknowledged round was read: each ACK is one round (STEP) after the one before
        for ack in acks:
            ends = {s: e + STEP for s, e in ends.items()}
            assert {int(k): v for k, v in ack.items()} == ends, (ack, ends)
        rounds_seen += len(acks)
        if acks:
            acked = {int(k): v for k, v in acks[-1].items()}
        await _check(path, acked)
        if acked is not None:  # the next child starts from what is stored, not from what it printed
            acked = await _stored_ends(path)
    print(f"{rounds_seen} acknowledged commits over {KILLS} kills")
    assert rounds_seen > 0


if __name__ == "__main__":
    asyncio.run(child(sys.argv[1]))
