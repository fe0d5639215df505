"""Keeps the copy of a SQLite metadata store current in its object storage (one background task).

The store writes each group commit's changes to ``pending_copy`` in the commit's own transaction
(:mod:`s3stream.metadata.sqlite_copy`). This component uploads them, oldest first, as log objects
(every group pending at that moment in one PUT, so concurrent operations share it), then deletes them
locally; it uploads a snapshot first (the copy is not restorable before one) and again every
``snapshot_every_groups`` groups or ``snapshot_interval_ms``, and then deletes the snapshots and log
objects the two newest snapshots make unnecessary. Keys and framing: :mod:`s3stream.metacopy.objects`.

Every group reaches a log object, also one a snapshot already holds: a snapshot does not drop the
pending groups it covers. So the older kept snapshot plus the logs after it restore everything, even
when the newest snapshot is damaged (restore skips the groups a log holds that its base already has).

The window: once attached, every write operation of the store returns only after the copy holds the
group commit it wrote (and every earlier one): :meth:`wait_copied`. So whatever an operation
acknowledged is in the bucket; a data dir lost right after loses from the copy only what was never
acknowledged. While the bucket does not answer, uploads are retried with backoff for ever and
operations wait at most ``wait_timeout_ms``, then raise :class:`~s3stream.errors.UnavailableError`:
their change is committed locally, stays in ``pending_copy`` and is copied when the bucket answers
(also by the next process to open the data dir, before anything else).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from s3stream.errors import ClosedError, S3StreamError, UnavailableError
from s3stream.logfmt import log_event
from s3stream.metacopy.objects import (
    copy_prefix,
    encode_log,
    encode_snapshot,
    log_key,
    parse_copy_key,
    snapshot_key,
)
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.metadata.sqlite_copy import SNAPSHOT_NONE
from s3stream.storage.base import ObjectStorage

log = logging.getLogger(__name__)

WAIT_TIMEOUT_MS_DEFAULT = 30_000
"""How long a write operation waits for its change to reach the bucket before UnavailableError."""
SNAPSHOT_EVERY_GROUPS_DEFAULT = 10_000
SNAPSHOT_INTERVAL_MS_DEFAULT = 10 * 60_000
LOG_BYTES_MAX = 8 * 1024 * 1024
"""Group bytes one log object holds at most (at least one group, whatever its size)."""
SNAPSHOTS_KEPT = 2
"""Snapshots kept in the bucket: a damaged newest one leaves the one before it and the logs after it."""
POLL_INTERVAL_S = 1.0
"""How often the task looks for groups nobody told it about (written by a store not attached)."""
RETRY_BACKOFF_MS_MIN = 100
RETRY_BACKOFF_MS_MAX = 5_000
SNAPSHOT_TEMP_MARK = ".copy-snapshot~"
"""A snapshot is built in ``<database><mark><random>`` beside the database, then removed."""

assert SNAPSHOTS_KEPT >= 2, "a damaged newest snapshot must leave an older one to restore from"


class MetadataCopy:
    """The metadata copy of one SQLite store in one object storage; ``start()`` / ``close()``."""

    def __init__(
        self,
        store: SqliteMetadataStore,
        storage: ObjectStorage,
        *,
        namespace: str,
        wait_timeout_ms: int = WAIT_TIMEOUT_MS_DEFAULT,
        snapshot_every_groups: int = SNAPSHOT_EVERY_GROUPS_DEFAULT,
        snapshot_interval_ms: int = SNAPSHOT_INTERVAL_MS_DEFAULT,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        assert wait_timeout_ms > 0
        assert snapshot_every_groups > 0
        assert snapshot_interval_ms > 0
        self._store = store
        self._storage = storage
        self._namespace = namespace
        self._wait_timeout_s = wait_timeout_ms / 1000
        self._snapshot_every_groups = snapshot_every_groups
        self._snapshot_interval_s = snapshot_interval_ms / 1000
        self._clock_s = clock_s
        self._prefix = ""
        self.copy_id = ""
        self._copied = -1
        """Every group up to this one is in the bucket (-1: nothing yet: no snapshot)."""
        self._snapshot_seq = SNAPSHOT_NONE
        self._groups_since_snapshot = 0
        self._last_snapshot_s = 0.0
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        """Heap of (seq, tie-break, future): resolved once ``_copied`` reaches seq."""
        self._tie = itertools.count()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._closed = False
        self.stats = {"log_objects": 0, "groups": 0, "snapshots": 0, "retries": 0, "pruned": 0}

    @property
    def copied_seq(self) -> int:
        return self._copied

    @property
    def prefix(self) -> str:
        """The key prefix of this copy's objects."""
        return self._prefix

    async def start(self) -> None:
        """Turn the copy on (for good) and start copying; then attach: every later write operation of
        the store waits for its copy. What is pending from an earlier process is copied first."""
        state = await self._store.copy_enable()
        self.copy_id = state.copy_id
        self._prefix = copy_prefix(self._namespace, state.copy_id)
        self._copied = state.copied_seq
        self._snapshot_seq = state.snapshot_seq
        self._last_snapshot_s = self._clock_s()
        await asyncio.to_thread(_remove_leftover_snapshots, self._store.path)
        self._task = asyncio.create_task(self._run(), name="s3stream-metadata-copy")
        self._store.attach_copy(self.wait_copied)

    async def wait_copied(self, seq: int) -> None:
        """Return once group ``seq`` and every one before it are in the bucket; UnavailableError after
        ``wait_timeout_ms`` (the groups stay pending and are copied later)."""
        if seq <= self._copied:
            return
        if self._failure is not None:
            raise UnavailableError(f"the metadata copy stopped: {self._failure}") from self._failure
        if self._closed:
            raise ClosedError("the metadata copy is closed")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (seq, next(self._tie), future))
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(future), self._wait_timeout_s)
        except TimeoutError:
            raise UnavailableError(
                f"the metadata change (copy group {seq}) is committed locally but not yet in the bucket's "
                f"copy after {self._wait_timeout_s:g} s (copied up to group {self._copied}); it is copied "
                "when the bucket answers"
            ) from None

    async def close(self) -> None:
        """Copy what is pending (waiting at most ``wait_timeout_ms``), then stop. Call it before the
        store's ``close()``."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._task is not None and not self._task.done():
                state = await self._store.copy_state()
                last = -1 if state is None else state.next_seq - 1
                if last > self._copied:
                    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    heapq.heappush(self._waiters, (last, next(self._tie), future))
                    self._wake.set()
                    with contextlib.suppress(TimeoutError, S3StreamError):
                        await asyncio.wait_for(asyncio.shield(future), self._wait_timeout_s)
                    if last > self._copied:
                        log_event(log, logging.WARNING, "metacopy.closed_behind", first_group=self._copied + 1, last_group=last, action="copied at the next open")  # fmt: skip
        finally:
            self._store.attach_copy(None)
            if self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._task
            self._fail_waiters(ClosedError("the metadata copy is closed"))

    # -- the task ---------------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            while True:
                self._wake.clear()
                if self._snapshot_seq == SNAPSHOT_NONE or self._snapshot_due():
                    await self._retrying("snapshot upload", self._snapshot)
                    continue
                rows = await self._store.copy_pending(bytes_max=LOG_BYTES_MAX)
                if rows:
                    await self._retrying("log upload", functools.partial(self._upload_log, rows))
                    continue
                timeout = POLL_INTERVAL_S
                if self._groups_since_snapshot:
                    due_in = self._last_snapshot_s + self._snapshot_interval_s - self._clock_s()
                    timeout = max(0.0, min(timeout, due_in))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the task's boundary: fail every waiter, then die
            log.exception("the metadata copy failed")
            self._failure = exc
            self._fail_waiters(UnavailableError(f"the metadata copy stopped: {exc}"))
            raise

    def _snapshot_due(self) -> bool:
        if self._groups_since_snapshot >= self._snapshot_every_groups:
            return True
        return bool(self._groups_since_snapshot) and (
            self._clock_s() - self._last_snapshot_s >= self._snapshot_interval_s
        )

    async def _retrying(self, what: str, step: Callable[[], Awaitable[None]]) -> None:
        backoff_ms = RETRY_BACKOFF_MS_MIN
        while True:
            try:
                await step()
                return
            except UnavailableError as exc:
                self.stats["retries"] += 1
                log_event(
                    log, logging.WARNING, "metacopy.step_failed", step=what, retry_ms=backoff_ms, error=exc
                )
                await asyncio.sleep(backoff_ms / 1000)
                backoff_ms = min(2 * backoff_ms, RETRY_BACKOFF_MS_MAX)

    async def _upload_log(self, rows: list[tuple[int, bytes]]) -> None:
        first, last = rows[0][0], rows[-1][0]
        await self._storage.put(log_key(self._prefix, first, last), encode_log(rows))
        await self._store.copy_done(through_seq=last)
        self.stats["log_objects"] += 1
        self.stats["groups"] += len(rows)
        self._groups_since_snapshot += len(rows)
        self._advance(last)

    async def _snapshot(self) -> None:
        target = f"{self._store.path}{SNAPSHOT_TEMP_MARK}{secrets.token_hex(8)}"
        try:
            seq = await asyncio.to_thread(self._store.snapshot_into, target)
            database = await asyncio.to_thread(Path(target).read_bytes)
        except OSError as exc:  # a passing local fault (disk full, I/O): retried like the bucket
            raise UnavailableError(f"reading the metadata snapshot {target} failed: {exc}") from exc
        finally:
            await asyncio.to_thread(_unlink_quietly, target)
        await self._storage.put(snapshot_key(self._prefix, seq), encode_snapshot(seq, database))
        await self._store.copy_done(snapshot_seq=seq)  # its groups still go to a log
        self.stats["snapshots"] += 1
        self._snapshot_seq = max(self._snapshot_seq, seq)
        self._groups_since_snapshot = 0
        self._last_snapshot_s = self._clock_s()
        self._advance(seq)
        try:
            await self._prune()
        except UnavailableError as exc:  # the next snapshot prunes again
            log_event(
                log, logging.WARNING, "metacopy.delete_failed", error=exc, action="retried at the next pass"
            )

    async def _prune(self) -> None:
        """Delete the snapshots older than the newest ``SNAPSHOTS_KEPT`` and the log objects that hold
        only groups the oldest kept snapshot holds."""
        keys = []
        async for info in self._storage.list(self._prefix):
            parsed = parse_copy_key(self._namespace, info.key)
            if parsed is not None and parsed.copy_id == self.copy_id:
                keys.append((info.key, parsed))
        snapshots = sorted((p.last_seq, k) for k, p in keys if p.kind == "snapshot")
        if not snapshots:
            return
        floor = snapshots[-SNAPSHOTS_KEPT:][0][0]
        doomed = [k for _, k in snapshots[:-SNAPSHOTS_KEPT]]
        doomed += [k for k, p in keys if p.kind == "log" and p.last_seq <= floor]
        if doomed:
            await self._storage.delete(doomed)
            self.stats["pruned"] += len(doomed)

    def _advance(self, seq: int) -> None:
        if seq <= self._copied:
            return
        self._copied = seq
        while self._waiters and self._waiters[0][0] <= seq:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)

    def _fail_waiters(self, error: BaseException) -> None:
        waiters, self._waiters = self._waiters, []
        for _, _, future in waiters:
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: its waiter may have timed out already


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _remove_leftover_snapshots(database_path: str) -> None:
    """Remove the snapshot files a process killed while building one left beside the database."""
    directory, name = os.path.split(os.path.abspath(database_path))
    with contextlib.suppress(OSError):
        for entry in os.listdir(directory):
            if entry.startswith(name + SNAPSHOT_TEMP_MARK):
                _unlink_quietly(os.path.join(directory, entry))
