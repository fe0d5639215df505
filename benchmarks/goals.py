"""The performance goals of the fair bench: one row per goal, judged from a run's results.

Each :class:`Goal` names the result it reads (workload and metric prefix), which of its figures (the
wall-clock ratio value / baseline, or the CPU s/GiB ratio) and the bound. :func:`evaluate` turns a
run's results into :class:`GoalRow` values: value, baseline, ratio, goal, met or not, or "not run"
when the workload did not run or did not report the figure. The harness prints them as a table at
the end of every run and writes them under the results JSON's ``goals`` key.

Ratios are always value / baseline as the result reports them; a goal with ``at_least`` is met when
the ratio is at least the bound (rates), else when it is at most the bound (latency, CPU per GiB).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from benchmarks.core import Result


@dataclass(frozen=True)
class Goal:
    row: str
    """The goal as the issue's table names it."""
    workload: str
    metric_prefixes: tuple[str, ...]
    """The result's metric starts with one of these; the first prefix with a result wins."""
    bound: float
    at_least: bool
    figure: Literal["ratio", "cpu_ratio"] = "ratio"


GOALS: tuple[Goal, ...] = (
    Goal("1 KiB ingest with uploads vs WAL alone", "ingest", ("ingest MB/s (1 KiB records",), 0.9, True),
    Goal(
        "engine CPU s per GiB with uploads vs WAL alone's",
        "ingest",
        ("ingest MB/s (1 KiB records",),
        1.25,
        False,
        "cpu_ratio",
    ),
    Goal(
        "64 KiB upload rate vs raw PUT ceiling",
        "ingest",
        ("upload MB/s while uploads are in flight (64 KiB records",),
        0.9,
        True,
    ),
    Goal(
        "catch-up read, 1 KiB records, vs raw ranged GETs",
        "read",
        ("catch-up read MB/s, 1 KiB records",),
        0.85,
        True,
    ),
    Goal("object encode, 1 KiB records, vs memory copy", "format", ("encode_mb_s_1k",), 0.5, True),
    Goal("object decode, 1 KiB records, vs memory copy", "format", ("decode_mb_s_1k",), 0.5, True),
    Goal(
        "Spark sink rows/s vs parquet file sink",
        "spark",
        ("direct_rows_per_s_1KiB", "rows_per_s_1KiB"),
        1.0,
        True,
    ),
    Goal(
        "append p99 at half the max rate, uploads running, vs minimal loop at that rate",
        "ingest",
        ("append p99 latency at half max rate",),
        1.5,
        False,
    ),
)


@dataclass
class GoalRow:
    row: str
    goal: str
    """The bound as text: ``>= 0.9x`` or ``<= 1.25x``."""
    status: Literal["met", "not met", "not run"]
    value: float | None = None
    baseline: float | None = None
    ratio: float | None = None
    unit: str = ""
    workload: str = ""
    metric: str = ""
    note: str = ""

    @property
    def met(self) -> bool | None:
        return None if self.status == "not run" else self.status == "met"

    def to_json(self) -> dict[str, Any]:
        return {
            "row": self.row,
            "goal": self.goal,
            "status": self.status,
            "met": self.met,
            "value": self.value,
            "baseline": self.baseline,
            "ratio": self.ratio,
            "unit": self.unit,
            "workload": self.workload,
            "metric": self.metric,
            "note": self.note,
        }


def _find(goal: Goal, results: Sequence[Result]) -> Result | None:
    for prefix in goal.metric_prefixes:
        for result in results:
            if result.workload == goal.workload and result.metric.startswith(prefix):
                return result
    return None


def _stall_note(result: Result) -> str:
    """The disk stalls counted beside an append-latency figure (``disk_stalls`` extra), as text."""
    stalls = result.extra.get("disk_stalls")
    if not isinstance(stalls, dict):
        return ""
    parts: list[str] = []
    thresholds: set[float] = set()
    for side, info in stalls.items():
        if not isinstance(info, dict) or not isinstance(info.get("count"), int | float):
            parts.append(f"{side} not timed")
            continue
        parts.append(f"{side} {int(info['count'])}/{int(info.get('group_writes') or 0)}")
        if isinstance(info.get("threshold_ms"), int | float):
            thresholds.add(float(info["threshold_ms"]))
    if not parts:
        return ""
    over = f" > {'/'.join(f'{t:g}' for t in sorted(thresholds))} ms" if thresholds else ""
    return f"disk stalls (group writes{over}): " + ", ".join(parts)


def _ceiling_note(result: Result) -> str:
    """The machine's ceiling for the figure's ratio, when the workload measured one (``ceiling`` extra:
    ``{"ratio": r, "why": text}``)."""
    ceiling = result.extra.get("ceiling")
    if not isinstance(ceiling, dict) or not isinstance(ceiling.get("ratio"), int | float):
        return ""
    why = f" ({ceiling['why']})" if ceiling.get("why") else ""
    return f"ceiling on this machine {float(ceiling['ratio']):.2f}x{why}"


def evaluate(results: Sequence[Result], ran: Sequence[str] | None = None) -> list[GoalRow]:
    """One :class:`GoalRow` per :data:`GOALS` entry, from ``results``; ``ran`` names the workloads
    that ran (a missing row then says whether its workload ran at all)."""
    rows: list[GoalRow] = []
    for goal in GOALS:
        bound_text = f"{'>=' if goal.at_least else '<='} {goal.bound:g}x"
        result = _find(goal, results)
        if result is None:
            did_run = ran is None or goal.workload in ran
            note = (
                f"workload {goal.workload} did not report it"
                if did_run
                else f"workload {goal.workload} did not run (or failed)"
            )
            rows.append(GoalRow(goal.row, bound_text, "not run", workload=goal.workload, note=note))
            continue
        if goal.figure == "cpu_ratio":
            value, baseline, ratio, unit = (
                result.cpu_s_per_gib,
                result.baseline_cpu_s_per_gib,
                result.cpu_ratio,
                "CPU s/GiB",
            )
        else:
            value, baseline, ratio, unit = result.value, result.baseline_value, result.ratio, result.unit
        note = "; ".join(part for part in (_stall_note(result), _ceiling_note(result)) if part)
        if ratio is None or not math.isfinite(ratio):
            rows.append(
                GoalRow(
                    goal.row,
                    bound_text,
                    "not run",
                    value,
                    baseline,
                    None,
                    unit,
                    result.workload,
                    result.metric,
                    note or "no ratio (a side was not measured)",
                )
            )
            continue
        met = ratio >= goal.bound if goal.at_least else ratio <= goal.bound
        rows.append(
            GoalRow(
                goal.row,
                bound_text,
                "met" if met else "not met",
                value,
                baseline,
                ratio,
                unit,
                result.workload,
                result.metric,
                note,
            )
        )
    return rows
