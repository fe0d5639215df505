"""The write-path chooser of ``WalConfig.aio="adaptive"``: Linux AIO or the I/O threads, by measurement.

Each path wins in one condition and loses badly in another on this kind of machine (see
:class:`wal.config.WalConfig`): AIO from the loop avoids the GIL hand-offs of the I/O threads, but its
O_DSYNC completion runs on a kernel worker bound to one CPU that waits to run while other processes
keep the CPUs busy. So the WAL writes its groups with the path that currently completes them faster,
as this chooser measures it:

- a group's latency is the time from its hand-over (submission or job queue) to its completion being
  handled on the loop, the delay each path adds to every append of the group;
- latencies are kept as an exponentially weighted mean of their logarithm (a geometric mean: one
  outlier moves it by a bounded factor, each sample's step clipped to a factor of four) per path and
  per group-size class (sizes within a factor of four), and the paths are compared only within a
  class: a 4 KiB group is not compared with 256 KiB;
- the path not in use gets one group of its own now and then (time-based: one probe per
  ``probe_interval_s``, doubled up to ``probe_interval_max_s`` while probes come back well slower than
  the path in use, since completions resolve in offset order and a slow probe holds the groups after
  it), so its estimate stays fresh without sending it a share of the groups;
- the WAL switches when the other path (with two samples at least in the class) has been ``margin``
  times faster on ``confirm`` consecutive comparable samples of the path in use and the last switch
  is at least ``min_dwell_s`` old (hysteresis: noise and single outliers do not flip it back and
  forth).

Pure logic with the clock passed in: the tests drive it with made-up latencies.
"""

from __future__ import annotations

import math

AIO = "aio"
THREADS = "threads"

_CLASSES = 5
"""Group-size classes: up to 4 KiB, 16 KiB, 64 KiB, 256 KiB, and larger (a factor of four each)."""


_CLIP = math.log(4)
"""The largest step of one sample in the log-latency mean (a factor of four)."""


def size_class(nbytes: int) -> int:
    """The size class of a group write of ``nbytes``."""
    return min((((max(nbytes, 1) - 1) >> 12).bit_length() + 1) >> 1, _CLASSES - 1)


class PathChooser:
    """Which path writes the next group (:meth:`use_aio`), learning from completions (:meth:`record`).

    Starts on AIO. ``switches`` and ``probes`` count what it did; ``path`` is the path in use.
    """

    def __init__(
        self,
        *,
        probe_interval_s: float = 0.1,
        probe_interval_max_s: float = 0.8,
        margin: float = 1.25,
        confirm: int = 8,
        min_dwell_s: float = 0.25,
        alpha_current: float = 0.2,
        alpha_probe: float = 0.5,
    ) -> None:
        self.probe_interval_s = probe_interval_s
        self.probe_interval_max_s = probe_interval_max_s
        self._log_margin = math.log(margin)
        self.confirm = confirm
        self.min_dwell_s = min_dwell_s
        self._alpha_current = alpha_current
        self._alpha_probe = alpha_probe
        self.path = AIO
        self.switches = 0
        self.probes = 0
        # per path, per size class: the EWMA of log(latency), None before the first sample
        self._est: dict[str, list[float | None]] = {AIO: [None] * _CLASSES, THREADS: [None] * _CLASSES}
        self._count: dict[str, list[int]] = {AIO: [0] * _CLASSES, THREADS: [0] * _CLASSES}
        self._interval = probe_interval_s
        self._last_probe: float | None = None  # (None: no group chosen yet)
        self._last_switch = -math.inf
        self._agree = 0  # consecutive comparable samples of the path in use where the other was faster

    def use_aio(self, now: float) -> bool:
        """Whether the group handed over now goes to AIO: the path in use, or the other one as a
        probe once the probe interval has passed since the last probe (or the first group)."""
        last = self._last_probe
        if last is None:
            self._last_probe = now
        elif now - last >= self._interval:
            self._last_probe = now
            self.probes += 1
            return self.path != AIO
        return self.path == AIO

    def record(self, on_aio: bool, nbytes: int, latency_s: float, now: float) -> None:
        """A group of ``nbytes`` written on AIO (or the threads) took ``latency_s``; maybe switch."""
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
        if path != self.path:  # a probe: back off while the probed path stays well slower
            mine = self._est[self.path][cls]
            if mine is not None and sample - mine > 2 * self._log_margin:
                self._interval = min(self._interval * 2, self.probe_interval_max_s)
            else:
                self._interval = self.probe_interval_s
            return
        theirs = self._est[other][cls]
        if theirs is None or self._count[other][cls] < 2:
            return  # not comparable (yet): neither counts for nor against a switch
        if ests[cls] - theirs > self._log_margin:  # type: ignore[operator]
            self._agree += 1
            if self._agree >= self.confirm and now - self._last_switch >= self.min_dwell_s:
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
