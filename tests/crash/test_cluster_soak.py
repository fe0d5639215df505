"""The cluster soak: node processes on one PostgreSQL metadata store and one Ceph RGW bucket, producers
that follow ``assignments()``, and a driver that reassigns streams (sometimes two requests racing for
one), kills nodes with SIGKILL (sometimes a dead node's taker in the middle of its takeover) and pauses
them with SIGSTOP (past the lease: a zombie that resumes fenced; within it: nothing happens).

Afterwards (every node stopped cleanly, GC and the orphan scan run, TTLs 0): every acknowledged record
is readable exactly once at the offset it was acknowledged at, every record read was acknowledged or is
unknown, offsets are contiguous, no object is left in the bucket that is not committed, and no ack was
logged by a fenced node (its offset would hold another record). ``tests/crash/cluster_verify.py`` holds
the checks. Knobs: ``S3STREAM_SOAK_EVENTS`` (default 30), ``S3STREAM_SOAK_SECONDS`` (run events until
this much time passed; unset: by count), ``S3STREAM_SOAK_NODES`` (4), ``S3STREAM_SOAK_STREAMS`` (8),
``S3STREAM_SOAK_LEASE_MS`` (3000); runs longer than pytest's 600 s timeout need ``--timeout=0``. A
failure prints the seed (``S3STREAM_SEED`` replays the driver's choices; the timing of the processes is
not replayable), the event log and where the node logs are.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from s3stream.metadata.base import TakeoverState
from tests.crash.cluster_harness import EXIT_FENCED, ClusterHarness, env_int, wait_until
from tests.crash.cluster_verify import (
    check_records,
    collect_and_check_bucket,
    read_logs,
    read_streams,
    summary,
)
from tests.support.s3 import S3TestServer

pytestmark = [pytest.mark.crash, pytest.mark.slow]

PREPARED_TTL_MS = 10_000
"""Prepared objects of a killed upload expire after this (the final GC waits for it)."""


def soak_config(lease_ms: int) -> dict[str, object]:
    return {
        "s3.node.lease.ms": lease_ms,
        "s3.wal.capacity": 16 << 20,
        "s3.wal.record.size.max": 1 << 20,
        "s3.record.size.max": 1 << 20,
        "s3.wal.upload.interval.ms": 1000,
        "s3.object.prepared.ttl.ms": PREPARED_TTL_MS,
        "s3.object.delete.retention.minutes": 0,
        "s3.stream.set.object.compaction.interval.minutes": 1,
    }


class Driver:
    """Random events against a running cluster; pending restarts and resumes run from :meth:`pump`."""

    def __init__(
        self, harness: ClusterHarness, rng: random.Random, *, lease_ms: int, stream_ids: list[int]
    ) -> None:
        self.h = harness
        self.rng = rng
        self.lease_s = lease_ms / 1000
        self.stream_ids = stream_ids
        self.due: list[tuple[float, str, int]] = []
        """(monotonic time, "restart" | "resume", node id)."""
        self.counts: dict[str, int] = {}

    def live(self) -> list[int]:
        return sorted(n for n, p in self.h.nodes.items() if p.alive() and not self._pending(n))

    def _pending(self, node_id: int) -> bool:
        return any(n == node_id for _, _, n in self.due)

    def pump(self, duration_s: float) -> None:
        """Waits ``duration_s`` while running due actions and restarting nodes that exited."""
        end = time.monotonic() + duration_s
        while True:
            now = time.monotonic()
            for entry in [d for d in self.due if d[0] <= now]:
                self.due.remove(entry)
                _, action, node_id = entry
                if action == "resume":
                    self.h.resume(node_id)
                else:
                    self.h.start(node_id)
            for node_id, node in list(self.h.nodes.items()):
                code = node.proc.poll()
                if code is None or node.killed or self._pending(node_id):
                    continue
                if code == EXIT_FENCED and node.paused_past_lease:
                    self.h.note(f"node {node_id} (pid {node.pid}) exited: fenced")
                elif code == EXIT_FENCED:
                    self.h.anomaly(f"node {node_id} (pid {node.pid}) fenced without a pause past its lease")
                else:
                    self.h.anomaly(f"node {node_id} (pid {node.pid}) exited {code}: {node.stderr_tail(1500)}")
                node.killed = True
                self.due.append((now + 0.3, "restart", node_id))
            if now >= end:
                return
            time.sleep(0.05)

    def event(self) -> None:
        live = self.live()
        choices: list[tuple[str, float, Callable[[list[int]], None]]] = [
            ("reassign", 4, self.reassign),
            ("race", 1.5, self.race),
        ]
        if len(live) >= 3:
            choices += [
                ("kill", 1.5, self.kill),
                ("zombie", 1.5, self.zombie),
                ("kill-taker", 1, self.kill_taker),
            ]
        if len(live) >= 2:
            choices.append(("pause", 1.5, self.short_pause))
        names, weights, actions = zip(*choices, strict=True)
        index = self.rng.choices(range(len(names)), weights=weights)[0]
        self.counts[names[index]] = self.counts.get(names[index], 0) + 1
        actions[index](live)

    def reassign(self, live: list[int]) -> None:
        if not live:
            return
        streams = self.rng.sample(self.stream_ids, self.rng.randint(1, 3))
        self.h.request_reassign(streams, self.rng.choice(live))

    def race(self, live: list[int]) -> None:
        if len(live) < 2:
            return self.reassign(live)
        stream = self.rng.choice(self.stream_ids)
        first, second = self.rng.sample(live, 2)
        self.h.request_reassign([stream], first)
        self.h.request_reassign([stream], second)

    def kill(self, live: list[int]) -> None:
        self._kill(self.rng.choice(live))

    def _kill(self, node_id: int, restart_leases: tuple[float, float] = (0.5, 2.5)) -> None:
        """SIGKILL now, started again ``restart_leases`` (a range of lease periods) later."""
        self.h.kill(node_id)
        self.due.append(
            (time.monotonic() + self.rng.uniform(*restart_leases) * self.lease_s, "restart", node_id)
        )

    def kill_taker(self, live: list[int]) -> None:
        """Kill a node, wait for its takeover to start, then kill the taker within 0-300 ms."""
        dead = self.rng.choice(live)
        delay_s = self.rng.uniform(0.0, 0.3)
        epoch = self.h.nodes[dead].epoch
        self._kill(dead, restart_leases=(3.0, 5.0))  # not back before its lease lapses: a takeover
        deadline = time.monotonic() + 4 * self.lease_s
        while time.monotonic() < deadline:
            rows = [t for t in self.h.takeovers() if int(t.node_id) == dead and t.node_epoch == epoch]
            if rows and rows[-1].state is TakeoverState.DONE:
                self.h.note(f"node {dead}'s takeover was done before its taker could be killed")
                return
            running = [t for t in rows if t.state is TakeoverState.RUNNING]
            if running:
                taker = running[0].taker_node_id
                self.pump(delay_s)
                node = self.h.nodes.get(taker)
                if node is not None and node.alive() and not self._pending(taker):
                    self.h.note(f"killing the taker of node {dead}'s takeover (attempt {running[0].attempt})")
                    self._kill(taker)
                return
            self.pump(0.02)
        self.h.note(f"no takeover of node {dead} started within {4 * self.lease_s:.1f} s")

    def zombie(self, live: list[int]) -> None:
        node_id = self.rng.choice(live)
        self.h.pause(node_id)
        self.h.nodes[node_id].paused_past_lease = True
        self.due.append((time.monotonic() + self.rng.uniform(1.5, 3.0) * self.lease_s, "resume", node_id))

    def short_pause(self, live: list[int]) -> None:
        node_id = self.rng.choice(live)
        self.h.pause(node_id)
        self.due.append((time.monotonic() + self.rng.uniform(0.05, 0.3) * self.lease_s, "resume", node_id))

    def reassign_orphans(self) -> None:
        """Streams CLOSED with no assignment: their last target or owner died; give them a live node."""
        live = self.live()
        if not live:
            return
        assigned = {int(a.stream_id) for a in self.h.run(self.h.store.list_assignments())}
        closed = [int(s.stream_id) for s in self.h.streams() if self.h.owner_of(s) == -1]
        for stream_id in closed:
            if stream_id not in assigned:
                self.h.request_reassign([stream_id], self.rng.choice(live))

    def settle(self, timeout_s: float) -> None:
        """Resume and restart everything, then wait for every node ready and no takeover in flight."""
        for entry in list(self.due):
            self.due.remove(entry)
            if entry[1] == "resume":
                self.h.resume(entry[2])
            else:
                self.h.start(entry[2])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.pump(0.5)
            if (
                not self.due
                and all(p.alive() for p in self.h.nodes.values())
                and not self.h.takeovers_in_flight()
            ):
                return
        raise AssertionError(f"the cluster did not settle in {timeout_s} s: {self.h.takeovers_in_flight()}")


def test_cluster_soak_with_reassignments_kills_and_zombies(
    tmp_path: Path, pg_url: str, s3_server: S3TestServer, s3_prefix: str, rng_seed: int
) -> None:
    nodes, stream_count = env_int("S3STREAM_SOAK_NODES", 4), env_int("S3STREAM_SOAK_STREAMS", 8)
    lease_ms = env_int("S3STREAM_SOAK_LEASE_MS", 3000)
    events, seconds = env_int("S3STREAM_SOAK_EVENTS", 30), env_int("S3STREAM_SOAK_SECONDS", 0)
    rng = random.Random(rng_seed)
    harness = ClusterHarness(
        tmp_path, metadata_url=pg_url, bucket_uri=s3_server.uri(s3_prefix), config_keys=soak_config(lease_ms)
    )
    violations: list[str] = []
    try:
        for node_id in range(1, nodes + 1):
            harness.start(node_id)
        harness.wait_ready(list(range(1, nodes + 1)))
        stream_ids = [int(s) for s in harness.create_streams(stream_count, node_id=1)]
        for index, stream_id in enumerate(stream_ids):
            harness.request_reassign([stream_id], 1 + index % nodes)
        driver = Driver(harness, rng, lease_ms=lease_ms, stream_ids=stream_ids)
        wait_until(
            lambda: all(harness.owner_of(s) > 0 for s in harness.streams()), "every stream opened", 60.0
        )
        started = time.monotonic()
        done = 0
        while (done < events) if not seconds else (time.monotonic() - started < seconds):
            driver.pump(rng.uniform(0.5, 2.5))
            driver.event()
            done += 1
            if done % 5 == 0:
                driver.reassign_orphans()
        harness.note(f"events done: {done} {driver.counts}")
        driver.settle(timeout_s=180.0)
        driver.reassign_orphans()
        driver.pump(3.0)
        # a node fenced while stopping is started again, so that its own recovery uploads its WAL
        for _ in range(3):
            codes = harness.terminate_all()
            failed = [n for n, code in codes.items() if code != 0]
            if not failed:
                break
            harness.anomaly(f"nodes {failed} did not stop cleanly ({codes}); starting them again")
            for node_id in failed:
                harness.start(node_id)
            harness.wait_ready(failed)
            time.sleep(1.0)
        logs = read_logs(p.log_path for p in harness.incarnations)
        harness.note(f"acks {len(logs.acks)} unknown {len(logs.unknown)}")
        _note_idle_incarnations(harness)
        assert len(logs.acks) > 100 * stream_count // 8, "the producers acknowledged almost nothing"
        violations += check_records(logs, read_streams(pg_url, harness.bucket_uri))
        violations += collect_and_check_bucket(
            pg_url, harness.bucket_uri, timeout_s=PREPARED_TTL_MS / 1000 + 30
        )
        harness.note(f"takeovers {harness.takeovers()}")
    except BaseException:
        _report(harness, rng_seed, violations)
        raise
    finally:
        harness.close()
    if violations or harness.anomalies:
        _report(harness, rng_seed, violations)
    assert not violations, f"seed={rng_seed}: {len(violations)} violations:\n{summary(violations)}"


def _note_idle_incarnations(harness: ClusterHarness) -> None:
    """An anomaly for each node process that tried appends and had none acknowledged (liveness, not
    safety: nothing is lost, but that node served nothing)."""
    for node in harness.incarnations:
        text = node.log_path.read_text() if node.log_path.exists() else ""
        tried = sum(1 for line in text.splitlines() if line.startswith("T "))
        acked = sum(1 for line in text.splitlines() if line.startswith("A "))
        if tried >= 5 and acked == 0:
            errors = sorted(
                {
                    line.split()[3]
                    for line in text.splitlines()
                    if line.startswith("U ") and len(line.split()) > 3
                }
            )
            harness.anomaly(
                f"node {node.node_id} incarnation {node.incarnation}: {tried} appends, none acknowledged ({errors})"
            )


def _report(harness: ClusterHarness, seed: int, violations: list[str]) -> None:
    print(f"cluster soak seed={seed} (replay the driver's choices with S3STREAM_SEED={seed})")
    print("event log:\n" + "\n".join(harness.events))
    print(f"node logs (acks, stderr): {harness.tmp / 'logs'}")
    if harness.anomalies:
        print("anomalies:\n" + "\n".join(harness.anomalies))
    if violations:
        print(f"{len(violations)} violations:\n{summary(violations)}")
