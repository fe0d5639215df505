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
    assert len(seen) == 4  # two rounds for each record size
    assert all(count > 0 for count in seen)
    assert all(r.extra["frozen_objects"] > 0 for r in results)
    assert all(r.value > 0 and r.baseline_value for r in results)
