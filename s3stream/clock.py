"""The product's one wall clock: milliseconds since the epoch.

Everything that stamps or compares wall-clock times (prepared-object TTLs, deletion retention, leases
in the metadata store) reads :func:`wall_clock_ms` or takes a :data:`Clock` so tests can move time.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]
"""Wall-clock milliseconds; injected so tests can move time."""


def wall_clock_ms() -> int:
    """Milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000


_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def lease_clock_s() -> float:
    """Seconds on the clock a node's local lease deadline is kept on: CLOCK_BOOTTIME on Linux, which
    keeps counting while the host is suspended (CLOCK_MONOTONIC stops, so a node resumed after a
    suspend longer than its lease would think its lease still runs); ``time.monotonic`` elsewhere."""
    if _BOOTTIME is not None:
        return time.clock_gettime(_BOOTTIME)
    return time.monotonic()
