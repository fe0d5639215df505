"""The read workload's rounds run on a frozen start-up heap, unfrozen afterwards."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from benchmarks.core import Context
from benchmarks.workloads import read


async def test_rounds_run_on_the_frozen_start_up_heap_and_unfreeze_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    engine_round = read._engine_round

    async def watched(*args: Any) -> Any:
        seen.append(gc.get_freeze_count())
        return await engine_round(*args)

    monkeypatch.setattr(read, "_engine_round", watched)
    ctx = Context(quick=True, work_dir=tmp_path, s3=None, params={"total_mib": "1", "object_mib": "1"})
    assert gc.get_freeze_count() == 0
    results = await read.run(ctx)
    assert gc.get_freeze_count() == 0
    assert len(seen) == 2 * 2 * 2  # per record size: two rounds of one pass beside each baseline setting
    assert all(count > 0 for count in seen)
    assert all(r.extra["frozen_objects"] > 0 for r in results)
    assert all(r.value > 0 and r.baseline_value for r in results)


async def test_both_sides_draw_the_same_number_of_timed_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A best of more draws favours its side: the engine makes one pass beside each baseline pass."""
    passes: list[str] = []
    engine_round, baseline_round = read._engine_round, read._baseline_round

    async def engine(*args: Any) -> Any:
        if gc.get_freeze_count():
            passes.append("engine")
        return await engine_round(*args)

    async def baseline(ctx: Context, storage: Any, spans: Any, inflight: int, **kw: Any) -> Any:
        if gc.get_freeze_count() and inflight > 1:  # not the warm-up or the sequential pass
            passes.append("baseline")
        return await baseline_round(ctx, storage, spans, inflight, **kw)

    monkeypatch.setattr(read, "_engine_round", engine)
    monkeypatch.setattr(read, "_baseline_round", baseline)
    ctx = Context(quick=True, work_dir=tmp_path, s3=None, params={"total_mib": "1", "object_mib": "1"})
    results = await read.run(ctx)
    assert passes.count("engine") == passes.count("baseline") == 2 * 2 * 2
    for result in results:
        assert result.extra["passes_per_side"] == 2 * 2
        assert 0 < result.extra["engine_median_mb_s"] <= result.value
        assert 0 < result.extra["baseline_median_mb_s_best_setting"] <= result.baseline_value
