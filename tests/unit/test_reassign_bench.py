"""The ``reassign`` workload's ``--quick`` run on real PostgreSQL and the real S3 server: every row the
cluster benchmark must report, each with its same-run baseline, from real node processes.

It needs ``S3STREAM_TEST_PG_URL`` and the S3 test server and fails (never skips) without them when
``S3STREAM_REQUIRE_S3=1``; it runs the workload's defaults under ``--quick`` (tiny: two moving node
processes, 3 moves per case, one failover, 1 s append rounds on three reused node processes).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psycopg
import pytest

from benchmarks import pgserver
from benchmarks.core import Context, Result
from benchmarks.workloads import reassign
from tests.support.s3 import S3TestServer, delete_prefix

QUICK_BUDGET_S = 180.0
"""Far above the ~50 s the tiny run takes on a loaded 2-core machine; a run near the old 300 s fails."""


def _bench_schemas(base_url: str) -> set[str]:
    with psycopg.connect(base_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (pgserver.SCHEMA_PREFIX + "%",)
        ).fetchall()
    return {row[0] for row in rows}


def _check_moves(rows: list[Result], *, moves: int) -> None:
    labels = [r.metric.split("), ", 1)[1] for r in rows]
    assert labels == [
        "1 stream, 0 MiB pending",
        "1 stream, 1 MiB pending",
        "10 streams at once, 64 KiB pending each",
    ]
    for row, pending, streams, goal_ms in zip(
        rows, [0, 1 << 20, 10 * 64 << 10], [1, 1, 10], [1000, 1000, 2000], strict=True
    ):
        extra = row.extra
        assert row.unit == "ms"
        assert not row.higher_is_better
        assert row.baseline == f"raw PUT of the same {pending} bytes (one object), same store, same run (p99)"
        assert extra["pending_bytes"] == pending
        assert extra["streams"] == streams
        assert extra["goal_p99_ms"] == goal_ms
        assert extra["nodes"] == "2 node processes"
        samples = extra["samples_ms"]
        assert len(samples) == extra["moves"] == moves == extra["latency_ms"]["count"]
        assert all(0 < s < reassign.EVENT_TIMEOUT_S * 1000 for s in samples)
        assert row.value == extra["latency_ms"]["p99"] >= extra["p50_ms"] > 0
        assert row.baseline_value == extra["baseline_latency_ms"]["p99"] >= extra["baseline_p50_ms"] > 0
        assert extra["goal_met"] == (row.value < goal_ms)
        phases = extra["phases_ms"]
        assert set(phases) == {"owner_closed", "target_opened", "first_append"}
        assert 0 < phases["owner_closed"]["p50"] <= row.value
        assert 0 < phases["first_append"]["p50"] <= row.value


def _check_failover(row: Result) -> None:
    extra = row.extra
    assert row.unit == "s"
    assert row.baseline == "the configured lease (s3.node.lease.ms)"
    assert row.baseline_value == extra["lease_ms"] / 1000 == 2.0
    assert extra["goal_s"] == 4.0
    assert len(extra["samples_s"]) == 1
    # The survivor gains the streams only after the victim's lease lapsed at the store's clock, which
    # is at least lease - renewal period (lease / 3) after the kill.
    assert extra["samples_s"][0] >= 2.0 * 2 / 3 - 0.05
    assert row.value == pytest.approx(extra["samples_s"][0], abs=0.002)


def _check_cluster(rows: list[Result]) -> None:
    assert [r.metric for r in rows] == [
        "cluster 1 KiB appends/s, 1 node process",
        "cluster 1 KiB appends/s, 2 node processes",
        "cluster 1 KiB appends/s, 3 node processes",
    ]
    for nodes, row in enumerate(rows, start=1):
        assert row.unit == "appends/s"
        assert row.baseline == "1 node process, same run"
        assert row.baseline_value == rows[0].value > 0
        by_node = row.extra["appends_per_s_by_node"]
        assert len(by_node) == nodes
        assert all(rate > 0 for rate in by_node)
        assert row.value == pytest.approx(sum(by_node), abs=nodes)
        assert row.extra["idle_node_processes"] == 3 - nodes


@pytest.mark.integration
async def test_the_quick_run_reports_every_row_with_its_baseline(
    s3_server: S3TestServer, tmp_path: Path
) -> None:
    base_url = os.environ.get(pgserver.PG_URL_ENV)
    if not base_url:
        pytest.fail(
            f'{pgserver.PG_URL_ENV} is not set: run scripts/postgres start; eval "$(scripts/postgres env)"'
        )
    before = _bench_schemas(base_url)
    ctx = Context(quick=True, work_dir=tmp_path, s3=s3_server.bench_target(), metadata_url=base_url)
    started = time.monotonic()
    try:
        results = await reassign.run(ctx)
    finally:
        delete_prefix(s3_server, f"bench/{ctx.run_id}/")
    took_s = time.monotonic() - started
    assert took_s < QUICK_BUDGET_S, f"the quick run took {took_s:.0f} s"
    assert [r.workload for r in results] == ["reassign"] * 7
    _check_moves(results[:3], moves=3)
    _check_failover(results[3])
    _check_cluster(results[4:])
    assert _bench_schemas(base_url) == before
