"""The ingest workload's paced latency method: open loop without coordinated omission."""

from __future__ import annotations

import asyncio
import time

from benchmarks.workloads.ingest import _paced, _paced_floor


async def _hold_loop(after_s: float, hold_s: float) -> None:
    await asyncio.sleep(after_s)
    time.sleep(hold_s)  # the loop is held: sends due meanwhile slip


async def test_a_held_loop_shows_in_the_latency_not_only_in_the_send_lag() -> None:
    holder = asyncio.ensure_future(_hold_loop(0.05, 0.1))
    floor = await _paced_floor(2000.0, 0.4)
    await holder
    assert floor.count == 800
    # The sends due during the 100 ms hold went out late; their latency runs from their due time.
    assert floor.percentile_s(1.0) >= 0.08
    assert floor.percentile_s(0.9) >= 0.01


async def test_every_slot_is_called_once_with_its_due_time() -> None:
    dues: list[float] = []

    async def one(due: float) -> None:
        dues.append(due)

    started = time.perf_counter()
    await _paced(one, 300, 3000.0)
    assert len(set(dues)) == 300
    assert min(dues) >= started
    assert max(dues) - min(dues) > 0.09
