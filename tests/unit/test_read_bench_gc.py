"""Each round of the read workload starts on a collected heap: no side pays for the other's garbage."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest

from benchmarks.core import Context
from benchmarks.workloads import read


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _old_cyclic_garbage(collected: list[str], name: str) -> None:
    """A reference cycle in the oldest generation, unreachable: only a full collection frees it."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    weakref.finalize(a, collected.append, name)
    gc.collect()  # survives (still referenced here): moved to the oldest generation
    del a, b


async def test_each_round_starts_after_the_previous_rounds_garbage_is_collected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    collected: list[str] = []
    planted: list[str] = []
    rounds: list[str] = []
    engine_round = read._engine_round
    baseline_round = read._baseline_round

    async def watched(name: str, round_: Any, *args: Any, **kw: Any) -> Any:
        if gc.get_freeze_count():  # a measured round (the warm-up pass runs before the freeze)
            assert collected == planted, f"a {name} round started with earlier rounds' garbage uncollected"
            rounds.append(name)
        result = await round_(*args, **kw)
        planted.append(name)  # the garbage this round leaves behind (a closed client, a reader)
        _old_cyclic_garbage(collected, name)
        return result

    async def engine(*args: Any) -> Any:
        return await watched("engine", engine_round, *args)

    async def baseline(*args: Any, **kw: Any) -> Any:
        return await watched("baseline", baseline_round, *args, **kw)

    monkeypatch.setattr(read, "_engine_round", engine)
    monkeypatch.setattr(read, "_baseline_round", baseline)
    ctx = Context(quick=True, work_dir=tmp_path, s3=None, params={"total_mib": "1", "object_mib": "1"})
    await read.run(ctx)
    assert rounds.count("engine") == 2 * 2 * 2  # per record size: two rounds, one pass beside each baseline's
    assert rounds.count("baseline") == 2 * (2 * 2 + 2)  # 4 and 16 in flight, then sequential, per round
