"""A zombie driver: SIGSTOPped before the commit of micro-batch 1, resumed after its successor went on.

Two driver processes (``direct_job.py``) of one query share the checkpoint, the bucket and the metadata
(PostgreSQL, as drivers on two machines would); each has its own data dir (its own WAL), and both run
the engine as the same node id, as a restarted driver does. Their node lease is long (10 min), so the
zombie's own lease timer does not stop it first: its commit meets the checks of the commit path:

1. driver A commits micro-batch 0, then uploads micro-batch 1's objects and stops itself (SIGSTOP)
   where the sink reports ``before_commit:1``: everything of the batch is written except its commit;
2. driver B starts from the same checkpoint (its engine's node session fences A's), replays
   micro-batch 1 (new ids, new objects), commits it and goes on to micro-batch 2;
3. A is resumed (SIGCONT) and runs its commit of micro-batch 1 with its old plan: it must be refused
   (the streams' ends moved, the progress record moved, A's node session is fenced) and write
   nothing; A's query fails. If A still runs after a while, it is SIGKILLed.

With the default lease (10 s) a pause longer than the lease is caught earlier still: the resumed
engine finds its lease ended without a renewal and refuses the commit (``FencedError``).

Then: every row of micro-batches 0-2 once with contiguous offsets (B's results intact), A reported no
micro-batch after 0, and a GC pass past every TTL leaves exactly the committed objects (A's uploads of
micro-batch 1 are gone).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.spark.direct_support import DRIVER_TIMEOUT_S, DirectRun, batches_of, events_of, job_env
from tests.support.s3 import S3TestServer

pytestmark = [pytest.mark.spark, pytest.mark.crash, pytest.mark.integration]

ROWS = 300
NODE_LEASE_MS = 600_000
"""Longer than the test: only the commit path's checks can refuse the zombie's commit."""
RESUMED_EXIT_TIMEOUT_S = 300.0
"""How long the resumed zombie may take to fail its commit and exit before it is SIGKILLed."""
REFUSALS = ("ConflictError", "FencedError", "UnavailableError")
"""The errors a refused commit of the zombie's may raise (whichever check meets it first). While it
was stopped, PostgreSQL may have ended its connection (a session idle in a transaction past
``idle_in_transaction_session_timeout``): the commit then fails as unavailable before any check, and
a retry would meet the checks. Either way nothing of the zombie's is committed, which the assertions
after the refusal check on the data itself."""


def _state(pid: int) -> str:
    """The process state letter from ``/proc/<pid>/stat`` (``T``: stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def _wait_stopped(proc: subprocess.Popen[bytes], out: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"driver A exited {proc.returncode} before it stopped:\n{out.read_text()[-4000:]}")
        if '"stopped_at"' in out.read_text() and _state(proc.pid) == "T":
            return
        time.sleep(0.2)
    pytest.fail(f"driver A did not stop itself within {timeout_s} s:\n{out.read_text()[-4000:]}")


@pytest.mark.timeout(3600)
def test_a_resumed_zombie_driver_commits_nothing_and_leaves_its_successor_intact(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str, pg_url: str
) -> None:
    run_a = DirectRun(
        tmp_path / "driver-a",
        s3_server.uri(s3_prefix),
        tmp_path / "checkpoint",
        rows=ROWS,
        metadata_url=pg_url,
    )
    run_b = dataclasses.replace(run_a, data_dir=tmp_path / "driver-b")
    out_a, err_a = tmp_path / "a.out", tmp_path / "a.err"
    lease = ("--node-lease-ms", str(NODE_LEASE_MS))
    with out_a.open("wb") as out, err_a.open("wb") as err:
        a = subprocess.Popen(
            run_a.args(2, *lease, "--stop-at", "before_commit:1", "--timeout-s", "1800"),
            env=job_env(),
            stdout=out,
            stderr=err,
        )
    try:
        _wait_stopped(a, out_a, timeout_s=DRIVER_TIMEOUT_S)
        assert batches_of(events_of(out_a.read_text())) == [(0, False)]

        code, events = run_b.run(2, *lease)
        assert code == 0
        assert batches_of(events) == [(1, False), (2, False)], "B replays batch 1 and goes on"
        run_b.check_exact(3)

        os.kill(a.pid, signal.SIGCONT)
        try:
            a.wait(timeout=RESUMED_EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            a.kill()
            a.wait(timeout=30)
    finally:
        if a.poll() is None:
            os.kill(a.pid, signal.SIGCONT)
            a.kill()
            a.wait(timeout=30)
    events_a = events_of(out_a.read_text())
    assert batches_of(events_a) == [(0, False)], "the zombie reported no commit"
    assert a.returncode != 0, "the zombie's query failed (or it was killed)"
    errors = [(e["batch_id"], e["type"], e["message"]) for e in events_a if e["event"] == "error"]
    stderr = err_a.read_text(errors="replace")[-3000:]
    assert errors, f"the zombie's sink raised on resuming:\n{stderr}"
    batch, kind, _ = errors[0]
    assert (batch, kind in REFUSALS) == (1, True), f"the commit of batch 1 was refused: {errors}"
    run_b.check_exact(3)

    before, after = run_b.gc_leaves_only_committed()
    assert before > after, "the zombie's uploads of micro-batch 1 were collected"
    run_b.check_exact(3)
