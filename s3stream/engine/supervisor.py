"""The engine's background tasks and failure state: a background task that dies fails the engine once.

Every task the engine starts goes through :meth:`Supervisor.spawn`. An :class:`S3StreamError` ending
a task (or any other exception, as :class:`UnavailableError`) marks the engine failed and calls the
engine's failure handler, which fails every pending append; ``close()`` cancels and awaits the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from s3stream.errors import ClosedError, S3StreamError, UnavailableError
from s3stream.logfmt import log_event

log = logging.getLogger(__name__)


class Supervisor:
    __slots__ = ("_on_failure", "closed", "failed", "tasks")

    def __init__(self, on_failure: Callable[[S3StreamError], None]) -> None:
        self._on_failure = on_failure
        self.failed: S3StreamError | None = None
        """The error that failed the engine (None while healthy)."""
        self.closed = False
        self.tasks: set[asyncio.Task[None]] = set()

    def check_alive(self) -> None:
        if self.failed is not None:
            raise self.failed
        if self.closed:
            raise ClosedError("engine closed")

    def fail(self, error: S3StreamError) -> None:
        """Record the first failure (a ClosedError is a close, not a failure) and run the handler."""
        if self.failed is None and not isinstance(error, ClosedError):
            self.failed = error
            log_event(log, logging.ERROR, "engine.failed", error=error)
        self._on_failure(error)

    def spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> None:
        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except S3StreamError as exc:
                self.fail(exc)
            except Exception as exc:
                self.fail(UnavailableError(f"background task {name} died: {exc!r}"))
                raise

        task = asyncio.create_task(guarded(), name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        # A task cancelled before its first step never started ``coro``: close it (no "never awaited").
        task.add_done_callback(lambda _: coro.close())

    def cancel(self) -> None:
        """Refuse work from now on and cancel every task without waiting (a crash, for tests)."""
        self.closed = True
        self.cancel_tasks()

    def cancel_tasks(self) -> None:
        """Cancel every task without waiting (uploads in flight stop writing objects)."""
        for task in list(self.tasks):
            task.cancel()

    async def cancel_and_wait(self) -> None:
        self.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self.tasks, return_exceptions=True)
