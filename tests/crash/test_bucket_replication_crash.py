"""kill -9 of a node process during replicated uploads over two buckets on the Ceph RGW test server.

Each bucket is a fresh prefix behind its own fault proxy; the second is throttled, so an object
reaches the first bucket well before the second and a kill often lands between the two. Each round
starts ``tests.crash.bucket_replication_node`` on the same data dir (restart recovery replays the WAL
and uploads again) and kills it at a random moment after a random one of its uploads started. After
every round the data dir is reopened: every acknowledged record reads back, intact and in order, and
every COMMITTED object's placement names both buckets and each of them holds the key (a HEAD on each
bucket directly, with the object's size). At the end, past the prepared TTL, the reaper and GC
(retention 0, orphan scan) run and each bucket holds exactly the committed objects: no orphan.

``S3STREAM_BUCKET_KILLS`` sets the rounds (default 3: under a minute on a loaded 2-core machine); the
seed is printed (replay with ``S3STREAM_SEED=<seed>``), and how many kills left an object in one
bucket only (about half of them with these sizes and rates).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.fault_proxy import FaultProxy
from compaction.gc import GarbageCollector, PreparedObjectReaper
from s3stream.assembly import open_client
from s3stream.metadata.base import ObjectState
from s3stream.objectformat import object_key
from s3stream.storage.base import ObjectStorage
from tests.crash.backend import iterations
from tests.crash.bucket_replication_node import CONFIG, payload
from tests.support.buckets_e2e import object_keys
from tests.support.fault_proxy import proxied
from tests.support.s3 import S3TestServer

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = iterations("S3STREAM_BUCKET_KILLS", 3)
STREAMS = 2
THROTTLE_BYTES_PER_S = 512 << 10
"""The second bucket's upload rate: a 192 KiB object takes it about 0.4 s, the first bucket far less."""
KILL_DELAY_S_MAX = 0.6
RUN_TIMEOUT_S = 60.0


def run_node(
    data_dir: Path, bucket_list: str, run: int, rng: random.Random
) -> tuple[list[tuple[int, int]], str]:
    """Start the node and kill it ``[0, KILL_DELAY_S_MAX)`` s after its k-th upload started (k in
    1..3); return its acknowledgements and where the kill landed."""
    args = [sys.executable, "-m", "tests.crash.bucket_replication_node", str(data_dir), bucket_list,
            str(run), str(STREAMS)]  # fmt: skip
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    kill_after = rng.randint(1, 3)
    delay_s = rng.uniform(0, KILL_DELAY_S_MAX)
    watchdog = threading.Timer(RUN_TIMEOUT_S, os.kill, (proc.pid, signal.SIGKILL))
    watchdog.start()
    acks: list[tuple[int, int]] = []
    uploads = 0
    armed: threading.Timer | None = None
    try:
        for line in proc.stdout:
            if line.startswith("ACK "):
                _, sid, base = line.split()
                acks.append((int(sid), int(base)))
            elif line.startswith("UPLOAD"):
                uploads += 1
                if uploads == kill_after and armed is None:
                    armed = threading.Timer(delay_s, os.kill, (proc.pid, signal.SIGKILL))
                    armed.start()
        proc.wait(timeout=30)
    finally:
        watchdog.cancel()
    stderr = proc.stderr.read() if proc.stderr else ""
    assert armed is not None, f"no upload {kill_after} before the node exited: {stderr[-3000:]}"
    assert proc.returncode == -signal.SIGKILL, f"node exited with {proc.returncode}: {stderr[-3000:]}"
    where = f"killed {delay_s:.2f} s after upload {kill_after} started"
    return acks, where


async def verify(
    data_dir: Path,
    bucket_list: str,
    acked: dict[int, set[int]],
    epoch: int,
    buckets: dict[int, ObjectStorage],
) -> int:
    """Restart recovery, then the checks of the module doc; returns the committed object count."""
    client = await open_client(data_dir, config=CONFIG, bucket_uri=bucket_list)
    try:
        for sid, offsets in acked.items():
            stream = await client.streams.open_stream(sid, epoch=epoch)  # type: ignore[arg-type]
            offset, end = stream.start_offset, stream.confirm_offset
            assert end > max(offsets, default=-1), f"stream {sid} lost its tail"
            seen = set()
            while offset < end:
                for batch in await stream.fetch(offset, end, max_bytes=4 << 20):
                    assert batch.base_offset == offset, f"stream {sid}: gap or overlap at {offset}"
                    assert batch.payload == payload(sid, offset), f"stream {sid}: bad payload at {offset}"
                    seen.add(offset)
                    offset = batch.end_offset
            assert offsets <= seen, f"stream {sid}: acknowledged offsets lost: {sorted(offsets - seen)[:10]}"
            await stream.close()
        metadata = client.engine.metadata
        committed = await metadata.list_objects([ObjectState.COMMITTED])
        placements = await metadata.placements([o.object_id for o in committed])
        for obj in committed:
            key = object_key(obj.object_id, CONFIG.namespace)
            held = placements.get(obj.object_id, ())
            assert set(held) == set(buckets), f"{key} committed with placement {held}, not every bucket"
            for bucket_id in held:
                info = await buckets[bucket_id].head(key)  # NotFoundError: a committed copy missing
                assert info.size_bytes == obj.size_bytes, (
                    f"{key} in bucket {bucket_id}: {info.size_bytes} bytes"
                )
        return len(committed)
    finally:
        await client.close()


async def collect_and_check_no_orphans(
    data_dir: Path, bucket_list: str, buckets: dict[int, ObjectStorage]
) -> None:
    await asyncio.sleep(CONFIG.object_prepared_ttl_ms / 1000 + 0.2)
    client = await open_client(data_dir, config=CONFIG, bucket_uri=bucket_list)
    try:
        metadata, storage = client.engine.metadata, client.engine.storage
        gc = GarbageCollector(metadata, storage, namespace=CONFIG.namespace, retention_ms=0, orphan_ttl_ms=0)
        await PreparedObjectReaper(gc).run_once()
        report = await gc.collect(scan_orphans=True)
        print(
            f"gc: {report.orphan_deleted_count} orphans, {report.incomplete_uploads_reclaimed} incomplete uploads"
        )
        assert await metadata.list_objects([ObjectState.PREPARED]) == []
        committed = await metadata.list_objects([ObjectState.COMMITTED])
        expected = {object_key(o.object_id, CONFIG.namespace) for o in committed}
        for bucket_id, plain in buckets.items():
            held = await object_keys(plain, CONFIG.namespace)
            assert held == expected, (
                f"bucket {bucket_id}: orphans {sorted(held - expected)[:5]}, missing {sorted(expected - held)[:5]}"
            )
    finally:
        await client.close()


@pytest.mark.timeout(max(300, 40 * ROUNDS))
def test_kill_during_replicated_uploads_commits_nothing_with_fewer_copies(
    tmp_path: Path,
    rng_seed: int,
    s3_server: S3TestServer,
    s3_prefix: str,
    fault_proxies: Callable[[], FaultProxy],
) -> None:
    rng = random.Random(rng_seed)
    proxies = [fault_proxies(), fault_proxies()]
    proxies[1].throttle(THROTTLE_BYTES_PER_S)
    servers = [proxied(s3_server, p) for p in proxies]
    prefixes = [f"{s3_prefix}{name}/" for name in "ab"]
    bucket_list = ",".join(servers[i].uri(prefixes[i]).replace("0@", f"{i}@", 1) for i in range(2))
    data_dir = tmp_path / "node"
    acked: dict[int, set[int]] = {}

    half_copied: list[int] = []
    """Per round: objects found in one bucket only right after the kill (the kill fell between copies)."""

    async def check(round_: int) -> int:
        buckets: dict[int, ObjectStorage] = {i: s3_server.storage(prefixes[i]) for i in range(2)}
        try:
            if round_ < ROUNDS:
                held = [await object_keys(buckets[i], CONFIG.namespace) for i in range(2)]
                half_copied.append(len(held[0] ^ held[1]))
                return await verify(data_dir, bucket_list, acked, 2 * round_ + 1, buckets)
            await collect_and_check_no_orphans(data_dir, bucket_list, buckets)
            return 0
        finally:
            for plain in buckets.values():
                await plain.close()

    for round_ in range(ROUNDS):
        acks, where = run_node(data_dir, bucket_list, round_, rng)
        for sid, base in acks:
            assert base not in acked.setdefault(sid, set()), (
                f"offset {base} of stream {sid} acknowledged twice"
            )
            acked[sid].add(base)
        committed = asyncio.run(check(round_))
        print(f"round {round_}: {len(acks)} acks, {committed} committed objects; {where}; "
              f"{half_copied[-1]} object(s) in one bucket only after the kill")  # fmt: skip
    assert sum(len(v) for v in acked.values()) > 100
    print(f"kills that left an object in one bucket only: {sum(1 for n in half_copied if n)} of {ROUNDS}")
    asyncio.run(check(ROUNDS))
