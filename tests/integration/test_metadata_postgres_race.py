"""Many processes committing, opening, closing and taking over the same streams in one PostgreSQL
schema at once: no lost update, every fence holds, ids are unique (:mod:`tests.support.metadata_race`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from s3stream.ids import NodeId, StreamId
from s3stream.metadata.url import open_metadata_store
from tests.support.metadata_race import check_race

ROOT = Path(__file__).resolve().parents[2]
NODES = 4
SHARED_STREAMS = 3
SETUP_NODE = NodeId(99)


async def _race(url: str, tmp_path: Path, seed: int, *, seconds: float) -> dict[str, int]:
    store = await open_metadata_store(url)
    try:
        await store.register_node(node_id=SETUP_NODE, node_epoch=1)
        streams = [await store.create_stream(node_id=SETUP_NODE, node_epoch=1) for _ in range(SHARED_STREAMS)]
    finally:
        await store.close()
    start_at = time.time() + 3.0  # every process imported and connected before the first round
    procs = []
    for node in range(1, NODES + 1):
        out = tmp_path / f"node-{node}.jsonl"
        argv = [
            sys.executable, "-m", "tests.support.metadata_race", "--url", url, "--node-id", str(node),
            "--streams", ",".join(map(str, streams)), "--seconds", str(seconds), "--seed", str(seed + node),
            "--start-at", str(start_at), "--out", str(out),
        ]  # fmt: skip
        procs.append((subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.PIPE, text=True), out))
    events = []
    for proc, out in procs:
        _, stderr = proc.communicate(timeout=seconds + 120)
        assert proc.returncode == 0, stderr[-3000:]
        events += [json.loads(line) for line in out.read_text().splitlines()]
    store = await open_metadata_store(url)
    try:
        return await check_race(store, events, [StreamId(s) for s in streams])
    finally:
        await store.close()


async def test_processes_racing_on_shared_streams_lose_no_update_and_keep_every_fence(
    pg_url: str, tmp_path: Path, rng_seed: int
) -> None:
    counts = await _race(pg_url, tmp_path, rng_seed, seconds=8.0)
    print(counts)
    # the race really raced: takeovers fenced commits in flight, and commits got through
    assert counts["commits_accepted"] >= 20, counts
    assert counts["commits_refused"] >= 1, counts
    assert counts["opens"] >= 3 * NODES, counts


async def test_the_same_race_on_one_sqlite_file(tmp_path: Path, rng_seed: int) -> None:
    """The race's baseline: SQLite serializes the processes with its file lock."""
    counts = await _race(f"sqlite://{tmp_path}/metadata.db", tmp_path, rng_seed, seconds=4.0)
    assert counts["commits_accepted"] >= 10, counts
