"""``WalConfig.aio="adaptive"``: the path chooser (wal.adaptive) driven with made-up latencies on a fake
clock, and the WAL writing with it (groups on the path it picks, its measurements fed back)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.directio import loop_writes_work
from tests.unit.test_wal_aio import CONFIG as AIO_CONFIG
from wal import BlockWAL, MemoryDevice
from wal.adaptive import AIO, THREADS, CpuLoad, PathChooser, parse_cpu_ticks, size_class

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


def test_probes_stay_at_the_interval_while_the_other_path_is_faster_but_below_the_margin() -> None:
    chooser = PathChooser(probe_interval_s=0.05)
    run = _Run(chooser)
    run.lat = {AIO: FAST, THREADS: FAST / 1.5}
    paths = run.until(1.0)
    probe_at = [i for i, p in enumerate(paths) if p == THREADS]
    assert len(probe_at) == 19
    assert all(49 <= b - a <= 51 for a, b in zip([0, *probe_at], probe_at, strict=False))  # (float steps)
    assert chooser.path == AIO
    assert chooser.switches == 0


def test_probes_back_off_while_the_other_path_is_no_faster() -> None:
    chooser = PathChooser(probe_interval_s=0.05, probe_interval_max_s=0.4)
    run = _Run(chooser)
    run.lat = {AIO: FAST, THREADS: FAST * 1.1}  # (the old rule kept probing a path this close)
    paths = run.until(1.0)
    assert [i for i, p in enumerate(paths) if p == THREADS] == [50, 150, 350, 750]


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
    run.lat = {AIO: FAST, THREADS: 3 * FAST}  # the hogs stop (AIO 3x faster: above the margin of 2)
    run.until(5.0)  # (the probes of AIO backed off to 3.2 s while it was slow)
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
    chooser = PathChooser(min_dwell_s=0.5, probe_interval_s=0.01, confirm=2, confirm_s=0.0)
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


def test_a_short_slowdown_of_the_path_in_use_does_not_switch() -> None:
    for confirm_s, switches in ((0.0, 1), (0.5, 0)):  # (0.0: the old rule, eight samples)
        chooser = PathChooser(confirm_s=confirm_s)
        run = _Run(chooser, step_s=0.000125)  # one producer: 8,000 groups/s
        run.lat = {AIO: FAST, THREADS: 1.5 * FAST}
        run.until(1.0)
        run.lat = {AIO: 4 * FAST, THREADS: 1.5 * FAST}  # 30 ms of slow AIO groups (a disk hiccup)
        run.until(0.03)
        run.lat = {AIO: FAST, THREADS: 1.5 * FAST}
        run.until(1.0)
        assert chooser.switches == switches
        assert chooser.path == (THREADS if switches else AIO)


def test_a_switch_needs_a_probe_of_the_other_path_during_the_streak() -> None:
    chooser = PathChooser(confirm_s=0.5, probe_interval_s=2.0, probe_interval_max_s=2.0)
    run = _Run(chooser)
    run.lat = {AIO: FAST, THREADS: 0.6 * FAST}  # (threads faster, below the margin)
    run.until(4.1)  # probes at 2.0 and 4.0 s
    run.lat = {AIO: 3 * FAST, THREADS: 0.6 * FAST}  # now 5x: well past the margin
    run.until(1.5)  # the estimates say switch, but no probe of the threads since AIO slowed
    assert chooser.path == AIO
    run.until(0.5)  # the probe at 6.0 s confirms it
    assert chooser.path == THREADS
    assert chooser.switches == 1


# ------------------------------------------------------------------------ CPU load first

STAT = b"cpu  {user} 0 {system} {idle} {iowait} 0 0 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1 2\n"


def _stat(user: int, system: int, idle: int, iowait: int = 0, steal: int = 0) -> bytes:
    return (
        STAT.replace(b"{user}", b"%d" % user)
        .replace(b"{system}", b"%d" % system)
        .replace(b"{idle}", b"%d" % idle)
        .replace(b"{iowait}", b"%d" % iowait)
        .replace(b"{steal}", b"%d" % steal)
    )


def test_the_cpu_line_gives_all_and_busy_ticks() -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice (guest is in user already)
    text = b"cpu  100 5 50 800 40 1 4 7 30 0\ncpu0 50 2 25 400 20 0 2 3 15 0\n"
    assert parse_cpu_ticks(text) == (1007, 167)  # busy: all but idle and iowait (steal counts)
    for bad in (b"", b"intr 1 2 3\n", b"cpu0 1 2 3 4 5 6 7 8\n", b"cpu 1 2\n"):
        with pytest.raises(ValueError, match="cpu line"):
            parse_cpu_ticks(bad)


def test_a_pinned_process_counts_only_its_own_cpus_lines() -> None:
    text = (
        b"cpu  300 0 100 1600 0 0 0 0 0 0\n"
        b"cpu0 10 0 0 490 0 0 0 0 0 0\n"  # idle but for ours
        b"cpu1 290 0 100 110 0 0 0 0 0 0\n"  # kept busy by another process
        b"cpu2 0 0 0 500 0 0 0 0 0 0\n"
        b"cpu3 0 0 0 500 0 0 0 0 0 0\n"
        b"intr 1 2 3\n"
    )
    assert parse_cpu_ticks(text) == (2000, 400)
    assert parse_cpu_ticks(text, frozenset({0, 1})) == (1000, 400)
    assert parse_cpu_ticks(text, frozenset({2, 3})) == (1000, 0)
    with pytest.raises(ValueError, match="lacks"):
        parse_cpu_ticks(text, frozenset({0, 7}))


def test_cpu_load_of_a_pinned_process_leaves_out_the_other_cpus() -> None:
    """Pinned to CPUs 0-1 of four, with CPU 1 kept busy by another process: one CPU is free for it,
    though the machine as a whole has three."""
    busy = [0, 0, 0, 0]
    idle = [0, 0, 0, 0]

    def read() -> bytes:
        line = b"cpu%s %d 0 0 %d 0 0 0 0 0 0\n"
        return line % (b"", sum(busy), sum(idle)) + b"".join(
            line % (b"%d" % n, busy[n], idle[n]) for n in range(4)
        )

    pinned = CpuLoad(read, own_cpu_s=lambda: 0.0, ticks_per_s=100, cpus=frozenset({0, 1}))
    whole = CpuLoad(read, own_cpu_s=lambda: 0.0, ticks_per_s=100)
    assert pinned.free_cpus(0.0) is None
    assert whole.free_cpus(0.0) is None
    busy[1] += 100  # one second: CPU 1 busy with another process, the others idle
    for n in (0, 2, 3):
        idle[n] += 100
    assert pinned.free_cpus(1.0) == pytest.approx(1.0)
    assert whole.free_cpus(1.0) == pytest.approx(3.0)


def test_open_reads_only_the_cpus_of_the_affinity_when_pinned() -> None:
    """In a child pinned to one CPU of several, CpuLoad.open picks that CPU's line (the whole
    machine's otherwise)."""
    if (os.cpu_count() or 1) < 2 or not Path("/proc/stat").exists():
        pytest.skip("needs /proc/stat and two CPUs")
    code = (
        "import os; from wal.adaptive import CpuLoad\n"
        "print(CpuLoad.open()._cpus)\n"
        "os.sched_setaffinity(0, {0}); print(CpuLoad.open()._cpus)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["None", "frozenset({0})"]


class _Proc:
    """/proc/stat and this process's CPU time, advanced by hand: ``tick(wall_s, others, ours)`` runs
    ``wall_s`` of a 2-CPU machine where others keep ``others`` CPUs busy and this process ``ours``."""

    def __init__(self) -> None:
        self.busy = 0.0
        self.all = 0.0
        self.own = 0.0
        self.now = 10.0

    def read(self) -> bytes:
        busy = round(self.busy * 100)
        return _stat(busy // 2, busy - busy // 2, round(self.all * 100) - busy)

    def tick(self, wall_s: float, others: float, ours: float) -> None:
        self.now += wall_s
        self.all += 2 * wall_s
        self.busy += (others + ours) * wall_s
        self.own += ours * wall_s


def test_cpu_load_is_the_cpus_that_others_left_free() -> None:
    proc = _Proc()
    load = CpuLoad(proc.read, own_cpu_s=lambda: proc.own, ticks_per_s=100)
    assert load.free_cpus(proc.now) is None  # the first call starts the window
    proc.tick(0.2, others=0.1, ours=0.9)  # quiet: our loop busy, others barely
    assert load.free_cpus(proc.now) == pytest.approx(1.9, abs=0.06)
    proc.tick(0.01, others=2, ours=0)
    assert load.free_cpus(proc.now) is None  # a window too short to tell
    proc.tick(0.3, others=1.6, ours=0.4)  # two CPU hogs
    assert load.free_cpus(proc.now) == pytest.approx(0.4, abs=0.1)


def test_cpu_load_reads_the_real_proc_stat_where_there_is_one(tmp_path: Path) -> None:
    assert CpuLoad.open(str(tmp_path / "missing")) is None
    (tmp_path / "stat").write_bytes(b"no cpu line here\n")
    assert CpuLoad.open(str(tmp_path / "stat")) is None
    if not Path("/proc/stat").exists():
        pytest.skip("no /proc/stat here")
    load = CpuLoad.open()
    assert load is not None
    assert load.free_cpus(time.perf_counter()) is None
    time.sleep(0.1)  # (some ticks to count)
    free = load.free_cpus(time.perf_counter())
    assert free is not None
    assert 0 <= free <= (os.cpu_count() or 1) * 1.2


class _Load:
    """Free CPUs as the test sets them; counts the readings."""

    def __init__(self, free: float) -> None:
        self.free: float | None = free
        self.reads = 0

    def free_cpus(self, now: float) -> float | None:
        self.reads += 1
        return self.free


def test_with_a_cpu_load_it_uses_the_threads_until_the_first_reading_and_aio_once_calm() -> None:
    load = _Load(1.8)
    load.free = None  # the first call only starts the window
    chooser = PathChooser(load=load)  # type: ignore[arg-type]
    run = _Run(chooser)
    assert run.steps(50) == [THREADS] * 50
    assert chooser.contended is None
    load.free = 1.8
    run.until(0.2)
    assert chooser.path == AIO
    assert chooser.contended is False
    assert chooser.switches == 1
    assert chooser.contended_count == 0
    assert load.reads <= 4  # one reading per 0.1 s of groups, not one per group


def test_cpu_contention_sends_every_group_to_the_threads_at_once_and_stops_probing_aio() -> None:
    load = _Load(1.8)
    chooser = PathChooser(load=load)  # type: ignore[arg-type]
    run = _Run(chooser)
    run.until(1.0)
    assert chooser.path == AIO
    load.free = 0.4  # two CPU hogs; AIO's groups still look fast (its signal lags under CPU load)
    paths = run.until(0.2)
    assert paths[-90:] == [THREADS] * 90  # from the next reading on
    assert chooser.contended is True
    assert chooser.contended_count == 1
    probes = chooser.probes
    assert run.until(3.0) == [THREADS] * 3000  # no AIO probe while contended
    assert chooser.probes == probes
    assert chooser.estimate_s(AIO, KB4) is None  # estimates start afresh on a change of CPU state


def test_it_returns_to_aio_only_after_calm_windows_in_a_row() -> None:
    load = _Load(0.4)
    chooser = PathChooser(load=load, calm_windows=3)  # type: ignore[arg-type]
    run = _Run(chooser)
    run.until(0.5)
    assert chooser.contended is True
    for free in (1.8, 1.8, 1.3, 1.8, 1.8):  # (1.3: between the two bounds, not calm)
        load.free = free
        assert run.until(0.1) == [THREADS] * 100
    load.free = 1.8
    run.until(0.1)  # the third calm window in a row
    assert chooser.contended is False
    assert chooser.path == AIO
    assert run.until(0.1).count(AIO) >= 99
    assert chooser.contended_count == 1
    load.free = 1.1  # below free_cpus_min: contended again at once
    run.until(0.1)
    assert chooser.path == THREADS
    assert chooser.contended_count == 2


# ---------------------------------------------------------------------------------- the WAL


CONFIG = dataclasses.replace(AIO_CONFIG, aio="adaptive")


async def _open_on_a_file(path: Path) -> BlockWAL:
    """A recovered adaptive WAL on an O_DIRECT file at ``path`` (the test skips where the kernel or
    the filesystem has no Linux AIO or no O_DIRECT)."""
    if not loop_writes_work(path.parent, "adaptive"):
        pytest.skip("no Linux AIO or no O_DIRECT here")
    wal = await BlockWAL.open(path, CONFIG)
    _ = [r async for r in wal.recover()]
    return wal


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
        self.contended_count = 0
        self.records: list[tuple[bool, int, float]] = []

    def use_aio(self, now: float) -> bool:
        return self.paths.pop(0)

    def record(self, on_aio: bool, nbytes: int, latency_s: float, now: float) -> None:
        self.records.append((on_aio, nbytes, latency_s))
        self.switches += 1


async def test_the_wal_writes_each_group_on_the_chosen_path_and_reports_its_latency(tmp_path: Path) -> None:
    path = tmp_path / "wal.dat"
    wal = await _open_on_a_file(path)
    # (with /proc/stat it starts on the threads until the first CPU reading)
    start = "threads" if CpuLoad.open() is not None else "aio"
    assert wal.mode == f"O_DIRECT+O_DSYNC+adaptive(aio|threads,now={start},switches=0)"
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
    wal = await _open_on_a_file(path)
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


async def test_the_wal_writes_on_the_threads_while_the_cpus_are_contended(tmp_path: Path) -> None:
    path = tmp_path / "wal.dat"
    wal = await _open_on_a_file(path)
    load = _Load(0.3)
    wal._chooser = PathChooser(load=load)  # type: ignore[arg-type]
    offsets = [await wal.append(bytes([i]) * 100) for i in range(50)]
    assert wal.stats["aio_writes"] == 0
    assert wal.stats["groups"] == 50
    assert wal.stats["adaptive_contended"] == 1
    assert "now=threads" in wal.mode
    load.free = 1.9
    wal._chooser.load_interval_s = 0.0  # (a reading per group: calm after three groups)
    wal._chooser.calm_windows = 3
    offsets += [await wal.append(bytes([i]) * 100) for i in range(50, 60)]
    assert wal.stats["aio_writes"] >= 7
    assert "now=aio" in wal.mode
    await wal.close()
    wal = await BlockWAL.open(path, CONFIG)
    assert [(r.offset, r.data) async for r in wal.recover()] == [
        (o, bytes([i]) * 100) for i, o in enumerate(offsets)
    ]
    await wal.close()
