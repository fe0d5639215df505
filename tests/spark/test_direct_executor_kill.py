"""An executor's Python worker SIGKILLed in the middle of a direct upload, on ``local-cluster[2,1,1024]``.

One driver (``direct_job.py``) on Spark's local cluster master (two worker JVMs with one executor each,
Python workers forked by each executor's daemon) writes micro-batch 0, 1,500 rows of 8 KB, into a
bucket whose multipart threshold is the 5 MiB minimum part: each of the two tasks uploads a ~6 MB
object in two parts. In micro-batch 0 the Python worker of task 0 kills itself with SIGKILL right
after the first part of its upload is stored (the upload is started, never completed). Spark sees the worker crash and runs the task again; the retry
writes under the next slot and the micro-batch commits once. Then the same driver reads the topic back
with the ``s3stream`` source on the same cluster (a batch read: planning on the driver, ranged reads on
the executors).

Checked: the worker died at that point (its marker names the object's key and an incomplete multipart
upload for it is in the bucket), the retry uploaded, the driver finished the micro-batch once; every
row once with contiguous offsets both through the engine and through the source; after GC exactly the
committed objects are in the bucket and no incomplete upload is left (the killed attempt left no
object, only its incomplete upload, which GC aborts).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.spark.direct_support import DirectRun, batches_of
from tests.support.s3 import S3TestServer

pytestmark = [pytest.mark.spark, pytest.mark.crash, pytest.mark.integration]

LOCAL_CLUSTER = "local-cluster[2,1,1024]"
ROWS = 1500
VALUE_BYTES = 8000
MULTIPART_THRESHOLD_BYTES = 5 << 20


async def _incomplete_uploads(s3_server: S3TestServer, prefix: str) -> list[str]:
    storage = s3_server.storage(prefix)
    try:
        client = await storage.client()
        page = await client.list_multipart_uploads(Bucket=storage.config.bucket, Prefix=prefix)
        return [str(u["Key"]) for u in page.get("Uploads", [])]
    finally:
        await storage.close()


@pytest.mark.timeout(2400)
def test_an_executor_killed_mid_upload_is_retried_and_the_batch_commits_once(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    run = DirectRun(
        tmp_path / "engine",
        s3_server.uri(s3_prefix) + f"&multipartThresholdBytes={MULTIPART_THRESHOLD_BYTES}",
        tmp_path / "checkpoint",
        rows=ROWS,
        value_bytes=VALUE_BYTES,
    )
    code, events = run.run(
        0,
        "--master",
        LOCAL_CLUSTER,
        "--kill-worker-mid-upload",
        "0",
        "--marker-dir",
        str(markers),
        "--read-back",
    )
    assert code == 0
    assert batches_of(events) == [(0, False)], "each micro-batch finished once"

    killed_pid, killed_key = (markers / "worker-killed").read_text().split(" ", 1)
    assert not (markers / "upload-0-0-0").exists(), "attempt 0 of task 0 never finished its upload"
    retries = sorted(p.name for p in markers.glob("upload-0-0-*"))
    assert retries, "Spark ran task 0 of micro-batch 0 again and the retry uploaded"
    assert all((markers / name).read_text() != killed_pid for name in retries)
    pending = asyncio.run(_incomplete_uploads(s3_server, s3_prefix))
    assert [k for k in pending if k.endswith(killed_key)], (
        f"the killed attempt's upload {killed_key!r} is started and incomplete: {pending}"
    )

    run.check_exact(1)
    (read,) = [e for e in events if e["event"] == "read"]
    by_partition: dict[int, list[tuple[int, int]]] = {}
    for partition, offset, key in read["rows"]:
        by_partition.setdefault(partition, []).append((offset, key))
    for partition, got in by_partition.items():
        got.sort()
        assert [o for o, _ in got] == list(range(len(got))), f"source: partition {partition} contiguous"
        assert all(k % run.partitions == partition for _, k in got)
    keys = sorted(k for _, _, k in read["rows"])
    assert keys == list(range(ROWS)), "the source on the local cluster reads every row once"

    run.gc_leaves_only_committed()
    assert asyncio.run(_incomplete_uploads(s3_server, s3_prefix)) == [], "GC aborted the killed upload"
    run.check_exact(1)
