"""A micro-batch four times ``spark.driver.memory`` goes through the direct path; the driver stays flat.

A real driver subprocess (``benchmarks/workloads/_spark_big_batch.py``) writes a small micro-batch, then one of
``factor x driver memory`` of 1 KiB rows generated on the executors, to Ceph RGW. Checked: every
partition ends at exactly the rows written, and the Python driver's peak RSS after the big batch is
below 1.5x its peak after the small one (no payload byte enters it).

CI size: ``spark.driver.memory=512m`` and a 2 GiB batch (4x). ``S3STREAM_SPARK_BIG_DRIVER_MEMORY``
(e.g. ``1g``) and ``S3STREAM_SPARK_BIG_FACTOR`` set a bigger run (``1g`` x 4 = 4 GiB).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.s3 import S3TestServer

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]

JOB_MODULE = "benchmarks.workloads._spark_big_batch"
ROOT = Path(__file__).resolve().parents[2]
DRIVER_MEMORY = os.environ.get("S3STREAM_SPARK_BIG_DRIVER_MEMORY", "512m")
FACTOR = int(os.environ.get("S3STREAM_SPARK_BIG_FACTOR", "4"))


def _mib(memory: str) -> int:
    unit = memory[-1].lower()
    return int(memory[:-1]) * {"m": 1, "g": 1024}[unit]


@pytest.mark.timeout(3600)
def test_a_micro_batch_four_times_the_driver_memory_goes_through(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    mib = FACTOR * _mib(DRIVER_MEMORY)
    args = [
        sys.executable,
        "-m",
        JOB_MODULE,
        "--data-dir",
        str(tmp_path / "engine"),
        "--bucket-uri",
        s3_server.uri(s3_prefix),
        "--mib",
        str(mib),
        "--driver-memory",
        DRIVER_MEMORY,
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=3500, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(json.dumps(result))
    assert sum(result["ends"]) == 1000 + result["rows"], "every row of both micro-batches committed"
    small, big = result["driver_peak_rss_small_bytes"], result["driver_peak_rss_big_bytes"]
    assert big < 1.5 * small, f"driver peak RSS grew from {small >> 20} MiB to {big >> 20} MiB"
