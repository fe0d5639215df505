"""The README's main job (scripts/main) end to end: Spark ingests exactly once, the CLI shows the result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_main_job_ingests_exactly_once_and_the_cli_shows_it(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    job = subprocess.run(
        [sys.executable, "-m", "spark_sink", str(data_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "exactly once." in job.stdout

    streams = subprocess.run(
        [sys.executable, "-m", "s3stream", "streams", "--data-dir", str(data_dir / "engine"), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert streams.returncode == 0, streams.stderr
    listed = json.loads(streams.stdout)
    assert len(listed) >= 3  # the demo topic's three partitions
