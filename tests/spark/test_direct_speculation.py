"""Speculation forced on: a slowed task attempt and its speculative copy both upload, one wins, once.

Spark launches a speculative copy only on a host where no attempt of the task runs, and every
executor of ``local-cluster`` has one host name, so this test runs on a standalone cluster of two
one-core workers on two loopback addresses (:mod:`tests.spark.standalone`). The driver
(``direct_job.py``) runs with ``spark.speculation`` on (checked every 100 ms, quantile 0.5,
multiplier 1.5, minimum runtime 100 ms) and attempt 0 of task 1 sleeps after its upload: task 0
finishes, task 1 is past 1.5x the median, a copy starts on the other executor, waits until attempt
0's upload is done (so both attempts surely write, whatever the machine's load), uploads under the
next slot and finishes first; Spark kills the slow attempt.

Checked for micro-batch 0: both attempts of task 1 uploaded (markers written by the attempts after
their uploads), the micro-batch finished once, every row once with contiguous offsets, and a GC pass
past every TTL leaves exactly the committed objects: the loser's object never became visible and is
gone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.spark.direct_support import DirectRun, batches_of, job_env
from tests.spark.standalone import standalone_cluster
from tests.support.s3 import S3TestServer

pytestmark = [pytest.mark.spark, pytest.mark.crash, pytest.mark.integration]

ROWS = 300
SLOW_S = 30.0
"""How long attempt 0 of task 1 sleeps after its upload (the copy finishes long before)."""


@pytest.mark.timeout(2400)
def test_a_speculative_copy_wins_and_the_slow_attempts_objects_are_collected(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    run = DirectRun(tmp_path / "engine", s3_server.uri(s3_prefix), tmp_path / "checkpoint", rows=ROWS)
    with standalone_cluster(tmp_path / "spark", job_env(), workers=2) as master:
        code, events = run.run(
            0,
            "--master",
            master,
            "--speculation",
            "--slow-first-attempt",
            str(SLOW_S),
            "--marker-dir",
            str(markers),
        )
    assert code == 0
    assert batches_of(events) == [(0, False)]
    uploads = sorted(p.name for p in markers.glob("upload-*"))
    assert "upload-0-1-0" in uploads, f"the slow attempt uploaded ({uploads})"
    assert "upload-0-1-1" in uploads, f"a speculative copy uploaded ({uploads})"
    run.check_exact(1)

    before, after = run.gc_leaves_only_committed()
    assert before > after, "the slow attempt had uploaded an object that GC removed"
    run.check_exact(1)
