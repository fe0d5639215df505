"""A node paused inside a metadata transaction must not fence the live nodes.

Found by the cluster soak (seed 21): a node stopped by SIGSTOP in the middle of a write transaction on
PostgreSQL keeps its row locks until it runs again. Every node renews the ``maintenance`` and
``controller`` leases every lease / 3, so the others' renewals wait on the locked lease rows; each
waiting statement holds one of the store's worker threads (the caller's timeout does not cancel the
statement), and once all of them wait, the heartbeats queue behind them: the live nodes lose their
leases and are fenced while the paused node is the one that stopped. Here a plain connection holds the
two lease rows (``SELECT ... FOR UPDATE``) for four leases, as the paused node would; the live nodes
should keep their sessions: the store's sessions end a transaction idle past
``IDLE_IN_TRANSACTION_TIMEOUT_MS`` and give up a lock wait past ``LOCK_TIMEOUT_MS``
(:mod:`s3stream.metadata.postgres`).
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from s3stream.metadata.postgres import SESSION_SETUP
from tests.crash.cluster_harness import ClusterHarness
from tests.support.s3 import S3TestServer

pytestmark = [pytest.mark.crash, pytest.mark.slow]
LEASE_MS = 3000


def test_a_transaction_paused_on_the_lease_rows_does_not_fence_the_live_nodes(
    tmp_path: Path, pg_url: str, s3_server: S3TestServer, s3_prefix: str
) -> None:
    config = {
        "s3.node.lease.ms": LEASE_MS,
        "s3.wal.capacity": 16 << 20,
        "s3.wal.record.size.max": 1 << 20,
        "s3.record.size.max": 1 << 20,
    }
    harness = ClusterHarness(
        tmp_path, metadata_url=pg_url, bucket_uri=s3_server.uri(s3_prefix), config_keys=config
    )
    try:
        for node_id in (1, 2):
            harness.start(node_id)
        harness.wait_ready([1, 2])
        time.sleep(LEASE_MS / 1000)  # both have renewed the leases at least once: the rows exist
        # a session set up as the store's are, stopped inside a transaction that locked the lease rows
        with psycopg.connect(pg_url) as conn:
            conn.execute(SESSION_SETUP)
            locked = conn.execute("SELECT name FROM leases ORDER BY name FOR UPDATE").fetchall()
            assert [row[0] for row in locked] == ["controller", "maintenance"]
            time.sleep(4 * LEASE_MS / 1000)
            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):  # the server ended it
                conn.execute("SELECT 1")
        time.sleep(LEASE_MS / 1000)
        fenced = {n: p.proc.poll() for n, p in harness.nodes.items() if p.proc.poll() is not None}
        assert fenced == {}, f"live nodes fenced (exit codes): {fenced}"
    finally:
        harness.close()
