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

import signal
from pathlib import Path

import pytest

from tests.spark.direct_support import DirectRun, batches_of
from tests.support.s3 import S3TestServer

pytestmark = [pytest.mark.spark, pytest.mark.crash, pytest.mark.integration]

ROWS = 300
PARTITIONS = 3


@pytest.mark.timeout(2400)
def test_sigkill_of_the_driver_at_every_step_of_a_direct_batch(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    run = DirectRun(
        tmp_path / "engine",
        s3_server.uri(s3_prefix),
        tmp_path / "checkpoint",
        rows=ROWS,
        partitions=PARTITIONS,
    )
    ckpt = run.checkpoint

    code, events = run.run(5, "--kill-at", "after_count:1")
    assert code == -signal.SIGKILL
    assert batches_of(events) == [(0, False)]
    run.check_exact(1)

    for kill in (
        ("--kill-during-upload", "1"),
        ("--kill-at", "before_commit:1"),
        ("--kill-inside-commit", "1"),
    ):
        code, events = run.run(5, *kill)
        assert code == -signal.SIGKILL, kill
        assert batches_of(events) == [], kill
        run.check_exact(1)

    code, events = run.run(5, "--kill-at", "after_batch:1")
    assert code == -signal.SIGKILL
    run.check_exact(2)
    assert not (ckpt / "commits" / "1").exists()

    code, events = run.run(3, "--master", "local[2,4]", "--fail-after-upload")
    assert code == 0
    assert batches_of(events) == [(1, True), (2, False), (3, False)], (
        "the replay of committed batch 1 is skipped"
    )
    run.check_exact(4)

    before, after = run.gc_leaves_only_committed()
    assert before > after, "the killed and failed attempts had uploaded objects that GC removed"
    run.check_exact(4)
