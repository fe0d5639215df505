"""ObjectReaderCache: a least-recently-used cache of open readers, bounded by their index bytes.

Opening a reader costs one tail GET (two when the index guess was short); the cache keeps readers so
that a fetch touching an object again needs only its block GETs. Concurrent ``get`` calls for one key
share one open.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from s3stream.errors import InvalidArgumentError
from s3stream.objectformat.reader import ObjectReader, RangeSource

DEFAULT_CAPACITY_BYTES = 100 << 20


class ObjectReaderCache:
    """Open readers by key, evicting the least recently used beyond ``capacity_bytes`` of index bytes.

    A reader whose index alone exceeds the capacity is returned but not kept.
    """

    def __init__(self, storage: RangeSource, *, capacity_bytes: int = DEFAULT_CAPACITY_BYTES) -> None:
        if capacity_bytes < 0:
            raise InvalidArgumentError("capacity_bytes must be non-negative")
        self._storage = storage
        self._capacity_bytes = capacity_bytes
        self._readers: OrderedDict[str, ObjectReader] = OrderedDict()
        self._opening: dict[str, asyncio.Task[ObjectReader]] = {}
        self._used_bytes = 0

    @property
    def used_bytes(self) -> int:
        return self._used_bytes

    def __len__(self) -> int:
        return len(self._readers)

    def __contains__(self, key: object) -> bool:
        return key in self._readers

    async def get(self, key: str, size_bytes: int) -> ObjectReader:
        """The reader of ``key``, opening it (once, however many callers wait) if not cached."""
        reader = self._readers.get(key)
        if reader is not None:
            if reader.size_bytes == size_bytes:
                self._readers.move_to_end(key)
                return reader
            self.invalidate(key)
        reader = await asyncio.shield(self._opening_task(key, size_bytes))
        if reader.size_bytes != size_bytes:  # a concurrent caller opened it with another size
            return await ObjectReader.open(self._storage, key, size_bytes)
        return reader

    def prefetch(self, key: str, size_bytes: int) -> None:
        """Start opening ``key`` unless it is cached or opening; a later :meth:`get` shares the open.
        A failed prefetch is forgotten (the next ``get`` opens again and meets the error)."""
        reader = self._readers.get(key)
        if reader is None or reader.size_bytes != size_bytes:
            self._opening_task(key, size_bytes)

    def peek(self, key: str, size_bytes: int) -> ObjectReader | None:
        """The cached reader of ``key`` if it is open already (no I/O, no waiting)."""
        reader = self._readers.get(key)
        if reader is None or reader.size_bytes != size_bytes:
            return None
        self._readers.move_to_end(key)
        return reader

    def _opening_task(self, key: str, size_bytes: int) -> asyncio.Task[ObjectReader]:
        task = self._opening.get(key)
        if task is None or (task.done() and task.cancelled()):
            task = asyncio.ensure_future(self._open(key, size_bytes))
            task.add_done_callback(_retrieve)
            self._opening[key] = task
        return task

    def invalidate(self, key: str) -> None:
        """Forget ``key`` (and let an open in progress finish without caching its reader)."""
        self._opening.pop(key, None)
        reader = self._readers.pop(key, None)
        if reader is not None:
            self._used_bytes -= reader.index_bytes

    async def _open(self, key: str, size_bytes: int) -> ObjectReader:
        task = asyncio.current_task()
        try:
            reader = await ObjectReader.open(self._storage, key, size_bytes)
        finally:
            if self._opening.get(key) is task:
                del self._opening[key]
                still_wanted = True
            else:
                still_wanted = False
        if still_wanted and reader.index_bytes <= self._capacity_bytes:
            self._insert(reader)
        return reader

    def _insert(self, reader: ObjectReader) -> None:
        old = self._readers.pop(reader.key, None)
        if old is not None:
            self._used_bytes -= old.index_bytes
        self._readers[reader.key] = reader
        self._used_bytes += reader.index_bytes
        while self._used_bytes > self._capacity_bytes:
            _, evicted = self._readers.popitem(last=False)
            self._used_bytes -= evicted.index_bytes


def _retrieve(task: asyncio.Task[ObjectReader]) -> None:
    """Mark a failed open's exception as seen: every waiter gets it; nobody waiting is not an error."""
    if not task.cancelled():
        task.exception()
