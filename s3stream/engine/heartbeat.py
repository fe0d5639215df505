"""A node's session in the metadata store: the lease renewed by heartbeats, and the fence when it is lost.

A node opens its session with ``MetadataStore.open_node`` (the database issues the node epoch: the
stored one + 1, which fences every older session of the node id). :class:`Heartbeat` then renews the
lease every ``lease_ms / 3`` (:data:`RENEWALS_PER_LEASE`). The session is **fenced** when

- a renewal is refused (``FencedError``: the epoch was bumped by a newer open, or the store saw the
  lease expire; ``NotFoundError``: the node row is gone), or
- no renewal succeeded before the local lease deadline: the send time of the last successful
  renewal + ``lease_ms`` (a renewal's lease starts no earlier than its send time, so the local
  deadline never ends after the store's). A node paused (SIGSTOP, a long GC, a stalled disk) past
  the deadline is fenced the moment it runs again, before it can rely on a lease it no longer has.

Once fenced it stays fenced: every listener is told once (the engine then refuses all work, the
maintenance election stops its jobs), and no renewal is sent again (an expired lease is never
revived; a new open is a new session). The store's session check on every write transaction
(``bind_node``) is the last line: a write a fenced node sends before it learns of the fence is
refused by the database. :meth:`Heartbeat.close` ends a healthy session with ``close_node``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from s3stream.clock import lease_clock_s
from s3stream.errors import ErrorCode, FencedError, NotFoundError, S3StreamError
from s3stream.ids import NodeId
from s3stream.logfmt import log_event
from s3stream.metadata.base import MetadataStore

log = logging.getLogger(__name__)

RENEWALS_PER_LEASE = 3
"""Renewals attempted per lease period: a lease survives two failed renewals in a row."""
RETRY_DIVISOR = 10
"""After a failed (transient) renewal, the next attempt comes ``lease_ms / RETRY_DIVISOR`` later."""

FenceListener = Callable[[FencedError], None]


class Heartbeat:
    """Renews one node session's lease; fences the node (tells every listener once) when it is lost.

    Invariant: while :attr:`fenced` is None, :meth:`lease_deadline_s` is in the future or the loop is
    about to observe that it is not; once :attr:`fenced` is set it never changes back.
    """

    def __init__(
        self,
        metadata: MetadataStore,
        *,
        node_id: NodeId,
        node_epoch: int,
        lease_ms: int,
        opened_at_s: float,
        clock: Callable[[], float] = lease_clock_s,
    ) -> None:
        """``opened_at_s``: the ``clock`` reading taken just before ``open_node`` was sent (the start of
        the first lease)."""
        if lease_ms <= 0:
            raise ValueError(f"lease_ms must be positive, got {lease_ms}")
        self.metadata = metadata
        self.node_id = node_id
        self.node_epoch = node_epoch
        self.lease_ms = lease_ms
        self.clock = clock
        self.fenced: FencedError | None = None
        self.renewal_count = 0
        self._deadline_s = opened_at_s + lease_ms / 1000
        self._listeners: list[FenceListener] = []
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.wal_pending_bytes: Callable[[], int] = lambda: -1
        """What each renewal reports as the node's un-uploaded WAL bytes (the engine's, once wired)."""

    @property
    def lease_deadline_s(self) -> float:
        """When the current lease ends, on ``clock`` (conservative: never after the store's expiry)."""
        return self._deadline_s

    def holds_lease(self) -> bool:
        """Not fenced and the lease deadline has not passed (fences the node if it has)."""
        self._check_deadline()
        return self.fenced is None

    def add_listener(self, listener: FenceListener) -> None:
        """Call ``listener`` once when the node is fenced (at once if it already is)."""
        if self.fenced is not None:
            listener(self.fenced)
        else:
            self._listeners.append(listener)

    def start(self) -> None:
        if self._task is None and not self._closed:
            self._task = asyncio.create_task(self._loop(), name="s3stream-node-heartbeat")
            log_event(log, logging.INFO, "node.lease_started", node=self.node_id, epoch=self.node_epoch, lease_ms=self.lease_ms)  # fmt: skip

    async def close(self) -> None:
        """Stop renewing; a session that is not fenced ends now (``close_node``: its leases are freed)."""
        if self._closed:
            return
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.fenced is None:
            try:
                await self.metadata.close_node(node_id=self.node_id, node_epoch=self.node_epoch)
            except (S3StreamError, OSError) as exc:  # the lease then simply expires
                log_event(log, logging.WARNING, "node.close_failed", node=self.node_id, epoch=self.node_epoch, error=exc)  # fmt: skip

    def fence(self, error: FencedError) -> None:
        """Mark the session fenced (once) and tell every listener."""
        if self.fenced is not None:
            return
        self.fenced = error
        log_event(log, logging.ERROR, "node.fenced", node=self.node_id, epoch=self.node_epoch, error=error)
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener(error)

    def _check_deadline(self) -> None:
        if self.fenced is None and self.clock() >= self._deadline_s:
            self.fence(
                FencedError(
                    f"node {self.node_id} epoch {self.node_epoch}: lease of {self.lease_ms} ms ended "
                    "without a successful renewal",
                    code=ErrorCode.NODE_FENCED,
                )
            )

    async def renew_once(self) -> None:
        """One renewal now; on success the deadline moves to its send time + ``lease_ms``.

        Raises what the store raised (a refusal also fences the node)."""
        self._check_deadline()
        if self.fenced is not None:
            raise self.fenced
        sent_s = self.clock()
        try:
            async with asyncio.timeout(max(self._deadline_s - sent_s, 0.0)):
                await self.metadata.heartbeat(
                    node_id=self.node_id,
                    node_epoch=self.node_epoch,
                    lease_ms=self.lease_ms,
                    wal_pending_bytes=self.wal_pending_bytes(),
                )
        except FencedError as exc:
            self.fence(exc)
            raise
        except NotFoundError as exc:
            error = FencedError(
                f"node {self.node_id} is no longer registered: {exc}", code=ErrorCode.NODE_FENCED
            )
            self.fence(error)
            raise error from exc
        except TimeoutError:
            self._check_deadline()
            raise
        self.renewal_count += 1
        self._deadline_s = max(self._deadline_s, sent_s + self.lease_ms / 1000)

    async def _loop(self) -> None:
        period_s = self.lease_ms / 1000 / RENEWALS_PER_LEASE
        retry_s = self.lease_ms / 1000 / RETRY_DIVISOR
        delay_s = period_s
        while self.fenced is None:
            # Wake up at the deadline at the latest, to fence on time even if the renewal is not due.
            await asyncio.sleep(max(0.0, min(delay_s, self._deadline_s - self.clock())))
            self._check_deadline()
            if self.fenced is not None:
                return
            try:
                await self.renew_once()
            except FencedError:
                return
            except (S3StreamError, OSError, TimeoutError) as exc:
                log_event(log, logging.WARNING, "node.heartbeat_failed", node=self.node_id, epoch=self.node_epoch, error=exc, action="retry")  # fmt: skip
                delay_s = retry_s
            else:
                delay_s = period_s
