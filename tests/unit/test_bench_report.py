"""Which results the benchmark report plots: every throughput unit, latency percentiles where carried."""

from __future__ import annotations

from pathlib import Path

from benchmarks.core import Result
from benchmarks.report import Report, WorkloadRun, latency_panels, percentile_keys, plot, throughput_panels

SUMMARY = {"count": 100, "mean": 1.0, "max": 9.0, "p50": 1.0, "p99": 5.0, "p999": 8.0}


def result(metric: str, unit: str, **extra: object) -> Result:
    return Result("wal", metric, 10.0, unit, "raw", 20.0, extra=dict(extra))


def test_every_rate_per_second_is_a_throughput_panel() -> None:
    results = [
        result("a", "MB/s"),
        result("b", "appends/s"),
        result("c", "records/s"),
        result("d", "rows/s"),
        result("e", "ops/s"),
        result("f", "MiB/s"),
        result("g", "req/GiB"),
        result("h", "MiB"),
        result("i", "ms"),
    ]
    panels = throughput_panels(results)
    assert [title for title, _, _ in panels] == [
        "a (MB/s)",
        "b (appends/s)",
        "c (records/s)",
        "d (rows/s)",
        "e (ops/s)",
        "f (MiB/s)",
    ]
    assert panels[1] == ("b (appends/s)", ["appends/s"], [("s3stream", [10.0]), ("raw", [20.0])])


def test_latency_panels_show_every_carried_percentile_summary() -> None:
    p99 = result(
        "append p99",
        "ms",
        latency_ms=SUMMARY,
        baseline_latency_ms={**SUMMARY, "p50": 0.5},
        send_lag_ms=SUMMARY,
        goal_p99_ms=2.0,  # a number, not a summary
        empty_ms={"count": 0},
    )
    throughput = result("appends", "appends/s", group_write_ms={"count": 3, "p50": 1.0, "p99": 2.0})
    panels = latency_panels([p99, throughput])
    assert [(title, groups) for title, groups, _ in panels] == [
        ("append p99", ["value"]),
        ("append p99 latency", ["p50", "p99", "p999"]),
        ("send_lag | append p99", ["p50", "p99", "p999"]),
        ("group_write | appends", ["p50", "p99"]),
    ]
    assert panels[1][2] == [("s3stream", [1.0, 5.0, 8.0]), ("raw", [0.5, 5.0, 8.0])]
    assert panels[2][2] == [("send_lag", [1.0, 5.0, 8.0])]


def test_percentile_keys_are_in_rank_order() -> None:
    assert percentile_keys({"p999": 1, "mean": 2, "p50": 3, "p99": 4, "p9": 5}) == [
        "p50",
        "p9",
        "p99",
        "p999",
    ]


def test_plot_writes_both_figures(tmp_path: Path) -> None:
    run = WorkloadRun("wal", results=[result("b", "appends/s"), result("p", "ms", latency_ms=SUMMARY)])
    report = Report("", "", 0.0, {}, {}, [run])
    written = plot(report, tmp_path)
    assert [p.name for p in written] == ["wal-throughput.png", "wal-latency.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)
