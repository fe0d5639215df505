"""Benchmark outputs: the JSON results file, the Markdown summary and the PNG plots.

JSON schema (``schema`` = ``s3stream-bench/1``)::

    {
      "schema": "s3stream-bench/1",
      "started_at": ISO-8601 UTC, "finished_at": ..., "duration_s": float,
      "machine": {cpu_count, cpu_model, memory_bytes, python, implementation, kernel, platform,
                  event_loop, disk: {path, device, fs_type, total_bytes, free_bytes, rotational},
                  packages: {name: version}, git_commit, git_dirty},
      "parameters": {workloads, quick, seed, run_id, params, target: {kind, endpoint, bucket, region}},
      "workloads": {name: {status: ok|error|missing|interrupted, error, duration_s, cpu_s, cpu_util,
                           peak_rss_bytes, s3_requests: {by_class, by_operation, bytes_written,
                           bytes_read, per_gib_moved: {class: requests per GiB PUT + GET}},
                           result_count}},
      "results": [{workload, metric, value, unit, baseline, baseline_value, ratio,
                   higher_is_better, extra, cpu_s_per_gib, baseline_cpu_s_per_gib, cpu_ratio}],
      "notes": [str],
      "pinning": null | {bench_pid, bench_cpu, bench_cpus_now, server_cpus,
                         servers: [{pid, name, cpus_now}], child_cpus, children},
      "goals": [{row, value, baseline, ratio, goal, met, workload, metric, note}]
    }

Non-finite floats (a ratio over a zero baseline) are written as ``null``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.core import Result
from benchmarks.goals import GoalRow, evaluate

SCHEMA = "s3stream-bench/1"

THROUGHPUT_UNITS = re.compile(r"^\S+/s$")
"""Any rate per second (MB/s, MiB/s, appends/s, records/s, rows/s, ops/s, ...) is a throughput."""
PERCENTILE_KEY = re.compile(r"^p(\d+)$")
"""Percentile keys of a latency summary: p50, p99, p999 (= 99.9th)."""
TIME_UNITS = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1000.0}


@dataclass
class WorkloadRun:
    name: str
    status: str = "ok"
    """ok, error (raised or timed out), missing (no such module) or interrupted (Ctrl-C)."""
    error: str = ""
    duration_s: float = 0.0
    cpu_s: float = 0.0
    cpu_util: float = 0.0
    peak_rss_bytes: int = 0
    s3_requests: dict[str, Any] = field(default_factory=dict)
    results: list[Result] = field(default_factory=list)
    profile: dict[str, Any] | None = None
    """``--profile``: the py-spy summary (:meth:`benchmarks.profiling.Profile.to_json`), or its error."""

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "error": self.error,
            "duration_s": self.duration_s,
            "cpu_s": self.cpu_s,
            "cpu_util": self.cpu_util,
            "peak_rss_bytes": self.peak_rss_bytes,
            "s3_requests": self.s3_requests,
            "result_count": len(self.results),
            **({"profile": self.profile} if self.profile is not None else {}),
        }


@dataclass
class Report:
    started_at: str
    finished_at: str
    duration_s: float
    machine: dict[str, Any]
    parameters: dict[str, Any]
    runs: list[WorkloadRun]
    notes: list[str] = field(default_factory=list)
    pinning: dict[str, Any] | None = None
    """``--pin``: the affinities while the workloads ran (:meth:`benchmarks.pinning.PinPlan.to_json`)."""

    @property
    def results(self) -> list[Result]:
        return [result for run in self.runs for result in run.results]

    def goals(self) -> list[GoalRow]:
        """The goal rows (:mod:`benchmarks.goals`) judged from this run's results."""
        return evaluate(self.results, [run.name for run in self.runs if run.status == "ok"])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = _finite(
            {
                "schema": SCHEMA,
                "started_at": self.started_at,
                "finished_at": self.finished_at,
                "duration_s": self.duration_s,
                "machine": self.machine,
                "parameters": self.parameters,
                "workloads": {run.name: run.to_json() for run in self.runs},
                "results": [result.to_json() for result in self.results],
                "notes": self.notes,
                "pinning": self.pinning,
                "goals": [row.to_json() for row in self.goals()],
            }
        )
        return out


def _finite(value: Any) -> Any:
    """NaN and infinities become None so the file is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


# --- formatting ------------------------------------------------------------------------------------


def fmt(value: float | None) -> str:
    """Three significant digits, thousands separated; '-' for missing or non-finite values."""
    if value is None or not math.isfinite(value):
        return "-"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def ratio_text(result: Result) -> str:
    """The ratio with a hint of which way is better (``1.8x`` / ``0.4x (lower is better)``)."""
    ratio = result.ratio
    if not math.isfinite(ratio):
        return "-"
    return f"{fmt(ratio)}x" + ("" if result.higher_is_better else " (lower is better)")


def cpu_text(result: Result) -> str:
    """The CPU column: ``engine / baseline`` CPU s per GiB and their ratio (``2.1 / 1.5 = 1.4x``);
    ``-`` for a side not measured."""
    own, base = result.cpu_s_per_gib, result.baseline_cpu_s_per_gib
    if own is None and base is None:
        return "-"
    text = f"{fmt(own)} / {fmt(base)}"
    return text + (f" = {fmt(result.cpu_ratio)}x" if math.isfinite(result.cpu_ratio) else "")


def _bytes_text(size: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size:.0f} B"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(report: Report, plot_files: Sequence[Path] = (), relative_to: Path | None = None) -> str:
    """The Markdown summary: machine, target, one table of every result, per-workload resources."""
    machine = report.machine
    target = report.parameters.get("target", {})
    disk = machine.get("disk", {})
    lines = [
        "# s3stream benchmark results",
        "",
        f"- run: {report.started_at} ({report.duration_s:.0f} s), quick={report.parameters.get('quick')}, "
        f"run id {report.parameters.get('run_id')}",
        f"- machine: {machine.get('cpu_count')} x {machine.get('cpu_model')}, "
        f"{_bytes_text(machine.get('memory_bytes', 0))} RAM, kernel {machine.get('kernel')}, "
        f"Python {machine.get('python')} ({machine.get('event_loop')})",
        f"- disk: {disk.get('device', '?')} ({disk.get('fs_type', '?')}, "
        f"{'rotational' if disk.get('rotational') else 'non-rotational'}) for {disk.get('path', '?')}",
        f"- target: {target.get('kind')}"
        + (f" {target.get('endpoint')} bucket {target.get('bucket')}" if target.get("endpoint") else ""),
        "",
        "## Results",
        "",
        "Every figure is next to a baseline measured in the same run; ratio = value / baseline.",
        "",
        "CPU s/GiB: the engine's CPU seconds (user + system, all threads, its child processes where it "
        "runs in them) per GiB over the figure's section / the baseline's, measured the same way.",
        "",
        "| workload | metric | value | unit | baseline | baseline value | ratio | CPU s/GiB (value / baseline) |",
        "| --- | --- | ---: | --- | --- | ---: | ---: | ---: |",
    ]
    for result in report.results:
        lines.append(
            f"| {result.workload} | {_escape(result.metric)} | {fmt(result.value)} | {result.unit} | "
            f"{_escape(result.baseline)} | {fmt(result.baseline_value)} | {ratio_text(result)} | "
            f"{cpu_text(result)} |"
        )
    latency_rows: list[tuple[Result, dict[str, Any], Any]] = [
        (result, result.extra["latency_ms"], result.extra.get("baseline_latency_ms"))
        for result in report.results
        if isinstance(result.extra.get("latency_ms"), dict)
    ]
    if latency_rows:
        lines += [
            "",
            "## Latency percentiles (ms)",
            "",
            "| workload | metric | p50 | p99 | p999 | baseline p50 | baseline p99 | baseline p999 |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for result, own, base in latency_rows:
            base = base if isinstance(base, dict) else {}
            lines.append(
                f"| {result.workload} | {_escape(result.metric)} | "
                + " | ".join(fmt(own.get(key)) for key in ("p50", "p99", "p999"))
                + " | "
                + " | ".join(fmt(base.get(key)) for key in ("p50", "p99", "p999"))
                + " |"
            )
    lines += ["", "## Goals", "", "| goal | value | baseline | ratio | goal | status | note |"]
    lines.append("| --- | ---: | ---: | ---: | --- | --- | --- |")
    for row in report.goals():
        lines.append(
            f"| {_escape(row.row)} | {fmt(row.value)} {row.unit} | {fmt(row.baseline)} | "
            f"{fmt(row.ratio)}{'x' if row.ratio is not None else ''} | {row.goal} | {row.status} | "
            f"{_escape(row.note)} |"
        )
    lines += [
        "",
        "## Workloads",
        "",
        "CPU, peak RSS and raw S3 requests (botocore hook; SlateDB's own requests are not seen there) "
        "over each whole workload, baselines included.",
        "",
        "| workload | status | time s | CPU s | CPU util | peak RSS | PUT | GET | COPY | DELETE | LIST | HEAD "
        "| S3 GiB moved | requests / GiB moved |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for run in report.runs:
        by_class = run.s3_requests.get("by_class", {})
        moved_bytes = run.s3_requests.get("bytes_written", 0) + run.s3_requests.get("bytes_read", 0)
        per_gib_moved = run.s3_requests.get("per_gib_moved") or {}
        per_gib_text = (
            ", ".join(f"{name} {fmt(value)}" for name, value in per_gib_moved.items() if value) or "-"
        )
        lines.append(
            f"| {run.name} | {run.status} | {fmt(run.duration_s)} | {fmt(run.cpu_s)} | {fmt(run.cpu_util)} | "
            f"{_bytes_text(run.peak_rss_bytes)} | "
            + " | ".join(
                str(by_class.get(name, 0)) for name in ("PUT", "GET", "COPY", "DELETE", "LIST", "HEAD")
            )
            + f" | {fmt(moved_bytes / (1 << 30))} | {per_gib_text} |"
        )
    errors = [run for run in report.runs if run.status != "ok"]
    if errors:
        lines += ["", "## Failures", ""]
        for run in errors:
            first_line = run.error.strip().splitlines()[-1] if run.error.strip() else run.status
            lines.append(f"- **{run.name}** ({run.status}): {_escape(first_line)}")
    if report.notes:
        lines += ["", "## Notes", ""]
        lines += [f"- {_escape(note)}" for note in report.notes]
    if plot_files:
        lines += ["", "## Plots", ""]
        for path in plot_files:
            shown = path.relative_to(relative_to) if relative_to is not None else path
            lines.append(f"![{path.stem}]({shown.as_posix()})")
    return "\n".join(lines) + "\n"


# --- plots -----------------------------------------------------------------------------------------


def is_throughput(unit: str) -> bool:
    return bool(THROUGHPUT_UNITS.match(unit.strip()))


def is_latency(unit: str) -> bool:
    return unit.strip() in TIME_UNITS


Panel = tuple[str, list[str], list[tuple[str, list[float]]]]
"""A plot panel: title, group labels on the x axis, and (peer, one value per group) bars."""


def subject_of(result: Result) -> str:
    """What ``value`` measured: ``extra["subject"]`` if a workload names it, else ``s3stream``."""
    subject = result.extra.get("subject")
    return subject if isinstance(subject, str) and subject else "s3stream"


def _short(text: str, limit: int = 48) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _panels(path: Path, title: str, panels: list[Panel], ylabel: str) -> None:
    """One subplot per metric: groups on the x axis (e.g. p50/p99/p999), one bar per peer in each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes_grid = plt.subplots(rows, columns, figsize=(5.2 * columns, 4.4 * rows), squeeze=False)
    try:
        for slot, axes in enumerate(axes_grid.flat):
            if slot >= len(panels):
                axes.set_visible(False)
                continue
            metric, groups, peers = panels[slot]
            width = 0.8 / max(1, len(peers))
            for index, (peer, values) in enumerate(peers):
                positions = [group + (index - (len(peers) - 1) / 2) * width for group in range(len(groups))]
                bars = axes.bar(
                    positions, [0.0 if math.isnan(v) else v for v in values], width, label=_short(peer)
                )
                axes.bar_label(bars, labels=[fmt(v) for v in values], fontsize=7)
            axes.set_xticks(range(len(groups)))
            axes.set_xticklabels(groups, fontsize=8)
            axes.set_title(_short(metric, 60), fontsize=9)
            axes.set_ylabel(ylabel, fontsize=8)
            axes.margins(y=0.15)
            axes.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False)
        figure.suptitle(title)
        figure.tight_layout(rect=(0.0, 0.0, 1.0, 1.0 - 0.4 / (4.4 * rows)))
        figure.savefig(path, dpi=90)
    finally:
        plt.close(figure)


def _merge_peers(panels: dict[tuple[str, str], Panel], key: tuple[str, str], panel: Panel) -> None:
    """Results of one metric measured once and compared with several baselines share a panel."""
    if key not in panels:
        panels[key] = panel
        return
    peers = panels[key][2]
    names = {name for name, _ in peers}
    peers.extend(peer for peer in panel[2] if peer[0] not in names)


def percentile_keys(summary: dict[str, Any]) -> list[str]:
    """The percentile keys of a latency summary in rank order (p50 < p99 < p999)."""
    found = [key for key in summary if PERCENTILE_KEY.match(key)]
    return sorted(found, key=lambda key: float("0." + key[1:]))


def _percentiles(summary: dict[str, Any], keys: Sequence[str]) -> list[float]:
    values = []
    for key in keys:
        value = summary.get(key)
        values.append(float(value) if isinstance(value, int | float) else math.nan)
    return values


def _is_summary(value: Any) -> bool:
    return isinstance(value, dict) and bool(value.get("count")) and bool(percentile_keys(value))


def throughput_panels(results: Sequence[Result]) -> list[Panel]:
    """One panel per throughput metric (any ``<unit>/s``): its subject beside its baselines."""
    panels: dict[tuple[str, str], Panel] = {}
    for result in results:
        if is_throughput(result.unit):
            key = (f"{result.metric} ({result.unit})", f"{subject_of(result)}={result.value!r}")
            panel: Panel = (
                key[0],
                [result.unit],
                [(subject_of(result), [result.value]), (result.baseline, [result.baseline_value])],
            )
            _merge_peers(panels, key, panel)
    return list(panels.values())


def latency_panels(results: Sequence[Result]) -> list[Panel]:
    """Latency panels in ms: each time-valued result (subject beside baseline), and, for any result,
    each latency summary it carries in its extras (``*_ms`` dicts with a count and percentiles): its
    percentiles on the x axis; ``latency_ms`` is drawn beside ``baseline_latency_ms``."""
    panels: dict[tuple[str, str], Panel] = {}
    for result in results:
        if is_latency(result.unit):
            scale = TIME_UNITS[result.unit.strip()]
            key = (result.metric, f"{subject_of(result)}={result.value!r}")
            panel: Panel = (
                result.metric,
                ["value"],
                [
                    (subject_of(result), [result.value * scale]),
                    (result.baseline, [result.baseline_value * scale]),
                ],
            )
            _merge_peers(panels, key, panel)
        base = result.extra.get("baseline_latency_ms")
        for name, summary in result.extra.items():
            if name == "baseline_latency_ms" or not name.endswith("_ms") or not _is_summary(summary):
                continue
            keys = percentile_keys(summary)
            if name == "latency_ms":
                title = f"{result.metric} latency"
                peers = [(subject_of(result), _percentiles(summary, keys))]
                if isinstance(base, dict) and _is_summary(base):
                    peers.append((result.baseline, _percentiles(base, keys)))
            else:  # the summary's name first: long metric names are cut in the title
                label = name.removesuffix("_ms")
                title = f"{label} | {result.metric}"
                peers = [(label, _percentiles(summary, keys))]
            key = (title, f"{subject_of(result)}={summary.get(keys[0])!r}")
            _merge_peers(panels, key, (title, keys, peers))
    return list(panels.values())


def plot(report: Report, plot_dir: Path) -> list[Path]:
    """Per workload: ``<workload>-throughput.png`` (:func:`throughput_panels`) and
    ``<workload>-latency.png`` (:func:`latency_panels`), one panel per metric."""
    plot_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for run in report.runs:
        throughput = throughput_panels(run.results)
        if throughput:
            path = plot_dir / f"{run.name}-throughput.png"
            _panels(path, f"{run.name}: throughput (higher is better)", throughput, "per second")
            written.append(path)
        latency = latency_panels(run.results)
        if latency:
            path = plot_dir / f"{run.name}-latency.png"
            _panels(path, f"{run.name}: latency in ms (lower is better)", latency, "ms")
            written.append(path)
    return written


def write_all(
    report: Report, *, out_dir: Path, json_path: Path | None = None, plots: bool = True
) -> dict[str, Any]:
    """Write ``results.json`` (or ``json_path``), ``summary.md`` and ``plots/*.png`` under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = json_path if json_path is not None else out_dir / "results.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report.to_json(), indent=2, allow_nan=False) + "\n")
    plot_files = plot(report, out_dir / "plots") if plots else []
    markdown_path = out_dir / "summary.md"
    markdown_path.write_text(markdown(report, plot_files, relative_to=out_dir))
    return {"json": json_path, "markdown": markdown_path, "plots": plot_files}
