"""Failover of a dead node across real processes: kill -9, SIGSTOP, a taker killed mid-way.

Every node is a ``tests.crash.cluster_node`` process on its own data dir; all share one metadata store
and one bucket: PostgreSQL (a fresh schema of the test server) and the Ceph RGW test bucket (a fresh
prefix), as in production; the main scenario also runs on one SQLite file and a local bucket. Records
are appended and acknowledged but never uploaded by their node (uploads only when asked), so
everything the checks find again came through the taker's replay of the dead node's WAL.
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from s3stream.metadata.base import TakeoverInfo, TakeoverState
from s3stream.metadata.url import open_metadata_store

pytestmark = pytest.mark.crash
ROOT = Path(__file__).resolve().parents[2]
LEASE_MS = 2500
"""Leases of the test nodes: long enough for a loaded machine's heartbeats to get through."""
REPLY_TIMEOUT_S = 60.0
FAILOVER_TIMEOUT_S = 60.0
"""Longest wait for a takeover to end (lease + controller election + replay, on a loaded machine)."""
RECORD_BYTES = 200


@dataclass(frozen=True)
class Cluster:
    """What the nodes of a test share: a directory (their data dirs), the metadata URL, the bucket."""

    tmp: Path
    metadata_url: str
    bucket_uri: str


class Node:
    """A node process; :meth:`cmd` sends one command and returns its answer (event lines aside)."""

    def __init__(self, cluster: Cluster, name: str, node_id: int, *extra: str) -> None:
        self.name = name
        args = [sys.executable, "-m", "tests.crash.cluster_node", str(cluster.tmp / name), cluster.metadata_url,
                cluster.bucket_uri, str(node_id), str(LEASE_MS), *extra]  # fmt: skip
        self.proc = subprocess.Popen(args, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)  # fmt: skip
        self.events: list[tuple[str, int, float]] = []
        """(kind, stream id, wall time s) of every assignment event, in order."""
        self.notes: list[str] = []
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        ready = self._reply()
        assert ready.startswith("READY epoch="), ready + self._stderr()
        self.epoch = int(ready.split("=")[1])

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("EVENT "):
                _, kind, sid, at = line.split()
                self.events.append((kind, int(sid), float(at)))
            elif line.startswith(("KILLING", "HOLDING")):
                self.notes.append(line.strip())
            else:
                self._lines.put(line.rstrip("\n"))
        self._lines.put("EOF")

    def _reply(self) -> str:
        try:
            return self._lines.get(timeout=REPLY_TIMEOUT_S)
        except queue.Empty:
            raise AssertionError(f"no reply from node {self.name}: " + self._stderr()) from None

    def _stderr(self) -> str:
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return ""
        return "" if self.proc.stderr is None else self.proc.stderr.read()[-4000:]

    def cmd(self, line: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def ok(self, line: str) -> str:
        answer = self.cmd(line)
        assert answer.startswith("OK"), f"{self.name}: {line} -> {answer}"
        return answer[3:]

    def status(self) -> dict[str, int]:
        return {k: int(v) for k, v in (kv.split("=") for kv in self.ok("status").split())}

    def gained(self) -> set[int]:
        return {sid for kind, sid, _ in self.events if kind == "gained"}

    def read(self, stream_id: int) -> list[str]:
        answer = self.ok(f"read {stream_id}")
        start, _, payloads = answer.partition(" ")
        assert start == "0"
        return payloads.split(",") if payloads else []

    def close(self) -> None:
        assert self.cmd("close") == "OK closed"
        assert self.proc.wait(timeout=60) == 0, self._stderr()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=60)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)


@pytest.fixture
def nodes() -> list[Node]:
    """Every node a test starts (append it); killed after the test whatever happened."""
    started: list[Node] = []
    yield started  # type: ignore[misc]
    for node in started:
        node.proc.send_signal(signal.SIGCONT) if node.proc.poll() is None else None
        node.stop()


@pytest.fixture
def pg_ceph(tmp_path: Path, pg_url: str, s3_server: object, s3_prefix: str) -> Cluster:
    """A fresh PostgreSQL schema and a fresh prefix of the Ceph RGW test bucket."""
    from tests.support.s3 import S3TestServer

    assert isinstance(s3_server, S3TestServer)
    return Cluster(tmp_path, pg_url, s3_server.uri(s3_prefix))


@pytest.fixture(params=["postgresql-s3", "sqlite-file"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Cluster:
    if request.param == "sqlite-file":
        return Cluster(tmp_path, f"sqlite://{tmp_path / 'metadata.db'}", f"file://{tmp_path / 'objects'}")
    result: Cluster = request.getfixturevalue("pg_ceph")
    return result


def wait_for(predicate: Callable[[], object], what: str, timeout_s: float = FAILOVER_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def takeovers(cluster: Cluster) -> list[TakeoverInfo]:
    async def read() -> list[TakeoverInfo]:
        store = await open_metadata_store(cluster.metadata_url)
        try:
            return await store.list_takeovers()
        finally:
            await store.close()

    return asyncio.run(read())


def payloads(stream_id: int, count: int, start: int = 0) -> list[str]:
    return [f"{stream_id}-{i}-".ljust(RECORD_BYTES, "x") for i in range(start, start + count)]


def fill(node: Node, stream_id: int, count: int) -> None:
    assert node.ok(f"fill {stream_id} {count} {RECORD_BYTES}") == str(count - 1)


def test_a_killed_node_s_acknowledged_records_come_back_open_on_another_node(
    cluster: Cluster, nodes: list[Node]
) -> None:
    victim = Node(cluster, "n1", 1)
    nodes.append(victim)
    taker = Node(cluster, "n2", 2)
    nodes.append(taker)
    streams = [int(victim.ok("create")) for _ in range(3)]
    for sid in streams:
        victim.ok(f"open {sid} 0")
    victim.ok("upload")  # nothing yet: the streams' objects start empty
    for sid in streams:
        fill(victim, sid, 40)  # acknowledged, in the WAL only
    killed_at = time.time()
    victim.kill()
    wait_for(lambda: taker.gained() >= set(streams), "the taker to open the dead node's streams")
    assert taker.ok(f"append {streams[0]} after") == "40"
    failover_s = time.time() - killed_at
    print(f"failover time (kill -9 to the first append acknowledged elsewhere): {failover_s:.2f} s, "
          f"lease {LEASE_MS} ms")  # fmt: skip
    for sid in streams:
        expected = payloads(sid, 40) + (["after"] if sid == streams[0] else [])
        assert taker.read(sid) == expected
    [done] = [t for t in takeovers(cluster) if t.node_id == 1]
    assert (done.state, done.taker_node_id, done.attempt) == (TakeoverState.DONE, 2, 1)
    assert taker.status()["takeovers"] == 1

    # The dead node restarts: it owns nothing any more and replays nothing twice.
    victim = Node(cluster, "n1", 1)
    nodes.append(victim)
    status = victim.status()
    assert status["recovered"] == 0
    assert victim.ok("held") == ""
    assert victim.cmd(f"open {streams[1]} 99").startswith("ERR NotOwnerError")
    taker.ok(f"append {streams[1]} later")
    assert taker.read(streams[1]) == [*payloads(streams[1], 40), "later"]
    victim.close()
    taker.close()


def test_a_resumed_zombie_is_fenced_and_nothing_it_uploads_becomes_visible(
    pg_ceph: Cluster, nodes: list[Node]
) -> None:
    cluster = pg_ceph
    taker = Node(cluster, "n2", 2)
    nodes.append(taker)
    zombie = Node(cluster, "n1", 1, "--hold-before-commit", "4")
    nodes.append(zombie)
    sid = int(zombie.ok("create"))
    zombie.ok(f"open {sid} 0")
    fill(zombie, sid, 30)
    assert zombie.proc.stdin is not None
    zombie.proc.stdin.write("upload\n")  # its objects are written, then the commit waits 4 s
    zombie.proc.stdin.flush()
    wait_for(lambda: zombie.notes, "the zombie's upload to reach its commit", 30)
    zombie.proc.send_signal(signal.SIGSTOP)
    wait_for(
        lambda: any(t.node_id == 1 and t.state == TakeoverState.DONE for t in takeovers(cluster)),
        "the takeover of the stopped node",
    )
    wait_for(lambda: sid in taker.gained(), "the taker to open the stream")
    zombie.proc.send_signal(signal.SIGCONT)
    assert zombie._reply().startswith("ERR FencedError")  # the held upload's commit was refused
    for i in range(3):
        assert zombie.cmd(f"append {sid} zombie{i}").startswith("ERR FencedError")
    assert zombie.cmd("upload").startswith("ERR FencedError")
    assert zombie.status()["fenced"] == 1
    assert taker.read(sid) == payloads(sid, 30)
    taker.ok(f"append {sid} after")
    taker.ok("upload")
    assert taker.read(sid) == [*payloads(sid, 30), "after"]
    zombie.close()
    taker.close()
