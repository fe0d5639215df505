"""One object written through :class:`~s3stream.buckets.storage.MultiBucketStorage`: to one bucket
(moving once to another when that one fails) or to every bucket (replication).

Invariants:

* The placement is recorded in metadata before any target's ``complete()`` runs, and names every
  bucket the object may be published in; it is never published in a bucket it does not name.
* Replication: ``complete()`` returns only once every bucket holds the object. Should one fail, the
  others are aborted (or, if already published, deleted) and the call raises: the caller's retry
  uploads the object again.
* Failover: a write, copy or complete that fails as the bucket not answering
  (:func:`~s3stream.buckets.health.counts_as_error`) moves the object once to the next bucket in list
  order, replaying what was written so far. Replay needs the written bytes, so they are kept (by
  reference when they are ``bytes``) up to ``REPLAY_BYTES_MAX``; a larger object that fails is not
  moved (the caller retries it whole, by then on a healthy bucket). Round robin and sharding do not
  move an upload: the caller's retry is placed anew, on another bucket.
* Failover, before publishing: when the lone target has become unhealthy or suspect since the upload
  was placed (its placement record may itself have waited out that bucket's deadline, through the
  metadata copy) and another bucket is neither, ``complete()`` moves the object there (the same one
  move, replayed, recorded) instead of completing on a bucket that just failed.
* A move only ever goes to a preferred bucket (healthy, not suspect); with none, the upload fails and
  its caller retries.
* A copy whose source must be read from another bucket and cannot be (:class:`SourceReadFailed`) is
  the source's failure: it is not counted against the target bucket's health, the upload does not move,
  and the source's error is raised.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from s3stream.errors import S3StreamError, UnavailableError
from s3stream.ids import ObjectId
from s3stream.storage.base import Upload

if TYPE_CHECKING:
    from s3stream.buckets.storage import MultiBucketStorage

REPLAY_BYTES_MAX = 64 * 1024 * 1024
"""Bytes an upload keeps to replay into another bucket (an engine upload or compaction step fits)."""
MOVES_MAX = 1
"""Times one upload moves to another bucket."""

_Op = tuple[bytes, None, int, int] | tuple[None, str, int, int]
"""A written chunk ``(data, None, 0, 0)`` or a copy ``(None, source_key, start, end)``."""


class SourceReadFailed(Exception):
    """Reading the source of a copy from another bucket failed with ``error``: the source's fault, not
    the target's. Internal to this package: the upload neither charges the target's health with it nor
    moves, and raises ``error`` itself."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _source_error(error: BaseException) -> BaseException | None:
    return error.error if isinstance(error, SourceReadFailed) else None


class MultiBucketUpload(Upload):
    def __init__(
        self,
        owner: MultiBucketStorage,
        key: str,
        object_id: ObjectId | None,
        targets: tuple[int, ...],
        buffer_max_bytes: int | None,
    ) -> None:
        self.key = key
        self._owner = owner
        self._object_id = object_id
        self._buffer_max_bytes = buffer_max_bytes
        self._replicated = len(targets) > 1
        self._tried: list[int] = []
        self._uploads: dict[int, Upload] = {t: self._open(t) for t in targets}
        # only failover moves an upload (the others place the retry elsewhere anyway): the replay copy
        # costs memory, so nothing is kept where it is never replayed
        self._ops: list[_Op] | None = (
            [] if owner.strategy.name == "failover" and not self._replicated else None
        )
        self._op_bytes = 0
        self._moves = 0

    def _open(self, bucket_id: int) -> Upload:
        self._tried.append(bucket_id)
        return self._owner.bucket(bucket_id).upload(self.key, buffer_max_bytes=self._buffer_max_bytes)

    @property
    def targets(self) -> tuple[int, ...]:
        return tuple(self._uploads)

    def _log(self, op: _Op, size: int) -> None:
        if self._ops is None:
            return
        self._op_bytes += size
        if self._op_bytes > REPLAY_BYTES_MAX:
            self._ops = None  # too large to replay: a failure is the caller's to retry
            return
        self._ops.append(op)

    async def _each(self, step: Callable[[int, Upload], Awaitable[None]]) -> None:
        """Run ``step`` on every target; a failure of a lone target moves it (once), else raises."""
        while True:
            items = list(self._uploads.items())
            results = await asyncio.gather(*(step(b, u) for b, u in items), return_exceptions=True)
            failed = [
                (b, r) for (b, _), r in zip(items, results, strict=True) if isinstance(r, BaseException)
            ]
            for bucket_id, error in failed:
                if _source_error(error) is None:  # a failed source read is not the target's fault
                    self._owner.health.record_error(bucket_id, error, write=True)
            if not failed:
                return
            bucket_id, error = failed[0]
            source_error = _source_error(error)
            if source_error is not None:  # moving would not help: the source is read the same way
                await self.abort()
                raise source_error
            if isinstance(error, asyncio.CancelledError) or not await self._move(bucket_id, error):
                await self.abort()
                raise error
            # moved: the loop runs the step on the new bucket

    def _movable(self) -> bool:
        return not self._replicated and self._ops is not None and self._moves < MOVES_MAX

    async def _move(self, failed: int, error: BaseException) -> bool:
        """Switch a one-bucket upload from ``failed`` to the next bucket and replay; False: cannot."""
        from s3stream.buckets.health import counts_as_error

        if not self._movable() or not counts_as_error(error, write=True):
            return False
        target = self._owner.next_bucket(self._tried)
        if target is None or not self._preferred(target):  # never onto a bucket that is failing too
            return False
        await self._switch(failed, target)
        return True

    async def _leave_failing_bucket(self) -> bool:
        """Before publishing: move a one-bucket upload off a target that is no longer preferred
        (unhealthy, or failed within its call deadline) to one that is. True: moved."""
        if not self._movable():
            return False
        (current,) = self._uploads
        if self._preferred(current):
            return False
        target = self._owner.next_bucket(self._tried)
        if target is None or not self._preferred(target):
            return False
        await self._switch(current, target)
        return True

    def _preferred(self, bucket_id: int) -> bool:
        """Healthy and not suspect (no error within the call deadline)."""
        health = self._owner.health
        return health.is_healthy(bucket_id) and not health.is_suspect(bucket_id)

    async def _switch(self, failed: int, target: int) -> None:
        """Abort the upload on ``failed``, open one on ``target`` and replay what was written."""
        assert self._ops is not None
        self._moves += 1
        old = self._uploads.pop(failed)
        with contextlib.suppress(Exception):
            await old.abort()
        upload = self._uploads[target] = self._open(target)
        try:
            for data, source, start, end in self._ops:
                if data is not None:
                    await upload.write(data)
                else:
                    assert source is not None
                    await self._owner.copy_into(upload, target, source, start, end)
        except BaseException as replay_error:
            await self.abort()
            source_error = _source_error(replay_error)
            if source_error is not None:
                raise source_error from None
            self._owner.health.record_error(target, replay_error, write=True)
            raise

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        await self._each(lambda _b, u: u.write(data))
        if self._ops is not None:  # kept for a replay: the caller may reuse a mutable buffer
            self._log((data if isinstance(data, bytes) else bytes(data), None, 0, 0), len(data))

    async def copy(self, source_key: str, start: int, end: int) -> None:
        """Server-side where the source is in the target bucket, else a ranged read and a write."""
        await self._each(lambda b, u: self._owner.copy_into(u, b, source_key, start, end))
        self._log((None, source_key, start, end), 0)

    async def _record(self) -> None:
        """Record the current targets as the object's placement (before any of them publishes it)."""
        if self._object_id is None:
            return
        try:
            await self._owner.placement.record(self._object_id, self.targets)
        except BaseException:
            await self.abort()
            raise

    async def complete(self) -> int:
        await self._record()
        if await self._leave_failing_bucket():
            await self._record()
        while True:
            items = list(self._uploads.items())
            results = await asyncio.gather(*(u.complete() for _, u in items), return_exceptions=True)
            failed = [
                (b, r) for (b, _), r in zip(items, results, strict=True) if isinstance(r, BaseException)
            ]
            for bucket_id, error in failed:
                self._owner.health.record_error(bucket_id, error, write=True)
            if not failed:
                for bucket_id, _ in items:
                    self._owner.health.record_upload(bucket_id)
                size = results[0]
                assert isinstance(size, int)
                return size
            bucket_id, error = failed[0]
            done = [b for (b, _), r in zip(items, results, strict=True) if not isinstance(r, BaseException)]
            if not isinstance(error, asyncio.CancelledError) and await self._move(bucket_id, error):
                await self._record()
                continue
            await self._undo(done)
            if isinstance(error, S3StreamError | asyncio.CancelledError):
                raise error
            raise UnavailableError(f"upload of {self.key!r} failed: {error}") from error

    async def _undo(self, published: list[int]) -> None:
        """Abort the unpublished targets and delete the object from the published ones (replication
        commits an object only when every bucket holds it)."""
        for bucket_id, upload in self._uploads.items():
            with contextlib.suppress(Exception):
                if bucket_id in published:
                    await self._owner.bucket(bucket_id).delete([self.key])
                else:
                    await upload.abort()

    async def abort(self) -> None:
        for upload in self._uploads.values():
            with contextlib.suppress(Exception):
                await upload.abort()
