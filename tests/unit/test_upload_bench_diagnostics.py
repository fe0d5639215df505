"""The ingest latency run's diagnostics: which of the loop and the generator's producers made sends
late (PacerStats), the loop thread's CPU and run-queue wait beside the other threads' CPU, and the
WAL-alone baseline run while another process PUTs objects into the store."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks.core import Context
from benchmarks.workloads import ingest
from benchmarks.workloads.ingest import PACED_PRODUCERS, PacerStats, ThreadTimes, _paced


async def test_a_target_slower_than_the_producers_allow_shows_every_producer_busy() -> None:
    stats = PacerStats()
    rate = 20_000.0  # 256 producers allow 12.8 ms per call at this rate; each call takes 40 ms

    async def one(due: float) -> None:
        await asyncio.sleep(0.04)

    await _paced(one, 2 * PACED_PRODUCERS, rate, stats=stats)
    summary = stats.summary()
    assert summary["busy_max"] == PACED_PRODUCERS
    assert summary["all_busy_s"] > 0
    assert summary["overdue_taken_share"] >= 0.4  # the second round waited for free producers


async def test_a_fast_target_leaves_producers_free_and_no_slot_waits_for_one() -> None:
    stats = PacerStats()

    async def one(due: float) -> None:
        await asyncio.sleep(0)

    await _paced(one, PACED_PRODUCERS // 2, 1000.0, stats=stats)  # every slot has its own producer
    summary = stats.summary()
    assert summary["busy_max"] < PACED_PRODUCERS
    assert summary["all_busy_s"] == 0
    assert summary["overdue_taken_share"] == 0


def test_thread_times_split_the_callers_cpu_from_the_other_threads() -> None:
    def burn(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    with ThreadTimes() as times:
        other = threading.Thread(target=burn, args=(0.05,))
        other.start()
        burn(0.03)
        other.join()
    summary = times.summary_s()
    loop_cpu, other_cpu = summary["loop_thread_cpu"], summary["other_threads_cpu"]
    assert loop_cpu is not None
    assert other_cpu is not None
    assert loop_cpu >= 0.03
    assert other_cpu >= 0.04
    if sys.platform != "linux":  # pragma: no cover
        pytest.skip("schedstat is Linux's")
    wait = summary["loop_thread_runqueue_wait"]
    assert wait is not None
    assert wait >= 0


async def test_the_wal_alone_baseline_under_put_load_runs_beside_a_process_putting_objects(
    tmp_path: Path,
) -> None:
    ctx = Context(quick=True, work_dir=tmp_path, s3=None)
    latency, times, pacer, puts = await ingest._wal_alone_under_put_load(
        ctx, rate_per_s=1000.0, duration_s=0.2, put_rate_per_s=20.0, object_bytes=64 * 1024
    )
    assert latency.count == 200
    assert puts >= 1
    stored = [p for p in (tmp_path / "objects-put-load").rglob("*") if p.is_file()]
    assert len(stored) >= puts
    assert times.loop_cpu_s > 0
    assert pacer.slot_count == 200
