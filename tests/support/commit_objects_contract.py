"""The ``commit_objects`` contract (external commits), run against every MetadataStore implementation.

A test module subclasses :class:`CommitObjectsContract` and provides an async ``store`` fixture built
on the ``clock`` fixture, as for :class:`tests.support.metadata_contract.MetadataContract`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from s3stream.errors import (
    ConflictError,
    ErrorCode,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
    S3StreamError,
)
from s3stream.ids import ObjectId, StreamId
from s3stream.metadata.base import (
    CommitObjectsRequest,
    CommittedObject,
    MetadataStore,
    ObjectKind,
    ObjectState,
    StreamOffsetRange,
)
from s3stream.metadata.store import TransactionalStore
from tests.support.metadata_contract import (
    EPOCH,
    LEASE,
    LEASE_MS,
    N1,
    N2,
    TTL_MS,
    FakeClock,
    node,
    opened,
    raises,
    snapshot,
    spans,
    upload,
)

PROGRESS = "direct/progress"


def sso(object_id: int, *ranges: tuple[int, int, int]) -> CommittedObject:
    """A StreamSet object; ranges: (stream, start, end)."""
    return CommittedObject(
        ObjectId(object_id),
        100 * len(ranges),
        tuple(StreamOffsetRange(StreamId(s), a, b, (b - a) * 10) for s, a, b in ranges),
    )


def so(object_id: int, stream: int, start: int, end: int) -> CommittedObject:
    return CommittedObject(
        ObjectId(object_id), 77, (StreamOffsetRange(StreamId(stream), start, end, 70),), stream_object=True
    )


def request(
    objects: Sequence[CommittedObject],
    epochs: Mapping[int, int],
    *,
    puts: Mapping[str, bytes] | None = None,
    expect: Mapping[str, bytes | None] | None = None,
    release: Sequence[int] = (),
    node_epoch: int = EPOCH,
) -> CommitObjectsRequest:
    return CommitObjectsRequest(
        node_id=N1,
        node_epoch=node_epoch,
        objects=tuple(objects),
        stream_epochs={StreamId(s): e for s, e in epochs.items()},
        kv_puts=dict(puts or {}),
        kv_expect=dict(expect or {}),
        release_ids=tuple(ObjectId(i) for i in release),
    )


async def read_all(store: MetadataStore, stream_id: StreamId) -> list[tuple[int, ObjectKind, int, int]]:
    return spans(await store.get_objects(stream_id=stream_id, start_offset=0, end_offset=-1, limit=1000))


class CommitObjectsContract:
    """Every rule of :meth:`MetadataStore.commit_objects`."""

    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    async def test_commits_every_object_advances_ends_and_puts_kv_at_once(self, store: MetadataStore) -> None:
        await node(store)
        s0, s1 = await opened(store), await opened(store)
        await upload(store, N1, [(s0, 0, 10)])  # object 0: the engine's own data first
        first = await store.prepare_objects(count=3, ttl_ms=TTL_MS)  # 1, 2, 3
        await store.commit_objects(
            request(
                [sso(first, (s0, 10, 15), (s1, 0, 4)), sso(first + 1, (s0, 15, 20)), so(first + 2, s1, 4, 9)],
                {s0: 0, s1: 0},
                puts={PROGRESS: b"7"},
                expect={PROGRESS: None},
            )
        )
        assert (await store.describe_stream(s0)).end_offset == 20
        assert (await store.describe_stream(s1)).end_offset == 9
        assert (await store.describe_stream(s0)).ranges[-1].end_offset == 20
        assert await store.kv_get(PROGRESS) == b"7"
        assert await read_all(store, s0) == [
            (0, ObjectKind.STREAM_SET, 0, 10),
            (first, ObjectKind.STREAM_SET, 10, 15),
            (first + 1, ObjectKind.STREAM_SET, 15, 20),
        ]
        assert await read_all(store, s1) == [
            (first, ObjectKind.STREAM_SET, 0, 4),
            (first + 2, ObjectKind.STREAM, 4, 9),
        ]
        objects = {o.object_id: o for o in await store.list_objects()}
        assert objects[ObjectId(first)].state == ObjectState.COMMITTED
        assert objects[ObjectId(first)].size_bytes == 200
        assert objects[ObjectId(first + 2)].kind == ObjectKind.STREAM
        # order ids come from the id counter at commit (4 and 5), which moved past them
        ssos = await store.get_stream_set_objects(N1)
        assert [(o.object_id, o.order_id) for o in ssos] == [(0, 0), (first, 4), (first + 1, 5)]
        assert await store.next_object_id() == 6
        assert await store.prepare_objects(count=1, ttl_ms=TTL_MS) == 6

    async def test_an_object_with_a_lower_id_committed_later_is_read_after(
        self, store: MetadataStore
    ) -> None:
        await node(store)
        s0 = await opened(store)
        early = await store.prepare_objects(count=2, ttl_ms=TTL_MS)  # ids 0 and 1
        await store.commit_objects(request([sso(early + 1, (s0, 0, 5))], {s0: 0}))
        wal = await upload(store, N1, [(s0, 5, 8)])  # an engine upload: order id = its id
        await store.commit_objects(request([sso(early, (s0, 8, 12))], {s0: 0}))
        assert await read_all(store, s0) == [
            (early + 1, ObjectKind.STREAM_SET, 0, 5),
            (wal, ObjectKind.STREAM_SET, 5, 8),
            (early, ObjectKind.STREAM_SET, 8, 12),
        ]
        slices = await store.get_objects(stream_id=s0, start_offset=9, end_offset=-1, limit=10)
        assert spans(slices) == [(early, ObjectKind.STREAM_SET, 8, 12)]

    async def test_an_engine_upload_prepared_after_a_commit_is_read_after_it(
        self, store: MetadataStore
    ) -> None:
        await node(store)
        s0 = await opened(store)
        direct = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        await store.commit_objects(request([sso(direct, (s0, 0, 5))], {s0: 0}))
        wal = await upload(store, N1, [(s0, 5, 9)])
        assert await read_all(store, s0) == [
            (direct, ObjectKind.STREAM_SET, 0, 5),
            (wal, ObjectKind.STREAM_SET, 5, 9),
        ]

    @pytest.mark.parametrize(
        "ranges",
        [
            [(0, 1, 5)],  # a gap at the start
            [(0, 0, 5), (0, 6, 9)],  # a gap between objects
            [(0, 5, 9), (0, 0, 5)],  # the right ranges in the wrong order
            [(0, 0, 5), (0, 3, 9)],  # an overlap
        ],
    )
    async def test_ranges_that_do_not_tile_from_the_end_write_nothing(
        self, store: MetadataStore, ranges: list[tuple[int, int, int]]
    ) -> None:
        await node(store)
        s0 = await opened(store)
        first = await store.prepare_objects(count=len(ranges), ttl_ms=TTL_MS)
        objects = [sso(first + i, r) for i, r in enumerate(ranges)]
        before = await snapshot(store, keys=(PROGRESS,))
        with raises(ConflictError, ErrorCode.OFFSET_NOT_MATCHED):
            await store.commit_objects(request(objects, {s0: 0}, puts={PROGRESS: b"1"}))
        assert await snapshot(store, keys=(PROGRESS,)) == before

    async def test_the_stream_epoch_state_and_owner_are_checked(self, store: MetadataStore) -> None:
        await node(store, N1, N2)
        s0 = await opened(store, epoch=3)
        other = await opened(store, N2)
        closed = await opened(store)
        await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=closed, epoch=0)
        first = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        before = await snapshot(store, keys=(PROGRESS,))
        cases: list[tuple[dict[int, int], StreamId, type[S3StreamError], ErrorCode]] = [
            ({s0: 2}, s0, FencedError, ErrorCode.STREAM_FENCED),
            ({s0: 4}, s0, ConflictError, ErrorCode.STREAM_INNER_ERROR),
            ({other: 0}, other, FencedError, ErrorCode.STREAM_FENCED),
            ({closed: 0}, closed, ConflictError, ErrorCode.STREAM_NOT_OPENED),
            ({s0: 3, 99: 0}, s0, NotFoundError, ErrorCode.STREAM_NOT_EXIST),
        ]
        for epochs, stream, kind, code in cases:
            with raises(kind, code):
                await store.commit_objects(
                    request([sso(first, (stream, 0, 5))], epochs, puts={PROGRESS: b"1"})
                )
        assert await snapshot(store, keys=(PROGRESS,)) == before
        with pytest.raises(InvalidArgumentError, match="no epoch"):
            await store.commit_objects(request([sso(first, (s0, 0, 5))], {}))
        await store.commit_objects(request([sso(first, (s0, 0, 5))], {s0: 3}))
        assert (await store.describe_stream(s0)).end_offset == 5

    async def test_a_kv_condition_that_fails_writes_nothing(self, store: MetadataStore) -> None:
        await node(store)
        s0 = await opened(store)
        await store.kv_put(PROGRESS, b"4")
        first = await store.prepare_objects(count=2, ttl_ms=TTL_MS)
        before = await snapshot(store, keys=(PROGRESS, "direct/other"))
        for expect in ({PROGRESS: b"3"}, {PROGRESS: None}, {"direct/other": b"x"}):
            with raises(ConflictError, ErrorCode.KV_CONDITION_FAILED):
                await store.commit_objects(
                    request(
                        [sso(first, (s0, 0, 5))],
                        {s0: 0},
                        puts={PROGRESS: b"5"},
                        expect=expect,
                        release=[first + 1],
                    )
                )
        assert await snapshot(store, keys=(PROGRESS, "direct/other")) == before
        await store.commit_objects(
            request(
                [sso(first, (s0, 0, 5))],
                {s0: 0},
                puts={PROGRESS: b"5", "direct/other": b"y"},
                expect={PROGRESS: b"4", "direct/other": None},
            )
        )
        assert [await store.kv_get(k) for k in (PROGRESS, "direct/other")] == [b"5", b"y"]

    async def test_released_ids_are_marked_destroyed_with_the_commit(
        self, store: MetadataStore, clock: FakeClock
    ) -> None:
        await node(store)
        s0 = await opened(store)
        first = await store.prepare_objects(count=4, ttl_ms=TTL_MS)  # winner, 2 losers, a marked one
        await store.mark_destroyed([ObjectId(first + 3)], now_ms=clock.now_ms - 5)
        await store.commit_objects(
            request([sso(first, (s0, 0, 5))], {s0: 0}, release=[first + 1, first + 2, first + 3, 4242])
        )
        states = {o.object_id: (o.state, o.marked_at_ms) for o in await store.list_objects()}
        assert states[ObjectId(first)][0] == ObjectState.COMMITTED
        assert states[ObjectId(first + 1)] == (ObjectState.MARK_DESTROYED, clock.now_ms)
        assert states[ObjectId(first + 2)] == (ObjectState.MARK_DESTROYED, clock.now_ms)
        assert states[ObjectId(first + 3)] == (ObjectState.MARK_DESTROYED, clock.now_ms - 5)  # unchanged

    async def test_releasing_a_committed_object_is_refused(self, store: MetadataStore) -> None:
        await node(store)
        s0 = await opened(store)
        committed = await upload(store, N1, [(s0, 0, 5)])
        first = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        before = await snapshot(store)
        with pytest.raises(ConflictError, match="committed"):
            await store.commit_objects(request([sso(first, (s0, 5, 9))], {s0: 0}, release=[committed]))
        assert await snapshot(store) == before

    async def test_objects_must_be_prepared(self, store: MetadataStore, clock: FakeClock) -> None:
        await node(store)
        s0 = await opened(store)
        first = await store.prepare_objects(count=2, ttl_ms=TTL_MS)
        await store.mark_destroyed([ObjectId(first + 1)], now_ms=clock.now_ms)
        for object_id in (first + 1, 999):
            with raises(NotFoundError, ErrorCode.OBJECT_NOT_EXIST):
                await store.commit_objects(
                    request([sso(first, (s0, 0, 5)), sso(object_id, (s0, 5, 6))], {s0: 0})
                )
        assert (await store.get_object(ObjectId(first))).state == ObjectState.PREPARED

    async def test_a_retry_of_a_commit_that_happened_is_a_no_op(self, store: MetadataStore) -> None:
        await node(store)
        s0 = await opened(store)
        first = await store.prepare_objects(count=2, ttl_ms=TTL_MS)
        req = request([sso(first, (s0, 0, 5))], {s0: 0}, puts={PROGRESS: b"1"}, expect={PROGRESS: None})
        await store.commit_objects(req)
        after = await snapshot(store, keys=(PROGRESS,))
        await store.commit_objects(req)  # the outcome was unknown: the same request again
        assert await snapshot(store, keys=(PROGRESS,)) == after
        # the same objects under another progress value: not a retry, and an object commits once
        with raises(ConflictError, ErrorCode.KV_CONDITION_FAILED):
            await store.commit_objects(
                request([sso(first, (s0, 0, 5))], {s0: 0}, puts={PROGRESS: b"2"}, expect={PROGRESS: b"0"})
            )
        with raises(ConflictError, ErrorCode.REDUNDANT_OPERATION):
            await store.commit_objects(request([sso(first, (s0, 5, 8))], {s0: 0}, puts={PROGRESS: b"2"}))
        with raises(ConflictError, ErrorCode.REDUNDANT_OPERATION):  # one committed, one new
            await store.commit_objects(request([sso(first, (s0, 5, 8)), sso(first + 1, (s0, 8, 9))], {s0: 0}))
        assert await snapshot(store, keys=(PROGRESS,)) == after

    async def test_the_node_session_is_checked(self, store: MetadataStore) -> None:
        await node(store)
        s0 = await opened(store)
        first = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        with raises(FencedError, ErrorCode.NODE_EPOCH_EXPIRED):
            await store.commit_objects(request([sso(first, (s0, 0, 5))], {s0: 0}, node_epoch=EPOCH - 1))
        assert (await store.describe_stream(s0)).end_offset == 0

    async def test_a_bound_store_commits_only_while_its_session_and_lease_are_valid(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        session = await store.open_node(node_id=N1, lease_ms=LEASE_MS)
        epoch = session.node_epoch
        store.bind_node(N1, epoch)
        s0 = await store.create_stream(node_id=N1, node_epoch=epoch)
        await store.open_stream(node_id=N1, node_epoch=epoch, stream_id=s0, epoch=0)
        first = await store.prepare_objects(count=3, ttl_ms=TTL_MS)
        leased = store.bind_lease(LEASE)
        with raises(FencedError, ErrorCode.NODE_FENCED):  # the lease is not held
            await leased.commit_objects(request([sso(first, (s0, 0, 5))], {s0: 0}, node_epoch=epoch))
        await store.acquire_lease(name=LEASE, node_id=N1, node_epoch=epoch, lease_ms=LEASE_MS)
        await leased.commit_objects(request([sso(first, (s0, 0, 5))], {s0: 0}, node_epoch=epoch))
        await store.commit_objects(request([sso(first + 1, (s0, 5, 6))], {s0: 0}, node_epoch=epoch))
        clock.advance(LEASE_MS)
        with raises(FencedError, ErrorCode.NODE_FENCED):
            await store.commit_objects(request([sso(first + 2, (s0, 6, 7))], {s0: 0}, node_epoch=epoch))
        assert (await store.describe_stream(s0)).end_offset == 6

    @pytest.mark.parametrize(
        "objects",
        [
            [CommittedObject(ObjectId(0), 1, ())],
            [CommittedObject(ObjectId(0), 1, (StreamOffsetRange(StreamId(0), 0, 1), StreamOffsetRange(StreamId(1), 1, 2)), stream_object=True)],
            [CommittedObject(ObjectId(0), 1, (StreamOffsetRange(StreamId(1), 0, 1), StreamOffsetRange(StreamId(0), 0, 1)))],
            [CommittedObject(ObjectId(0), 1, (StreamOffsetRange(StreamId(0), 3, 3),))],
            [CommittedObject(ObjectId(0), -1, (StreamOffsetRange(StreamId(0), 0, 3),))],
            [sso(0, (0, 0, 1)), sso(0, (0, 1, 2))],
        ],
    )  # fmt: skip
    async def test_malformed_requests_are_invalid_arguments(
        self, store: MetadataStore, objects: list[CommittedObject]
    ) -> None:
        await node(store)
        s0 = await opened(store)
        await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        with pytest.raises(InvalidArgumentError):
            await store.commit_objects(request(objects, {s0: 0}))
        with pytest.raises(InvalidArgumentError, match="release_ids"):
            await store.commit_objects(request([sso(0, (s0, 0, 1))], {s0: 0}, release=[0]))
        assert (await store.describe_stream(s0)).end_offset == 0
