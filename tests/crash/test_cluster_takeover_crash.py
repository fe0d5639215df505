"""A takeover whose taker is killed -9 in the middle: the controller gives it to another node, which
finishes it; every record the dead node acknowledged is then readable where it was acknowledged.

Three ``soak_node`` processes on the PostgreSQL test server and the Ceph RGW bucket; uploads only
every 10 minutes, so what node 1 acknowledged is only in its WAL when it is killed. The attach command
(``s3.wal.failover.attach.cmd``) holds the first taker while a flag file exists: it writes a marker
naming its node process and sleeps; the test then removes the flag and kills that taker with SIGKILL
(and the sleeping command). The second attempt attaches at once and finishes.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from s3stream.metadata.base import TakeoverInfo, TakeoverState
from tests.crash.cluster_harness import ClusterHarness, wait_until
from tests.crash.cluster_verify import (
    check_records,
    collect_and_check_bucket,
    read_logs,
    read_streams,
    summary,
)
from tests.support.s3 import S3TestServer

pytestmark = [pytest.mark.crash, pytest.mark.slow]
LEASE_MS = 3000
ACKS_BEFORE_KILL = 200


def _attach_cmd(flag: Path, marks: Path) -> str:
    """Holds the taker while ``flag`` exists: writes ``<taker pid> <own pid>`` to ``marks/attach-<pid>``."""
    return (
        f'if [ -e {flag} ]; then echo "$PPID $$" > {marks}/tmp-$$ && mv {marks}/tmp-$$ {marks}/attach-$$; '
        "sleep 60; fi"
    )


def _takeover_of(harness: ClusterHarness, node_id: int) -> TakeoverInfo | None:
    rows = [t for t in harness.takeovers() if int(t.node_id) == node_id]
    return rows[-1] if rows else None


def test_a_takeover_whose_taker_is_killed_is_finished_by_another_node(
    tmp_path: Path, pg_url: str, s3_server: S3TestServer, s3_prefix: str
) -> None:
    flag, marks = tmp_path / "hold-attach", tmp_path / "marks"
    flag.touch()
    marks.mkdir()
    config = {
        "s3.node.lease.ms": LEASE_MS,
        "s3.wal.capacity": 16 << 20,
        "s3.wal.record.size.max": 1 << 20,
        "s3.record.size.max": 1 << 20,
        "s3.wal.upload.interval.ms": 600_000,
        "s3.object.prepared.ttl.ms": 10_000,
        "s3.object.delete.retention.minutes": 0,
        "s3.wal.failover.attach.cmd": _attach_cmd(flag, marks),
    }
    harness = ClusterHarness(
        tmp_path, metadata_url=pg_url, bucket_uri=s3_server.uri(s3_prefix), config_keys=config
    )
    violations: list[str] = []
    try:
        for node_id in (1, 2, 3):
            harness.start(node_id)
        harness.wait_ready([1, 2, 3])
        stream_ids = [int(s) for s in harness.create_streams(2, node_id=1)]
        harness.request_reassign(stream_ids, 1)
        node1_log = harness.nodes[1].log_path
        wait_until(lambda: len(read_logs([node1_log]).acks) >= ACKS_BEFORE_KILL, "node 1's acks", 60.0)
        harness.kill(1)

        wait_until(lambda: any(marks.glob("attach-*")), "the first taker's attach command", 30.0)
        (mark,) = marks.glob("attach-*")
        taker_pid, attach_pid = (int(w) for w in mark.read_text().split())
        (first_taker,) = [n for n, p in harness.nodes.items() if p.pid == taker_pid]
        running = _takeover_of(harness, 1)
        assert running is not None
        assert running.state == TakeoverState.RUNNING
        assert (running.taker_node_id, running.attempt) == (first_taker, 1)
        flag.unlink()
        harness.kill(first_taker)
        os.killpg(attach_pid, signal.SIGKILL)  # the command's own process group (it outlives its node)
        harness.note(f"killed the first taker, node {first_taker}, inside its attach command")

        (second_taker,) = [n for n in (2, 3) if n != first_taker]
        wait_until(lambda: _state(harness, 1) == TakeoverState.DONE, "the takeover of node 1 done", 60.0)
        done = _takeover_of(harness, 1)
        assert done is not None
        assert done.taker_node_id == second_taker
        assert done.attempt == 2
        assert done.wal_end_offset > 0
        wait_until(
            lambda: all(harness.owner_of(s) == second_taker for s in harness.streams()),
            "the taker to open node 1's streams",
            30.0,
        )
        time.sleep(1.0)  # the second taker appends to them
        for node_id in (1, first_taker):
            harness.start(node_id)  # refused (and retried) while a takeover of it is in flight
        harness.wait_ready([1, first_taker])
        wait_until(lambda: not harness.takeovers_in_flight(), "no takeover in flight", 60.0)
        codes = harness.terminate_all()
        assert all(code == 0 for code in codes.values()), codes
        logs = read_logs(p.log_path for p in harness.incarnations)
        node1_acks = [a for a in logs.acks.values() if a.node_id == 1]
        assert len(node1_acks) >= ACKS_BEFORE_KILL
        assert any(a.node_id == second_taker for a in logs.acks.values()), "the new owner appended nothing"
        violations += check_records(logs, read_streams(pg_url, harness.bucket_uri))
        violations += collect_and_check_bucket(pg_url, harness.bucket_uri, timeout_s=40.0)
    except BaseException:
        print("event log:\n" + "\n".join(harness.events))
        raise
    finally:
        harness.close()
    assert not violations, summary(violations)


def _state(harness: ClusterHarness, node_id: int) -> TakeoverState | None:
    row = _takeover_of(harness, node_id)
    return None if row is None else row.state
