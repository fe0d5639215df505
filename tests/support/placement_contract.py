"""The object-placement part of the MetadataStore contract (schema version 6): ``record_placement``,
``placements``, ``bucket_usage``. One suite, run against every implementation (memory, SQLite,
PostgreSQL).

A test module subclasses :class:`PlacementContract` and provides an async ``store`` fixture built on
the ``clock`` fixture (a :class:`~tests.support.metadata_contract.FakeClock`).
"""

from __future__ import annotations

import pytest

from s3stream.errors import ErrorCode, InvalidArgumentError, NotFoundError
from s3stream.ids import ObjectId
from s3stream.metadata.base import MetadataStore, ObjectState
from tests.support.metadata_contract import N1, TTL_MS, FakeClock, node, opened, raises, upload


class PlacementContract:
    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    async def test_placement_of_a_prepared_object_is_recorded_and_read_back(
        self, store: MetadataStore
    ) -> None:
        first = await store.prepare_objects(count=3, ttl_ms=TTL_MS)
        await store.record_placement(first, [1])
        await store.record_placement(ObjectId(first + 1), [0, 1])
        assert await store.placements([first, ObjectId(first + 1), ObjectId(first + 2)]) == {
            first: (1,),
            first + 1: (0, 1),
        }

    async def test_recording_a_placement_twice_adds_nothing(self, store: MetadataStore) -> None:
        first = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        await store.record_placement(first, [2, 0])
        await store.record_placement(first, [0])
        await store.record_placement(first, [2, 0])
        assert await store.placements([first]) == {first: (0, 2)}

    async def test_placement_of_an_unknown_object_is_refused(self, store: MetadataStore) -> None:
        next_id = await store.next_object_id()
        with raises(NotFoundError, ErrorCode.OBJECT_NOT_EXIST):
            await store.record_placement(ObjectId(next_id + 5), [0])
        assert await store.placements([ObjectId(next_id + 5)]) == {}

    @pytest.mark.parametrize("bucket_ids", [[], [-1], [1, 1], [1 << 31]])
    async def test_bad_bucket_ids_are_refused(self, store: MetadataStore, bucket_ids: list[int]) -> None:
        first = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        with pytest.raises(InvalidArgumentError):
            await store.record_placement(first, bucket_ids)
        assert await store.placements([first]) == {}

    async def test_rows_leave_with_the_objects_record(self, store: MetadataStore, clock: FakeClock) -> None:
        first = await store.prepare_objects(count=2, ttl_ms=TTL_MS)
        await store.record_placement(first, [0, 1])
        await store.record_placement(ObjectId(first + 1), [1])
        clock.advance(TTL_MS + 1)
        assert sorted(await store.expire_prepared(now_ms=clock())) == [first, first + 1]
        assert await store.placements([first]) == {first: (0, 1)}  # marked: bytes may still be there
        await store.remove_objects([first])
        assert await store.placements([first, ObjectId(first + 1)]) == {first + 1: (1,)}
        # a later object with a new id starts without rows
        again = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        assert await store.placements([again]) == {}

    async def test_bucket_usage_counts_committed_objects_per_bucket(self, store: MetadataStore) -> None:
        await node(store)
        stream_id = await opened(store)
        unplaced = await upload(store, N1, [(stream_id, 0, 10)])  # no rows: the first bucket
        placed = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        await store.record_placement(placed, [1])
        from tests.support.metadata_contract import sso_request

        await store.commit_stream_set_object(sso_request(N1, placed, [(stream_id, 10, 20)], size_bytes=700))
        replicated = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        await store.record_placement(replicated, [0, 1])
        await store.commit_stream_set_object(
            sso_request(N1, replicated, [(stream_id, 20, 30)], size_bytes=300)
        )
        prepared = await store.prepare_objects(count=1, ttl_ms=TTL_MS)  # not committed: not counted
        await store.record_placement(prepared, [1])
        sizes = {o.object_id: o.size_bytes for o in await store.list_objects([ObjectState.COMMITTED])}
        assert await store.bucket_usage() == {0: (2, sizes[unplaced] + 300), 1: (2, 1000)}
        assert await store.bucket_usage(unplaced_bucket_id=5) == {
            5: (1, sizes[unplaced]),
            0: (1, 300),
            1: (2, 1000),
        }

    async def test_placements_of_many_objects_in_one_call(self, store: MetadataStore) -> None:
        first = await store.prepare_objects(count=1200, ttl_ms=TTL_MS)
        for i in range(0, 1200, 3):
            await store.record_placement(ObjectId(first + i), [i % 4])
        found = await store.placements([ObjectId(first + i) for i in range(1200)])
        assert found == {first + i: (i % 4,) for i in range(0, 1200, 3)}
