"""MemoryObjectStorage: the in-memory twin of an object store, for fast unit tests and benchmarks.

It keeps the contract of every backend (same key rules, same errors, objects invisible until a
write completes) and counts the requests an S3 store would have received in :attr:`stats`:
``put`` (a PUT or a completed upload), ``get``, ``head``, ``delete`` (per batch of
``MAX_DELETE_BATCH`` keys), ``list`` (per page of ``list_page_size`` keys), ``copy`` (per
``Upload.copy``). Nothing is persisted; ``close`` drops the objects.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from s3stream.errors import ClosedError, ConflictError, InvalidArgumentError, NotFoundError
from s3stream.storage.base import MAX_DELETE_BATCH, ObjectInfo, Upload, check_buffer_max_bytes
from s3stream.storage.keys import resolve_range, validate_key, validate_prefix, validate_range
from s3stream.storage.stats import StorageStats


@dataclass(frozen=True, slots=True)
class _Object:
    data: bytes
    last_modified_s: float
    etag: str


class MemoryObjectStorage:
    """A dict of immutable objects behind the ObjectStorage protocol."""

    def __init__(self, name: str = "", *, list_page_size: int = 1000) -> None:
        if list_page_size < 1:
            raise InvalidArgumentError(f"list_page_size must be >= 1, got {list_page_size}")
        self.name = name
        self.list_page_size = list_page_size
        self.stats = StorageStats()
        self._objects: dict[str, _Object] = {}
        self._sorted_keys: list[str] = []
        self._version = 0
        self._closed = False

    # -- helpers -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"memory object storage {self.name!r} is closed")

    def _publish(self, key: str, data: bytes, *, if_absent: bool) -> None:
        """Make ``data`` visible under ``key`` in one step (no await inside)."""
        self._check_open()
        exists = key in self._objects
        if if_absent and exists:
            raise ConflictError(f"object {key!r} already exists")
        self._version += 1
        self._objects[key] = _Object(data, time.time(), f"m{self._version}")
        if not exists:
            bisect.insort(self._sorted_keys, key)

    def _lookup(self, key: str) -> _Object:
        self._check_open()
        obj = self._objects.get(key)
        if obj is None:
            raise NotFoundError(f"object {key!r} not found")
        return obj

    def object_count(self) -> int:
        return len(self._objects)

    # -- ObjectStorage -----------------------------------------------------------------------

    async def put(self, key: str, data: bytes | bytearray | memoryview, *, if_absent: bool = False) -> None:
        validate_key(key)
        snapshot = bytes(data)
        await asyncio.sleep(0)  # let racing writers interleave as they would over a network
        self._publish(key, snapshot, if_absent=if_absent)
        self.stats.record("put", len(snapshot))

    def upload(self, key: str, *, buffer_max_bytes: int | None = None, if_absent: bool = False) -> Upload:
        """``buffer_max_bytes`` is validated and otherwise ignored: the twin's upload holds the whole
        object until ``complete`` (the twin is the store; it has no parts to size). ``if_absent``:
        ``complete`` publishes only if the key does not exist (else ConflictError)."""
        validate_key(key)
        check_buffer_max_bytes(buffer_max_bytes)
        self._check_open()
        return _MemoryUpload(self, key, if_absent=if_absent)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        validate_key(key)
        start, end = validate_range(key, start, end)
        if end is not None and start == end:
            return b""
        obj = self._lookup(key)
        lo, hi = resolve_range(key, start, end, len(obj.data))
        out = obj.data if (lo, hi) == (0, len(obj.data)) else obj.data[lo:hi]
        self.stats.record("get", len(out))
        return out

    async def head(self, key: str) -> ObjectInfo:
        validate_key(key)
        obj = self._lookup(key)
        self.stats.record("head")
        return ObjectInfo(key, len(obj.data), obj.last_modified_s, obj.etag)

    async def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            validate_key(key)
        self._check_open()
        for batch_start in range(0, len(keys), MAX_DELETE_BATCH):
            for key in keys[batch_start : batch_start + MAX_DELETE_BATCH]:
                if self._objects.pop(key, None) is not None:
                    index = bisect.bisect_left(self._sorted_keys, key)
                    del self._sorted_keys[index]
            self.stats.record("delete")

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        validate_prefix(prefix)
        self._check_open()
        after: str | None = None
        while True:
            # A page is a snapshot, like one ListObjectsV2 response; continue after its last key.
            if after is None:
                index = bisect.bisect_left(self._sorted_keys, prefix)
            else:
                index = bisect.bisect_right(self._sorted_keys, after)
            page: list[ObjectInfo] = []
            for key in self._sorted_keys[index : index + self.list_page_size]:
                if not key.startswith(prefix):
                    break
                obj = self._objects[key]
                page.append(ObjectInfo(key, len(obj.data), obj.last_modified_s, obj.etag))
            self.stats.record("list")
            for info in page:
                yield info
            if len(page) < self.list_page_size:
                return
            after = page[-1].key
            self._check_open()

    async def close(self) -> None:
        self._closed = True
        self._objects.clear()
        self._sorted_keys.clear()


class _MemoryUpload:
    """Buffers writes and copies; the object appears only when :meth:`complete` returns."""

    def __init__(self, storage: MemoryObjectStorage, key: str, *, if_absent: bool = False) -> None:
        self.key = key
        self._storage = storage
        self._if_absent = if_absent
        self._buffer = bytearray()
        self._done = False

    def _check_active(self) -> None:
        if self._done:
            raise ClosedError(f"upload of {self.key!r} already completed or aborted")

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        self._check_active()
        self._buffer += data

    async def copy(self, source_key: str, start: int, end: int) -> None:
        self._check_active()
        try:
            validate_key(source_key)
            validate_range(source_key, start, end)
            obj = self._storage._lookup(source_key)
            lo, hi = resolve_range(source_key, start, end, len(obj.data))
        except BaseException:
            await self.abort()
            raise
        self._buffer += memoryview(obj.data)[lo:hi]
        self._storage.stats.record("copy", hi - lo)

    async def complete(self) -> int:
        self._check_active()
        self._done = True
        data = bytes(self._buffer)
        self._buffer = bytearray()
        self._storage._publish(self.key, data, if_absent=self._if_absent)
        self._storage.stats.record("put", len(data))
        return len(data)

    async def abort(self) -> None:
        self._done = True
        self._buffer = bytearray()
