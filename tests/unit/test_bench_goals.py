"""The CPU s/GiB column and the goal table, from small hand-made results."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from benchmarks import harness
from benchmarks.core import Result
from benchmarks.goals import GOALS, evaluate
from benchmarks.measure import ResourceMeter, per_gib
from benchmarks.report import Report, WorkloadRun, cpu_text, markdown, write_all

P99 = "append p99 latency at half max rate (1 KiB records, uploads running)"


def _results() -> dict[str, list[Result]]:
    stalls = {
        "engine": {"threshold_ms": 20.0, "count": 2, "group_writes": 900, "max_ms": 41.0},
        "minimal_loop": {"threshold_ms": 20.0, "count": 1, "group_writes": 950, "max_ms": 25.0},
    }
    return {
        "ingest": [
            Result(
                "ingest",
                "ingest MB/s (1 KiB records, 1000 streams)",
                80.0,
                "MB/s",
                "WAL alone",
                100.0,
                cpu_s_per_gib=3.0,
                baseline_cpu_s_per_gib=2.0,
            ),
            Result(
                "ingest",
                "upload MB/s while uploads are in flight (64 KiB records, 1000 streams)",
                95.0,
                "MB/s",
                "raw PUT ceiling",
                100.0,
                cpu_s_per_gib=1.0,
                baseline_cpu_s_per_gib=0.5,
            ),
            Result(
                "ingest", P99, 2.0, "ms", "minimal group-commit loop", 1.0, False, {"disk_stalls": stalls}
            ),
        ],
        "format": [
            Result("format", "encode_mb_s_1k", 600.0, "MB/s", "memory copy", 1000.0),
            Result("format", "decode_mb_s_1k", 400.0, "MB/s", "memory copy", 1000.0),
        ],
        "spark": [
            Result("spark", "rows_per_s_1KiB", 90.0, "rows/s", "parquet", 100.0),
            Result("spark", "direct_rows_per_s_1KiB", 110.0, "rows/s", "parquet", 100.0),
        ],
    }


def _report(results: dict[str, list[Result]], failed: tuple[str, ...] = ()) -> Report:
    runs = [WorkloadRun(name=name, results=list(items)) for name, items in results.items()]
    runs += [WorkloadRun(name=name, status="error", error="boom") for name in failed]
    return Report("t0", "t1", 1.0, {}, {}, runs)


def test_every_goal_row_is_judged_or_says_it_did_not_run() -> None:
    rows = {
        row.row: row
        for row in evaluate(_report(_results(), failed=("read",)).results, ["ingest", "format", "spark"])
    }
    assert list(rows) == [goal.row for goal in GOALS]
    ingest = rows["1 KiB ingest with uploads vs WAL alone"]
    assert (ingest.value, ingest.baseline, ingest.ratio, ingest.goal, ingest.status) == (
        80.0,
        100.0,
        0.8,
        ">= 0.9x",
        "not met",
    )
    cpu = rows["engine CPU s per GiB with uploads vs WAL alone's"]
    assert (cpu.value, cpu.baseline, cpu.ratio, cpu.unit, cpu.status) == (
        3.0,
        2.0,
        1.5,
        "CPU s/GiB",
        "not met",
    )
    assert rows["64 KiB upload rate vs raw PUT ceiling"].status == "met"
    assert rows["object encode, 1 KiB records, vs memory copy"].status == "met"
    assert rows["object decode, 1 KiB records, vs memory copy"].status == "not met"
    spark = rows["Spark sink rows/s vs parquet file sink"]
    assert (spark.metric, spark.ratio, spark.status) == (
        "direct_rows_per_s_1KiB",
        1.1,
        "met",
    )  # the direct path first
    p99 = rows["append p99 at half the max rate, uploads running, vs minimal loop at that rate"]
    assert (p99.ratio, p99.goal, p99.status) == (2.0, "<= 1.5x", "not met")
    assert p99.note == "disk stalls (group writes > 20 ms): engine 2/900, minimal_loop 1/950"
    read = rows["catch-up read, 1 KiB records, vs raw ranged GETs"]
    assert (read.status, read.met, read.ratio) == ("not run", None, None)
    assert read.note == "workload read did not run (or failed)"


def test_stalls_of_a_side_not_timed_do_not_break_the_table() -> None:
    results = _results()
    results["ingest"][2].extra["disk_stalls"] = {
        "engine": {},
        "minimal_loop": {"threshold_ms": 20.0, "count": 0},
    }
    rows = {row.row: row for row in evaluate([r for items in results.values() for r in items])}
    p99 = rows["append p99 at half the max rate, uploads running, vs minimal loop at that rate"]
    assert p99.note == "disk stalls (group writes > 20 ms): engine not timed, minimal_loop 0/0"
    results["ingest"][2].extra["disk_stalls"] = {"engine": None}
    assert evaluate(results["ingest"])[-1].note == "disk stalls (group writes): engine not timed"


def test_a_measured_ceiling_is_shown_beside_the_row() -> None:
    results = _results()
    results["format"][1].extra["ceiling"] = {"ratio": 0.3456, "why": "one copy + CRC32C at 4,000 MB/s"}
    rows = {row.row: row for row in evaluate([r for items in results.values() for r in items])}
    decode = rows["object decode, 1 KiB records, vs memory copy"]
    assert decode.note == "ceiling on this machine 0.35x (one copy + CRC32C at 4,000 MB/s)"
    assert decode.status == "not met"  # a ceiling explains a row, it does not judge it
    assert rows["object encode, 1 KiB records, vs memory copy"].note == ""


def test_a_row_with_a_side_unmeasured_is_not_judged() -> None:
    results = _results()
    results["ingest"][0].baseline_cpu_s_per_gib = None
    rows = {row.row: row for row in evaluate([r for items in results.values() for r in items])}
    cpu = rows["engine CPU s per GiB with uploads vs WAL alone's"]
    assert cpu.status == "not run"
    assert "not measured" in cpu.note


def test_cpu_column_and_goals_reach_json_markdown_and_the_printed_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _report(_results())
    written = write_all(report, out_dir=tmp_path, plots=False)
    document = json.loads(Path(written["json"]).read_text())
    first = document["results"][0]
    assert (first["cpu_s_per_gib"], first["baseline_cpu_s_per_gib"], first["cpu_ratio"]) == (3.0, 2.0, 1.5)
    assert document["results"][-1]["cpu_ratio"] is None  # not measured: strict JSON null
    goals = {row["row"]: row for row in document["goals"]}
    assert goals["1 KiB ingest with uploads vs WAL alone"]["met"] is False
    assert goals["catch-up read, 1 KiB records, vs raw ranged GETs"]["status"] == "not run"
    assert cpu_text(report.results[0]) == "3.00 / 2.00 = 1.50x"
    assert cpu_text(report.results[-1]) == "-"
    summary = markdown(report)
    assert "| 80.0 | MB/s | WAL alone | 100 | 0.8x | 3.00 / 2.00 = 1.50x |" in summary
    assert "## Goals" in summary
    assert "| 64 KiB upload rate vs raw PUT ceiling | 95.0 MB/s | 100 | 0.95x | >= 0.9x | met |" in summary

    console = Console(width=200, record=True)
    console.print(harness.goal_table(report))
    printed = console.export_text()
    for goal in GOALS:
        assert goal.row[:30] in printed
    assert "not run" in printed and "not met" in printed  # noqa: PT018


def test_resource_meter_without_a_sampling_thread_still_counts_this_process_cpu() -> None:
    with ResourceMeter(interval_s=0) as meter:
        total = sum(i * i for i in range(2_000_000))
    assert total > 0
    assert meter.usage.cpu_s > 0.01
    assert meter.usage.peak_rss_bytes == 0  # no sampling: no RSS figure
    assert per_gib(meter.usage.cpu_s, 1 << 30) == pytest.approx(meter.usage.cpu_s)
    assert math.isnan(per_gib(1.0, 0))
