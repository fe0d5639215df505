"""SIGKILL a producing engine process during appends, during an upload and between upload and commit.

After each kill the data dir is reopened (restart recovery): every acknowledged record must be
readable exactly once, offsets contiguous from 0, payloads intact. At the end, once the prepared
TTL has passed, no object may be left in the bucket that metadata does not reference. The seed is
printed; replay with S3STREAM_SEED=<seed>. S3STREAM_CRASH_ITERATIONS sets the runs per chain (default 10);
S3STREAM_CRASH_S3=1 puts the objects on the S3 test server, S3STREAM_CRASH_WAL_AIO picks the WAL write
path (:mod:`tests.crash.backend`).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compaction.gc import GarbageCollector, PreparedObjectReaper
from s3stream.assembly import open_client
from s3stream.metadata.base import ObjectState
from s3stream.objectformat import object_key
from tests.crash.backend import SMALL_WAL_ENV, bucket_uri, engine_config, iterations
from tests.crash.engine_producer import CONFIG, payload

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[2]
STREAMS = 4
MODES = ["append", "before_upload", "before_commit", "after_commit", "recovery"]
"""Where a run dies: mid-append (killed by the test), at a hook (by itself), or in restart recovery (killed
by the test at a random moment after it started opening the engine)."""
SMALL_WAL_CHAIN = 3
"""This chain's WAL is the smallest allowed (4 MiB: four of the largest records) and uploads wait for
2 MiB (or 2 s), so it wraps often and fills (appends wait for a trim and are written again)."""
ITERATIONS = iterations("S3STREAM_CRASH_ITERATIONS", 10)
"""Runs (kills) per chain."""


def run_producer(
    data_dir: Path, run: int, seed: int, mode: str, rng: random.Random, kv_acks: list[tuple[int, int]]
) -> list[tuple[int, int, int]]:
    """Start the producer, let it be killed (by itself at a hook, or by us mid-append); return its acks."""
    args = [
        sys.executable,
        "-m",
        "tests.crash.engine_producer",
        str(data_dir),
        str(STREAMS),
        str(run),
        str(seed),
    ]
    if mode not in ("append", "recovery"):
        args += [mode, str(rng.randint(1, 3))]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    acks: list[tuple[int, int, int]] = []
    deadline = time.monotonic() + 30
    ack_target = rng.randint(20, 400) if mode == "append" else None
    for line in proc.stdout:
        if mode == "recovery" and line.startswith("OPENING"):
            time.sleep(rng.uniform(0, 0.3))  # replay, its upload and commit, the WAL trim
            os.kill(proc.pid, signal.SIGKILL)
            break
        if line.startswith("KV "):
            kv_acks.append(_kv_ack(line))
        if line.startswith("ACK "):
            _, sid, base, count = line.split()
            acks.append((int(sid), int(base), int(count)))
            if ack_target is not None and len(acks) >= ack_target:
                os.kill(proc.pid, signal.SIGKILL)
                break
        if time.monotonic() > deadline:
            os.kill(proc.pid, signal.SIGKILL)
            break
    # Drain whatever was already acknowledged before the kill took effect.
    for line in proc.stdout:
        if line.startswith("ACK "):
            _, sid, base, count = line.split()
            acks.append((int(sid), int(base), int(count)))
        elif line.startswith("KV "):
            kv_acks.append(_kv_ack(line))
    proc.wait(timeout=30)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == -signal.SIGKILL, f"producer exited with {proc.returncode}: {stderr[-3000:]}"
    return acks


def _kv_ack(line: str) -> tuple[int, int]:
    """``KV n k``: the KV value ``n.k`` was acknowledged (k 0: by an atomic group, 1: by a plain put)."""
    _, n, k = line.split()
    return int(n), int(k)


async def verify(
    data_dir: Path, acked: dict[int, dict[int, int]], epoch: int, kv_acked: tuple[int, int]
) -> None:
    client = await open_client(data_dir, config=engine_config(CONFIG), bucket_uri=bucket_uri())
    try:
        n, _, k = (await client.kv.get("crash/atomic") or b"0.0").decode().partition(".")
        stored = (int(n), int(k))
        # KV changes keep one order across crashes: never older than the last acknowledged one.
        assert stored >= kv_acked, f"acknowledged KV value {kv_acked} lost or overwritten (stored {stored})"
        for sid, by_base in acked.items():
            stream = await client.streams.open_stream(sid, epoch=epoch)  # type: ignore[arg-type]
            end = stream.confirm_offset
            assert end >= max((b + c for b, c in by_base.items()), default=0), f"stream {sid} lost its tail"
            offset = 0
            seen: dict[int, int] = {}
            while offset < end:
                batches = await stream.fetch(offset, end, max_bytes=1 << 22)
                for batch in batches:
                    assert batch.base_offset == offset, f"stream {sid}: gap or overlap at {offset}"
                    expect = payload(sid, batch.base_offset, batch.count, len(batch.payload))
                    assert batch.payload == expect, f"stream {sid}: bad payload at {offset}"
                    seen[batch.base_offset] = batch.count
                    offset = batch.end_offset
            for base, count in by_base.items():
                assert seen.get(base) == count, f"stream {sid}: acknowledged batch at {base} missing"
            await stream.close()
    finally:
        await client.close()


async def assert_no_leaked_objects(data_dir: Path) -> None:
    await asyncio.sleep(CONFIG.object_prepared_ttl_ms / 1000 + 0.2)
    client = await open_client(data_dir, config=engine_config(CONFIG), bucket_uri=bucket_uri())
    try:
        reaper = PreparedObjectReaper(GarbageCollector(client.engine.metadata, client.engine.storage,
                                                       namespace=CONFIG.namespace, retention_ms=0, orphan_ttl_ms=0))  # fmt: skip
        await reaper.run_once()
        committed = await client.engine.metadata.list_objects([ObjectState.COMMITTED])
        keys = {object_key(o.object_id, CONFIG.namespace) for o in committed}
        stored = {info.key async for info in client.engine.storage.list("")}
        assert stored == keys, f"leaked: {sorted(stored - keys)}, missing: {sorted(keys - stored)}"
        assert await client.engine.metadata.list_objects([ObjectState.PREPARED]) == []
        # uploads killed midway (invisible to listings: local temporary files, S3 multipart uploads)
        gc = GarbageCollector(client.engine.metadata, client.engine.storage, namespace=CONFIG.namespace,
                              retention_ms=0, orphan_ttl_ms=0)  # fmt: skip
        report = await gc.collect(scan_orphans=True)
        assert report.orphan_deleted_count == 0
        print(f"{report.incomplete_uploads_reclaimed} incomplete uploads reclaimed")
        if bucket_uri() is None:
            assert [p for p in (data_dir / "objects").rglob("*") if "~" in p.name] == []
    finally:
        await client.close()


@pytest.mark.timeout(max(600, 15 * ITERATIONS))  # long runs take longer
@pytest.mark.parametrize("chain", range(4))
def test_kill_during_appends_and_uploads_loses_nothing(
    tmp_path: Path, rng_seed: int, chain: int, crash_bucket: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if chain == SMALL_WAL_CHAIN:
        monkeypatch.setenv(SMALL_WAL_ENV, "1")  # for the producers and our reopens
    seed = rng_seed + chain
    rng = random.Random(seed)
    acked: dict[int, dict[int, int]] = {}
    kv_acks: list[tuple[int, int]] = [(0, 0)]
    for run in range(ITERATIONS):
        mode = MODES[(run + chain) % len(MODES)]
        acks = run_producer(tmp_path, run, seed * 1000 + run, mode, rng, kv_acks)
        for sid, base, count in acks:
            assert base not in acked.setdefault(sid, {}), f"offset {base} of stream {sid} acknowledged twice"
            acked[sid][base] = count
        print(f"chain {chain} run {run} mode {mode}: {len(acks)} acks")
        asyncio.run(verify(tmp_path, acked, epoch=2 * run + 1, kv_acked=max(kv_acks)))
    asyncio.run(assert_no_leaked_objects(tmp_path))
