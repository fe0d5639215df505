"""Real processes compete for one maintenance lease in one SQLite metadata store; one holder is
killed with SIGKILL.

Each child (``python -m tests.crash.test_metadata_leases DB NODE_ID SECONDS``) opens its own node
session, binds its store to it and loops: heartbeat, ``acquire_lease`` (150 ms); while it holds the
lease it writes through the lease-bound view and prints ``HELD {session, from, to}`` (the interval
the store granted, at the store's clock); after holding for a few rounds it stops renewing and
sleeps past the lease, so the lease changes hands by expiry.

Checked: the intervals of different sessions never overlap (one holder at a time, across
processes); the lease changed hands; after the holder was killed another session took the lease;
the killed session's last interval ends no later than the next holder's first one starts.
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
import time
from pathlib import Path

import pytest

from s3stream.clock import wall_clock_ms
from s3stream.errors import FencedError
from s3stream.ids import NodeId
from s3stream.metadata.sqlite import SqliteMetadataStore

LEASE = "maintenance"
LEASE_MS = 150
NODE_LEASE_MS = 5_000
HOLD_ROUNDS = 4
"""Renewals a child makes before it lets the lease lapse."""
WORKERS = 4
RUN_S = 3.0
REPO = Path(__file__).resolve().parents[2]


async def child(path: str, node_id: NodeId, seconds: float) -> None:
    store = await SqliteMetadataStore.open(path, check_integrity=False)
    session = await store.open_node(node_id=node_id, lease_ms=NODE_LEASE_MS)
    epoch = session.node_epoch
    store.bind_node(node_id, epoch)
    maintenance = store.bind_lease(LEASE)
    print("READY", flush=True)
    deadline = time.monotonic() + seconds
    held_rounds = 0
    while time.monotonic() < deadline:
        await store.heartbeat(node_id=node_id, node_epoch=epoch, lease_ms=NODE_LEASE_MS)
        lease = await store.acquire_lease(name=LEASE, node_id=node_id, node_epoch=epoch, lease_ms=LEASE_MS)
        if (lease.node_id, lease.node_epoch) == (node_id, epoch):
            interval = {
                "session": [node_id, epoch],
                "from": lease.expires_at_ms - LEASE_MS,
                "to": lease.expires_at_ms,
            }
            print("HELD", json.dumps(interval), flush=True)
            try:
                await maintenance.kv_put(f"written-by-{node_id}", str(lease.expires_at_ms).encode())
            except FencedError:  # the lease lapsed between the two transactions (a slow machine)
                print("LAPSED", flush=True)
            held_rounds += 1
            if held_rounds % HOLD_ROUNDS == 0:
                await asyncio.sleep(2 * LEASE_MS / 1000)
        await asyncio.sleep(0.02)
    # close_node ends the session and so releases the lease early: a grant ends here at the latest
    print("CLOSING", wall_clock_ms(), flush=True)
    await store.close_node(node_id=node_id, node_epoch=epoch)
    await store.close()


def _overlaps(intervals: list[tuple[tuple[int, int], int, int]]) -> list[tuple[object, object]]:
    """Pairs of intervals of different sessions that overlap."""
    found: list[tuple[object, object]] = []
    ordered = sorted(intervals, key=lambda i: (i[1], i[2]))
    for a, b in itertools.combinations(ordered, 2):
        if a[0] != b[0] and max(a[1], b[1]) < min(a[2], b[2]):
            found.append((a, b))
    return found


@pytest.mark.crash
async def test_one_maintenance_lease_holder_at_a_time_across_processes(tmp_path: Path, rng_seed: int) -> None:
    rng = random.Random(rng_seed)
    path = tmp_path / "meta.db"
    await (await SqliteMetadataStore.open(path)).close()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.crash.test_metadata_leases", str(path), str(node_id), str(RUN_S)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node_id in range(1, WORKERS + 1)
    ]
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "READY", proc.stderr.read() if proc.stderr else ""
    time.sleep(rng.uniform(0.3, 0.8))
    # kill whichever child holds the lease now (read from the store, as the children do)
    store = await SqliteMetadataStore.open(path)
    try:
        for _ in range(200):
            holder = await store.get_lease(LEASE)
            if holder is not None:
                break
            await asyncio.sleep(0.01)
        assert holder is not None, "nobody took the lease"
        victim = procs[holder.node_id - 1]
        victim.send_signal(signal.SIGKILL)
        killed_at_ms = wall_clock_ms()
        outputs = [proc.communicate(timeout=60) for proc in procs]
        assert victim.returncode == -signal.SIGKILL
        for proc, (_, err) in zip(procs, outputs, strict=True):
            assert proc is victim or proc.returncode == 0, err
        intervals = []
        for out, _ in outputs:
            closing = [int(line.split()[1]) for line in out.splitlines() if line.startswith("CLOSING ")]
            end_ms = closing[0] if closing else None
            for line in out.splitlines():
                if line.startswith("HELD "):
                    held = json.loads(line[5:])
                    to = held["to"] if end_ms is None else min(held["to"], end_ms)
                    intervals.append((tuple(held["session"]), held["from"], to))
        sessions = {i[0] for i in intervals}
        victim_session = (holder.node_id, holder.node_epoch)
        print(f"{len(intervals)} grants to {len(sessions)} sessions; killed {victim_session}")
        assert _overlaps(intervals) == []
        assert len(sessions) >= 2
        later = [i for i in intervals if i[0] != victim_session and i[1] >= killed_at_ms]
        assert later, "no other session took the lease after the holder was killed"
        victim_end = max(i[2] for i in intervals if i[0] == victim_session)
        assert victim_end <= min(i[1] for i in later)
        assert await store.get_lease(LEASE) is None  # the survivors closed their sessions
    finally:
        await store.close()


def test_overlapping_grants_of_two_sessions_are_found() -> None:
    a, b = (1, 1), (2, 1)
    assert _overlaps([(a, 0, 10), (a, 5, 15), (b, 15, 20)]) == []
    assert _overlaps([(a, 0, 10), (b, 9, 20)]) == [((a, 0, 10), (b, 9, 20))]


if __name__ == "__main__":
    asyncio.run(child(sys.argv[1], NodeId(int(sys.argv[2])), float(sys.argv[3])))
