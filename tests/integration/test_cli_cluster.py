"""The cluster's commands as a person runs them: ``serve`` node processes, ``streams create``,
``reassign``, ``nodes``, a node killed with SIGKILL and one stopped with SIGTERM, on real PostgreSQL
metadata (a fresh schema) and the real Ceph RGW bucket (a fresh prefix). Both servers are required:
the test fails without them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.s3 import S3TestServer

REPO = Path(__file__).resolve().parents[2]
LEASE_MS = 3000
WAIT_S = 60.0


class Node:
    """A ``s3stream serve`` process whose output lines are read from a file."""

    def __init__(self, tmp: Path, node_id: int, common: list[str]) -> None:
        self.node_id = node_id
        self.out = tmp / f"node{node_id}.out"
        with self.out.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "s3stream", "serve", "--data-dir", str(tmp / f"node{node_id}"),
                 "--node-id", str(node_id), "--produce", "50", "--report-s", "1", "--json", *common],
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip

    def events(self) -> list[dict[str, object]]:
        lines = self.out.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def wait_for(self, kind: str, count: int = 1) -> list[dict[str, object]]:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            found = [e for e in self.events() if e["event"] == kind]
            if len(found) >= count:
                return found
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(
            f"node {self.node_id}: no {count} {kind!r} events; output:\n{self.out.read_text()}"
        )

    def wait_for_records(self) -> None:
        """Until a rate line counts acknowledged records."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if any(e["event"] == "rate" and int(str(e["records"])) > 0 for e in self.events()):
                return
            time.sleep(0.1)
        raise AssertionError(f"node {self.node_id}: no record acknowledged; output:\n{self.out.read_text()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def cli(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "s3stream", *argv], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done


@pytest.fixture
def common(pg_url: str, s3_server: S3TestServer, s3_prefix: str, tmp_path: Path) -> list[str]:
    return [
        "--metadata-url",
        pg_url,
        "--bucket-uri",
        s3_server.uri(s3_prefix),
        "-c",
        f"s3.node.lease.ms={LEASE_MS}",
    ]


@pytest.fixture
def nodes(tmp_path: Path, common: list[str]) -> Iterator[dict[int, Node]]:
    started: dict[int, Node] = {}
    yield started
    for node in started.values():
        node.stop()


def test_serve_reassign_nodes_and_a_killed_node_streams_come_back(
    tmp_path: Path, common: list[str], pg_url: str, nodes: dict[int, Node]
) -> None:
    meta = ["--metadata-url", pg_url]
    nodes[1] = Node(tmp_path, 1, common)
    nodes[1].wait_for("serving")
    nodes[2] = Node(tmp_path, 2, common)
    nodes[2].wait_for("serving")

    created = json.loads(cli("streams", "create", "--count", "4", "--to-node", "1", "--json", *meta).stdout)
    assert [(r["stream_id"], r["to_node"]) for r in created] == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert {e["stream_id"] for e in nodes[1].wait_for("gained", 4)} == {0, 1, 2, 3}

    moved = json.loads(cli("reassign", "--stream", "2", "3", "--to-node", "2", "--json", *meta).stdout)
    assert [(r["stream_id"], r["from_node"], r["to_node"]) for r in moved] == [(2, 1, 2), (3, 1, 2)]
    assert all(0 < float(str(r["took_ms"])) < 30_000 for r in moved)
    assert {e["stream_id"] for e in nodes[1].wait_for("lost", 2)} == {2, 3}
    assert {e["stream_id"] for e in nodes[2].wait_for("gained", 2)} == {2, 3}
    nodes[2].wait_for_records()  # node 2 appends to what it gained

    unknown = cli("reassign", "--stream", "99", "--to-node", "2", *meta, check=False)
    assert (unknown.returncode, unknown.stderr.count("\n")) == (2, 1)
    assert "stream 99" in unknown.stderr
    dead_target = cli("reassign", "--stream", "0", "--to-node", "7", *meta, check=False)
    assert dead_target.returncode == 2
    assert "node 7" in dead_target.stderr

    rows = {r["node_id"]: r for r in json.loads(cli("nodes", "--json", *meta).stdout)}
    assert (rows[1]["streams"], rows[2]["streams"]) == ([0, 1], [2, 3])
    assert rows[1]["lease"] == rows[2]["lease"] == "alive"

    nodes[1].stop()  # SIGKILL: its lease lapses, the controller hands its streams to node 2
    gained = nodes[2].wait_for("gained", 4)
    assert {e["stream_id"] for e in gained} == {0, 1, 2, 3}
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        rows = {r["node_id"]: r for r in json.loads(cli("nodes", "--json", *meta).stdout)}
        takeover = rows[1]["takeover"]
        if takeover is not None and takeover["state"] == "DONE" and rows[2]["streams"] == [0, 1, 2, 3]:
            break
        time.sleep(0.2)
    assert takeover is not None, rows
    assert (takeover["state"], takeover["taker"], takeover["streams"]) == ("DONE", 2, [0, 1])
    text = cli("nodes", *meta).stdout
    assert "takeovers (0 in flight)" in text
    assert "DONE" in text

    nodes[2].process.send_signal(signal.SIGTERM)
    assert nodes[2].process.wait(timeout=WAIT_S) == 0
    closed = nodes[2].wait_for("closed")
    assert int(str(closed[0]["records"])) > 0
    streams = json.loads(cli("streams", "--json", *meta).stdout)
    assert [s["state"] for s in streams] == ["CLOSED"] * 4  # a clean close closes what it held


def test_a_second_session_of_a_node_id_fences_the_first_which_exits_2(
    tmp_path: Path, common: list[str], pg_url: str, nodes: dict[int, Node]
) -> None:
    nodes[1] = Node(tmp_path, 1, common)
    nodes[1].wait_for("serving")
    cli("streams", "create", "--count", "1", "--to-node", "1", "--metadata-url", pg_url)
    nodes[1].wait_for_records()
    # The same node id from another data dir: open_node issues a newer epoch, fencing the first.
    second = Node(tmp_path / "again", 1, common) if (tmp_path / "again").mkdir() is None else None
    assert second is not None
    nodes[11] = second
    second.wait_for("serving")
    assert nodes[1].process.wait(timeout=WAIT_S) == 2
    assert "was fenced" in nodes[1].out.read_text()
    os.kill(second.process.pid, signal.SIGTERM)
    assert second.process.wait(timeout=WAIT_S) == 0
