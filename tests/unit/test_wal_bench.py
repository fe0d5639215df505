"""The wal benchmark's open-loop latency generator: every slot sent and counted, lateness measured."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from benchmarks.core import Context
from benchmarks.measure import LatencyRecorder
from benchmarks.workloads import wal as wal_workload
from benchmarks.workloads.wal import PAIRED_SLICES, _NoopAppend, _paced_latency, _paired_appends
from tests.support.directio import loop_writes_work
from wal import BlockWAL, MemoryDevice, WalConfig


class _DelayedAppend:
    """Completes each append ``delay_s`` after it was sent; counts the sends."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.sent = 0

    def append(self, data: bytes) -> asyncio.Future[int]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        loop.call_later(self.delay_s, fut.set_result, self.sent)
        self.sent += 1
        return fut


async def test_every_slot_is_sent_once_and_counted() -> None:
    target = _DelayedAppend(0.002)
    lag = LatencyRecorder()
    stats: dict[str, float] = {}
    rec = await _paced_latency(target, 5000, 0.2, b"x", send_lag=lag, stats=stats)
    assert target.sent == rec.count == lag.count == 1000
    assert rec.percentile_s(0.5) >= 0.002  # from the send (or the due time) to the completion
    assert stats["cpu_us_per_send"] > 0


async def test_a_stalled_loop_shows_in_the_latency_and_the_send_lag() -> None:
    """No coordinated omission: slots that fall due while the loop is blocked count from their due
    time, although they go out only once it runs again."""

    async def stall() -> None:
        await asyncio.sleep(0.05)
        time.sleep(0.1)  # blocks the loop: about 100 slots fall due meanwhile

    stalling = asyncio.ensure_future(stall())
    lag = LatencyRecorder()
    rec = await _paced_latency(_NoopAppend(), 1000, 0.3, b"x", send_lag=lag)
    await stalling
    assert rec.count == 300
    assert lag.max_s >= 0.08
    assert rec.max_s >= 0.08
    assert rec.percentile_s(0.75) >= 0.01  # a quarter of the slots waited for the stall


async def test_a_failed_append_fails_the_run() -> None:
    class Failing:
        def append(self, data: bytes) -> asyncio.Future[int]:
            fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            fut.set_exception(OSError("disk gone"))
            return fut

    with pytest.raises(OSError, match="disk gone"):
        await _paced_latency(Failing(), 1000, 0.05, b"x")


async def test_the_wal_times_every_group_write_when_asked() -> None:
    config = WalConfig(capacity_bytes=256 << 10, record_max_bytes=8 << 10, batch_max_bytes=16 << 10)
    wal = await BlockWAL.open(MemoryDevice(config.device_bytes), config)
    await asyncio.gather(*(wal.append(b"x" * 100) for _ in range(3)))
    assert wal.group_write_s is None  # not timed unless asked
    wal.group_write_s = []
    await asyncio.gather(*(wal.append(b"x" * 100) for _ in range(10)))
    await wal.append(b"y")
    assert len(wal.group_write_s) == 2
    assert all(w >= 0 for w in wal.group_write_s)
    await wal.close()


async def test_the_pacer_wakes_every_tick_not_every_millisecond() -> None:
    """The timerfd pacer sends the slots due within each tick (uvloop's timers can only wake it every
    1-2 ms, which sent ~2 ms of slots in one burst). 0.2 ms ticks: 2,500 in 0.5 s; a pacer woken by
    a 1 ms timer has at most 500 wakes. A machine busy with other work can starve the loop of a
    run's ticks, so the best of three runs counts (a pacer woken by a 1 ms timer passes none)."""
    wakes = []
    for _ in range(3):
        stats: dict[str, float] = {}
        rec = await _paced_latency(_NoopAppend(), 10_000, 0.5, b"x", stats=stats, tick_s=0.0002)
        assert rec.count == 5000
        wakes.append(stats["pacer_wakes"])
        if wakes[-1] > 750:
            break
    assert max(wakes) > 750, wakes


async def test_the_sleeping_pacer_is_still_there_without_a_timerfd() -> None:
    stats: dict[str, float] = {}
    rec = await _paced_latency(_NoopAppend(), 10_000, 0.2, b"x", stats=stats, timerfd=False, tick_s=0.001)
    assert rec.count == 2000
    assert stats["pacer_wakes"] <= 200


async def test_a_failed_send_fails_the_run() -> None:
    class Refusing:
        def append(self, data: bytes) -> asyncio.Future[int]:
            raise OSError("refused")

    with pytest.raises(OSError, match="refused"):
        await _paced_latency(Refusing(), 1000, 0.05, b"x")


async def test_the_paired_rates_run_the_wal_with_every_aio_setting(tmp_path: Path) -> None:
    config = WalConfig(
        capacity_bytes=2 << 20,
        record_max_bytes=8 << 10,
        batch_max_bytes=64 << 10,
        inflight_max_bytes=1 << 20,
        on_full="wait",  # (the trimmer runs every 50 ms)
        aio="off",
    )
    paired = await _paired_appends(tmp_path, config, 4, 0.4, b"x" * 1024)
    assert set(paired.rates) == {"wal", "base", "format", "aio=auto", "aio=uring", "aio=adaptive"}
    assert all(rate > 0 for rate in paired.rates.values())
    assert len(paired.ratios) == PAIRED_SLICES
    assert {k: len(v) for k, v in paired.other_ratios.items()} == {
        "auto": PAIRED_SLICES,
        "uring": PAIRED_SLICES,
        "adaptive": PAIRED_SLICES,
    }
    assert paired.loop_writes["off"] == 0
    if loop_writes_work(tmp_path, "auto"):
        assert paired.loop_writes["auto"] > 0  # the AIO WAL wrote from the loop
    if loop_writes_work(tmp_path, "uring"):
        assert paired.loop_writes["uring"] > 0  # and so did the io_uring one
    if loop_writes_work(tmp_path, "adaptive"):
        # the adaptive one wrote from the loop unless CPU load kept it on the threads, and says so
        chooser = paired.chooser
        assert set(chooser) == {"groups", "aio_groups", "switches", "probes", "contended"}
        assert chooser["aio_groups"] == paired.loop_writes["adaptive"]
        assert chooser["groups"] > 0
        assert paired.loop_writes["adaptive"] > 0 or chooser["contended"] > 0
    else:
        assert paired.chooser == {}
    assert not list(tmp_path.iterdir())  # every file removed


async def test_only_the_sections_asked_for_run(tmp_path: Path) -> None:
    for bad in ("small,bogus", "latency", "large,latency"):  # (latency needs the 1 KiB rates)
        with pytest.raises(ValueError, match="sections"):
            await wal_workload.run(Context(quick=True, work_dir=tmp_path, s3=None, params={"sections": bad}))
    results = await wal_workload.run(
        Context(quick=True, work_dir=tmp_path, s3=None, params={"sections": "many"})
    )
    assert [r.metric for r in results] == ["append_many, 100-byte records in batches of 10,000"]


async def test_the_64_kib_row_tells_the_mode_after_its_run_and_what_the_chooser_did(tmp_path: Path) -> None:
    (row,) = await wal_workload.run(
        Context(quick=True, work_dir=tmp_path, s3=None, params={"sections": "large", "aio": "adaptive"})
    )
    chooser = row.extra["adaptive_chooser"]
    if not loop_writes_work(tmp_path, "adaptive"):
        assert chooser == {}
        return
    assert chooser["groups"] == row.extra["groups"] > 0
    # (the mode after the run: the path then and the switches so far, the first reading's included)
    assert row.extra["mode"].endswith(f"switches={chooser['switches']})")
