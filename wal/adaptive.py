"""The write-path chooser of ``WalConfig.aio="adaptive"``: Linux AIO or the I/O threads, by CPU load and
by measurement.

Each path wins in one condition and loses badly in another on this kind of machine (see
:class:`wal.config.WalConfig`): AIO from the loop avoids the GIL hand-offs of the I/O threads, but its
O_DSYNC completion runs on a kernel worker bound to one CPU that waits to run while other processes
keep the CPUs busy. So the WAL writes its groups with the path that suits the machine now:

- **CPU load first** (:class:`CpuLoad`): every ``load_interval_s`` (on a group's hand-over) the chooser
  reads how many CPUs other processes left free over the last window (``/proc/stat``'s busy ticks of
  the CPUs this process may run on, all or those of its affinity, minus this process's own CPU time). Below ``free_cpus_min`` (1.2: others keep all but about
  one CPU busy, the one the loop itself needs) it is *contended*: every group goes to the I/O threads
  and AIO is not probed; it is calm again once ``calm_windows`` windows in a row left at least
  ``free_cpus_calm`` free. Until the first window is read the chooser uses the threads. Other
  signals were measured and not kept (scratch paired slices, share of wall time, quiet / two CPU
  hogs): a group's own latency (below) did not follow the appends' under CPU load; the loop
  thread's run-queue wait (``/proc/thread-self/schedstat``) does not see AIO's weakness, since on
  AIO the loop sleeps while the kernel worker waits (1 and 16 producers on AIO: 0.011-0.013 quiet,
  0.013-0.030 with hogs, while one producer's AIO appends ran at 0.45-0.65x the threads'), and on
  the threads it overlaps (0.07-0.11 quiet, 0.12-0.21 with hogs); CPU pressure
  (``/proc/pressure/cpu``, "some") counts this process's own wake-up waits: the I/O threads alone
  drove it to 0.28 quiet, where two hogs gave 0.27-0.87. Free CPUs read 1.6-1.9 quiet and 0.35-0.66
  with two hogs.
- **latency while calm**: a group's latency is the time from its hand-over (submission or job queue)
  to its completion being handled on the loop; latencies are kept as an exponentially weighted mean
  of their logarithm (a geometric mean: one outlier moves it by a bounded factor, each sample's step
  clipped to a factor of four) per path and per group-size class (sizes within a factor of four), and
  the paths are compared only within a class;
- the path not in use gets one group of its own now and then (time-based: one probe per
  ``probe_interval_s``, doubled up to ``probe_interval_max_s`` while probes come back no faster than
  the path in use, since completions resolve in offset order and a slow probe holds the groups after
  it), so its estimate stays fresh without sending it a share of the groups;
- the WAL switches when the other path (with two samples at least in the class) has been ``margin``
  (2) times faster on ``confirm`` consecutive comparable samples of the path in use, for
  ``confirm_s`` (0.5 s) at least, with a probe of the other path during that time, and the last
  switch is at least ``min_dwell_s`` old. (Eight samples alone are a millisecond at one producer: a
  short disk stall on AIO against a threads estimate from before it switched a quiet run to the
  threads for the rest of it.) The margin is wide on purpose: a group's latency leaves out
  what each path costs the loop (an I/O thread's GIL hand-offs), so the threads can show shorter
  groups and still append slower (1 producer, quiet: threads' groups 0.14 ms against AIO probes'
  0.17-0.25 ms, yet AIO appended 1.4x faster); only a gross difference is worth a switch.
- a change of the CPU state starts both estimates afresh (those taken under the other state do not
  tell about this one) and puts AIO in use when calm, the threads when contended.

Pure logic with the clock and the load passed in: the tests drive it with made-up latencies and loads.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

AIO = "aio"
THREADS = "threads"

_CLASSES = 5
"""Group-size classes: up to 4 KiB, 16 KiB, 64 KiB, 256 KiB, and larger (a factor of four each)."""


_CLIP = math.log(4)
"""The largest step of one sample in the log-latency mean (a factor of four)."""


def size_class(nbytes: int) -> int:
    """The size class of a group write of ``nbytes``."""
    return min((((max(nbytes, 1) - 1) >> 12).bit_length() + 1) >> 1, _CLASSES - 1)


def parse_cpu_ticks(text: bytes, cpus: frozenset[int] | None = None) -> tuple[int, int]:
    """(all ticks, busy ticks) of the aggregate ``cpu`` line that starts ``/proc/stat``, or summed over
    the ``cpuN`` lines of the CPUs in ``cpus`` (the ones this process may run on, when fewer than all).

    The fields: user nice system idle iowait irq softirq steal guest guest_nice (guest time is also in
    user). Busy is everything but idle and iowait: steal counts as busy (a CPU the hypervisor gave to
    someone else is not free for our kernel worker either). ValueError if the aggregate line, or the
    line of one of ``cpus``, is not there.
    """
    first, _, rest = text.partition(b"\n")
    fields = first.split()
    if len(fields) < 6 or fields[0] != b"cpu":
        raise ValueError(f"not a /proc/stat cpu line: {text[:80]!r}")
    rows = [fields]
    if cpus is not None:  # (the per-CPU lines follow the aggregate one, before the long intr line)
        wanted = {b"cpu%d" % n for n in cpus}
        rows = []
        for line in rest.split(b"\nintr", 1)[0].split(b"\n"):
            if not line.startswith(b"cpu"):
                break
            fields = line.split()
            if fields[0] in wanted:
                rows.append(fields)
        if len(rows) != len(wanted):
            raise ValueError(f"/proc/stat lacks the line of one of the CPUs {sorted(cpus)}")
    total = busy = 0
    for fields in rows:
        ticks = [int(v) for v in fields[1:9]]
        total += sum(ticks)
        busy += sum(ticks) - ticks[3] - ticks[4]
    return total, busy


class CpuLoad:
    """How many CPUs other processes left free, from ``/proc/stat`` and this process's CPU time.

    :meth:`free_cpus` gives, over the window since its previous call, the CPUs there are minus the
    CPUs that processes other than this one (and kernel work) kept busy: e.g. 2.0 on an idle 2-core
    machine, ~0.4 with two CPU hogs. With ``cpus`` (a process pinned to fewer CPUs than the machine
    has, see :meth:`open`) only those CPUs count: others' work on the rest takes nothing from it.
    ``read`` returns the file's bytes, ``own_cpu_s`` this process's CPU seconds (all threads); both
    injectable for tests.
    """

    def __init__(
        self,
        read: Callable[[], bytes],
        own_cpu_s: Callable[[], float] = time.process_time,
        ticks_per_s: int = 100,
        window_min_s: float = 0.05,
        cpus: frozenset[int] | None = None,
    ) -> None:
        self._read = read
        self._cpus = cpus
        self._own_cpu_s = own_cpu_s
        self._ticks_per_s = ticks_per_s
        self._window_min_s = window_min_s
        self._last: tuple[float, int, int, float] | None = None

    @classmethod
    def open(cls, path: str = "/proc/stat") -> CpuLoad | None:
        """A reader of ``path`` (opened and read on each call: no descriptor to leak), or None where it
        is missing or not a Linux ``/proc/stat``. A process whose CPU affinity leaves out some of the
        machine's CPUs reads only its own CPUs' lines."""

        def read() -> bytes:
            with open(path, "rb") as f:
                # (the kernel builds the whole file on the first read anyway; the CPU lines come first)
                return f.read(1 << 16)

        affinity = frozenset(os.sched_getaffinity(0))
        cpus = affinity if len(affinity) < (os.cpu_count() or len(affinity)) else None
        try:
            parse_cpu_ticks(read(), cpus)
            ticks_per_s = os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError):
            return None
        return cls(read, ticks_per_s=ticks_per_s, cpus=cpus)

    def free_cpus(self, now: float) -> float | None:
        """CPUs not kept busy by others since the last call (at ``now``, seconds of a monotonic clock),
        None for the first call (it starts the window), a window shorter than ``window_min_s`` or an
        unreadable file."""
        try:
            total, busy = parse_cpu_ticks(self._read(), self._cpus)
        except (OSError, ValueError):
            return None
        own = self._own_cpu_s()
        last = self._last
        if last is not None and now - last[0] < self._window_min_s:
            return None
        self._last = (now, total, busy, own)
        if last is None:
            return None
        then, total0, busy0, own0 = last
        if total <= total0:
            return None
        wall_s = now - then
        cpus = (total - total0) / self._ticks_per_s / wall_s
        others = max(0.0, ((busy - busy0) / self._ticks_per_s - (own - own0)) / wall_s)
        return max(0.0, cpus - others)


class PathChooser:
    """Which path writes the next group (:meth:`use_aio`), learning from completions (:meth:`record`).

    With ``load`` (a :class:`CpuLoad`, or any object with its ``free_cpus``) it starts on the threads
    and follows the CPU load first; without, it starts on AIO and goes by latency only. ``switches``
    and ``probes`` count what it did, ``contended_count`` how often CPU load sent it to the threads;
    ``path`` is the path in use.
    """

    def __init__(
        self,
        *,
        probe_interval_s: float = 0.2,
        probe_interval_max_s: float = 3.2,
        margin: float = 2.0,
        confirm: int = 8,
        confirm_s: float = 0.5,
        min_dwell_s: float = 0.25,
        alpha_current: float = 0.2,
        alpha_probe: float = 0.5,
        load: CpuLoad | None = None,
        load_interval_s: float = 0.1,
        free_cpus_min: float = 1.2,
        free_cpus_calm: float = 1.4,
        calm_windows: int = 3,
    ) -> None:
        assert free_cpus_min <= free_cpus_calm
        self.probe_interval_s = probe_interval_s
        self.probe_interval_max_s = probe_interval_max_s
        self._log_margin = math.log(margin)
        self.confirm = confirm
        self.confirm_s = confirm_s
        self.min_dwell_s = min_dwell_s
        self._alpha_current = alpha_current
        self._alpha_probe = alpha_probe
        self._load = load
        self.load_interval_s = load_interval_s
        self.free_cpus_min = free_cpus_min
        self.free_cpus_calm = free_cpus_calm
        self.calm_windows = calm_windows
        # None: no CPU reading yet (with a load: the threads until the first); else contended or not
        self.contended: bool | None = None if load is not None else False
        self.contended_count = 0
        self.free_cpus: float | None = None  # the last reading
        self._calm = 0  # consecutive calm windows while contended
        self._load_at = -math.inf
        self.path = AIO if load is None else THREADS
        self.switches = 0
        self.probes = 0
        # per path, per size class: the EWMA of log(latency), None before the first sample
        self._est: dict[str, list[float | None]] = {}
        self._count: dict[str, list[int]] = {}
        self._forget()
        self._interval = probe_interval_s
        self._last_probe: float | None = None  # (None: no group chosen yet)
        self._last_switch = -math.inf
        self._agree = 0  # consecutive comparable samples of the path in use where the other was faster
        self._agree_since = 0.0  # when that streak began
        self._sampled_at = {AIO: -math.inf, THREADS: -math.inf}  # each path's last sample

    def _forget(self) -> None:
        self._est = {AIO: [None] * _CLASSES, THREADS: [None] * _CLASSES}
        self._count = {AIO: [0] * _CLASSES, THREADS: [0] * _CLASSES}

    def use_aio(self, now: float) -> bool:
        """Whether the group handed over now goes to AIO: never while the CPUs are contended (or not
        read yet); else the path in use, or the other one as a probe once the probe interval has
        passed since the last probe (or the first group)."""
        if self._load is not None and now - self._load_at >= self.load_interval_s:
            self._load_at = now
            free = self._load.free_cpus(now)
            if free is not None:
                self._observe(free, now)
        if self.contended is not False:
            return False
        last = self._last_probe
        if last is None:
            self._last_probe = now
        elif now - last >= self._interval:
            self._last_probe = now
            self.probes += 1
            return self.path != AIO
        return self.path == AIO

    def _observe(self, free_cpus: float, now: float) -> None:
        """A CPU reading: maybe turn contended (at once) or calm (after ``calm_windows`` readings)."""
        self.free_cpus = free_cpus
        was = self.contended
        if free_cpus < self.free_cpus_min:
            self._calm = 0
            if was:
                return
            self.contended = True
            self.contended_count += 1
            self._enter(THREADS, now)
            return
        calm = free_cpus >= self.free_cpus_calm
        self._calm = self._calm + 1 if calm else 0
        if was is None:  # the first reading decides at once
            self.contended = not calm
            if self.contended:
                self.contended_count += 1
            self._enter(THREADS if self.contended else AIO, now)
        elif was and self._calm >= self.calm_windows:
            self.contended = False
            self._enter(AIO, now)

    def _enter(self, path: str, now: float) -> None:
        """The CPU state changed: estimates start afresh, ``path`` in use."""
        self._forget()
        self._agree = 0
        self._interval = self.probe_interval_s
        self._last_probe = now
        if path != self.path:
            self.path = path
            self.switches += 1
            self._last_switch = now

    def record(self, on_aio: bool, nbytes: int, latency_s: float, now: float) -> None:
        """A group of ``nbytes`` written on AIO (or the threads) took ``latency_s``; maybe switch."""
        if self.contended is not False:
            return  # (all on the threads: nothing to compare)
        path = AIO if on_aio else THREADS
        other = THREADS if on_aio else AIO
        cls = size_class(nbytes)
        sample = math.log(max(latency_s, 1e-7))
        ests = self._est[path]
        old = ests[cls]
        alpha = self._alpha_current if path == self.path else self._alpha_probe
        # (a step is clipped to a factor of 4: a disk stall that holds the groups in flight for
        # 100x their usual time moves the estimate as much as a group 4x slower)
        ests[cls] = sample if old is None else old + alpha * max(-_CLIP, min(_CLIP, sample - old))
        self._count[path][cls] += 1
        self._sampled_at[path] = now
        if path != self.path:  # a probe: back off while the probed path is no faster
            mine = self._est[self.path][cls]
            if mine is not None and sample >= mine:
                self._interval = min(self._interval * 2, self.probe_interval_max_s)
            else:
                self._interval = self.probe_interval_s
            return
        theirs = self._est[other][cls]
        if theirs is None or self._count[other][cls] < 2:
            return  # not comparable (yet): neither counts for nor against a switch
        if ests[cls] - theirs > self._log_margin:  # type: ignore[operator]
            if not self._agree:  # a streak begins: probe the other path again soon
                self._agree_since = now
                self._interval = self.probe_interval_s
            self._agree += 1
            if (
                self._agree >= self.confirm
                and now - self._agree_since >= self.confirm_s
                and self._sampled_at[other] > self._agree_since  # (measured during the streak)
                and now - self._last_switch >= self.min_dwell_s
            ):
                self.path = other
                self.switches += 1
                self._last_switch = now
                self._agree = 0
                self._interval = self.probe_interval_s
                self._last_probe = now  # the path just left is probed one interval from now
        else:
            self._agree = 0

    def estimate_s(self, path: str, nbytes: int) -> float | None:
        """The path's current latency estimate for groups of ``nbytes`` (seconds), None if none yet."""
        est = self._est[path][size_class(nbytes)]
        return None if est is None else math.exp(est)
