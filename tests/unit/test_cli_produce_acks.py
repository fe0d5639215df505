"""``s3stream produce`` killed with SIGKILL: every acknowledgement it printed is a stored record.

The output of ``produce`` is the user's record of what is stored; it must stay true whatever happens
after an append was acknowledged, including the process dying before it closes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TextIO

import pytest

from tests.support.configs import cli_data_dir_args

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def engine_args(tmp_path: Path) -> list[str]:
    return cli_data_dir_args(tmp_path)


def _read_line(out: TextIO) -> str:
    line = out.readline()
    assert line, "produce exited before printing an acknowledgement"
    return line


def test_records_printed_before_a_kill_9_are_all_stored(engine_args: list[str], tmp_path: Path) -> None:
    """A real process killed while it appends: every acknowledgement it printed is a stored record."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [
        sys.executable,
        "-m",
        "s3stream",
        "produce",
        *engine_args,
        "--count",
        "200000",
        "--size",
        "64",
        "--json",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert proc.stdout is not None
    printed = [json.loads(_read_line(proc.stdout)) for _ in range(300)]
    assert proc.poll() is None, "still appending: the lines came as the records were acknowledged"
    proc.send_signal(signal.SIGKILL)
    rest = proc.stdout.read()
    proc.wait()
    printed += [json.loads(line) for line in rest.splitlines() if line.endswith("}")]
    acked = [row["offset"] for row in printed if "offset" in row]
    assert acked == list(range(len(acked)))

    fetch = [sys.executable, "-m", "s3stream", "fetch", *engine_args, "--stream", "0", "--json"]
    stored = json.loads(
        subprocess.run(fetch, capture_output=True, text=True, env=env, cwd=ROOT, check=True).stdout
    )
    assert [row["offset"] for row in stored][: len(acked)] == acked
