"""The maintenance election: the cluster's once-per-cluster jobs run on the one node holding a lease.

Compaction, garbage collection, the prepared-object reaper and the orphan scan act on the whole
bucket and the whole metadata, so one node runs them at a time: the holder of the lease named
:data:`MAINTENANCE_LEASE` in the metadata store. :class:`MaintenanceElection` tries to acquire (or
renew) the lease every ``lease_ms / 3``; it starts its jobs when it gains the lease and stops them
when it loses it: a renewal that shows another holder, a refused renewal (the node is fenced), or no
successful renewal before the local lease deadline (the send time of the last successful acquire +
``lease_ms``, which never ends after the store's expiry). Stopping cancels the jobs and waits for
them. The jobs' metadata writes go through the store's lease-guarded view, so a write that a node
sends after its lease ended (a pause between the check and the write) is refused by the store.

A node that holds no lease runs none of the jobs; when the holder dies, another node takes the lease
once it expired (at most ``lease_ms`` after the holder's last renewal) plus one election period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from s3stream.errors import FencedError, S3StreamError
from s3stream.ids import NodeId
from s3stream.logfmt import log_event
from s3stream.metadata.base import MetadataStore

log = logging.getLogger(__name__)

MAINTENANCE_LEASE = "maintenance"
"""Name of the lease whose holder runs the cluster's maintenance jobs."""
ATTEMPTS_PER_LEASE = 3
"""Acquire/renew attempts per lease period."""


class MaintenanceJob(Protocol):
    """A background component that may be started and stopped any number of times."""

    def start(self) -> None: ...

    async def close(self) -> None: ...


class MaintenanceElection:
    """Runs ``jobs`` exactly while this node session holds the maintenance lease.

    Invariant: :attr:`running` is True only between a successful acquire and the local lease deadline
    it set (the jobs are stopped before, or as soon as the loop runs after, the deadline)."""

    def __init__(
        self,
        metadata: MetadataStore,
        *,
        node_id: NodeId,
        node_epoch: int,
        lease_ms: int,
        jobs: Sequence[MaintenanceJob],
        lease_name: str = MAINTENANCE_LEASE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metadata = metadata
        self.node_id = node_id
        self.node_epoch = node_epoch
        self.lease_ms = lease_ms
        self.lease_name = lease_name
        self.jobs = list(jobs)
        self.clock = clock
        self.running = False
        self.gained_count = 0
        """How many times this node gained the lease (and started the jobs)."""
        self._deadline_s = 0.0
        self._fenced = False
        self._task: asyncio.Task[None] | None = None
        self._stopping: asyncio.Task[None] | None = None
        """The stop of the jobs that a fence started (awaited by :meth:`close`)."""
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """One election round now (a single node holds the lease when this returns), then the loop."""
        if self._task is not None:
            return
        await self.elect_once()
        self._task = asyncio.create_task(self._loop(), name="s3stream-maintenance-election")

    async def close(self) -> None:
        """Stop the loop and the jobs; give the lease up if this node holds it."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._stopping is not None:
            await self._stopping
        held = self.running
        await self._stop_jobs("closing")
        if held and not self._fenced:
            try:
                await self.metadata.release_lease(
                    name=self.lease_name, node_id=self.node_id, node_epoch=self.node_epoch
                )
            except (S3StreamError, OSError) as exc:  # the lease then simply expires
                log_event(log, logging.WARNING, "maintenance.release_failed", node=self.node_id, lease=self.lease_name, error=exc)  # fmt: skip

    def on_fenced(self, error: FencedError) -> None:
        """The node's session is lost: stop the jobs at once (their writes would be refused anyway)."""
        self._fenced = True
        if self.running and self._stopping is None:
            self._stopping = asyncio.get_running_loop().create_task(
                self._stop_jobs(f"node fenced: {error}"), name="s3stream-maintenance-stop"
            )

    async def elect_once(self) -> bool:
        """Acquire or renew the lease; start or stop the jobs to match. Returns whether this node holds it."""
        async with self._lock:
            if self._fenced:
                await self._stop_jobs("node fenced")
                return False
            sent_s = self.clock()
            try:
                async with asyncio.timeout(self.lease_ms / 1000 / ATTEMPTS_PER_LEASE):
                    lease = await self.metadata.acquire_lease(
                        name=self.lease_name,
                        node_id=self.node_id,
                        node_epoch=self.node_epoch,
                        lease_ms=self.lease_ms,
                    )
            except FencedError as exc:
                self._fenced = True
                await self._stop_jobs(f"node fenced: {exc}")
                return False
            except (S3StreamError, OSError, TimeoutError) as exc:
                log_event(log, logging.WARNING, "maintenance.lease_failed", node=self.node_id, lease=self.lease_name, error=exc)  # fmt: skip
                if self.running and self.clock() >= self._deadline_s:
                    await self._stop_jobs("lease not renewed before its end")
                return self.running
            if self._fenced:  # fenced while the acquire was in flight: never start jobs now
                await self._stop_jobs("node fenced")
                return False
            holds = lease.node_id == self.node_id and lease.node_epoch == self.node_epoch
            if not holds:
                await self._stop_jobs(f"held by node {lease.node_id} epoch {lease.node_epoch}")
                return False
            self._deadline_s = sent_s + self.lease_ms / 1000
            if not self.running:
                self.running = True
                self.gained_count += 1
                log_event(log, logging.INFO, "maintenance.started", node=self.node_id, lease=self.lease_name)
                for job in self.jobs:
                    job.start()
            return True

    async def _stop_jobs(self, why: str) -> None:
        if not self.running:
            return
        self.running = False
        log_event(log, logging.INFO, "maintenance.stopped", node=self.node_id, reason=why)
        for job in self.jobs:
            with contextlib.suppress(S3StreamError, OSError):
                await job.close()

    async def _loop(self) -> None:
        period_s = self.lease_ms / 1000 / ATTEMPTS_PER_LEASE
        while True:
            delay_s = period_s
            if self.running:  # wake at the deadline at the latest, to stop the jobs on time
                delay_s = max(0.0, min(delay_s, self._deadline_s - self.clock()))
            await asyncio.sleep(delay_s)
            if self.running and self.clock() >= self._deadline_s:
                async with self._lock:
                    await self._stop_jobs("lease not renewed before its end")
            if self._fenced:
                await self._stop_jobs("node fenced")
                return
            await self.elect_once()
