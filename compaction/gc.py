"""Deletion and garbage collection of objects (docs/automq-model.md sections 8 and 11).

One pass: expire PREPARED objects past their TTL (they become MARK_DESTROYED); delete from the bucket
the MARK_DESTROYED objects marked at least ``retention_ms`` ago (so reads in flight finish), in
DeleteObjects batches of at most 1000 keys, then forget them in metadata; optionally scan the bucket
for orphans: keys of this namespace whose object id metadata does not know (a crash between a delete
and its metadata removal, or an object written under an id that was removed), below the next object
id, and last modified more than ``orphan_ttl_ms`` ago (the rule, safe with other nodes uploading at
the same time, is written at :meth:`GarbageCollector._delete_orphans`). Keys that are not object keys of the namespace are left
alone. The orphan scan also reclaims what a writer killed mid-upload left invisible to listings,
older than ``orphan_ttl_ms`` too: the local store's temporary files, an S3 bucket's (prefix's)
incomplete multipart uploads. Such an upload's object id was prepared with a TTL (at most the orphan
TTL, by default half of it), so it expired and can never be committed.

:class:`PreparedObjectReaper` is the background component that runs the first two steps (no orphan
scan) every second, one delete batch per pass, so crashed uploads never leak.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

from compaction.observer import CompactionObserver
from s3stream.clock import Clock, wall_clock_ms
from s3stream.errors import InvalidArgumentError, S3StreamError
from s3stream.hooks import call_hook
from s3stream.ids import ObjectId
from s3stream.logfmt import log_event
from s3stream.metadata.base import MetadataStore
from s3stream.objectformat import object_key, parse_object_key
from s3stream.storage.base import MAX_DELETE_BATCH, ObjectStorage

log = logging.getLogger(__name__)

DELETE_ROUNDS_MAX = 100
"""Batches deleted per pass (the rest waits for the next pass)."""
REAPER_PERIOD_S = 1.0
"""How often the reaper looks for expired prepared objects and destroyable objects (AutoMQ: 1 s)."""


@dataclass(frozen=True, slots=True)
class GcReport:
    prepared_expired_count: int = 0
    deleted_count: int = 0
    deleted_bytes: int = 0
    delete_request_count: int = 0
    orphan_deleted_count: int = 0
    scanned_key_count: int = 0
    incomplete_uploads_reclaimed: int = 0
    """Local temporary files deleted or S3 multipart uploads aborted (orphan scans only)."""


class GarbageCollector:
    """Removes what compaction, trimming, deletion and crashed uploads left behind."""

    def __init__(
        self,
        metadata: MetadataStore,
        storage: ObjectStorage,
        *,
        namespace: str,
        retention_ms: int,
        orphan_ttl_ms: int,
        clock_ms: Clock = wall_clock_ms,
        observer: CompactionObserver | None = None,
    ) -> None:
        if retention_ms < 0 or orphan_ttl_ms < 0:
            raise InvalidArgumentError("retention_ms and orphan_ttl_ms must be non-negative")
        self.metadata = metadata
        self.storage = storage
        self.namespace = namespace
        self.retention_ms = retention_ms
        self.orphan_ttl_ms = orphan_ttl_ms
        self.clock_ms = clock_ms
        self.observer = observer or CompactionObserver()
        self.meter: Callable[[int, int], None] | None = None
        """Told of each deleted batch, ``(objects, bytes)`` (metrics); None: nothing."""

    async def collect(self, *, scan_orphans: bool = False, rounds_max: int = DELETE_ROUNDS_MAX) -> GcReport:
        """One pass; ``rounds_max`` bounds the delete batches (the rest waits for the next pass)."""
        report, _ = await self._expire_and_delete(rounds_max)
        if scan_orphans:
            orphans, scanned = await self._delete_orphans(self.clock_ms())
            reclaimed = await self._reclaim_incomplete_uploads()
            report = dataclasses.replace(
                report,
                orphan_deleted_count=orphans,
                scanned_key_count=scanned,
                incomplete_uploads_reclaimed=reclaimed,
            )
        return report

    async def reap(self) -> list[ObjectId]:
        """Expire prepared objects, then delete one batch past retention; returns the deleted ids."""
        _, deleted_ids = await self._expire_and_delete(1)
        return deleted_ids

    async def _expire_and_delete(self, rounds_max: int) -> tuple[GcReport, list[ObjectId]]:
        now_ms = self.clock_ms()
        expired = await self.metadata.expire_prepared(now_ms=now_ms)
        deleted_ids: list[ObjectId] = []
        deleted_bytes = requests = 0
        for _ in range(rounds_max):
            doomed = await self.metadata.destroyable_objects(
                marked_before_ms=now_ms - self.retention_ms + 1, limit=MAX_DELETE_BATCH
            )
            if not doomed:
                break
            await self.storage.delete([object_key(o.object_id, self.namespace) for o in doomed])
            await self.observer.after_delete()
            await self.metadata.remove_objects([o.object_id for o in doomed])
            deleted_ids.extend(o.object_id for o in doomed)
            batch_bytes = sum(o.size_bytes for o in doomed)
            deleted_bytes += batch_bytes
            if self.meter is not None:
                call_hook("gc.meter", self.meter, len(doomed), batch_bytes)
            requests += 1
        report = GcReport(len(expired), len(deleted_ids), deleted_bytes, requests)
        log_event(log, logging.INFO if deleted_ids else logging.DEBUG, "gc.deleted", objects=len(deleted_ids), bytes=deleted_bytes, prepared_expired=len(expired), requests=requests)  # fmt: skip
        return report, deleted_ids

    async def _reclaim_incomplete_uploads(self) -> int:
        """Uploads a killed writer never completed nor aborted (listings skip them; they take space)."""
        older_than_s = self.orphan_ttl_ms / 1000
        # LocalObjectStorage and S3ObjectStorage each have one (the in-memory twin needs none)
        for name in ("remove_stale_temp_files", "abort_incomplete_uploads"):
            reclaim = getattr(self.storage, name, None)
            if reclaim is not None:
                return int(await reclaim(older_than_s=older_than_s))
        return 0

    async def _delete_orphans(self, now_ms: int) -> tuple[int, int]:
        """Delete the orphans of the namespace; returns (deleted, keys scanned).

        The orphan rule (it must hold with other nodes preparing, uploading and committing at the same
        time): list the bucket FIRST, then read metadata; a listed key is an orphan only if

        1. its object id has no metadata row at all (read after the listing), and
        2. the id is below the next object id (the object id counter, read after the listing), and
        3. it was last modified more than ``orphan_ttl_ms`` ago.

        An object another node uploads was prepared (its row written) before its first byte was, so
        if the listing saw it, the metadata read after the listing has its row: it is kept (1) until
        metadata itself forgets the id (GC after it deleted the bytes, or an expired prepare).
        An id at or above the counter was never issued by this metadata (another cluster, or a
        metadata store restored from an older copy writing into the same bucket): kept (2).

        The counter is read before the rows: an id below it was issued (its row written) before the
        rows are read, so a missing row means metadata forgot it. Read the other way round, an id
        this metadata issues between the two reads (its upload may overwrite the listed key) would
        have no row in the earlier read yet be below the later counter.
        """
        candidates: list[tuple[int, str]] = []
        scanned = 0
        cutoff_s = (now_ms - self.orphan_ttl_ms) / 1000
        async for info in self.storage.list(""):
            scanned += 1
            try:
                object_id, namespace = parse_object_key(info.key)
            except InvalidArgumentError:
                continue
            if namespace == self.namespace and info.last_modified_s < cutoff_s:
                candidates.append((object_id, info.key))
        if not candidates:
            return 0, scanned
        next_object_id = await self.metadata.next_object_id()  # after the listing, before the rows
        known = {o.object_id for o in await self.metadata.list_objects()}
        orphans = orphan_keys(candidates, known, next_object_id)
        for i in range(0, len(orphans), MAX_DELETE_BATCH):
            await self.storage.delete(orphans[i : i + MAX_DELETE_BATCH])
        return len(orphans), scanned


def orphan_keys(candidates: list[tuple[int, str]], known: set[ObjectId], next_object_id: int) -> list[str]:
    """The orphan rule on listed ``(object id, key)`` pairs already older than the orphan TTL: no
    metadata row and an id below the next object id (see
    :meth:`GarbageCollector._delete_orphans`)."""
    return [key for object_id, key in candidates if object_id not in known and object_id < next_object_id]


class PreparedObjectReaper:
    """Background component: every ``period_s``, expires PREPARED objects past their TTL and deletes
    one batch of marked objects' bytes past the collector's ``retention_ms``
    (``s3.object.delete.retention.minutes``), through :meth:`GarbageCollector.reap`."""

    def __init__(self, collector: GarbageCollector, *, period_s: float = REAPER_PERIOD_S) -> None:
        self.collector = collector
        self.period_s = period_s
        self.deleted_count = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the loop (no-op while it runs)."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="s3stream-prepared-reaper")

    async def close(self) -> None:
        task, self._task = self._task, None  # detached first: a start() meanwhile makes a new one
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def run_once(self) -> list[ObjectId]:
        """One pass: expire, then delete what is past retention; returns the deleted ids."""
        ids = await self.collector.reap()
        self.deleted_count += len(ids)
        return ids

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
            except (S3StreamError, OSError) as exc:
                log_event(log, logging.WARNING, "gc.pass_failed", error=exc, action="retry")
            await asyncio.sleep(self.period_s)
