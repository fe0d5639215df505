"""kill -9 of an engine that interleaves WAL KV puts with external commits: the restart replays its WAL
(batches and KV records) without reverting the keys the external commits wrote, and every batch of both
paths reads back once, in offset order."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.crash
ROOT = Path(__file__).resolve().parents[2]


def node(data_dir: Path, action: str) -> list[str]:
    return [sys.executable, "-m", "tests.crash.direct_commit_node", str(data_dir), action]


def test_a_wal_replay_after_kill_never_reverts_an_external_commits_kv(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        node(tmp_path, "commit-hold"), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line == "READY\n", (line, proc.stderr.read() if proc.stderr else "")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    done = subprocess.run(
        node(tmp_path, "check"), cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")[:-1]
    assert lines[0] == "REPLAYED 2"  # the last two WAL batches were only in the WAL
    assert lines[1] == "KV wal-3 2"
    sources = ["wal"] * 3 + ["ext"] * 3 + ["wal"] * 2 + ["ext"] * 4 + ["wal"] * 2
    assert lines[2:] == [f"BATCH {o} {s}-{o}" for o, s in enumerate(sources)]
