"""Node processes of a cluster test (``tests.crash.soak_node``) and the metadata calls of its driver.

A :class:`ClusterHarness` starts, kills (SIGKILL), pauses (SIGSTOP / SIGCONT) and stops (SIGTERM) node
processes on one metadata URL and one bucket URI, each with its own data dir and one ack log per
process (``<tmp>/logs/node-<id>-<incarnation>.log``; stderr beside it as ``.err``). Metadata calls
(create streams, request reassignments, list takeovers) run on one event loop of the harness
(:class:`asyncio.Runner`) over one store the harness opens. Everything it does is written to its event
log with the time since the start, so a failure can print what led to it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from s3stream.ids import NodeId, StreamId
from s3stream.metadata.base import MetadataStore, StreamMetadata, StreamState, TakeoverInfo, TakeoverState
from s3stream.metadata.url import open_metadata_store

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")
EXIT_FENCED = 3
"""``soak_node``'s exit code once it found itself fenced."""


class NodeProcess:
    """One ``soak_node`` process (one incarnation of a node id)."""

    def __init__(self, harness: ClusterHarness, node_id: int, incarnation: int) -> None:
        self.node_id = node_id
        self.incarnation = incarnation
        logs = harness.tmp / "logs"
        logs.mkdir(exist_ok=True)
        self.log_path = logs / f"node-{node_id}-{incarnation}.log"
        self.err_path = logs / f"node-{node_id}-{incarnation}.err"
        args = [sys.executable, "-m", "tests.crash.soak_node", str(harness.tmp / f"node-{node_id}"),
                harness.metadata_url, harness.bucket_uri, str(node_id), str(self.log_path),
                json.dumps(harness.config_keys)]  # fmt: skip
        with self.err_path.open("w") as err:
            self.proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
        self.ready = threading.Event()
        self.epoch = -1
        self.stopped = False
        """SIGSTOP sent and no SIGCONT yet."""
        self.killed = False
        self.paused_past_lease = False
        """Set by a driver that paused it past its lease: a fence is then expected."""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("READY epoch="):
                self.epoch = int(line.split("=")[1])
                self.ready.set()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        """Running, ready, not paused: a node that can serve."""
        return self.proc.poll() is None and self.ready.is_set() and not self.stopped and not self.killed

    def stderr_tail(self, chars: int = 3000) -> str:
        try:
            return self.err_path.read_text()[-chars:]
        except OSError:
            return ""


class ClusterHarness:
    """The node processes of one test, its metadata store and its event log."""

    def __init__(self, tmp: Path, *, metadata_url: str, bucket_uri: str, config_keys: dict[str, Any]) -> None:
        self.tmp = tmp
        self.metadata_url = metadata_url
        self.bucket_uri = bucket_uri
        self.config_keys = config_keys
        self.nodes: dict[int, NodeProcess] = {}
        self.incarnations: list[NodeProcess] = []
        self.events: list[str] = []
        self.anomalies: list[str] = []
        """Things that are not failures of the checked properties but should not happen (reported)."""
        self._t0 = time.monotonic()
        self._runner = asyncio.Runner()
        self._store: MetadataStore | None = None

    # -- event log -------------------------------------------------------------------------------

    def note(self, text: str) -> None:
        line = f"{time.monotonic() - self._t0:8.2f}s {text}"
        self.events.append(line)
        with (self.tmp / "events.log").open("a") as f:
            f.write(line + "\n")

    def anomaly(self, text: str) -> None:
        self.anomalies.append(text)
        self.note("ANOMALY " + text)

    # -- processes -------------------------------------------------------------------------------

    def start(self, node_id: int) -> NodeProcess:
        node = NodeProcess(self, node_id, sum(1 for p in self.incarnations if p.node_id == node_id))
        self.nodes[node_id] = node
        self.incarnations.append(node)
        self.note(f"start node {node_id} (incarnation {node.incarnation}, pid {node.pid})")
        return node

    def wait_ready(self, node_ids: Sequence[int], timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        for node_id in node_ids:
            node = self.nodes[node_id]
            while not node.ready.wait(0.1):
                if node.proc.poll() is not None:
                    raise AssertionError(
                        f"node {node_id} exited {node.proc.returncode}: {node.stderr_tail()}"
                    )
                if time.monotonic() > deadline:
                    raise AssertionError(f"node {node_id} not ready in {timeout_s} s: {node.stderr_tail()}")

    def kill(self, node_id: int) -> None:
        node = self.nodes[node_id]
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(timeout=30)
        node.killed = True
        self.note(f"kill -9 node {node_id} (pid {node.pid}, epoch {node.epoch})")

    def pause(self, node_id: int) -> None:
        node = self.nodes[node_id]
        node.proc.send_signal(signal.SIGSTOP)
        node.stopped = True
        self.note(f"SIGSTOP node {node_id} (pid {node.pid}, epoch {node.epoch})")

    def resume(self, node_id: int) -> None:
        node = self.nodes[node_id]
        node.proc.send_signal(signal.SIGCONT)
        node.stopped = False
        self.note(f"SIGCONT node {node_id} (pid {node.pid})")

    def terminate_all(self, timeout_s: float = 90.0) -> dict[int, int]:
        """SIGTERM to every running node, then wait: node id -> exit code (-9 when it had to be killed)."""
        running = [n for n in self.nodes.values() if n.proc.poll() is None]
        for node in running:
            if node.stopped:
                self.resume(node.node_id)
            node.proc.send_signal(signal.SIGTERM)
        self.note("SIGTERM " + " ".join(str(n.node_id) for n in running))
        codes: dict[int, int] = {}
        deadline = time.monotonic() + timeout_s
        for node in running:
            try:
                codes[node.node_id] = node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.anomaly(f"node {node.node_id} did not stop in {timeout_s} s: {node.stderr_tail(800)}")
                node.proc.kill()
                node.proc.wait(timeout=30)
                codes[node.node_id] = -9
        self.note(f"exit codes {codes}")
        return codes

    def kill_all(self) -> None:
        for node in self.nodes.values():
            if node.proc.poll() is None:
                node.proc.kill()
                node.proc.wait(timeout=30)

    # -- metadata --------------------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)

    @property
    def store(self) -> MetadataStore:
        if self._store is None:
            self._store = self.run(open_metadata_store(self.metadata_url))
        assert self._store is not None
        return self._store

    def create_streams(self, count: int, *, node_id: int) -> list[StreamId]:
        """``count`` new CLOSED streams, created under the session of the (ready) node ``node_id``."""
        epoch = self.nodes[node_id].epoch
        return [
            self.run(self.store.create_stream(node_id=NodeId(node_id), node_epoch=epoch))
            for _ in range(count)
        ]

    def request_reassign(self, stream_ids: Sequence[int], to_node_id: int) -> bool:
        """One request; False (noted) when the store refuses it (the target's session lapsed, ...)."""
        from s3stream.errors import S3StreamError

        ids = [StreamId(s) for s in stream_ids]
        try:
            rows = self.run(self.store.request_reassign(stream_ids=ids, to_node_id=NodeId(to_node_id)))
        except S3StreamError as exc:
            self.note(f"reassign {list(stream_ids)} -> {to_node_id} refused: {type(exc).__name__} {exc}")
            return False
        self.note(f"reassign {list(stream_ids)} -> {to_node_id} ({len(rows)} rows)")
        return True

    def streams(self) -> list[StreamMetadata]:
        return self.run(self.store.list_streams())

    def takeovers(self) -> list[TakeoverInfo]:
        return self.run(self.store.list_takeovers())

    def takeovers_in_flight(self) -> list[TakeoverInfo]:
        return [t for t in self.takeovers() if t.state in (TakeoverState.PENDING, TakeoverState.RUNNING)]

    def owner_of(self, stream: StreamMetadata) -> int:
        """The node of the stream's last range while it is OPENED, else -1."""
        if stream.state != StreamState.OPENED or not stream.ranges:
            return -1
        return int(stream.ranges[-1].node_id)

    def close(self) -> None:
        self.kill_all()
        if self._store is not None:
            self.run(self._store.close())
            self._store = None
        self._runner.close()


def wait_until(predicate: Any, what: str, timeout_s: float, poll_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))
