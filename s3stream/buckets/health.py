"""Which buckets are healthy: errors counted in a window, probes that bring a bucket back, stats.

A bucket becomes **unhealthy** once ``errors_max`` errors or timeouts (UnavailableError, TimeoutError)
happened within ``window_ms``. Until then a bucket whose last error is younger than a call deadline
(twice ``request_timeout_ms``, and never shorter than the wait for the next probe round) is
**suspect**: still healthy, but new writes go to the other buckets while any is neither unhealthy
nor suspect, so a dead bucket costs one deadline, not one per write until the threshold. Requests that answer (NotFound included) are not errors. An unhealthy
bucket takes no new objects (the strategies skip it) but is still read when it holds an object that
no healthy bucket has. The :class:`BucketHealth` component (``start()`` / ``close()``) probes every
unhealthy or suspect bucket every ``probe_interval_ms`` (a small PUT of a reserved key, under
``request_timeout_ms``). A suspect bucket's failed probe counts as an error, so a bucket that stopped
answering keeps being avoided and reaches the threshold from probes, not by stalling real writes
each time its suspicion lapses. After ``probe_successes`` consecutive successful probes an unhealthy
bucket is **healthy** again and its error count starts over. Real traffic never makes a bucket healthy: only
probes do, so one lucky request does not send new objects back to a bucket that is still failing.

It also keeps, per bucket, the recent errors, the last error (text, secrets redacted) and the recent
uploads (``STATS_WINDOW_S``), the figures of :meth:`stats`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from s3stream.errors import AccessDeniedError, UnavailableError
from s3stream.logfmt import log_event, redact

log = logging.getLogger(__name__)

STATS_WINDOW_S = 60.0
"""The window of ``errors_recent`` and ``uploads_recent``."""
EVENTS_MAX = 10_000
"""Recent events kept per bucket and kind (older ones are dropped first)."""
ERROR_TEXT_MAX = 300


def counts_as_error(exc: BaseException, *, write: bool = False) -> bool:
    """Whether a failure says the bucket is not answering (the others are answers); on a ``write``
    also a refusal of access (credentials revoked on this bucket: new writes should leave it)."""
    if write and isinstance(exc, AccessDeniedError):
        return True
    return isinstance(exc, UnavailableError | TimeoutError | asyncio.TimeoutError)


@dataclass(frozen=True, slots=True)
class BucketStats:
    """One bucket's figures for ``s3stream buckets`` and the published health KV."""

    bucket_id: int
    healthy: bool
    errors_recent: int
    last_error: str
    uploads_recent: int
    write_share: float
    """This bucket's part of the recent uploads (0..1; 0 when there were none)."""


class _Bucket:
    __slots__ = ("errors", "healthy", "last_error", "probe_ok", "uploads")

    def __init__(self) -> None:
        self.healthy = True
        self.errors: deque[float] = deque(maxlen=EVENTS_MAX)
        self.uploads: deque[float] = deque(maxlen=EVENTS_MAX)
        self.last_error = ""
        self.probe_ok = 0


class BucketHealth:
    """Health of each bucket of a list; thread-unsafe, used on the event loop only."""

    def __init__(
        self,
        bucket_ids: Sequence[int],
        *,
        errors_max: int = 3,
        window_ms: int = 10_000,
        probe_interval_ms: int = 1_000,
        probe_successes: int = 3,
        request_timeout_ms: int = 2_000,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        assert errors_max >= 1
        assert probe_successes >= 1
        self._buckets = {bucket_id: _Bucket() for bucket_id in bucket_ids}
        self.errors_max = errors_max
        self.window_s = window_ms / 1000
        self.probe_interval_s = probe_interval_ms / 1000
        self.probe_successes = probe_successes
        self.request_timeout_s = request_timeout_ms / 1000
        self._clock_s = clock_s
        # A suspicion lasts a call deadline, and at least until a probe round has looked at the bucket:
        # rounds start probe_interval after the previous one ended (at most a request timeout), so two
        # intervals leave room for a late round; with a short timeout the deadline alone would lapse
        # before any probe, and the bucket would never reach the threshold.
        self.suspect_s = max(2 * self.request_timeout_s, 2 * self.probe_interval_s + self.request_timeout_s)
        self._probe: Callable[[int], Awaitable[None]] | None = None
        self._task: asyncio.Task[None] | None = None

    # -- state ---------------------------------------------------------------------------------
    def is_healthy(self, bucket_id: int) -> bool:
        return self._buckets[bucket_id].healthy

    def healthy(self) -> dict[int, bool]:
        """Each bucket's health; safe to call from another thread (reads one flag per bucket, where
        :meth:`stats` iterates event lists the loop appends to)."""
        return {bucket_id: state.healthy for bucket_id, state in self._buckets.items()}

    def is_suspect(self, bucket_id: int) -> bool:
        """Whether the bucket failed within the last ``suspect_s`` (a call deadline, or the wait for
        the next probe round when that is longer). Below the unhealthy threshold such a bucket still
        counts as healthy, but new writes prefer the others meanwhile: the failing call already
        waited out its deadline, and the next one would likely wait again before the threshold."""
        errors = self._buckets[bucket_id].errors
        return bool(errors) and errors[-1] > self._clock_s() - self.suspect_s

    def record_error(self, bucket_id: int, exc: BaseException, *, write: bool = False) -> None:
        """Count ``exc`` against the bucket if it is one (:func:`counts_as_error`; ``write``: it failed
        a write)."""
        if not counts_as_error(exc, write=write):
            return
        bucket = self._buckets[bucket_id]
        now = self._clock_s()
        bucket.errors.append(now)
        bucket.last_error = redact(f"{type(exc).__name__}: {exc}")[:ERROR_TEXT_MAX]
        recent = sum(1 for at in bucket.errors if at > now - self.window_s)
        if bucket.healthy and recent >= self.errors_max:
            bucket.healthy = False
            bucket.probe_ok = 0
            log_event(log, logging.WARNING, "bucket.unhealthy", bucket=bucket_id, errors=recent, window_s=self.window_s, last_error=bucket.last_error)  # fmt: skip

    def record_upload(self, bucket_id: int) -> None:
        self._buckets[bucket_id].uploads.append(self._clock_s())

    def record_probe(self, bucket_id: int, error: BaseException | None) -> None:
        """One probe's outcome; enough consecutive successes make the bucket healthy again."""
        bucket = self._buckets[bucket_id]
        if error is not None:
            bucket.probe_ok = 0
            bucket.last_error = redact(f"probe: {type(error).__name__}: {error}")[:ERROR_TEXT_MAX]
            return
        bucket.probe_ok += 1
        if not bucket.healthy and bucket.probe_ok >= self.probe_successes:
            bucket.healthy = True
            bucket.errors.clear()
            log_event(log, logging.INFO, "bucket.healthy", bucket=bucket_id, probes=bucket.probe_ok)

    def stats(self) -> dict[int, BucketStats]:
        now = self._clock_s()
        since = now - STATS_WINDOW_S
        uploads = {b: sum(1 for at in s.uploads if at > since) for b, s in self._buckets.items()}
        total = sum(uploads.values())
        return {
            bucket_id: BucketStats(
                bucket_id=bucket_id,
                healthy=state.healthy,
                errors_recent=sum(1 for at in state.errors if at > since),
                last_error=state.last_error,
                uploads_recent=uploads[bucket_id],
                write_share=uploads[bucket_id] / total if total else 0.0,
            )
            for bucket_id, state in self._buckets.items()
        }

    # -- probes --------------------------------------------------------------------------------
    def start(self, probe: Callable[[int], Awaitable[None]]) -> None:
        """Probe unhealthy buckets with ``probe(bucket_id)`` (raises when the bucket does not answer)."""
        assert self._task is None
        self._probe = probe
        self._task = asyncio.get_running_loop().create_task(self._run(), name="bucket-probes")

    async def probe_now(self) -> None:
        """One round: probe every unhealthy or suspect bucket once, in parallel. A suspect (still
        healthy) bucket's failed probe is also an error (:meth:`record_error`)."""
        probe = self._probe
        assert probe is not None
        targets = [b for b, s in self._buckets.items() if not s.healthy or self.is_suspect(b)]

        async def one(bucket_id: int) -> None:
            try:
                await asyncio.wait_for(probe(bucket_id), self.request_timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure is a failed probe
                if self._buckets[bucket_id].healthy:
                    self.record_error(bucket_id, exc, write=True)
                self.record_probe(bucket_id, exc)
            else:
                self.record_probe(bucket_id, None)

        await asyncio.gather(*(one(b) for b in targets))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.probe_interval_s)
            await self.probe_now()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
