"""``WalConfig.aio="adaptive"``: the path chooser (wal.adaptive) driven with made-up latencies on a fake
clock, and the WAL writing with it (groups on the path it picks, its measurements fed back)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.directio import loop_writes_work
from wal import BlockWAL, MemoryDevice, WalConfig
from wal.adaptive import AIO, THREADS, PathChooser, size_class

KB4 = 4096
FAST = 0.0005
SLOW = 0.005


class _Run:
    """Drives a chooser: each step hands one group over, and completes it with the latency its path
    has now (``lat``), ``step_s`` later on the fake clock."""

    def __init__(self, chooser: PathChooser, step_s: float = 0.001, nbytes: int = KB4) -> None:
        self.c = chooser
        self.now = 0.0
        self.step_s = step_s
        self.nbytes = nbytes
        self.lat = {AIO: FAST, THREADS: SLOW}
        self.paths: list[str] = []  # the path of each group

    def steps(self, count: int) -> list[str]:
        paths = []
        for _ in range(count):
            on_aio = self.c.use_aio(self.now)
            path = AIO if on_aio else THREADS
            paths.append(path)
            self.now += self.step_s
            self.c.record(on_aio, self.nbytes, self.lat[path], self.now)
        self.paths += paths
        return paths

    def until(self, seconds: float) -> list[str]:
        return self.steps(round(seconds / self.step_s))


def test_size_classes_are_a_factor_of_four_apart() -> None:
    assert [size_class(n) for n in (1, 4096, 4097, 16384, 16385, 65536, 65537, 1 << 18, (1 << 18) + 1)] == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
        3,
        4,
    ]
    assert size_class(64 << 20) == 4


def test_it_starts_on_aio_and_stays_while_aio_is_faster() -> None:
    run = _Run(PathChooser())
    assert run.steps(1) == [AIO]
    run.until(2.0)
    assert run.c.path == AIO
    assert run.c.switches == 0


def test_it_probes_the_other_path_once_per_interval() -> None:
    chooser = PathChooser(probe_interval_s=0.1)
    run = _Run(chooser)
    paths = run.until(1.0)
    probe_at = [i for i, p in enumerate(paths) if p == THREADS]
    # the threads are 10x slower: probes back off: 0.1, then 0.2, then 0.4 s apart (at most one per interval)
    assert probe_at == [100, 300, 700]
    assert chooser.probes == 3
    assert chooser.estimate_s(THREADS, KB4) == pytest.approx(SLOW)


def test_probes_stay_at_the_interval_while_the_other_path_is_close() -> None:
    chooser = PathChooser(probe_interval_s=0.05)
    run = _Run(chooser)
    run.lat = {AIO: FAST, THREADS: FAST * 1.1}
    paths = run.until(1.0)
    probe_at = [i for i, p in enumerate(paths) if p == THREADS]
    assert len(probe_at) == 19
    assert all(49 <= b - a <= 51 for a, b in zip([0, *probe_at], probe_at, strict=False))  # (float steps)
    assert chooser.path == AIO


def test_it_switches_to_the_threads_when_aio_slows_well_below_them_and_back_when_it_recovers() -> None:
    chooser = PathChooser()
    run = _Run(chooser)
    run.lat = {AIO: FAST, THREADS: 2 * FAST}
    run.until(1.0)
    assert chooser.path == AIO
    run.lat = {AIO: 10 * FAST, THREADS: 2 * FAST}  # CPU hogs: AIO's completion waits for a kworker
    run.until(1.0)
    assert chooser.path == THREADS
    assert chooser.switches == 1
    assert chooser.estimate_s(AIO, KB4) == pytest.approx(10 * FAST, rel=0.3)
    run.until(2.0)
    assert chooser.switches == 1  # probes of a slow AIO do not bring it back
    run.lat = {AIO: FAST, THREADS: 2 * FAST}  # the hogs stop
    run.until(2.0)
    assert chooser.path == AIO
    assert chooser.switches == 2


def test_it_does_not_switch_on_a_path_that_is_only_a_little_faster() -> None:
    chooser = PathChooser(margin=1.25)
    run = _Run(chooser)
    run.lat = {AIO: 1.2 * FAST, THREADS: FAST}  # threads 20 % faster: below the margin
    run.until(3.0)
    assert chooser.path == AIO
    assert chooser.switches == 0


def test_noise_and_single_outliers_do_not_flap_it() -> None:
    chooser = PathChooser()
    run = _Run(chooser)
    run.lat = {AIO: FAST, THREADS: 1.5 * FAST}
    for i in range(3000):
        # both paths jitter by +-40 %, and every 97th AIO group takes 20x as long (a disk stall)
        jitter = 1 + 0.4 * ((i * 7919) % 11 - 5) / 5
        run.lat = {AIO: FAST * (20 if i % 97 == 0 else jitter), THREADS: 1.5 * FAST * (2 - jitter)}
        run.steps(1)
    assert chooser.switches == 0
    assert chooser.path == AIO


def test_a_disk_stall_holding_a_few_groups_does_not_switch() -> None:
    chooser = PathChooser()
    run = _Run(chooser)
    run.lat = {AIO: FAST, THREADS: 1.5 * FAST}
    run.until(1.0)
    for _ in range(5):  # a 45 ms stall holds three groups in flight, then they finish in a burst
        run.lat = {AIO: 0.045, THREADS: 1.5 * FAST}
        run.steps(3)
        run.lat = {AIO: FAST, THREADS: 1.5 * FAST}
        run.until(0.2)
    assert chooser.switches == 0


def test_groups_of_other_sizes_are_not_compared() -> None:
    chooser = PathChooser()
    run = _Run(chooser, nbytes=256 << 10)
    run.lat = {AIO: 8 * FAST, THREADS: 8 * FAST}  # large groups take longer on both
    run.until(1.0)
    run.nbytes = KB4  # small groups on AIO: no threads estimate in their class yet, so no switch
    run.lat = {AIO: FAST, THREADS: 8 * FAST}
    run.until(0.09)
    assert chooser.path == AIO
    assert chooser.switches == 0
    assert chooser.estimate_s(THREADS, 256 << 10) == pytest.approx(8 * FAST)


def test_it_waits_the_dwell_time_between_switches() -> None:
    chooser = PathChooser(min_dwell_s=0.5, probe_interval_s=0.01, confirm=2)
    run = _Run(chooser)
    run.lat = {AIO: 10 * FAST, THREADS: FAST}
    while chooser.path == AIO:
        run.steps(1)
    assert run.now < 0.2  # the first switch needs no dwell
    switched_at = run.now
    run.lat = {AIO: FAST, THREADS: 10 * FAST}
    while chooser.path == THREADS:
        run.steps(1)
    assert run.now - switched_at >= 0.5
    assert chooser.switches == 2


# ---------------------------------------------------------------------------------- the WAL


CONFIG = WalConfig(
    capacity_bytes=2 << 20,
    record_max_bytes=64 << 10,
    batch_max_bytes=64 << 10,
    inflight_max_bytes=1 << 20,
    on_full="wait",
    aio="adaptive",
)


async def test_a_memory_device_writes_on_the_threads_without_a_chooser() -> None:
    wal = await BlockWAL.open(MemoryDevice(CONFIG.device_bytes), CONFIG)
    await wal.append(b"x")
    assert wal.mode == "memory"
    assert wal.stats["aio_writes"] == 0
    assert "adaptive_switches" not in wal.stats
    await wal.close()


class _Scripted:
    """A chooser that says which path each group takes and keeps what the WAL reports back."""

    def __init__(self, paths: list[bool]) -> None:
        self.paths = paths
        self.path = AIO
        self.switches = 0
        self.probes = 0
        self.records: list[tuple[bool, int, float]] = []

    def use_aio(self, now: float) -> bool:
        return self.paths.pop(0)

    def record(self, on_aio: bool, nbytes: int, latency_s: float, now: float) -> None:
        self.records.append((on_aio, nbytes, latency_s))
        self.switches += 1


async def test_the_wal_writes_each_group_on_the_chosen_path_and_reports_its_latency(tmp_path: Path) -> None:
    path = tmp_path / "wal.dat"
    if not loop_writes_work(tmp_path, "adaptive"):
        pytest.skip("no Linux AIO or no O_DIRECT here")
    wal = await BlockWAL.open(path, CONFIG)
    _ = [r async for r in wal.recover()]
    assert wal.mode == "O_DIRECT+O_DSYNC+adaptive(aio|threads,now=aio,switches=0)"
    scripted: Any = _Scripted([True, False, False, True])
    wal._chooser = scripted
    offsets = [await wal.append(bytes([i]) * 100) for i in range(4)]
    assert [on_aio for on_aio, _, _ in scripted.records] == [True, False, False, True]
    assert all(nbytes == KB4 and 0 < latency < 5 for _, nbytes, latency in scripted.records)
    assert wal.stats["aio_writes"] == 2
    assert wal.stats["groups"] == 4
    assert wal.stats["adaptive_switches"] == 4
    assert wal.mode.endswith("now=aio,switches=4)")
    await wal.close()
    wal = await BlockWAL.open(path, CONFIG)
    assert [(r.offset, r.data) async for r in wal.recover()] == [
        (o, bytes([i]) * 100) for i, o in enumerate(offsets)
    ]
    await wal.close()


async def test_groups_on_both_paths_at_once_complete_in_offset_order(tmp_path: Path) -> None:
    path = tmp_path / "wal.dat"
    if not loop_writes_work(tmp_path, "adaptive"):
        pytest.skip("no Linux AIO or no O_DIRECT here")
    wal = await BlockWAL.open(path, CONFIG)
    _ = [r async for r in wal.recover()]
    scripted: Any = _Scripted([i % 3 != 0 for i in range(10_000)])
    wal._chooser = scripted
    done: list[int] = []

    async def producer(k: int) -> None:
        for i in range(20):  # (~1.1 MiB: no trim needed)
            done.append(await wal.append(bytes([k]) * (200 + 997 * ((i + k) % 7))))

    await asyncio.gather(*(producer(k) for k in range(16)))
    assert done == sorted(done)  # futures resolve in offset order across both paths
    assert 0 < wal.stats["aio_writes"] < wal.stats["groups"]
    await wal.close()
