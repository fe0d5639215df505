"""KV on shared metadata across processes (nodes 1 and 2, own WALs, one SQLite metadata file and one
bucket): a restart after kill -9 replays its WAL without undoing another node's newer KV change."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.crash
ROOT = Path(__file__).resolve().parents[2]


def node_args(tmp: Path, node_id: int, *action: str) -> list[str]:
    return [sys.executable, "-m", "tests.crash.kv_node", str(tmp / f"node{node_id}"), str(tmp), str(node_id),
            *action]  # fmt: skip


def run_node(tmp: Path, node_id: int, *action: str) -> list[str]:
    done = subprocess.run(
        node_args(tmp, node_id, *action), cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split("\n")[:-1]


def put_and_kill(tmp: Path, node_id: int, key: str, value: str) -> None:
    """``put-hold`` on node ``node_id``; SIGKILL once the put is acknowledged."""
    proc = subprocess.Popen(
        node_args(tmp, node_id, "put-hold", key, value),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line == "PUT\n", (line, proc.stderr.read() if proc.stderr else "")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def test_a_replay_after_kill_does_not_undo_another_nodes_newer_put(tmp_path: Path) -> None:
    put_and_kill(tmp_path, 1, "k", "old")
    assert run_node(tmp_path, 2, "get", "k") == ["GET old", "REPLAYED 0"]  # acknowledged: seen on node 2
    assert run_node(tmp_path, 2, "put", "k", "new") == ["PUT"]
    # Node 1 restarts: its WAL still holds the put of "old" (behind the batch it keeps untrimmed) and
    # replays the batch, but not the put that was applied before the crash.
    assert run_node(tmp_path, 1, "get", "k") == ["GET new", "REPLAYED 1"]
    assert run_node(tmp_path, 2, "get", "k") == ["GET new", "REPLAYED 0"]
