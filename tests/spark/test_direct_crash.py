"""SIGKILL of the Spark driver at every step of a direct micro-batch, forced task retries: exactly once.

One scenario table against one data dir, one Ceph RGW prefix and one checkpoint (each step is a fresh
driver process, ``direct_job.py``; a JVM start costs 10-15 s, so the steps share their setup). Batch 0
completes in step 1; every kill then hits the replay of batch 1:

| step | how the driver dies (batch 1)                                    | the reader then shows |
|------|------------------------------------------------------------------|-----------------------|
| 1    | after the count pass (hook)                                      | batch 0               |
| 2    | during the uploads: task 0's executor process kills the driver   | batch 0               |
| 3    | after every upload, before the commit (hook)                     | batch 0               |
| 4    | inside the metadata transaction, before COMMIT (wrapped controller) | batch 0            |
| 5    | after the commit, before Spark's ``commits/1`` (hook)            | batches 0-1           |
| 6    | clean run to batch 3, attempt 0 of task 0 fails after its upload (``local[2,4]`` retries it) | batches 0-3 |

After each step: no duplicate, no missing row, offsets contiguous from 0 in every partition. At the
end, a garbage-collection pass (clock moved past the prepared TTL and the retention, orphan scan on)
leaves exactly the committed objects in the bucket: the uploads of killed, failed and replayed
attempts are all gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from compaction.gc import GarbageCollector
from s3stream.assembly import open_sync
from s3stream.metadata.base import ObjectState
from s3stream.objectformat import object_key
from spark_sink.reader import read_records
from tests.support.s3 import S3TestServer

pytestmark = [pytest.mark.spark, pytest.mark.crash, pytest.mark.integration]

JOB = Path(__file__).with_name("direct_job.py")
ROOT = Path(__file__).resolve().parents[2]
ROWS = 300
PARTITIONS = 3
T = TypeVar("T")


def _run(data_dir: Path, uri: str, ckpt: Path, until: int, *extra: str) -> tuple[int, list[dict[str, Any]]]:
    args = [
        sys.executable,
        str(JOB),
        "--data-dir",
        str(data_dir),
        "--bucket-uri",
        uri,
        "--checkpoint",
        str(ckpt),
        "--rows-per-batch",
        str(ROWS),
        "--until-batch",
        str(until),
        "--partitions",
        str(PARTITIONS),
        *extra,
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900, check=False)
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode not in (0, -signal.SIGKILL):
        pytest.fail(
            f"driver exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
        )
    return proc.returncode, events


def _check_exact(data_dir: Path, uri: str, batches: int) -> None:
    with open_sync(data_dir, bucket_uri=uri) as client:
        records = read_records(client, "rate")
    values: list[int] = []
    for part, recs in records.items():
        assert [r.offset for r in recs] == list(range(len(recs))), (
            f"partition {part}: offsets contiguous from 0"
        )
        for r in recs:
            i = int(r.key or b"")
            assert i % PARTITIONS == part
            values.append(i)
    assert len(values) == len(set(values)), f"{len(values) - len(set(values))} duplicate rows"
    assert sorted(values) == list(range(batches * ROWS)), "missing or extra rows"


def _batches(events: list[dict[str, Any]]) -> list[tuple[int, bool]]:
    return [(e["batch_id"], e["skipped"]) for e in events if e["event"] == "batch"]


def _gc_leaves_only_committed(data_dir: Path, uri: str) -> tuple[int, int]:
    """Run GC past every TTL; returns (keys before, keys after) and checks keys after == committed."""
    with open_sync(data_dir, bucket_uri=uri) as client:

        def run(coro: Coroutine[Any, Any, T]) -> T:
            return asyncio.run_coroutine_threadsafe(coro, client.loop).result()

        engine = client.client.engine
        namespace = client.client.config.namespace

        async def keys() -> set[str]:
            return {o.key async for o in engine.storage.list("") if f"/{namespace}/" in o.key}

        before = run(keys())
        gc = GarbageCollector(
            engine.metadata,
            engine.storage,
            namespace=namespace,
            retention_ms=0,
            orphan_ttl_ms=0,
            clock_ms=lambda: 10**13,  # far past the prepared TTL, the retention and the orphan TTL
        )
        for _ in range(3):
            run(gc.collect(scan_orphans=True))
        committed = run(engine.metadata.list_objects([ObjectState.COMMITTED]))
        want = {object_key(o.object_id, namespace) for o in committed}
        after = run(keys())
    assert after == want, f"uncommitted keys left: {sorted(after - want)}; missing: {sorted(want - after)}"
    return len(before), len(after)


@pytest.mark.timeout(2400)
def test_sigkill_of_the_driver_at_every_step_of_a_direct_batch(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    data_dir, ckpt, uri = tmp_path / "engine", tmp_path / "checkpoint", s3_server.uri(s3_prefix)

    code, events = _run(data_dir, uri, ckpt, 5, "--kill-at", "after_count:1")
    assert code == -signal.SIGKILL
    assert _batches(events) == [(0, False)]
    _check_exact(data_dir, uri, 1)

    for kill in (
        ("--kill-during-upload", "1"),
        ("--kill-at", "before_commit:1"),
        ("--kill-inside-commit", "1"),
    ):
        code, events = _run(data_dir, uri, ckpt, 5, *kill)
        assert code == -signal.SIGKILL, kill
        assert _batches(events) == [], kill
        _check_exact(data_dir, uri, 1)

    code, events = _run(data_dir, uri, ckpt, 5, "--kill-at", "after_batch:1")
    assert code == -signal.SIGKILL
    _check_exact(data_dir, uri, 2)
    assert not (ckpt / "commits" / "1").exists()

    code, events = _run(data_dir, uri, ckpt, 3, "--master", "local[2,4]", "--fail-after-upload")
    assert code == 0
    assert _batches(events) == [(1, True), (2, False), (3, False)], (
        "the replay of committed batch 1 is skipped"
    )
    _check_exact(data_dir, uri, 4)

    before, after = _gc_leaves_only_committed(data_dir, uri)
    assert before > after, "the killed and failed attempts had uploaded objects that GC removed"
    _check_exact(data_dir, uri, 4)
