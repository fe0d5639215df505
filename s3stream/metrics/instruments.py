"""The cheap instruments the hot paths update: a fixed-bucket histogram and a labelled counter.

They are plain Python objects mutated on the event loop thread (the only writer) and read by the
exporter's thread at scrape time; a read may see one observation half applied (a bucket counted, the
sum not yet), never a lost one. prometheus_client's own metric objects take a lock per update
(~0.3-1 us each); these cost an attribute load, a bisect and two adds.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0,
)  # fmt: skip
"""Upper bounds (seconds) of every latency histogram: 100 us (a WAL group write on a fast disk) to 30 s
(a retried S3 call's deadline)."""
assert list(LATENCY_BUCKETS_S) == sorted(set(LATENCY_BUCKETS_S)), "bucket bounds strictly increase"


class Histogram:
    """Counts of observations per bucket (``value <= bound``, Prometheus' ``le``) and their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS_S) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        """One per bound, then the +Inf bucket; not cumulative."""
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def append(self, value: float) -> None:
        """:meth:`observe` under the name of a list's method (for code that appends samples to a list)."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def snapshot(self) -> tuple[list[tuple[str, float]], float]:
        """(cumulative buckets as (le, count) with ``+Inf`` last, sum): the exposition's shape."""
        counts = list(self.counts)  # one copy: a consistent set of buckets
        total = self.sum
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*map(_le, self.bounds), "+Inf"), counts, strict=True):
            running += count
            out.append((bound, float(running)))
        return out, total

    @property
    def count(self) -> int:
        return sum(self.counts)


class LabelledCounts:
    """A counter per label value tuple, created on first use (for labels of a small, closed set)."""

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, labels: tuple[str, ...], amount: float = 1) -> None:
        values = self.values
        values[labels] = values.get(labels, 0) + amount

    def items(self) -> list[tuple[tuple[str, ...], float]]:
        return list(self.values.items())


def _le(bound: float) -> str:
    return repr(float(bound))
