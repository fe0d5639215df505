"""The block cache: decoded data blocks of objects, keyed by (object id, block position), byte-bounded.

Design (AutoMQ's ``DataBlockCache``, ``docs/automq-model.md`` section 12):

* **Bounded**: the sizes of stored blocks plus blocks being loaded never exceed ``capacity_bytes``
  for long: a load reserves its size up front and evicts least-recently-used blocks to make room.
  A block larger than the whole cache is returned to its reader but not kept.
* **One GET per miss**: concurrent requests for a block that is being loaded wait for that load
  instead of starting another one. A failed load fails every waiter with the same error.
* **Freed early once read**: a reader that asks with ``hold=True`` becomes a holder of the block;
  when it calls :meth:`release` with ``read=True`` and no holder is left, the block is dropped at once
  (a sequential reader never comes back to a block it has read). Releasing with ``read=False``
  (a reader state given up) leaves the block to the LRU.
* **TTL**: blocks not touched for ``ttl_s`` are dropped on the next cache operation (no background
  task). An evicted or expired block that still had holders counts in ``evicted_unread_count``;
  readahead watches it to back off.

The cache holds values of any type; the read path stores :class:`s3stream.objectformat.DataBlock`.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

from s3stream.errors import InvalidArgumentError
from s3stream.ids import ObjectId

V = TypeVar("V")

BLOCK_CACHE_TTL_S_DEFAULT = 60.0
"""AutoMQ's DataBlockCache idle expiry (1 min)."""


class BlockKey(NamedTuple):
    """A data block: its object and its byte position in that object."""

    object_id: ObjectId
    position: int


class BlockRequest(NamedTuple):
    key: BlockKey
    size_bytes: int
    hold: bool = True
    """Become a holder of the block (see :meth:`BlockCache.release`)."""


@dataclass(slots=True)
class _Entry(Generic[V]):
    value: V
    size_bytes: int
    holders: int
    last_access_s: float


@dataclass(frozen=True, slots=True)
class CacheRead(Generic[V]):
    """The blocks of one :meth:`BlockCache.get_many` call, in request order."""

    values: list[V]
    hit_count: int
    """Requests answered from stored blocks."""
    miss_count: int
    """Requests that started a load or waited for one already running."""


@dataclass(frozen=True, slots=True)
class CacheStats:
    capacity_bytes: int
    used_bytes: int
    """Stored blocks plus reservations of loads in flight."""
    block_count: int
    hit_count: int
    miss_count: int
    load_count: int
    """Loader calls (each may fetch several blocks)."""
    evicted_unread_count: int


class BlockCache(Generic[V]):
    """A byte-bounded LRU cache of data blocks with single-flight loads. Use from one event loop."""

    def __init__(
        self,
        capacity_bytes: int,
        *,
        ttl_s: float = BLOCK_CACHE_TTL_S_DEFAULT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity_bytes <= 0:
            raise InvalidArgumentError(f"block cache capacity must be positive, got {capacity_bytes}")
        if ttl_s <= 0:
            raise InvalidArgumentError(f"block cache ttl must be positive, got {ttl_s}")
        self.capacity_bytes = capacity_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[BlockKey, _Entry[V]] = OrderedDict()
        self._inflight: dict[BlockKey, asyncio.Future[V]] = {}
        self._stored_bytes = 0
        self._reserved_bytes = 0
        self._hit_count = 0
        self._miss_count = 0
        self._load_count = 0
        self._evicted_unread_count = 0

    # -- queries ----------------------------------------------------------------------------
    @property
    def used_bytes(self) -> int:
        return self._stored_bytes + self._reserved_bytes

    @property
    def free_bytes(self) -> int:
        return max(0, self.capacity_bytes - self.used_bytes)

    @property
    def evicted_unread_count(self) -> int:
        return self._evicted_unread_count

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def stored_or_loading(self, key: BlockKey) -> bool:
        return key in self._entries or key in self._inflight

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> CacheStats:
        return CacheStats(
            capacity_bytes=self.capacity_bytes,
            used_bytes=self.used_bytes,
            block_count=len(self._entries),
            hit_count=self._hit_count,
            miss_count=self._miss_count,
            load_count=self._load_count,
            evicted_unread_count=self._evicted_unread_count,
        )

    # -- reads ------------------------------------------------------------------------------
    async def get_many(
        self,
        requests: Sequence[BlockRequest],
        load: Callable[[Sequence[BlockRequest]], Awaitable[Sequence[V]]],
    ) -> CacheRead[V]:
        """The blocks of ``requests``; the missing ones come from ONE call of ``load``.

        ``load`` receives the requests that are neither stored nor being loaded (in request order)
        and returns their values in the same order. Errors of ``load`` propagate to this caller and
        to every concurrent caller waiting for the same blocks.
        """
        assert len({r.key for r in requests}) == len(requests), "duplicate block requests"
        now = self._clock()
        self._expire(now)
        values: list[V | None] = [None] * len(requests)
        waits: list[tuple[int, asyncio.Future[V]]] = []
        missing: list[int] = []
        hit_count = 0
        held: list[BlockKey] = []  # holds this call took: given back if it fails
        loop = asyncio.get_running_loop()
        for i, request in enumerate(requests):
            entry = self._entries.get(request.key)
            if entry is not None:
                self._entries.move_to_end(request.key)
                entry.last_access_s = now
                if request.hold:
                    entry.holders += 1
                    held.append(request.key)
                values[i] = entry.value
                hit_count += 1
            elif request.key in self._inflight:
                waits.append((i, self._inflight[request.key]))
            else:
                missing.append(i)
        for i in missing:  # after the hits, so making room never evicts a block this call uses
            self._inflight[requests[i].key] = loop.create_future()
            self._reserve(requests[i].size_bytes)
        self._hit_count += hit_count
        self._miss_count += len(waits) + len(missing)
        try:
            if missing:
                await self._load(requests, missing, values, load)
                held.extend(requests[i].key for i in missing if requests[i].hold)
            retry: list[int] = []
            for i, future in waits:
                try:
                    value = await asyncio.shield(future)
                except asyncio.CancelledError:
                    if not future.cancelled():
                        raise  # this caller was cancelled
                    retry.append(i)  # the loading caller was cancelled: load it ourselves
                    continue
                values[i] = value
                if requests[i].hold and (entry := self._entries.get(requests[i].key)) is not None:
                    entry.holders += 1
                    held.append(requests[i].key)
            if retry:
                again = await self.get_many([requests[i] for i in retry], load)
                for i, value in zip(retry, again.values, strict=True):
                    values[i] = value
        except BaseException:
            self.release(held, read=False)
            raise
        out: list[V] = []
        for v in values:
            assert v is not None
            out.append(v)
        return CacheRead(out, hit_count, len(requests) - hit_count)

    async def _load(
        self,
        requests: Sequence[BlockRequest],
        missing: list[int],
        values: list[V | None],
        load: Callable[[Sequence[BlockRequest]], Awaitable[Sequence[V]]],
    ) -> None:
        self._load_count += 1
        try:
            loaded = await load([requests[i] for i in missing])
            if len(loaded) != len(missing):
                raise AssertionError(f"loader returned {len(loaded)} blocks for {len(missing)} requests")
        except BaseException as exc:
            for i in missing:
                request = requests[i]
                future = self._inflight.pop(request.key)
                self._unreserve(request.size_bytes)
                if isinstance(exc, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(exc)
                    future.exception()  # retrieved: waiters re-raise it, no "never retrieved" noise
            raise
        now = self._clock()
        for i, value in zip(missing, loaded, strict=True):
            request = requests[i]
            future = self._inflight.pop(request.key)
            self._unreserve(request.size_bytes)
            values[i] = value
            self._store(request, value, now)
            future.set_result(value)

    def _store(self, request: BlockRequest, value: V, now: float) -> None:
        if request.size_bytes > self.capacity_bytes:
            return  # larger than the whole cache: hand it out, keep nothing
        self._evict_for(request.size_bytes)
        self._entries[request.key] = _Entry(value, request.size_bytes, int(request.hold), now)
        self._stored_bytes += request.size_bytes

    # -- releases ---------------------------------------------------------------------------
    def release(self, keys: Sequence[BlockKey], *, read: bool) -> None:
        """Drop one hold on each block; a block read by its last holder is freed at once."""
        for key in keys:
            entry = self._entries.get(key)
            if entry is None or entry.holders == 0:
                continue
            entry.holders -= 1
            if read and entry.holders == 0:
                self._remove(key)

    def clear(self) -> None:
        for key in list(self._entries):
            self._remove(key)

    # -- space ------------------------------------------------------------------------------
    def _reserve(self, size_bytes: int) -> None:
        size_bytes = min(size_bytes, self.capacity_bytes)
        self._evict_for(size_bytes)
        self._reserved_bytes += size_bytes

    def _unreserve(self, size_bytes: int) -> None:
        self._reserved_bytes -= min(size_bytes, self.capacity_bytes)
        assert self._reserved_bytes >= 0

    def _evict_for(self, size_bytes: int) -> None:
        while self._entries and self.used_bytes + size_bytes > self.capacity_bytes:
            key = next(iter(self._entries))
            if self._entries[key].holders > 0:
                self._evicted_unread_count += 1
            self._remove(key)

    def _expire(self, now: float) -> None:
        deadline = now - self.ttl_s
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry.last_access_s > deadline:
                break
            if entry.holders > 0:
                self._evicted_unread_count += 1
            self._remove(key)

    def _remove(self, key: BlockKey) -> None:
        entry = self._entries.pop(key)
        self._stored_bytes -= entry.size_bytes
        assert self._stored_bytes >= 0
