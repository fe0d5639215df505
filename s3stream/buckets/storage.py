"""MultiBucketStorage: the ObjectStorage protocol over several buckets with stable ids.

Object keys (:func:`s3stream.objectformat.parse_object_key`) are placed by the strategy and their
placement recorded in metadata before they are published (:mod:`s3stream.buckets.upload`); reads go
to the buckets the placement names, healthy ones first, falling back to the next on an error or a
missing key, and read the placement again once before giving up. Other keys (the metadata copy,
markers) go to every healthy bucket under replication (a ``put`` succeeds once one bucket holds the
key, so a bucket that is down does not stall metadata writes), else to the first healthy bucket in
list order, and are read from the buckets in list order until found (``list`` is the union, so a key
missing from one bucket is still listed and read from another). ``delete`` goes to every bucket (a missing key is
a no-op; a bucket that fails fails the call, and GC retries it), ``list`` is the union over all
buckets in key order, each key once: so GC, the orphan scan and the prepared-object reaper cover
every bucket without knowing there are several.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from s3stream.buckets.health import BucketHealth, BucketStats
from s3stream.buckets.placement import PlacementLog
from s3stream.buckets.strategy import PlacementStrategy
from s3stream.buckets.upload import MultiBucketUpload, SourceReadFailed
from s3stream.errors import (
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    S3StreamError,
    UnavailableError,
)
from s3stream.ids import ObjectId
from s3stream.metadata.base import MetadataStore
from s3stream.objectformat.keys import parse_object_key
from s3stream.storage.base import ObjectInfo, ObjectStorage, Upload, check_buffer_max_bytes
from s3stream.storage.keys import validate_key

_T = TypeVar("_T")

PROBE_KEY = "__s3stream/bucket-probe"
"""The key a health probe writes (never an object key: the orphan scan leaves it alone)."""
COPY_CHUNK_BYTES = 8 * 1024 * 1024
"""Ranged reads of a copy between buckets."""


def _object_id(key: str) -> ObjectId | None:
    try:
        return ObjectId(parse_object_key(key)[0])
    except InvalidArgumentError:
        return None


class MultiBucketStorage(ObjectStorage):
    """``buckets`` in list order (``{bucket id: storage}``); owns them and closes them."""

    def __init__(
        self,
        buckets: dict[int, ObjectStorage],
        *,
        strategy: PlacementStrategy,
        health: BucketHealth,
        metadata: MetadataStore | None = None,
        names: dict[int, str] | None = None,
    ) -> None:
        if len(buckets) < 1:
            raise InvalidArgumentError("MultiBucketStorage needs at least one bucket")
        self._buckets = dict(buckets)
        self.bucket_ids = tuple(buckets)
        self.strategy = strategy
        self.health = health
        self.placement = PlacementLog(self.bucket_ids[0], metadata)
        self._names = names or {b: f"bucket {b}" for b in self.bucket_ids}
        self._closed = False
        self._write_probes = True

    def __repr__(self) -> str:
        listed = ", ".join(f"{b}@{self._names[b]}" for b in self.bucket_ids)
        return f"MultiBucketStorage({self.strategy.name}: {listed})"

    def bucket(self, bucket_id: int) -> ObjectStorage:
        return self._buckets[bucket_id]

    def backends(self) -> dict[int, ObjectStorage]:
        """Bucket id -> that bucket's storage, in list order (metrics meter each one's requests)."""
        return {b: self._buckets[b] for b in self.bucket_ids}

    def attach(self, metadata: MetadataStore) -> None:
        """The metadata store that records object placement (and hands out object ids)."""
        self.placement.attach(metadata)

    def start(self, *, write_probes: bool = True) -> None:
        """Start the health probes (on the running loop). ``write_probes=False`` (a reader, which writes
        nothing): a probe is a HEAD of the probe key, where an answer, NotFound included, is success."""
        self._write_probes = write_probes
        self.health.start(self._probe)

    async def _probe(self, bucket_id: int) -> None:
        if self._write_probes:
            await self._buckets[bucket_id].put(PROBE_KEY, b"probe")
            return
        with contextlib.suppress(NotFoundError):
            await self._buckets[bucket_id].head(PROBE_KEY)

    def stats(self) -> dict[int, BucketStats]:
        """Per bucket: healthy, recent errors, the last error (redacted), recent uploads, write share."""
        return self.health.stats()

    # -- placement -----------------------------------------------------------------------------
    def _healthy(self, bucket_id: int) -> bool:
        return self.health.is_healthy(bucket_id)

    def _preferred(self, bucket_id: int) -> bool:
        """Healthy and without an error in the last call deadline (see BucketHealth.is_suspect)."""
        return self.health.is_healthy(bucket_id) and not self.health.is_suspect(bucket_id)

    def _usable(self) -> Callable[[int], bool]:
        """What the strategies count as healthy now: the preferred buckets while there is one, else
        the healthy ones."""
        if any(self._preferred(b) for b in self.bucket_ids):
            return self._preferred
        return self._healthy

    def choose(self) -> tuple[int, ...]:
        return self.strategy.choose(self.bucket_ids, self._usable())

    def _targets(self, object_id: ObjectId | None) -> tuple[int, ...]:
        """The strategy's choice for an object. Another key (the metadata copy): under replication
        every healthy bucket (every bucket when none is), else the first usable bucket in list order."""
        if object_id is not None:
            return self.choose()
        healthy = tuple(b for b in self.bucket_ids if self._healthy(b))
        if self.strategy.name == "replication":
            return healthy or self.bucket_ids
        usable = self._usable()
        return tuple(b for b in self.bucket_ids if usable(b))[:1] or self.bucket_ids[:1]

    def next_bucket(self, tried: Sequence[int]) -> int | None:
        return self.strategy.next_after(self.bucket_ids, self._usable(), tried)

    def _read_order(self, bucket_ids: Sequence[int]) -> list[int]:
        return sorted(
            bucket_ids,
            key=lambda b: (not self._healthy(b), not self._preferred(b), self.bucket_ids.index(b)),
        )

    async def _holders(self, key: str, *, fresh: bool = False) -> tuple[list[int], list[int]]:
        """The buckets of this list holding ``key``, and the ids its placement names that this node
        does not know (a bucket another node's newer list added)."""
        object_id = _object_id(key)
        if object_id is None:
            return list(self.bucket_ids), []
        placed = await self.placement.lookup(object_id, fresh=fresh)
        return [b for b in placed if b in self._buckets], [b for b in placed if b not in self._buckets]

    def _unknown_buckets(self, key: str, unknown: Sequence[int]) -> UnavailableError:
        return UnavailableError(
            f"object {key!r} is placed in bucket id(s) {sorted(set(unknown))} that this node's bucket list "
            f"{list(self.bucket_ids)} does not name: restart the node with the full bucket list"
        )

    # -- ObjectStorage -------------------------------------------------------------------------
    async def put(self, key: str, data: bytes | bytearray | memoryview, *, if_absent: bool = False) -> None:
        validate_key(key)
        object_id = _object_id(key)
        targets = self._targets(object_id)
        if object_id is not None:
            await self.placement.record(object_id, targets)
        tried: list[int] = []
        while True:
            results = await asyncio.gather(
                *(self._buckets[b].put(key, data, if_absent=if_absent) for b in targets),
                return_exceptions=True,
            )
            tried += targets
            failed = [(b, r) for b, r in zip(targets, results, strict=True) if isinstance(r, BaseException)]
            for bucket_id, error in failed:
                self.health.record_error(bucket_id, error, write=True)
            done = [b for b, r in zip(targets, results, strict=True) if not isinstance(r, BaseException)]
            for bucket_id in done:
                self.health.record_upload(bucket_id)
            if not failed or (object_id is None and done):  # another key: one bucket holding it is enough
                return
            error = failed[0][1]
            if len(targets) > 1 or len(tried) > 1 or not _retriable(error):
                if len(targets) > 1 and not if_absent:  # replication: all or nothing
                    await self._delete_from(done, [key])
                raise error
            nxt = self.next_bucket(tried)
            if nxt is None:
                raise error
            targets = (nxt,)
            if object_id is not None:
                await self.placement.record(object_id, targets)

    def upload(self, key: str, *, buffer_max_bytes: int | None = None) -> Upload:
        validate_key(key)
        check_buffer_max_bytes(buffer_max_bytes)
        object_id = _object_id(key)
        if object_id is not None and not self.placement.attached:
            raise InvalidArgumentError(
                "several buckets need the metadata store to place objects, and none is attached"
            )
        return MultiBucketUpload(self, key, object_id, self._targets(object_id), buffer_max_bytes)

    async def copy_into(self, upload: Upload, target: int, source_key: str, start: int, end: int) -> None:
        """Append ``[start, end)`` of ``source_key`` to ``upload`` (writing to bucket ``target``):
        server-side when the target holds the source, else ranged reads and writes. A failed read of
        the source from another bucket raises :class:`SourceReadFailed` (not the target's fault)."""
        holders, _ = await self._holders(source_key)
        if target in holders:
            try:
                await upload.copy(source_key, start, end)
                return
            except NotFoundError:
                pass  # not there after all: read it from a bucket that has it
        position = start
        while position < end:
            stop = min(end, position + COPY_CHUNK_BYTES)
            try:
                chunk = await self.get(source_key, position, stop)
            except Exception as exc:
                raise SourceReadFailed(exc) from exc
            await upload.write(chunk)
            position = stop

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        validate_key(key)

        async def read(bucket_id: int) -> bytes:
            return await self._buckets[bucket_id].get(key, start, end)

        return await self._first_answer(key, read)

    async def head(self, key: str) -> ObjectInfo:
        validate_key(key)

        async def read(bucket_id: int) -> ObjectInfo:
            return await self._buckets[bucket_id].head(key)

        return await self._first_answer(key, read)

    async def _first_answer(self, key: str, read: Callable[[int], Awaitable[_T]]) -> _T:
        """``read`` from the buckets holding ``key``, healthy first; the placement is read again once
        when none answers. For an object key any error of one copy (S3StreamError but ConflictError,
        or a timeout) moves on to the next; other keys move on after NotFound or a bucket not
        answering. When all fail: the first error that is not NotFoundError, else NotFoundError (only
        when every bucket asked said the key is missing)."""
        is_object = _object_id(key) is not None
        passed: tuple[type[BaseException], ...] = (
            (S3StreamError, TimeoutError) if is_object else (NotFoundError, UnavailableError, TimeoutError)
        )
        asked: set[int] = set()
        first: BaseException | None = None
        missing: NotFoundError | None = None
        unknown: list[int] = []
        for fresh in (False, True):
            holders, unknown = await self._holders(key, fresh=fresh)
            order = [b for b in self._read_order(holders) if b not in asked]
            for bucket_id in order:
                asked.add(bucket_id)
                try:
                    return await read(bucket_id)
                except ConflictError:
                    raise
                except passed as exc:
                    if isinstance(exc, NotFoundError):
                        missing = missing or exc
                        continue
                    self.health.record_error(bucket_id, exc)
                    first = first or exc
            if not is_object:
                break
        if unknown and first is None:  # the object may be in a bucket this node cannot reach
            raise self._unknown_buckets(key, unknown) from missing
        if first is not None:
            raise first
        if missing is not None:
            raise missing
        raise NotFoundError(f"object {key!r} is in no bucket")

    async def delete(self, keys: Sequence[str]) -> None:
        """Delete ``keys`` from every bucket. An object whose placement names a bucket this node does
        not know raises UnavailableError before anything is deleted: its bytes would stay there, so GC
        must keep the object's metadata until a node with the full list deletes it."""
        if keys and self.placement.attached:
            object_ids = {object_id: key for key in keys if (object_id := _object_id(key)) is not None}
            if object_ids:
                placed = await self.placement.lookup_many(list(object_ids))
                for object_id, bucket_ids in placed.items():
                    unknown = [b for b in bucket_ids if b not in self._buckets]
                    if unknown:
                        raise self._unknown_buckets(object_ids[object_id], unknown)
        await self._delete_from(self.bucket_ids, keys, strict=True)

    async def _delete_from(
        self, bucket_ids: Sequence[int], keys: Sequence[str], *, strict: bool = False
    ) -> None:
        if not keys or not bucket_ids:
            return
        results = await asyncio.gather(
            *(self._buckets[b].delete(keys) for b in bucket_ids), return_exceptions=True
        )
        for bucket_id, result in zip(bucket_ids, results, strict=True):
            if isinstance(result, BaseException):
                self.health.record_error(bucket_id, result)
                if strict:
                    raise result

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """Every key under ``prefix`` in any bucket, in key order, each key once (the first bucket's
        entry in list order when several hold it)."""
        iterators = [self._buckets[b].list(prefix).__aiter__() for b in self.bucket_ids]
        try:
            heap: list[tuple[str, int, ObjectInfo]] = []
            for index, iterator in enumerate(iterators):
                with contextlib.suppress(StopAsyncIteration):
                    info = await anext(iterator)
                    heap.append((info.key, index, info))
            heapq.heapify(heap)
            last_key: str | None = None
            while heap:
                key, index, info = heapq.heappop(heap)
                if key != last_key:
                    yield info
                    last_key = key
                with contextlib.suppress(StopAsyncIteration):
                    nxt = await anext(iterators[index])
                    heapq.heappush(heap, (nxt.key, index, nxt))
        finally:  # a caller that stops early (or a bucket that failed) leaves no listing open
            for iterator in iterators:
                close = getattr(iterator, "aclose", None)
                if close is not None:
                    with contextlib.suppress(Exception):
                        await close()

    # -- maintenance and lifecycle -------------------------------------------------------------
    async def abort_incomplete_uploads(self, older_than_s: float = 3600.0) -> int:
        """Every bucket's reclaim of writes a killed writer left behind (incomplete multipart uploads
        on S3, temporary files on a local store); the count over all buckets."""
        total = 0
        for storage in self._buckets.values():
            for name in ("remove_stale_temp_files", "abort_incomplete_uploads"):
                reclaim = getattr(storage, name, None)
                if reclaim is not None:
                    total += int(await reclaim(older_than_s=older_than_s))
                    break
        return total

    async def check_access(self) -> str | None:
        """Each S3 bucket's access check: a missing bucket or refused keys raise; the buckets that did
        not answer are named in the message returned (None: all answered)."""
        unreachable = []
        for bucket_id, storage in self._buckets.items():
            check = getattr(storage, "check_access", None)
            if check is not None:
                message = await check()
                if message is not None:
                    unreachable.append(f"bucket {bucket_id}: {message}")
        return "; ".join(unreachable) or None

    async def connect(self) -> None:
        for storage in self._buckets.values():
            connect = getattr(storage, "connect", None)
            if connect is not None:
                await connect()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.health.close()
        for storage in self._buckets.values():
            with contextlib.suppress(Exception):
                await storage.close()


def _retriable(error: BaseException) -> bool:
    from s3stream.buckets.health import counts_as_error

    return counts_as_error(error, write=True)
