"""SIGKILL of a driver reading with the ``s3stream`` source: the restart continues exactly.

The topic is written first (the sink, closed: all uploaded); then ``tests/spark/source_job.py``
reads it in micro-batches of 300 records into one parquet directory per micro-batch. It is killed
after a micro-batch's output is written but before Spark records the commit, and at a random
moment; each restart from the checkpoint must replay the same offsets for the unfinished
micro-batch and go on from there: at the end the output holds every record once.
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

from tests.spark.source_support import TopicEnv, keys_of, topic_env, write_batches
from tests.support.s3 import S3TestServer

ROOT = Path(__file__).resolve().parents[2]
ROWS = 1200
JOB_TIMEOUT_S = 600


def _job(env: TopicEnv, ckpt: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "tests" / "spark" / "source_job.py"),
        "--metadata-url",
        env.metadata_url,
        "--bucket-uri",
        env.bucket_uri,
        "--checkpoint",
        str(ckpt),
        "--out",
        str(out),
        *extra,
    ]


def _env() -> dict[str, str]:
    """This checkout first on the path (the job and its Python workers import ``spark_sink`` from it)."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}


def _events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _run(args: list[str]) -> tuple[int, list[dict[str, Any]]]:
    proc = subprocess.run(
        args, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False
    )
    if proc.returncode not in (0, -signal.SIGKILL):
        print(proc.stderr[-5000:])
    return proc.returncode, _events(proc.stdout)


def _output(spark: Any, out: Path) -> Any:
    return spark.read.parquet(*[str(p) for p in sorted(out.glob("batch=*"))])


def test_sigkill_before_the_commit_replays_the_same_offsets(
    spark: Any, tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    env = topic_env(tmp_path, s3_server.uri(s3_prefix))
    write_batches(env, spark, "w", [(0, 0, 500), (1, 500, 700)])
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"

    code, first = _run(_job(env, ckpt, out, "--kill-at-batch", "1"))
    assert code == -signal.SIGKILL
    assert [e["batch_id"] for e in first if e["event"] == "batch"] == [0, 1]
    code, second = _run(_job(env, ckpt, out))
    assert code == 0
    replayed = [e for e in second if e["event"] == "batch"]
    assert replayed[0]["batch_id"] == 1
    assert replayed[0]["ranges"] == first[1]["ranges"]  # the replay of batch 1 read the same offsets
    assert sum(e["rows"] for e in first[:1] + replayed) == ROWS
    assert keys_of(_output(spark, out)) == list(range(ROWS))


def test_sigkill_at_a_random_moment(
    spark: Any, tmp_path: Path, s3_server: S3TestServer, s3_prefix: str, rng_seed: int
) -> None:
    env = topic_env(tmp_path, s3_server.uri(s3_prefix))
    write_batches(env, spark, "w", [(0, 0, ROWS)])
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    rng = random.Random(rng_seed)
    proc = subprocess.Popen(
        _job(env, ckpt, out, "--kill-at-batch", "1000"),
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + JOB_TIMEOUT_S
    line = proc.stdout.readline()  # the first micro-batch is done
    assert line.startswith("{"), line
    time.sleep(rng.uniform(0.0, 3.0))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    code, _ = _run(_job(env, ckpt, out))
    assert code == 0
    assert keys_of(_output(spark, out)) == list(range(ROWS))
