"""Stream reassignment and zombie safety across real node processes on PostgreSQL and Ceph RGW.

Every node is a ``tests.crash.reassign_node`` process with its own data dir, all on one fresh PostgreSQL
schema and one key prefix of the Ceph RGW test bucket. Each node fsyncs every acknowledgement it gives
to its own file before answering; afterwards the streams are read back with ``s3stream.open_reader``
(metadata and objects only) and must hold every acknowledged record exactly once, at its offset.
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import s3stream
from s3stream.ids import NodeId, StreamId
from s3stream.metadata.base import StreamState
from s3stream.metadata.url import open_metadata_store
from tests.support.s3 import S3TestServer

pytestmark = pytest.mark.crash
ROOT = Path(__file__).resolve().parents[2]
LEASE_MS = 3000
"""Leases of the test nodes: long enough for a loaded machine's heartbeats to get through."""
REPLY_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class Cluster:
    tmp: Path
    metadata_url: str
    bucket_uri: str


class Node:
    """A node process; :meth:`cmd` sends one command and returns its answer line."""

    def __init__(self, cluster: Cluster, node_id: int, *, env: dict[str, str] | None = None) -> None:
        self.node_id = node_id
        self.acks_path = cluster.tmp / f"acks-{node_id}"
        args = [sys.executable, "-m", "tests.crash.reassign_node", str(cluster.tmp / f"node{node_id}"),
                cluster.metadata_url, cluster.bucket_uri, str(node_id), str(LEASE_MS), str(self.acks_path)]  # fmt: skip
        self.proc = subprocess.Popen(args, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})  # fmt: skip
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        ready = self._reply()
        assert ready.startswith("READY epoch="), ready + self._stderr()
        self.epoch = int(ready.split("=")[1])

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put("EOF")

    def _reply(self) -> str:
        try:
            return self._lines.get(timeout=REPLY_TIMEOUT_S)
        except queue.Empty:
            raise AssertionError(f"no reply from node {self.node_id}") from None

    def _stderr(self) -> str:
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return ""
        return "" if self.proc.stderr is None else self.proc.stderr.read()[-3000:]

    def cmd(self, line: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def send(self, line: str) -> None:
        """Send a command without waiting for its answer (read it with :meth:`reply`)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def reply(self) -> str:
        return self._reply()

    def ok(self, line: str) -> str:
        answer = self.cmd(line)
        assert answer.startswith("OK"), f"node {self.node_id}: {line!r} -> {answer!r}"
        return answer[3:]

    def events(self) -> list[str]:
        answer = self.ok("events")
        return answer.split(",") if answer else []

    def acks(self) -> list[tuple[int, int, str]]:
        if not self.acks_path.exists():
            return []
        rows = []
        for line in self.acks_path.read_text().splitlines():
            sid, offset, payload = line.split(" ", 2)
            rows.append((int(sid), int(offset), payload))
        return rows

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.cmd("close") == "OK closed"
            assert self.proc.wait(timeout=60) == 0, self._stderr()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> Cluster:
    """PostgreSQL (a fresh schema; fails without the server); ``S3STREAM_TEST_CLUSTER_METADATA=sqlite``
    runs the same tests on one SQLite file instead."""
    if os.environ.get("S3STREAM_TEST_CLUSTER_METADATA") == "sqlite":
        return Cluster(tmp_path, f"sqlite://{tmp_path / 'metadata.db'}", s3_server.uri(s3_prefix))
    return Cluster(tmp_path, request.getfixturevalue("pg_url"), s3_server.uri(s3_prefix))


@pytest.fixture
def nodes() -> Iterator[list[Node]]:
    """Every node a test starts is killed at the end if it is still running."""
    started: list[Node] = []
    yield started
    for node in started:
        node.proc.send_signal(signal.SIGCONT)
        node.kill()


def wait_for(predicate: object, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def read_back(cluster: Cluster, stream_ids: list[int]) -> dict[int, list[tuple[int, str]]]:
    """Every stream's records as (offset, payload), from metadata and objects alone."""

    async def read() -> dict[int, list[tuple[int, str]]]:
        reader = await s3stream.open_reader(bucket_uri=cluster.bucket_uri, metadata_url=cluster.metadata_url)
        try:
            out: dict[int, list[tuple[int, str]]] = {}
            for sid in stream_ids:
                meta = await reader.metadata.describe_stream(sid)  # type: ignore[arg-type]
                records, offset = [], meta.start_offset
                while offset < meta.end_offset:
                    for batch in await reader.fetch(sid, offset, meta.end_offset):  # type: ignore[arg-type]
                        records.append((batch.base_offset, batch.payload.decode()))
                        offset = batch.base_offset + batch.count
                out[sid] = records
            return out
        finally:
            await reader.close()

    return asyncio.run(read())


def assert_exactly_once(acked: list[tuple[int, int, str]], stored: dict[int, list[tuple[int, str]]]) -> None:
    """Every acknowledged record is stored once at its offset; offsets are contiguous."""
    for sid, records in stored.items():
        offsets = [o for o, _ in records]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))) if offsets else True, sid
        payloads = [p for _, p in records]
        assert len(set(payloads)) == len(payloads), f"stream {sid}: a record stored twice"
    for sid, offset, payload in acked:
        assert (offset, payload) in stored[sid], f"acknowledged record {payload!r} at {sid}/{offset} is lost"


def test_a_reassigned_stream_moves_to_the_target_with_every_acknowledged_record(
    cluster: Cluster, nodes: list[Node]
) -> None:
    one = Node(cluster, 1)
    nodes.append(one)
    two = Node(cluster, 2)
    nodes.append(two)
    sid = int(one.ok("create"))
    one.ok(f"open {sid}")
    for i in range(5):
        assert one.ok(f"append {sid} a{i}") == str(i)
    moved_at = time.monotonic()
    one.ok(f"reassign {sid} 2")
    took_s = time.monotonic() - moved_at
    wait_for(lambda: f"gained:{sid}" in two.events(), "the target's gained event")
    assert f"lost:{sid}" in one.events()
    assert one.cmd(f"append {sid} late") == "ERR MovedError 2"
    assert two.ok(f"append {sid} b0") == "5"
    # A third party opening the stream while node 2 holds it is told who owns it.
    assert one.cmd(f"open {sid}") == "ERR NotOwnerError 2"
    one.close()
    two.close()
    stored = read_back(cluster, [sid])
    assert [p for _, p in stored[sid]] == ["a0", "a1", "a2", "a3", "a4", "b0"]
    assert_exactly_once(one.acks() + two.acks(), stored)
    print(f"one stream moved in {took_s:.3f} s")


def test_a_hundred_streams_move_under_load_and_nothing_acknowledged_is_lost(
    cluster: Cluster, nodes: list[Node]
) -> None:
    one = Node(cluster, 1)
    nodes.append(one)
    two = Node(cluster, 2)
    nodes.append(two)
    sids = [int(one.ok("create")) for _ in range(100)]
    for sid in sids:
        one.ok(f"open {sid}")
        one.ok(f"append {sid} first-{sid}")
    one.ok(f"flood {sids[0]} f 8")  # appends in flight on one of them while everything moves
    time.sleep(0.3)
    moved_at = time.monotonic()
    one.ok(f"reassign {','.join(map(str, sids))} 2")
    took_s = time.monotonic() - moved_at
    summary = one.ok("stop")
    assert "MovedError" in summary, summary
    wait_for(lambda: sum(e.startswith("gained:") for e in two.events()) == 100, "100 gained events")
    assert one.ok("owned") == ""
    assert sorted(int(e.split(":")[1]) for e in one.events() if e.startswith("lost:")) == sids
    for sid in sids[:5]:
        two.ok(f"append {sid} after-{sid}")
    one.close()
    two.close()
    stored = read_back(cluster, sids)
    assert_exactly_once(one.acks() + two.acks(), stored)
    assert all(stored[sid][0][1] == f"first-{sid}" for sid in sids)
    print(f"100 streams moved in {took_s:.3f} s ({summary})")


def stream_state(cluster: Cluster, sid: int) -> tuple[int, int]:
    """(state, node of the last range) of a stream, read from the shared metadata."""

    async def read() -> tuple[int, int]:
        store = await open_metadata_store(cluster.metadata_url, read_only=True)
        try:
            meta = await store.describe_stream(sid)  # type: ignore[arg-type]
            return int(meta.state), meta.ranges[-1].node_id if meta.ranges else -1
        finally:
            await store.close()

    return asyncio.run(read())


def test_a_move_to_a_slow_target_completes_once_it_runs_again(cluster: Cluster, nodes: list[Node]) -> None:
    one = Node(cluster, 1)
    nodes.append(one)
    two = Node(cluster, 2)
    nodes.append(two)
    sid = int(one.ok("create"))
    one.ok(f"open {sid}")
    one.ok(f"append {sid} x0")
    two.proc.send_signal(signal.SIGSTOP)  # the target stalls (well within its lease)
    one.send(f"reassign {sid} 2")
    wait_for(
        lambda: stream_state(cluster, sid) == (int(StreamState.CLOSED), 1), "the owner to close the stream"
    )
    time.sleep(0.5)
    assert stream_state(cluster, sid) == (int(StreamState.CLOSED), 1)  # nobody else took it meanwhile
    two.proc.send_signal(signal.SIGCONT)
    assert one.reply() == "OK"
    wait_for(lambda: f"gained:{sid}" in two.events(), "the target's gained event")
    assert two.ok(f"append {sid} x1") == "1"
    one.close()
    two.close()
    stored = read_back(cluster, [sid])
    assert [p for _, p in stored[sid]] == ["x0", "x1"]


def test_two_racing_reassignments_of_one_stream_leave_exactly_one_owner(
    cluster: Cluster, nodes: list[Node]
) -> None:
    one, two, three = Node(cluster, 1), Node(cluster, 2), Node(cluster, 3)
    nodes.extend((one, two, three))
    sid = int(one.ok("create"))
    one.ok(f"open {sid}")
    one.ok(f"append {sid} r0")

    async def race() -> None:
        stores = [await open_metadata_store(cluster.metadata_url) for _ in range(2)]
        try:
            await asyncio.gather(
                *(
                    s.request_reassign(stream_ids=[StreamId(sid)], to_node_id=NodeId(n))
                    for s, n in zip(stores, (2, 3), strict=True)
                )
            )
        finally:
            for store in stores:
                await store.close()

    asyncio.run(race())
    wait_for(lambda: stream_state(cluster, sid)[1] in (2, 3) and stream_state(cluster, sid)[0] == int(StreamState.OPENED),
             "the stream to be open on one target")  # fmt: skip
    time.sleep(1.0)  # a second move, were there one, would be under way by now
    state, owner = stream_state(cluster, sid)
    assert state == int(StreamState.OPENED)
    owners = [n.node_id for n in (one, two, three) if str(sid) in n.ok("owned").split(",")]
    assert owners == [owner]
    target = two if owner == 2 else three
    assert target.ok(f"append {sid} r1") == "1"
    for node in (one, two, three):
        node.close()
    assert [p for _, p in read_back(cluster, [sid])[sid]] == ["r0", "r1"]


def test_a_node_paused_past_its_lease_acknowledges_nothing_after_it_resumes(
    cluster: Cluster, nodes: list[Node]
) -> None:
    one = Node(cluster, 1)
    nodes.append(one)
    sid = int(one.ok("create"))
    one.ok(f"open {sid}")
    one.ok(f"flood {sid} z 8")  # eight appends in flight at any time
    wait_for(lambda: len(one.acks()) >= 20, "some acknowledged appends")
    one.proc.send_signal(signal.SIGSTOP)
    time.sleep(0.2)  # a write the kernel had under way lands in the file now
    before = one.acks()
    time.sleep(2 * LEASE_MS / 1000)
    assert one.acks() == before
    one.proc.send_signal(signal.SIGCONT)
    time.sleep(1.0)  # every append in flight completes, later ones are refused
    summary = one.ok("stop")
    assert one.acks() == before, "a paused node acknowledged appends after its lease ended"
    kinds = dict(kv.split(":") for kv in summary.split("kinds=")[1].split(",") if kv)
    assert set(kinds) == {"FencedError"}, summary
    assert int(kinds["FencedError"]) >= 8, summary  # at least the eight in flight
    assert one.ok("status").endswith("fenced=1")
    assert one.cmd(f"append {sid} later").startswith("ERR FencedError")
    assert one.acks() == before
