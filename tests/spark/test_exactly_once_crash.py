"""SIGKILL of the Spark driver mid-batch and between the engine's commit and Spark's: exactly once.

One scenario table, run in order against one data dir and one checkpoint (each step is a fresh
driver process, ``stream_job.py``; a JVM start costs 10-15 s, so the steps share their setup):

| step | how the driver dies                                   | the sink's reader then shows (raw streams)      |
|------|-------------------------------------------------------|-------------------------------------------------|
| 1    | hook after chunk 0 of batch 1 (mid-batch)              | batch 0 only (streams: + chunk 0 of batch 1)    |
| 2    | hook after batch 3's last chunk, before Spark's commit | batches 0-3 exactly; batch 1 resumed at chunk 1 |
| 3    | external SIGKILL at a random moment (seeded)           | whole batches 0..k, no duplicates; 3 skipped    |
| 4    | clean stop after batch 7                               | batches 0..last exactly; no batch re-run        |
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from s3stream.assembly import open_sync
from spark_sink.reader import read_records
from spark_sink.topic import describe_topic, open_partitions

pytestmark = [pytest.mark.spark, pytest.mark.crash]

JOB = Path(__file__).with_name("stream_job.py")
ROWS = 300
PARTITIONS = 3


def _job_args(data_dir: Path, ckpt: Path, until: int) -> list[str]:
    return [
        sys.executable,
        str(JOB),
        "--data-dir",
        str(data_dir),
        "--checkpoint",
        str(ckpt),
        "--rows-per-batch",
        str(ROWS),
        "--until-batch",
        str(until),
        "--partitions",
        str(PARTITIONS),
        "--value-bytes",
        "200",
        "--batch-bytes-target",
        "8192",
        "--chunk-max-bytes",
        "20000",
    ]


def _run(
    data_dir: Path, ckpt: Path, until: int, *, kill_at: str | None = None
) -> tuple[int, list[dict[str, Any]]]:
    args = _job_args(data_dir, ckpt, until)
    if kill_at is not None:
        args += ["--kill-at", kill_at]
    proc = subprocess.run(
        args, env=dict(os.environ), capture_output=True, text=True, timeout=240, check=False
    )
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode not in (0, -signal.SIGKILL):
        pytest.fail(
            f"driver exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
        )
    return proc.returncode, events


def _run_and_kill(data_dir: Path, ckpt: Path, until: int, rng: random.Random) -> list[dict[str, Any]]:
    """Start the driver, wait for its first finished batch, SIGKILL it after a random delay."""
    proc = subprocess.Popen(
        _job_args(data_dir, ckpt, until),
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    events: list[dict[str, Any]] = []
    try:
        for line in proc.stdout:
            if line.startswith("{"):
                events.append(json.loads(line))
                if events[-1]["event"] == "batch":
                    break
        time.sleep(rng.uniform(0.0, 0.6))
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events.extend(json.loads(line) for line in rest.splitlines() if line.startswith("{"))
    return events


def _stored_values(data_dir: Path) -> list[int]:
    with open_sync(data_dir) as client:
        records = read_records(client, "rate")
    values: list[int] = []
    for part, recs in records.items():
        for r in recs:
            assert r.key is not None
            assert r.value is not None
            i = int(r.key)
            assert i % PARTITIONS == part
            assert r.value.startswith(f"{i}:".encode())
            values.append(i)
    return values


def _raw_record_count(data_dir: Path) -> int:
    """Records in the topic's streams, committed or not (below the sink's reader)."""
    with open_sync(data_dir) as client:
        topic = describe_topic(client, "rate")
        assert topic is not None
        return sum(s.confirm_offset for s in open_partitions(client, topic))


def _assert_no_duplicates(values: list[int]) -> None:
    dupes = len(values) - len(set(values))
    assert dupes == 0, f"{dupes} duplicate rows"


def _assert_exactly_batches(values: list[int], batch_count: int) -> None:
    _assert_no_duplicates(values)
    assert sorted(values) == list(range(batch_count * ROWS)), "missing or extra rows"


def test_sigkill_of_the_driver_loses_and_duplicates_nothing(tmp_path: Path, rng_seed: int) -> None:
    rng = random.Random(rng_seed)
    data_dir, ckpt = tmp_path / "engine", tmp_path / "checkpoint"

    # 1: killed after chunk 0 of batch 1 was committed to the engine
    code, events = _run(data_dir, ckpt, until=5, kill_at="after_chunk:1:0")
    assert code == -signal.SIGKILL
    assert [e["batch_id"] for e in events if e["event"] == "batch"] == [0]
    assert ROWS < _raw_record_count(data_dir) < 2 * ROWS, "the streams hold chunk 0 of batch 1"
    _assert_exactly_batches(_stored_values(data_dir), 1)  # ... which the reader does not show

    # 2: killed after batch 3 reached the engine but before Spark wrote commits/3
    code, events = _run(data_dir, ckpt, until=5, kill_at="after_batch:3")
    assert code == -signal.SIGKILL
    batches = [e for e in events if e["event"] == "batch"]
    assert [e["batch_id"] for e in batches] == [1, 2]
    assert 0 < batches[0]["chunks_written"] < batches[0]["chunks"], "batch 1 resumed after its chunk 0"
    _assert_exactly_batches(_stored_values(data_dir), 4)
    assert not (ckpt / "commits" / "3").exists()

    # 3: external SIGKILL at a random moment; batch 3 is replayed and skipped
    events = _run_and_kill(data_dir, ckpt, until=1000, rng=rng)
    batches = [e for e in events if e["event"] == "batch"]
    assert batches[0]["batch_id"] == 3
    assert batches[0]["chunks_written"] == 0, "the replay of a committed batch writes nothing"
    values = _stored_values(data_dir)
    _assert_exactly_batches(values, len(values) // ROWS)  # whole batches only, wherever it died

    # 4: clean run: continues from the checkpoint and ends with whole batches only
    committed = max(int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit())
    code, events = _run(data_dir, ckpt, until=committed + 3)
    assert code == 0
    batches = [e for e in events if e["event"] == "batch"]
    assert batches[0]["batch_id"] == committed + 1, "restart continues after the last committed batch"
    assert events[-1]["event"] == "stopped"
    last = max(int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit())
    values = _stored_values(data_dir)
    assert len(values) in ((last + 1) * ROWS, (last + 2) * ROWS)
    _assert_exactly_batches(values, len(values) // ROWS)
