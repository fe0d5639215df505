"""The database server's clock, read locally: what every node sharing a PostgreSQL store compares.

Prepared-object deadlines, deletion marks and leases are stamped and compared by the store's clock.
With one shared database, two nodes whose own clocks disagree would disagree about whether a lease
has expired; so the PostgreSQL store's default clock is the server's: a sample of
``clock_timestamp()`` taken at open (and again every ``REFRESH_INTERVAL_MS``, by whichever worker
runs the next operation) plus the local monotonic time elapsed since the sample. The error is the
sample's round trip over two (its midpoint is taken as the instant the server read its clock) plus
the local clock's drift since the sample. Readings never go back.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from s3stream.errors import UnavailableError

REFRESH_INTERVAL_MS = 60_000
"""How old a sample may grow before the next operation takes a new one."""

SERVER_NOW_MS = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"


def _monotonic_ms() -> float:
    return time.monotonic_ns() / 1_000_000


class ServerClock:
    """Milliseconds since the Unix epoch by the server's clock (a :data:`~s3stream.clock.Clock`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._server_ms = 0.0
        """The server's time at ``_local_ms``."""
        self._local_ms = 0.0
        self._last_ms = 0
        self._sampled = False

    def sample(self, conn: psycopg.Connection[Any]) -> None:
        """Read the server's clock over ``conn`` (outside a transaction: ``clock_timestamp`` is the
        current time, not the transaction's start)."""
        before = _monotonic_ms()
        row = conn.execute(SERVER_NOW_MS).fetchone()
        after = _monotonic_ms()
        if row is None or not isinstance(row[0], int):
            raise UnavailableError(f"the metadata database answered the clock query with {row!r:.80}")
        with self._lock:
            self._server_ms = float(row[0])
            self._local_ms = (before + after) / 2
            self._sampled = True

    def stale(self) -> bool:
        """Whether the sample is older than ``REFRESH_INTERVAL_MS``."""
        return _monotonic_ms() - self._local_ms > REFRESH_INTERVAL_MS

    def __call__(self) -> int:
        with self._lock:
            assert self._sampled, "the server's clock is read before its first sample"
            now_ms = int(self._server_ms + (_monotonic_ms() - self._local_ms))
            self._last_ms = max(self._last_ms, now_ms)
            return self._last_ms
