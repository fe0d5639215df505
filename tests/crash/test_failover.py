"""Failover of a dead node across real processes: kill -9, SIGSTOP, a taker killed mid-way.

Every node is a ``tests.crash.cluster_node`` process on its own data dir; all share one metadata store
and one bucket: PostgreSQL (a fresh schema of the test server) and the Ceph RGW test bucket (a fresh
prefix), as in production; the main scenario also runs on one SQLite file and a local bucket. Records
are appended and acknowledged but never uploaded by their node (uploads only when asked), so
everything the checks find again came through the taker's replay of the dead node's WAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from compaction.gc import GarbageCollector
from s3stream.errors import InvalidArgumentError
from s3stream.ids import StreamId
from s3stream.metadata.base import ObjectState, TakeoverInfo, TakeoverState
from s3stream.metadata.url import open_metadata_store
from s3stream.objectformat import parse_object_key
from s3stream.storage.uri import open_storage

pytestmark = pytest.mark.crash
ROOT = Path(__file__).resolve().parents[2]
LEASE_MS = 2500
"""Leases of the test nodes: long enough for a loaded machine's heartbeats to get through."""
REPLY_TIMEOUT_S = 60.0
FAILOVER_TIMEOUT_S = 60.0
"""Longest wait for a takeover to end (lease + controller election + replay, on a loaded machine)."""
RECORD_BYTES = 200
NAMESPACE = "s3stream"


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
def nodes() -> Iterator[list[Node]]:
    """Every node a test starts (append it); killed after the test whatever happened."""
    started: list[Node] = []
    yield started
    for node in started:
        if node.proc.poll() is None:
            node.proc.send_signal(signal.SIGCONT)
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


def object_ids(cluster: Cluster) -> set[int]:
    """The ids of the object keys in the bucket (the metadata copy and other keys aside)."""

    async def read() -> set[int]:
        storage = open_storage(cluster.bucket_uri)
        try:
            ids = set()
            async for info in storage.list(""):
                with contextlib.suppress(InvalidArgumentError):
                    ids.add(parse_object_key(info.key)[0])
            return ids
        finally:
            await storage.close()

    return asyncio.run(read())


def object_states(cluster: Cluster) -> dict[int, ObjectState]:
    async def read() -> dict[int, ObjectState]:
        store = await open_metadata_store(cluster.metadata_url)
        try:
            return {int(o.object_id): o.state for o in await store.list_objects()}
        finally:
            await store.close()

    return asyncio.run(read())


def collect_garbage(cluster: Cluster, *, clock_ahead_ms: int) -> None:
    """One GC pass with an orphan scan, its clock ``clock_ahead_ms`` ahead (prepared objects older
    than that expire), deleting at once what it marks."""

    async def run() -> None:
        store = await open_metadata_store(cluster.metadata_url)
        storage = open_storage(cluster.bucket_uri)
        try:
            gc = GarbageCollector(
                store, storage, namespace=NAMESPACE, retention_ms=0, orphan_ttl_ms=0,
                clock_ms=lambda: int(time.time() * 1000) + clock_ahead_ms,
            )  # fmt: skip
            await gc.collect(scan_orphans=True)
        finally:
            await storage.close()
            await store.close()

    asyncio.run(run())


def end_offsets(cluster: Cluster, stream_ids: list[int]) -> list[int]:
    async def read() -> list[int]:
        store = await open_metadata_store(cluster.metadata_url)
        try:
            return [(await store.describe_stream(StreamId(sid))).end_offset for sid in stream_ids]
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
    before = object_ids(cluster)
    assert zombie.proc.stdin is not None
    zombie.proc.stdin.write("upload\n")  # its objects are written, then the commit waits 4 s
    zombie.proc.stdin.flush()
    wait_for(lambda: zombie.notes, "the zombie's upload to reach its commit", 30)
    zombie.proc.send_signal(signal.SIGSTOP)
    written = object_ids(cluster) - before
    assert written, "the zombie wrote its objects before its commit"
    wait_for(
        lambda: any(t.node_id == 1 and t.state == TakeoverState.DONE for t in takeovers(cluster)),
        "the takeover of the stopped node",
    )
    wait_for(lambda: sid in taker.gained(), "the taker to open the stream")
    zombie.proc.send_signal(signal.SIGCONT)
    assert zombie._reply().startswith("ERR FencedError")  # the held upload's commit was refused
    for i in range(3):
        answer = zombie.cmd(f"append {sid} zombie{i}")
        assert answer.startswith("ERR FencedError"), answer + zombie._stderr()
    assert zombie.cmd("upload").startswith("ERR FencedError")
    assert zombie.status()["fenced"] == 1
    assert taker.read(sid) == payloads(sid, 30)
    taker.ok(f"append {sid} after")
    taker.ok("upload")
    assert taker.read(sid) == [*payloads(sid, 30), "after"]
    zombie.close()
    states = object_states(cluster)
    assert all(states.get(oid) != ObjectState.COMMITTED for oid in written), "a fenced upload was committed"
    # Past the prepared TTL (1 h) GC removes what the zombie wrote; everything committed stays.
    collect_garbage(cluster, clock_ahead_ms=2 * 3600 * 1000)
    assert not written & object_ids(cluster)
    assert taker.read(sid) == [*payloads(sid, 30), "after"]
    taker.close()


ATTACH_SCRIPT = """#!/bin/sh
# The attach command of the test: "attach" node $1's WAL $2 by copying it to a directory of this node.
set -e
mkdir -p "$3/node-$1"
cp "$2" "$3/node-$1/wal"
echo "attached node $1"
echo "$3/node-$1/wal"
"""


def test_a_taker_killed_mid_way_leaves_a_takeover_that_another_taker_finishes(
    pg_ceph: Cluster, nodes: list[Node]
) -> None:
    cluster = pg_ceph
    victim = Node(cluster, "n1", 1)
    nodes.append(victim)
    first_taker = Node(cluster, "n2", 2, "--kill-at", "after_commit", "--threshold", str(64 * 1024))
    nodes.append(first_taker)
    streams = [int(victim.ok("create")) for _ in range(3)]
    for sid in streams:
        victim.ok(f"open {sid} 0")
    for sid in streams:
        fill(victim, sid, 300)  # 180 KB in all: several upload groups of 64 KiB
    victim.kill()
    wait_for(lambda: first_taker.proc.poll() is not None, "the first taker to die after its first commit")
    assert first_taker.notes == ["KILLING at after_commit"]
    [running] = [t for t in takeovers(cluster) if t.node_id == 1]
    assert (running.state, running.taker_node_id, running.attempt) == (TakeoverState.RUNNING, 2, 1)
    committed = sum(end_offsets(cluster, streams))
    assert 0 < committed < 900, f"the first taker committed part of the WAL ({committed} of 900 records)"

    script = cluster.tmp / "attach.sh"
    script.write_text(ATTACH_SCRIPT)
    script.chmod(0o755)
    attach = f"{script} {{node_id}} {{wal_path}} {cluster.tmp / 'attached'}"
    second_taker = Node(cluster, "n3", 3, "--attach", attach)
    nodes.append(second_taker)
    wait_for(lambda: second_taker.gained() >= set(streams), "the second taker to open the streams")
    [done] = [t for t in takeovers(cluster) if t.node_id == 1]
    assert (done.state, done.taker_node_id, done.attempt) == (TakeoverState.DONE, 3, 2)
    assert (cluster.tmp / "attached" / "node-1" / "wal").exists(), "the attach command ran"
    for sid in streams:
        assert second_taker.read(sid) == payloads(sid, 300)  # each record once, none lost
        assert second_taker.ok(f"append {sid} next") == "300"
    second_taker.close()


def test_a_dead_node_restarted_during_its_takeover_waits_for_it_and_replays_nothing(
    pg_ceph: Cluster, nodes: list[Node]
) -> None:
    cluster = pg_ceph
    victim = Node(cluster, "n1", 1)
    nodes.append(victim)
    # The hold outlasts the restarted process's start-up (a few seconds here), so its open_node comes
    # while the takeover is RUNNING.
    taker = Node(cluster, "n2", 2, "--hold-at", "after_streams_taken", "--hold-s", "12")
    nodes.append(taker)
    sid = int(victim.ok("create"))
    victim.ok(f"open {sid} 0")
    fill(victim, sid, 50)
    victim.kill()
    wait_for(lambda: taker.notes == ["HOLDING at after_streams_taken"], "the taker to hold its takeover")
    victim = Node(cluster, "n1", 1)  # its open waits while the takeover is in flight
    ready_ms = time.time() * 1000
    nodes.append(victim)
    [done] = [t for t in takeovers(cluster) if t.node_id == 1]
    assert done.state == TakeoverState.DONE, "the dead node opened while its WAL was being taken over"
    assert done.updated_at_ms <= ready_ms + 100, "the restarted node was ready before the takeover ended"
    assert victim.status()["recovered"] == 0
    assert victim.ok("held") == ""
    wait_for(lambda: sid in taker.gained(), "the taker to open the stream")
    assert taker.read(sid) == payloads(sid, 50)
    victim.close()
    taker.close()
