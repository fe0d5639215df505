"""Retries with jittered exponential backoff under an overall deadline, for remote storage calls.

The policy is pure data (:class:`RetryPolicy`); :func:`call_with_retries` runs one logical call as a
series of attempts, each under its own timeout, until one succeeds, an error is permanent, or the
deadline (or attempt budget) is spent. A caller-supplied ``classify`` turns any exception into an
:class:`~s3stream.errors.S3StreamError`; its ``retriable`` flag decides whether to try again. The
final error of an exhausted retry is an :class:`~s3stream.errors.UnavailableError` naming the
operation, the attempt count and the last cause.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from s3stream.errors import InvalidArgumentError, S3StreamError, UnavailableError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Limits for one logical call. Times grow with payload size (``size_bytes / slow_link``)."""

    deadline_s: float = 30.0
    """Overall time budget of a call, all attempts and backoff included (AutoMQ apiCallTimeoutMs)."""
    attempt_timeout_s: float = 10.0
    """Budget of one attempt (AutoMQ apiCallAttemptTimeoutMs)."""
    attempts_max: int = 20
    backoff_base_s: float = 0.05
    backoff_max_s: float = 2.0
    slow_link_bytes_per_s: float = 8 * 1024 * 1024
    """Both budgets grow by ``size_bytes / slow_link_bytes_per_s`` so big bodies get time to move."""

    def __post_init__(self) -> None:
        if not (self.attempt_timeout_s > 0 and self.deadline_s > 0):
            raise InvalidArgumentError("retry deadline and attempt timeout must be > 0")
        if self.attempts_max < 1 or self.backoff_base_s < 0 or self.backoff_max_s < self.backoff_base_s:
            raise InvalidArgumentError(f"bad retry policy {self}")
        if self.slow_link_bytes_per_s <= 0:
            raise InvalidArgumentError("slow_link_bytes_per_s must be > 0")

    def backoff_s(self, retry_index: int, rng: random.Random) -> float:
        """Full jitter: uniform in ``[0, min(max, base * 2**retry_index)]``."""
        return rng.uniform(0.0, min(self.backoff_max_s, self.backoff_base_s * 2.0 ** min(retry_index, 30)))

    def budgets_s(self, size_bytes: int) -> tuple[float, float]:
        """(deadline, attempt timeout) for a call moving ``size_bytes``."""
        extra_s = size_bytes / self.slow_link_bytes_per_s
        return self.deadline_s + extra_s, self.attempt_timeout_s + extra_s


async def call_with_retries(
    op: str,
    attempt: Callable[[], Awaitable[T]],
    *,
    policy: RetryPolicy,
    classify: Callable[[Exception], S3StreamError],
    rng: random.Random,
    size_bytes: int = 0,
    on_retry: Callable[[S3StreamError], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Run ``attempt()`` until it succeeds, fails permanently, or the policy's budget runs out."""
    deadline_budget_s, attempt_budget_s = policy.budgets_s(size_bytes)
    started = clock()
    deadline = started + deadline_budget_s
    attempts = 0
    while True:
        attempts += 1
        remaining_s = deadline - clock()
        try:
            async with asyncio.timeout(max(0.0, min(attempt_budget_s, remaining_s))):
                return await attempt()
        except Exception as exc:
            error = classify(exc)
            if not error.retriable:
                if error is exc:
                    raise
                raise error from exc
            last: Exception = exc
        backoff_s = policy.backoff_s(attempts - 1, rng)
        if attempts >= policy.attempts_max or clock() + backoff_s >= deadline:
            elapsed_s = clock() - started
            raise UnavailableError(
                f"{op}: gave up after {attempts} attempts in {elapsed_s:.2f}s: {error}"
            ) from last
        if on_retry is not None:
            on_retry(error)
        await asyncio.sleep(backoff_s)
