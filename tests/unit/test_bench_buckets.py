"""The ``buckets`` benchmark's arithmetic: throughput figures and the failover time (pure)."""

from __future__ import annotations

import math

import pytest

from benchmarks.core import S3Target
from benchmarks.workloads.buckets import (
    GOAL_ROUND_ROBIN_RATIO,
    Run,
    bucket_uri,
    failover_result,
    throughput_results,
)


def test_throughput_is_payload_over_time_beside_the_one_bucket_baseline() -> None:
    single = Run(payload_bytes=80_000_000, seconds=10.0, objects=20)
    both = Run(payload_bytes=80_000_000, seconds=5.0, objects=20)
    copies = Run(payload_bytes=80_000_000, seconds=12.5, objects=20)
    rr, rep = throughput_results(single=single, round_robin=both, replication=copies, rate_mib_s=8, extra={})
    assert (rr.value, rr.baseline_value, rr.ratio) == (16.0, 8.0, 2.0)
    assert rep.value == pytest.approx(6.4)
    assert rep.ratio == pytest.approx(0.8)
    assert rr.extra["goal_ratio_min"] == GOAL_ROUND_ROBIN_RATIO
    assert "8 MiB/s" in rr.metric
    assert "8 MiB/s" in rr.baseline
    assert Run(1, 0.0, 0).mb_per_s == 0.0


def test_failover_time_runs_from_the_failure_to_the_first_commit_on_the_standby() -> None:
    commits = [(1_000, (0,)), (1_300, (0,)), (1_500, (0,)), (2_100, (0,)), (6_200, (0, 1)), (6_300, (1,))]
    result = failover_result(failed_at_ms=2_000, commits=commits, standby=1, stall_ms_max=12.34)
    assert result.value == pytest.approx(4.2)  # the moved object (placed on both) counts
    assert result.baseline_value == pytest.approx(0.25)  # median of 300, 200 ms
    assert not result.higher_is_better
    assert result.extra["commits_before"] == 3
    assert result.extra["append_stall_ms_max"] == 12.3
    assert result.extra["commits_after_ms"] == [[100, [0]], [4_200, [0, 1]], [4_300, [1]]]


def test_failover_without_a_standby_commit_is_an_error_and_one_commit_before_has_no_gap() -> None:
    with pytest.raises(RuntimeError, match="standby"):
        failover_result(failed_at_ms=10, commits=[(5, (0,)), (20, (0,))], standby=1, stall_ms_max=0)
    result = failover_result(failed_at_ms=10, commits=[(5, (0,)), (20, (1,))], standby=1, stall_ms_max=0)
    assert math.isnan(result.baseline_value)


def test_a_bucket_uri_names_the_proxy_and_the_prefix() -> None:
    target = S3Target("http://127.0.0.1:7480", "AK", "S+K", "bench")
    uri = bucket_uri(target, "http://127.0.0.1:5555", "bench/r/x/b1/", 1)
    assert uri.startswith("1@s3://bench?")
    assert "endpoint=http://127.0.0.1:5555&" in uri
    assert "secretKey=S%2BK" in uri
    assert uri.endswith("prefix=bench/r/x/b1/")
