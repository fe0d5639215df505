"""Node sessions across real processes: DB-issued epochs, fencing by a newer open or a lost lease, one
maintenance node at a time, and an orphan scan that never deletes another node's objects.

Every node is a ``tests.crash.node_driver`` process on its own data dir; all share one metadata store
(``s3.metadata.url``: a SQLite file, or a fresh schema of the PostgreSQL test server) and one bucket
(``file://``). Each test runs on both.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from s3stream.ids import NodeId, ObjectId
from s3stream.metadata.base import ObjectState
from s3stream.metadata.url import open_metadata_store
from s3stream.objectformat import object_key, parse_object_key
from s3stream.storage.local import LocalObjectStorage

pytestmark = pytest.mark.crash
ROOT = Path(__file__).resolve().parents[2]
LEASE_MS = 2500
"""Leases of the test nodes: long enough for a loaded machine's heartbeats to get through."""
NAMESPACE = "s3stream"
REPLY_TIMEOUT_S = 60.0


class Node:
    """A node process; :meth:`cmd` sends one command and returns its answer (``MAINT`` lines aside)."""

    def __init__(
        self, cluster: Cluster, name: str, node_id: int, *, watch: bool = False, clock_offset_s: float = 0.0
    ) -> None:
        tmp = cluster.tmp
        args = [sys.executable, "-m", "tests.crash.node_driver", str(tmp / name), cluster.metadata_url,
                f"file://{tmp / 'objects'}", str(node_id), str(LEASE_MS)]  # fmt: skip
        if watch:
            args.append("--watch")
        env = dict(os.environ)
        if clock_offset_s:
            env["S3STREAM_TEST_CLOCK_OFFSET_S"] = str(clock_offset_s)
        self.proc = subprocess.Popen(args, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
        self.maint: list[tuple[int, float]] = []
        """(running, wall time s) transitions of its maintenance jobs (with ``watch``)."""
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        ready = self._reply()
        assert ready.startswith("READY epoch="), ready + self._stderr()
        self.epoch = int(ready.split("=")[1])

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("MAINT "):
                _, running, at = line.split()
                self.maint.append((int(running), float(at)))
            else:
                self._lines.put(line.rstrip("\n"))
        self._lines.put("EOF")

    def _reply(self) -> str:
        try:
            return self._lines.get(timeout=REPLY_TIMEOUT_S)
        except queue.Empty:
            raise AssertionError("no reply from node: " + self._stderr()) from None

    def _stderr(self) -> str:
        """The end of its stderr once it has exited (waits a little for an exit under way)."""
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

    def status(self) -> dict[str, int]:
        answer = self.cmd("status")
        assert answer.startswith("OK "), answer
        return {k: int(v) for k, v in (kv.split("=") for kv in answer[3:].split())}

    def close(self) -> None:
        assert self.cmd("close") == "OK closed"
        assert self.proc.wait(timeout=60) == 0, self._stderr()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=60)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)


@dataclass(frozen=True)
class Cluster:
    """What the nodes of a test share: a directory (their data dirs, the bucket) and the metadata URL."""

    tmp: Path
    metadata_url: str


@pytest.fixture(params=["sqlite", "postgresql"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Cluster:
    """One SQLite file, or a fresh schema of the PostgreSQL test server (fails when it is not set)."""
    if request.param == "sqlite":
        return Cluster(tmp_path, f"sqlite://{tmp_path / 'metadata.db'}")
    return Cluster(tmp_path, request.getfixturevalue("pg_url"))


def wait_for(predicate: object, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


async def _metadata_state(cluster: Cluster) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
    """(nodes as (id, epoch), objects as (id, state, size)) in the shared metadata."""
    store = await open_metadata_store(cluster.metadata_url)
    try:
        nodes = [(int(n.node_id), n.node_epoch) for n in await store.list_nodes()]
        objects = [(int(o.object_id), int(o.state), o.size_bytes) for o in await store.list_objects()]
        return nodes, objects
    finally:
        await store.close()


def metadata_state(cluster: Cluster) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
    return asyncio.run(_metadata_state(cluster))


def bucket_keys(tmp: Path) -> set[str]:
    async def keys() -> set[str]:
        storage = LocalObjectStorage(str(tmp / "objects"))
        try:
            return {info.key async for info in storage.list("")}
        finally:
            await storage.close()

    return asyncio.run(keys())


def test_a_second_open_of_the_same_node_id_fences_the_first(cluster: Cluster) -> None:
    first = Node(cluster, "a", node_id=1)
    stream_id = int(first.cmd("create").split()[1])
    assert first.cmd(f"open {stream_id} 0") == "OK"
    assert first.cmd(f"append {stream_id} before") == "OK 0"
    assert first.cmd("upload") == "OK"
    second = Node(cluster, "b", node_id=1)  # same node id, another data dir and process
    assert second.epoch == first.epoch + 1
    keys, state = bucket_keys(cluster.tmp), metadata_state(cluster)
    # The first node's next commit is refused by the store; it then refuses everything itself. Its
    # heartbeat may notice the new epoch first and fence it before the append.
    late = first.cmd(f"append {stream_id} late")  # if OK: only its own WAL knows this one
    assert late.startswith(("OK", "ERR FencedError")), late
    assert first.cmd("upload").startswith("ERR FencedError")
    assert first.cmd(f"append {stream_id} later").startswith("ERR FencedError")
    assert first.cmd("create").startswith("ERR FencedError")
    assert first.cmd(f"open {stream_id} 1").startswith("ERR FencedError")
    assert first.status()["fenced"] == 1
    time.sleep(2 * LEASE_MS / 1000)  # its heartbeat and maintenance had time to write, had they tried
    assert first.cmd("upload").startswith("ERR FencedError")
    assert bucket_keys(cluster.tmp) == keys
    assert metadata_state(cluster) == state
    first.close()
    second.close()


def test_the_heartbeat_fences_a_node_whose_epoch_was_bumped_without_any_write_of_its_own(
    cluster: Cluster,
) -> None:
    first = Node(cluster, "a", node_id=1)
    second = Node(cluster, "b", node_id=1)
    wait_for(
        lambda: first.status()["fenced"] == 1, "the heartbeat to fence the first node", 3 * LEASE_MS / 1000
    )
    assert first.cmd("create").startswith("ERR FencedError")
    assert second.status()["fenced"] == 0
    first.close()
    second.close()


def test_a_node_paused_past_its_lease_cannot_commit_and_its_data_stays_in_its_wal(cluster: Cluster) -> None:
    node = Node(cluster, "a", node_id=1)
    stream_id = int(node.cmd("create").split()[1])
    assert node.cmd(f"open {stream_id} 0") == "OK"
    assert node.cmd(f"append {stream_id} committed") == "OK 0"
    assert node.cmd("upload") == "OK"
    assert node.cmd(f"append {stream_id} in-wal") == "OK 1"
    keys, state = bucket_keys(cluster.tmp), metadata_state(cluster)
    node.signal(signal.SIGSTOP)
    time.sleep(2.5 * LEASE_MS / 1000)
    node.signal(signal.SIGCONT)
    assert node.cmd("upload").startswith("ERR FencedError")
    assert node.cmd(f"append {stream_id} refused").startswith("ERR FencedError")
    assert bucket_keys(cluster.tmp) == keys
    assert metadata_state(cluster) == state
    node.close()
    # The node's next session replays its WAL: the record the fenced session could not upload is there.
    again = Node(cluster, "a", node_id=1)
    assert again.epoch == node.epoch + 1
    assert again.status()["recovered"] == 1
    assert again.cmd(f"open {stream_id} 1") == "OK"
    assert again.cmd(f"read {stream_id}") == "OK committed,in-wal"
    again.close()


def test_node_epochs_rise_by_one_per_open_whatever_the_wall_clock_says(cluster: Cluster) -> None:
    epochs = []
    for offset_s in (0.0, -86_400.0, -86_400.0 * 365, 0.0):  # the clock stepped back a day, a year
        node = Node(cluster, "a", node_id=3, clock_offset_s=offset_s)
        stream_id = int(node.cmd("create").split()[1])
        assert node.cmd(f"open {stream_id} 0") == "OK"
        assert node.cmd(f"append {stream_id} x") == "OK 0"
        epochs.append(node.epoch)
        node.close()
    assert epochs == [epochs[0] + i for i in range(4)]
    assert epochs[0] == 1
    nodes, _ = metadata_state(cluster)
    assert nodes == [(3, epochs[-1])]


def maintenance_spans(node: Node, end_s: float) -> list[tuple[float, float]]:
    """The [start, stop) wall-time spans during which ``node`` ran its maintenance jobs."""
    spans, start = [], None
    for running, at in node.maint:
        if running and start is None:
            start = at
        elif not running and start is not None:
            spans.append((start, at))
            start = None
    if start is not None:
        spans.append((start, end_s))
    return spans


def test_one_node_of_many_runs_maintenance_and_another_takes_over_after_a_kill(cluster: Cluster) -> None:
    nodes = [Node(cluster, f"n{i}", node_id=10 + i, watch=True) for i in range(3)]
    time.sleep(LEASE_MS / 1000)
    holders = [n for n in nodes if n.status()["maint"] == 1]
    assert len(holders) == 1
    holder = holders[0]
    assert holder.status()["jobs"] == 1
    assert all(n.status()["jobs"] == 0 for n in nodes if n is not holder)
    killed_at = time.time()
    holder.kill()
    rest = [n for n in nodes if n is not holder]
    wait_for(
        lambda: any(running for n in rest for running, _ in n.maint),
        "a new maintenance node",
        4 * LEASE_MS / 1000,
    )
    took_over_s = min(at for n in rest for running, at in n.maint if running) - killed_at
    assert 0 < took_over_s < 2 * LEASE_MS / 1000
    time.sleep(2 * LEASE_MS / 1000)
    end_s = time.time()
    spans = sorted(
        [(s, min(e, killed_at)) for s, e in maintenance_spans(holder, end_s)]
        + [span for n in rest for span in maintenance_spans(n, end_s)]
    )
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start, f"two nodes ran maintenance at once: {spans}"
    assert sum(n.status()["maint"] for n in rest) == 1
    for n in rest:
        n.close()


async def _prepare_as_another_node(cluster: Cluster, node_id: int) -> tuple[int, int]:
    """Node ``node_id`` (a session of its own) prepares two object ids and writes an object under
    the first, as an upload in flight does; the second id is then forgotten by metadata. Returns both."""
    store = await open_metadata_store(cluster.metadata_url)
    storage = LocalObjectStorage(str(cluster.tmp / "objects"))
    try:
        info = await store.open_node(node_id=NodeId(node_id), lease_ms=60_000)
        store.bind_node(NodeId(node_id), info.node_epoch)
        first = int(await store.prepare_objects(count=2, ttl_ms=3_600_000))
        await storage.put(object_key(first, NAMESPACE), b"an upload not yet committed")
        # the second id is forgotten (as after an expired prepare and its removal): it has no row
        await store.mark_destroyed([ObjectId(first + 1)], now_ms=int(time.time() * 1000))
        await store.remove_objects([ObjectId(first + 1)])
        return first, first + 1
    finally:
        await storage.close()
        await store.close()


def test_the_orphan_scan_never_deletes_an_object_another_node_prepared_or_committed(cluster: Cluster) -> None:
    maintainer = Node(cluster, "m", node_id=1)
    assert maintainer.status()["maint"] == 1
    writer = Node(cluster, "w", node_id=2)
    assert writer.status()["maint"] == 0
    stream_id = int(writer.cmd("create").split()[1])
    assert writer.cmd(f"open {stream_id} 0") == "OK"
    prepared, _ = asyncio.run(_prepare_as_another_node(cluster, node_id=3))
    # A key metadata knows nothing of, under an id it issued: the one orphan.
    orphan = object_key(prepared + 1, NAMESPACE)
    (cluster.tmp / "objects").mkdir(exist_ok=True)
    asyncio.run(_put(cluster.tmp, orphan))
    time.sleep(0.05)  # every key strictly older than now (orphan TTL 0)
    # The writer uploads and commits while the maintenance node scans with an orphan TTL of 0.
    for i in range(20):
        assert writer.cmd(f"append {stream_id} r{i}") == f"OK {i}"
        assert writer.cmd("upload") == "OK"
        assert maintainer.cmd("scan").startswith("OK ")
    assert writer.cmd("scan").startswith("ERR FencedError")  # not the maintenance node
    keys = bucket_keys(cluster.tmp)
    assert orphan not in keys
    assert object_key(prepared, NAMESPACE) in keys
    _, objects = metadata_state(cluster)
    live = {object_key(o, NAMESPACE) for o, state, _ in objects if state == ObjectState.COMMITTED}
    assert live, "the writer committed objects"
    assert live <= keys
    assert {parse_object_key(k)[0] for k in keys} <= {o for o, _, _ in objects}
    writer.close()
    # Everything the writer committed reads back from objects in a new session.
    reader = Node(cluster, "w", node_id=2)
    assert reader.cmd(f"open {stream_id} 1") == "OK"
    assert reader.cmd(f"read {stream_id}") == "OK " + ",".join(f"r{i}" for i in range(20))
    reader.close()
    maintainer.close()


async def _put(tmp: Path, key: str) -> None:
    storage = LocalObjectStorage(str(tmp / "objects"))
    try:
        await storage.put(key, b"orphan")
    finally:
        await storage.close()
