"""The placement log: which buckets hold an object, read from and written to the metadata store, cached.

Objects are immutable and their placement only grows (rows are added before each upload completes,
never changed), so a cached placement stays right for an object that is readable; a read that finds
none of the cached buckets holding it reads the placement again once (:meth:`PlacementLog.lookup` with
``fresh=True``). An object with no rows lives in the list's first bucket. The metadata store is
attached after the storage is opened (the assembly opens storage before metadata); until then object
placement can be neither recorded nor read (InvalidArgumentError).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from s3stream.errors import InvalidArgumentError
from s3stream.ids import ObjectId
from s3stream.metadata.base import MetadataStore

CACHE_ENTRIES_MAX = 200_000
"""Placements kept in memory (least recently used dropped first)."""


class PlacementLog:
    def __init__(self, first_bucket_id: int, metadata: MetadataStore | None = None) -> None:
        self.first_bucket_id = first_bucket_id
        self._metadata = metadata
        self._cache: OrderedDict[ObjectId, tuple[int, ...]] = OrderedDict()

    def attach(self, metadata: MetadataStore) -> None:
        """Use ``metadata`` for placement from now on (the store object ids come from)."""
        self._metadata = metadata

    @property
    def attached(self) -> bool:
        return self._metadata is not None

    def _store(self) -> MetadataStore:
        if self._metadata is None:
            raise InvalidArgumentError(
                "several buckets need the metadata store to place objects, and none is attached"
            )
        return self._metadata

    def _remember(self, object_id: ObjectId, bucket_ids: tuple[int, ...]) -> None:
        self._cache[object_id] = bucket_ids
        self._cache.move_to_end(object_id)
        while len(self._cache) > CACHE_ENTRIES_MAX:
            self._cache.popitem(last=False)

    async def record(self, object_id: ObjectId, bucket_ids: Sequence[int]) -> None:
        """Record (before the object is published) that ``bucket_ids`` hold it."""
        await self._store().record_placement(object_id, list(bucket_ids))
        known = self._cache.get(object_id, ())
        self._remember(object_id, tuple(sorted(set(known) | set(bucket_ids))))

    async def lookup(self, object_id: ObjectId, *, fresh: bool = False) -> tuple[int, ...]:
        """The buckets holding ``object_id`` (the first bucket when it has no rows)."""
        if not fresh:
            cached = self._cache.get(object_id)
            if cached is not None:
                self._cache.move_to_end(object_id)
                return cached
        found = (await self._store().placements([object_id])).get(object_id) or (self.first_bucket_id,)
        self._remember(object_id, found)
        return found

    async def lookup_many(self, object_ids: Sequence[ObjectId]) -> dict[ObjectId, tuple[int, ...]]:
        """The buckets holding each of ``object_ids``, read from the metadata (one batched query; the
        cache is refreshed, not trusted)."""
        found = await self._store().placements(list(object_ids))
        result: dict[ObjectId, tuple[int, ...]] = {}
        for object_id in object_ids:
            result[object_id] = found.get(object_id) or (self.first_bucket_id,)
            self._remember(object_id, result[object_id])
        return result
