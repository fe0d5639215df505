"""The one Spark failure that a query over the ``s3stream`` source may simply run again: a slow worker start.

Spark gives a new Python worker a fixed window (10 s, not configurable in Spark 4) to connect back to
its JVM. The worker that serves a Python data source on the driver (planning offsets, reading the
schema) is started on demand; on a loaded machine its interpreter start-up can take longer, and the
query then fails with :data:`WORKER_START_TIMEOUT_MESSAGES` in its error. Nothing ran yet: a query
restarted from its checkpoint (or a batch read run again) continues exactly where it was.

:func:`is_worker_start_timeout` is the only test for it (the demo, the tests and the benchmark retry
on it); every other failure is the caller's to raise.
"""

from __future__ import annotations

WORKER_START_TIMEOUT_MESSAGES = (
    "Python worker failed to connect back",
    "Timed out while waiting for the Python worker to connect back",
)
"""The texts Spark (``PythonWorkerFactory``) puts in the error when a worker misses its window."""
WORKER_START_ATTEMPTS = 5
"""How many times the callers run a query that keeps failing this way before they raise."""
_CHAIN_MAX = 32
"""How many causes the test follows (a cycle in ``__cause__``/``__context__`` must not loop)."""


def is_worker_start_timeout(exc: BaseException) -> bool:
    """True when ``exc``, or an exception it was raised from, reports a Python worker that did not
    connect back in time (and nothing else decides it: the test is on the error text only)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < _CHAIN_MAX:
        seen.add(id(current))
        text = str(current)
        if any(message in text for message in WORKER_START_TIMEOUT_MESSAGES):
            return True
        current = current.__cause__ or current.__context__
    return False
