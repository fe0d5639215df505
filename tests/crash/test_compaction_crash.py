"""SIGKILL a compacting process between upload and commit, after commit before the deletes, between
a delete and its metadata removal, and at random moments.

Each iteration appends more data (several StreamSet and stream objects per round, some trims), then
a subprocess compacts the data dir and kills itself at a chosen point. After every kill the data
dir is reopened: every record at or above its stream's start offset must read back identically.
At the end, once the prepared TTL has passed, one normal compaction + GC pass must leave exactly
the committed objects in the bucket: nothing lost, nothing leaked. The seed is printed; replay with
S3STREAM_SEED=<seed>. S3STREAM_COMPACTION_CRASH_ITERATIONS sets the kills (default 6); S3STREAM_CRASH_S3=1
puts the objects on the S3 test server, S3STREAM_CRASH_WAL_AIO picks the WAL write path
(:mod:`tests.crash.backend`).
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compaction.compactor import Compactor
from s3stream.assembly import open_client
from s3stream.cli.streams import next_epoch
from s3stream.engine.client import Client, Stream
from s3stream.ids import StreamId
from s3stream.metadata.base import ObjectState
from s3stream.model import RecordBatch
from s3stream.objectformat import object_key
from tests.crash.backend import bucket_uri, engine_config, iterations
from tests.crash.compaction_data import CONFIG, payload

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[2]
STREAMS = 3
ITERATIONS = iterations("S3STREAM_COMPACTION_CRASH_ITERATIONS", 6)
KILL_POINTS = ("before_commit", "after_commit", "after_delete", "random")
"""Where the compacting process dies, in turn (see tests/crash/compaction_runner.py)."""
Expected = dict[int, dict[int, tuple[int, int]]]
"""stream id -> base offset -> (count, payload size)."""


async def open_streams(client: Client) -> list[Stream]:
    blob = await client.kv.get("crash/streams")
    if blob is None:
        ids = [await client.streams.create_stream() for _ in range(STREAMS)]
        await client.kv.put("crash/streams", ",".join(map(str, ids)).encode())
    else:
        ids = [StreamId(int(x)) for x in blob.decode().split(",")]
    streams = []
    for sid in ids:
        meta = await client.engine.metadata.describe_stream(sid)
        streams.append(await client.streams.open_stream(sid, epoch=next_epoch(meta)))
    return streams


async def append_rounds(data_dir: Path, expected: Expected, rng: random.Random) -> None:
    client = await open_client(data_dir, config=engine_config(CONFIG), bucket_uri=bucket_uri())
    try:
        streams = await open_streams(client)
        for _ in range(rng.randint(3, 5)):
            for s in streams:
                for _ in range(rng.randint(1, 6)):
                    count, size = rng.randint(1, 4), rng.choice([200, 2000, 9000])
                    base = await s.append(
                        RecordBatch(payload(s.stream_id, s.next_offset, count, size), count)
                    )
                    expected.setdefault(s.stream_id, {})[base] = (count, size)
            await client.engine.force_upload(None)
        if rng.random() < 0.5:
            s = rng.choice(streams)
            await s.trim(rng.randint(s.start_offset, s.confirm_offset))
        for s in streams:
            await s.close()
    finally:
        await client.close()


async def verify(data_dir: Path, expected: Expected) -> None:
    client = await open_client(data_dir, config=engine_config(CONFIG), bucket_uri=bucket_uri())
    try:
        for s in await open_streams(client):
            want = {b: v for b, v in expected.get(s.stream_id, {}).items() if b + v[0] > s.start_offset}
            got: dict[int, tuple[int, int]] = {}
            offset = s.start_offset
            while offset < s.confirm_offset:
                for batch in await s.fetch(offset, s.confirm_offset, max_bytes=1 << 20):
                    assert batch.payload == payload(
                        s.stream_id, batch.base_offset, batch.count, len(batch.payload)
                    )
                    got[batch.base_offset] = (batch.count, len(batch.payload))
                    offset = batch.end_offset
            assert got == want, f"stream {s.stream_id}: records lost or changed"
            await s.close()
    finally:
        await client.close()


def run_compactor(data_dir: Path, kill_at: str, kill_count: int, rng: random.Random) -> str:
    args = [sys.executable, "-m", "tests.crash.compaction_runner", str(data_dir), kill_at, str(kill_count)]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        started = proc.stdout.readline()
        if kill_at == "random" and started.startswith("STARTED"):
            time.sleep(rng.uniform(0, 0.15))  # anywhere in the run (~0.05-0.1 s): uploads, commits, deletes
            proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = started + out
    print(out.strip())
    if "DONE" in out:  # (a random kill may land in the close after it)
        assert proc.returncode == 0 or (kill_at == "random" and proc.returncode == -signal.SIGKILL), err[
            -3000:
        ]
        return "done"
    assert proc.returncode == -signal.SIGKILL, f"runner exited with {proc.returncode}: {err[-3000:]}"
    assert kill_at == "random" or f"KILL {kill_at}" in out
    return "killed"


async def assert_nothing_leaked(data_dir: Path) -> None:
    await asyncio.sleep(CONFIG.object_prepared_ttl_ms / 1000 + 0.3)
    client = await open_client(data_dir, config=engine_config(CONFIG), bucket_uri=bucket_uri())
    try:
        engine = client.engine
        compactor = Compactor(
            CONFIG, engine.metadata, engine.storage, node_id=engine.node_id, node_epoch=engine.node_epoch,
            orphan_ttl_ms=0,
        )  # fmt: skip
        report = await compactor.run_once(stream_objects=True, scan_orphans=True)
        assert report.problems == ()
        await compactor.gc.collect(scan_orphans=True)  # the objects this last run replaced
        committed = await engine.metadata.list_objects([ObjectState.COMMITTED])
        keys = {object_key(o.object_id, CONFIG.namespace) for o in committed}
        stored = {info.key async for info in engine.storage.list("")}
        assert stored == keys, f"leaked: {sorted(stored - keys)}, missing: {sorted(keys - stored)}"
        assert await engine.metadata.list_objects([ObjectState.PREPARED, ObjectState.MARK_DESTROYED]) == []
    finally:
        await client.close()


@pytest.mark.timeout(max(600, 20 * ITERATIONS))  # long runs take longer
def test_sigkill_during_compaction_loses_nothing_and_leaks_nothing(
    tmp_path: Path, rng_seed: int, crash_bucket: str | None
) -> None:
    rng = random.Random(rng_seed)
    data_dir = tmp_path / "data"
    expected: Expected = {}
    outcomes = []
    for i in range(ITERATIONS):
        asyncio.run(append_rounds(data_dir, expected, rng))
        kill_at = KILL_POINTS[i % len(KILL_POINTS)]
        outcomes.append(run_compactor(data_dir, kill_at, rng.randint(1, 2), rng))
        asyncio.run(verify(data_dir, expected))
    print("outcomes:", outcomes)
    assert "killed" in outcomes
    asyncio.run(assert_nothing_leaked(data_dir))
    asyncio.run(verify(data_dir, expected))


_KILLED_MID_UPLOAD = """
import asyncio, os, signal, sys
from s3stream.objectformat import object_key
from s3stream.storage.local import LocalObjectStorage
async def main():
    storage = LocalObjectStorage(sys.argv[1])
    upload = storage.upload(object_key(12345, sys.argv[2]))
    await upload.write(bytearray(1 << 20))  # not bytes and large: written to its temporary file now
    os.kill(os.getpid(), signal.SIGKILL)
asyncio.run(main())
"""


def test_gc_reclaims_what_an_upload_killed_midway_left(tmp_path: Path) -> None:
    """Listings skip a killed upload's temporary file, so the orphan scan must reclaim it by age."""
    data_dir = tmp_path / "data"
    asyncio.run(append_rounds(data_dir, {}, random.Random(0)))
    objects = data_dir / "objects"
    done = subprocess.run([sys.executable, "-c", _KILLED_MID_UPLOAD, str(objects), CONFIG.namespace],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    left = [p for p in objects.rglob("*") if p.is_file() and "~" in p.name]
    assert len(left) == 1, left

    async def collect(orphan_ttl_ms: int) -> int:
        client = await open_client(data_dir, config=CONFIG)
        try:
            engine = client.engine
            compactor = Compactor(
                CONFIG, engine.metadata, engine.storage, node_id=engine.node_id, node_epoch=engine.node_epoch,
                orphan_ttl_ms=orphan_ttl_ms,
            )  # fmt: skip
            return (await compactor.gc.collect(scan_orphans=True)).incomplete_uploads_reclaimed
        finally:
            await client.close()

    assert asyncio.run(collect(3_600_000)) == 0  # too young: it may be an upload in progress
    assert left[0].exists()
    time.sleep(0.01)
    assert asyncio.run(collect(0)) == 1
    assert not left[0].exists()
